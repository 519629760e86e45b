"""The docs site builds clean (Sphinx warnings are errors, every reference resolves), every relative
markdown link of its pages and the README lands on a file and heading that exist, and the README fits
on a screen (10 KB)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
README = REPO / "README.md"
README_LIMIT_BYTES = 10 * 1024

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
LABEL = re.compile(r"^\(([\w.-]+)\)=\s*$", re.M)  # MyST's target before a heading: (name)=


def slug(heading: str) -> str:
    """The anchor GitHub and MyST (``myst_heading_anchors``) give a heading."""
    text = re.sub(r"[`*_]|\{[a-z]+\}", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(h) for h in HEADING.findall(text)} | set(LABEL.findall(text))


def relative_links(page: Path) -> list[str]:
    """Links to files of this repository (not http, mailto), outside code blocks."""
    text = FENCE.sub("", page.read_text())
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z]+:", t)]


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """Each relative link of `page` whose file, or heading, does not exist."""
    page, root, broken = page.resolve(), root.resolve(), []
    for link in relative_links(page):
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{page.relative_to(root)}: {link} (no file {target.relative_to(root)})")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{page.relative_to(root)}: {link} (no heading #{anchor} in {target.name})")
    return broken


def shell_blocks(text: str) -> list[str]:
    """The contents of the ```bash blocks of a page."""
    blocks, block, language = [], None, ""
    for line in text.splitlines():
        if line.startswith("```") and block is None:
            block, language = [], line[3:].strip()
        elif line.startswith("```"):
            if language in ("bash", "sh"):
                blocks.append("\n".join(block))
            block = None
        elif block is not None:
            block.append(line)
    return blocks


def workbench_commands(page: Path) -> list[list[str]]:
    """The arguments of every ``python -m workbench`` (or torchrun ``-m workbench``) command in a page's
    shell blocks, continuation lines joined, environment variables and comments left out."""
    found = []
    for block in shell_blocks(page.read_text()):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            while words and re.match(r"^[A-Z_]+=", words[0]):
                words = words[1:]
            if words[:3] == ["python", "-m", "workbench"]:
                found.append(words[3:])
            elif words[:1] == ["torchrun"] and words[words.index("-m") + 1 : words.index("-m") + 2] == [
                "workbench"
            ]:
                found.append(words[words.index("-m") + 2 :])
    return found


def test_every_command_the_pages_show_parses_and_its_config_loads():
    """What a reader copies must run: each command is parsed by the CLI's own parser, and its
    ``--config`` file and KEY=VALUE overrides load (known keys, allowed values)."""
    from workbench.__main__ import parse_args
    from workbench.config import load_config

    failures, seen = [], 0
    for page in [README, *sorted(DOCS.rglob("*.md"))]:
        for argv in workbench_commands(page):
            seen += 1
            try:
                args = parse_args(argv)
                if getattr(args, "overrides", None) is not None:
                    config = getattr(args, "config", None)
                    load_config(REPO / config if config else None, args.overrides)
            except (SystemExit, Exception) as err:  # argparse exits; a bad override raises ConfigError
                failures.append(f"{page.relative_to(REPO)}: {shlex.join(argv)}: {type(err).__name__} {err}")
    assert seen >= 30, seen
    assert not failures, "\n".join(failures)


def test_the_docs_build_with_no_warning_and_every_link_and_reference_resolved(tmp_path):
    # make docs's command: -W (warnings are errors), -n (nitpicky: every code reference resolves)
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html"]
    command += ["-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"sphinx-build failed:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    for page in (
        "index",
        "tutorials/colab-v5e-1",
        "how-to/sessions",
        "reference/api",
        "explanation/measurements",
    ):
        assert (tmp_path / "html" / f"{page}.html").exists(), page
    # Sphinx checks the links inside the site; the README's, and anchors as GitHub reads them, here
    # (after the build, which writes the generated reference pages that some pages link to).
    pages = [README, *sorted(DOCS.rglob("*.md"))]
    assert len(pages) > 20, pages
    broken = [b for page in pages for b in broken_links(page)]
    assert not broken, "\n".join(broken)


def test_the_link_check_sees_a_missing_page_and_a_missing_heading(tmp_path):
    (tmp_path / "there.md").write_text("# A heading with `code`\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md#a-heading-with-code) [gone](gone.md) [bad](there.md#nope) [web](https://x.org/y.md)\n"
        "```\n[in code](ignored.md)\n```\n"
    )
    broken = [b.split(" (")[0] for b in broken_links(page, root=tmp_path)]
    assert broken == ["page.md: gone.md", "page.md: there.md#nope"]


def test_the_readme_fits_in_10_kb_and_links_each_figure_to_its_reproducing_command():
    text = README.read_text()
    assert len(text.encode()) <= README_LIMIT_BYTES, len(text.encode())
    assert "make demo" in text and "make test" in text
    assert "docs/hosted-runtimes.md" in text
    figures = text.split("## Headline figures", 1)[1].split("\n## ", 1)[0]
    bullets = re.split(r"\n- ", figures)[1:]
    assert len(bullets) >= 4, figures
    for bullet in bullets:  # the measurements page gives each table its reproducing command
        assert re.search(r"\(docs/explanation/measurements\.md#[\w-]+\)", bullet), bullet
    page = (DOCS / "explanation" / "measurements.md").read_text()
    for section in page.split("\n## ")[1:]:
        assert "```bash" in section, f"no command reproduces: {section[:80]}"
