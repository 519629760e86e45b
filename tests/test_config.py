"""Config: YAML load/save, dotted overrides, round trips, and clear errors for bad input."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from workbench.config import ConfigError, ModelConfig, WorkbenchConfig, load_config

REPO = Path(__file__).resolve().parent.parent


def test_every_field_is_documented() -> None:
    import ast
    import inspect

    import workbench.config as config_module
    import workbench.config_grpo as grpo_settings

    nodes = [n for m in (config_module, grpo_settings) for n in ast.parse(inspect.getsource(m)).body]
    for node in nodes:
        if isinstance(node, ast.ClassDef) and node.name.endswith("Config") and node.name != "ConfigError":
            body = node.body
            for i, stmt in enumerate(body):
                if isinstance(stmt, ast.AnnAssign):
                    nxt = body[i + 1] if i + 1 < len(body) else None
                    documented = isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    assert documented, f"{node.name}.{stmt.target.id} has no docstring under it"


def test_dict_and_yaml_round_trip(tmp_path: Path) -> None:
    cfg = WorkbenchConfig().with_overrides(
        ["model.family=qwen2", "train.steps=7", "mesh.fsdp=8", "train.max_grad_norm=null"]
    )
    assert WorkbenchConfig.from_dict(cfg.to_dict()) == cfg
    path = tmp_path / "cfg.yaml"
    cfg.to_yaml(path)
    assert WorkbenchConfig.from_yaml(path) == cfg
    assert WorkbenchConfig.from_yaml(cfg.to_yaml()) == cfg  # YAML text works too


def test_quickstart_yaml_loads_and_overrides_coerce() -> None:
    cfg = load_config(
        REPO / "configs" / "quickstart.yaml",
        ["train.learning_rate=1e-3", "bucketing.packing=yes", "data.max_examples=100"],
    )
    assert cfg.model.family == "llama" and cfg.train.steps == 30
    assert cfg.train.learning_rate == pytest.approx(1e-3) and isinstance(cfg.train.learning_rate, float)
    assert cfg.bucketing.packing is True and cfg.data.max_examples == 100
    assert isinstance(WorkbenchConfig().with_overrides({"train.learning_rate": 1}).train.learning_rate, float)


def test_yaml_is_loaded_safely(tmp_path: Path) -> None:
    path = tmp_path / "evil.yaml"
    path.write_text("train: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        WorkbenchConfig.from_yaml(path)


BAD = [
    (["train.stpes=3"], r"unknown key 'train\.stpes'.*did you mean 'train\.steps'"),
    (["modle.family=llama"], r"unknown key 'modle'.*did you mean 'model'"),
    (["train.steps=ten"], r"train\.steps='ten' is not allowed: expected int"),
    (["train.steps=0"], r"train\.steps=0 is not allowed: must be >= 1"),
    (["train.learning_rate=-1"], r"train\.learning_rate=-1\.0 is not allowed: must be > 0"),
    (
        ["model.family=bert"],
        r"model\.family='bert' is not allowed: expected one of 'llama', 'qwen2', 'mistral', 'gemma', 'gpt2'",
    ),
    (
        ["train.optimizer=adam"],
        r"train\.optimizer='adam' is not allowed: expected one of 'adamw', 'adafactor', 'sgd'",
    ),
    (["model.num_heads=5"], r"model\.num_heads=5 is not allowed: must divide hidden_size=64"),
    (["model.num_kv_heads=3"], r"model\.num_kv_heads=3 is not allowed: must divide num_heads=4"),
    (
        ["mesh.data=-1", "mesh.fsdp=-1"],
        r"mesh\.axes=\(-1, -1, 1\) is not allowed: at most one axis may be -1",
    ),
    (["mesh.model=0"], r"mesh\.model=0 is not allowed: must be >= 1, or -1"),
    (
        ["bucketing.strategy=exponential"],
        r"bucketing\.strategy='exponential' is not allowed: expected one of 'optimal'",
    ),
    (
        ["bucketing.overflow=wrap"],
        r"bucketing\.overflow='wrap' is not allowed: expected one of 'truncate', 'drop'",
    ),
    (["data.eval_fraction=0.9"], r"data\.eval_fraction=0\.9 is not allowed: must be in \[0, 0\.5\]"),
    (
        ["data.max_length=4096"],
        r"data\.max_length=4096 is not allowed: must be <= model\.max_position_embeddings=512",
    ),
    (
        ["train.gradient_checkpointing=maybe"],
        r"train\.gradient_checkpointing='maybe' is not allowed: expected bool",
    ),
    (
        ["train.device_type=gpu"],
        r"train\.device_type='gpu' is not allowed: expected one of 'auto', 'tpu', 'cuda', 'xla', 'cpu'",
    ),
    (["train.steps"], r"override 'train\.steps' must look like section\.field=value"),
    (["train=3"], r"'train' is a section; set one of its fields, e\.g\. train\.device_type="),
    (["train.steps.x=3"], r"'train\.steps' is a value, not a section"),
    (["bucketing.max_buckets=0"], r"bucketing\.max_buckets=0 is not allowed: must be >= 1"),
    (["train.max_grad_norm=0"], r"train\.max_grad_norm=0\.0 is not allowed: must be > 0 or null"),
    (["train.dynamic_batch_factor=1"], r"train\.dynamic_batch_factor=1\.0 is not allowed: must be > 1"),
    (
        ["train.dynamic_batch_every=10", "bucketing.tokens_per_batch=2048"],
        r"train\.dynamic_batch_every=10 is not allowed: must be 0 while bucketing\.tokens_per_batch=2048 is set",
    ),
    (["lora.rnak=8"], r"unknown key 'lora\.rnak' in section 'lora'; did you mean 'lora\.rank'\?"),
    (["lora.rank=-1"], r"lora\.rank=-1 is not allowed: must be >= 0 \(0 turns LoRA off\)"),
    (["lora.rank=eight"], r"lora\.rank='eight' is not allowed: expected int"),
    (["lora.alpha=0"], r"lora\.alpha=0\.0 is not allowed: must be > 0"),
    (["lora.dropout=1"], r"lora\.dropout=1\.0 is not allowed: must be in \[0, 1\)"),
    (
        ["lora.target_modules=q-proj,v_proj"],
        r"lora\.target_modules=\['q-proj', 'v_proj'\] is not allowed: 'auto' or a non-empty list of module names",
    ),
    (["lora.target_modules=[]"], r"lora\.target_modules=\[\] is not allowed: 'auto' or a non-empty list"),
    (["grpo.num_generations=1"], r"grpo\.num_generations=1 is not allowed: must be >= 2"),
    (["grpo.temperature=0"], r"grpo\.temperature=0\.0 is not allowed: must be > 0"),
    (["grpo.top_p=1.5"], r"grpo\.top_p=1\.5 is not allowed: must be in \(0, 1\]"),
    (["grpo.epsilon_high=0.1"], r"grpo\.epsilon_high=0\.1 is not allowed: must be >= epsilon=0\.2 or null"),
    (
        ["grpo.loss_type=bnpo"],
        r"grpo\.loss_type='bnpo' is not allowed: expected one of 'grpo', 'dr_grpo', 'dapo'",
    ),
    (
        ["grpo.reward_funcs=math_answer,format", "grpo.reward_weights=1.0"],
        r"grpo\.reward_weights=\[1\.0\] is not allowed: must give one weight per reward function "
        r"\(reward_funcs has 2\)",
    ),
    (["grpo.reward_funcs=[]"], r"grpo\.reward_funcs=\[\] is not allowed: a non-empty list of reward names"),
    (
        ["train.objective=grpo", "grpo.max_completion_length=64", "grpo.beta=0.04"],
        r"grpo\.beta=0\.04 is not allowed: must be 0 without LoRA adapters",
    ),
    (
        ["train.objective=grpo", "grpo.max_completion_length=512"],
        r"grpo\.max_completion_length=512 \+ data\.max_length=256 \(the longest prompt\) = 768 > "
        r"model\.max_position_embeddings=512",
    ),
    (["train.simpo_gamma=-1"], r"train\.simpo_gamma=-1\.0 is not allowed: must be >= 0"),
]


def test_grpo_section_takes_trls_names_lists_from_the_command_line_and_yaml_ints() -> None:
    from workbench.config_grpo import GRPOConfig

    assert WorkbenchConfig().grpo == GRPOConfig()  # TRL's defaults: G 8, dapo, beta 0, epsilon 0.2, group
    cfg = WorkbenchConfig().with_overrides(
        ["train.objective=grpo", "lora.rank=4", "grpo.beta=0.04", "grpo.max_completion_length=128",
         "grpo.reward_funcs=math_answer,mymod.rewards:brevity", "grpo.reward_weights=[1, 0.5]"]
    )  # fmt: skip
    assert cfg.grpo.reward_funcs == ["math_answer", "mymod.rewards:brevity"]
    assert cfg.grpo.reward_weights == [1.0, 0.5]
    assert WorkbenchConfig.from_yaml(cfg.to_yaml()) == cfg
    assert WorkbenchConfig.from_yaml(
        "grpo: {reward_funcs: [a, b], reward_weights: [2, 1]}"
    ).grpo.reward_weights == [
        2.0,
        1.0,
    ]  # YAML's ints in a list of floats


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_overrides_name_field_value_and_allowed(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        WorkbenchConfig().with_overrides(overrides)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"train": {"steps": "10"}},
            r"train\.steps='10' is not allowed: it is a quoted string, not a number: drop the quotes "
            r"\(train\.steps=10\); expected int",
        ),  # YAML types are not guessed
        ({"train": {"batch_size": True}}, r"train\.batch_size=True is not allowed: expected int"),
        ({"model": [1, 2]}, r"model must be a mapping"),
        ({"extra": {}}, r"unknown key 'extra' in the top level"),
        ({"model": {"hidden": 32}}, r"unknown key 'model\.hidden'.*did you mean 'model\.hidden_size'"),
        (
            {"lora": {"target_modules": ["q_proj", 3]}},
            r"lora\.target_modules=\['q_proj', 3\] is not allowed: expected str or a list of str",
        ),
        ({"lora": {"rank": 1.5}}, r"lora\.rank=1\.5 is not allowed: expected int"),
    ],
)
def test_bad_dicts(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        WorkbenchConfig.from_dict(data)


def test_missing_file_and_non_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        WorkbenchConfig.from_yaml("nope.yaml")
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping of sections, got list"):
        WorkbenchConfig.from_yaml(path)


def test_sections_are_independent_defaults() -> None:
    a, b = WorkbenchConfig(), WorkbenchConfig()
    a.train.steps = 99
    assert b.train.steps != 99
    assert dataclasses.replace(ModelConfig(), hidden_size=128).hidden_size == 128


def test_lora_section_defaults_overrides_and_round_trip(tmp_path: Path) -> None:
    assert WorkbenchConfig().lora.rank == 0 and WorkbenchConfig().lora.target_modules == "auto"  # off
    cfg = WorkbenchConfig().with_overrides(
        ["lora.rank=8", "lora.alpha=32", "lora.dropout=0.05", "lora.target_modules=q_proj, v_proj"]
    )
    assert (cfg.lora.rank, cfg.lora.alpha, cfg.lora.dropout) == (8, 32.0, 0.05)
    assert cfg.lora.target_modules == ["q_proj", "v_proj"]  # a comma-separated override is a list
    assert WorkbenchConfig().with_overrides({"lora.target_modules": "[q_proj]"}).lora.target_modules == [
        "q_proj"
    ]
    assert WorkbenchConfig().with_overrides({"lora.target_modules": "auto"}).lora.target_modules == "auto"
    path = tmp_path / "lora.yaml"
    cfg.to_yaml(path)
    assert "target_modules:\n  - q_proj\n  - v_proj" in path.read_text()  # a YAML list
    assert WorkbenchConfig.from_yaml(path) == cfg and WorkbenchConfig.from_dict(cfg.to_dict()) == cfg


def test_the_8b_recipe_fits_one_v5e_chip_by_the_estimate():
    # configs/lora-8b-v5e-1.yaml on a Llama-3.1-8B checkpoint: what docs/tutorials/colab-v5e-1.md promises a Colab user
    from workbench.analysis.batch import max_batch_size
    from workbench.analysis.estimate import estimate
    from workbench.models.presets import MODEL_PRESETS
    from workbench.units import GiB

    cfg = load_config(Path(__file__).parent.parent / "configs" / "lora-8b-v5e-1.yaml")
    shape = {f"model.{k}": v for k, v in MODEL_PRESETS["Llama-3.1-8B shape"].items()}
    cfg = cfg.with_overrides({**shape, "model.vocab_size": 128256})
    assert (cfg.model.quantize, cfg.lora.rank, cfg.train.loss_chunk_tokens) == ("int8", 16, "auto")
    common = dict(
        seq_len=cfg.data.max_length,
        precision=cfg.train.precision,
        gradient_checkpointing=cfg.train.gradient_checkpointing,
        lora_rank=cfg.lora.rank,
        quantize=cfg.model.quantize,
        loss_chunk_tokens=cfg.train.loss_chunk_tokens,
    )
    est = estimate(cfg.model, batch_size=cfg.train.batch_size, memory_bytes=16 * GiB, **common)
    assert est.fits(16 * GiB), est.table()
    assert max_batch_size(cfg.model, memory_bytes=16 * GiB, **common) >= cfg.train.batch_size
    unquantized = estimate(
        cfg.model, batch_size=cfg.train.batch_size, memory_bytes=16 * GiB, **{**common, "quantize": "none"}
    )
    assert not unquantized.fits(16 * GiB)
