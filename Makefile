# Two entry points on a fresh machine: `make demo` and `make test`.
# Both create .venv when it is missing and install the project into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
EXTRAS := xla-cpu,notebook,dev

.PHONY: demo test lint docs venv bench browser-deps clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(STAMP)

# Debian's Chromium for the one real-browser test (never `playwright install`).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium missing and not root: the browser test will be skipped"; fi; }

lint: venv
	$(VENV)/bin/ruff check workbench widgets tests bench
	$(VENV)/bin/ruff format --check workbench widgets tests bench

# The test files run in parallel workers, a file per worker at a time (shared module fixtures stay in one
# process); tests/conftest.py starts the longest files first. `pytest tests/FILE` alone runs serially.
test: venv browser-deps lint
	$(VENV)/bin/pytest -q -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder --durations 25

# The docs site (Sphinx + MyST): warnings are errors and every reference must resolve (-n).
# `make test` builds it too (tests/test_docs.py).
docs: venv
	$(VENV)/bin/sphinx-build -W --keep-going -n -b html docs build/docs

demo: venv
	$(PY) -m workbench demo

bench: venv browser-deps
	PJRT_DEVICE=CPU $(PY) bench/bucketing.py
	PJRT_DEVICE=CPU $(PY) bench/bucketing.py --auto
	PJRT_DEVICE=CPU $(PY) bench/sharding.py
	PJRT_DEVICE=CPU $(PY) bench/memory.py
	PJRT_DEVICE=CPU $(PY) bench/profiling.py
	PJRT_DEVICE=CPU $(PY) bench/train.py
	PJRT_DEVICE=CPU $(PY) bench/generate.py
	PJRT_DEVICE=CPU $(PY) bench/compile.py
	PJRT_DEVICE=CPU $(PY) bench/compile.py --real
	PJRT_DEVICE=CPU $(PY) bench/quantize.py
	PJRT_DEVICE=CPU $(PY) bench/memory_real.py
	PJRT_DEVICE=CPU $(PY) bench/compile_log_cost.py
	PJRT_DEVICE=CPU $(PY) bench/attention.py
	PJRT_DEVICE=CPU $(PY) bench/communication.py
	PJRT_DEVICE=CPU $(PY) bench/distributed.py
	$(PY) bench/frontends.py

clean:
	rm -rf $(VENV) reports .pytest_cache build *.egg-info
