"""``train.objective: grpo``: reinforcement learning from verifiable rewards on sampled completions.

The examples are prompts with their answers (`workbench.data.prompts`), the run is the RL room's
(`workbench.rl.wiring.GRPORun`: rollouts on the device, rewards, the clipped loss; imported when a run
starts), and the memory estimate counts each prompt as its G completions' rows of prompt + completion
after a rollout (`workbench.analysis.rollout_memory.RolloutPlan`). Its settings are the ``grpo``
section (`workbench.config_grpo`), checked here against the rest of the config.
"""

from __future__ import annotations

import difflib
from typing import Any

from workbench.config_grpo import BUILTIN_REWARD_NAMES, keeps_old_logps, steps_per_generation
from workbench.config_parse import ConfigError, require
from workbench.objective_registry import Objective, register_objective


class GRPO(Objective):
    """Group-relative policy optimisation: TRL's losses under TRL's names."""

    name = "grpo"
    summary = "reinforcement learning from rewards on sampled completions"
    example_kind = "prompts"
    settings = ("grpo.",)

    def check_config(self, cfg: Any) -> None:
        """The ``grpo`` section against the rest of the config: a reference it can have, rows it can
        train, completions that fit the model's positions, reward names that exist."""
        grpo = cfg.grpo
        require(
            grpo.beta == 0 or cfg.lora.rank > 0,
            "grpo.beta",
            grpo.beta,
            "must be 0 without LoRA adapters (the KL reference is the model with its adapters switched off): "
            "set lora.rank >= 1 or grpo.beta=0",
        )
        require(
            not cfg.bucketing.packing,
            "bucketing.packing",
            cfg.bucketing.packing,
            "must be false under train.objective=grpo: each prompt + completion is a row of its own",
        )
        if grpo.generation_batch_size is not None:
            micro = cfg.train.batch_size * grpo.num_generations
            require(
                grpo.generation_batch_size % micro == 0,
                "grpo.generation_batch_size",
                grpo.generation_batch_size,
                f"must be a multiple of train.batch_size={cfg.train.batch_size} x grpo.num_generations="
                f"{grpo.num_generations} = {micro} (a micro-step's completions): e.g. {micro * 2}",
            )
        longest = cfg.data.max_length + grpo.max_completion_length
        positions = cfg.model.max_position_embeddings
        if longest > positions and cfg.model.pretrained_path is None:  # a checkpoint's positions are its own
            raise ConfigError(
                f"grpo.max_completion_length={grpo.max_completion_length} + data.max_length={cfg.data.max_length} "
                f"(the longest prompt) = {longest} > model.max_position_embeddings={positions}: a prompt and its "
                "completion are one sequence; lower one of them or raise model.max_position_embeddings"
            )
        for key in ("reward_funcs", "eval_reward_funcs"):  # a misspelt built-in, found with the config
            for spec in getattr(grpo, key) or ():
                name = spec.strip()
                if ":" not in name and name not in BUILTIN_REWARD_NAMES:
                    close = difflib.get_close_matches(name, BUILTIN_REWARD_NAMES, n=1, cutoff=0.6)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise ConfigError(
                        f"grpo.{key}: {name!r} is not a reward function{hint}; the built-ins are "
                        f"{', '.join(BUILTIN_REWARD_NAMES)}, or give 'module:function' (a function importable "
                        "from Python's path, with TRL's signature fn(prompts, completions, **columns))"
                    )

    def examples(self, cfg: Any, tokenizer: Any, cache_dir: Any) -> Any:
        from workbench.data import prompts

        return prompts.build_prompts(cfg, tokenizer, cache_dir)

    def memory(self, cfg: Any) -> Any:
        from workbench.analysis.rollout_memory import RolloutPlan

        grpo = cfg.grpo
        return RolloutPlan(
            grpo.num_generations,
            grpo.max_completion_length,
            grpo.num_iterations,
            steps_per_generation=steps_per_generation(cfg),
            old_logps=keeps_old_logps(cfg),
        )

    def start(self, trainer: Any, *, teacher: Any = None) -> Any:
        if teacher is not None:
            raise ValueError(
                "train.objective='grpo' takes no teacher: distillation and GRPO are separate runs"
            )
        from workbench.rl.rewards import check_reward_specs
        from workbench.rl.wiring import GRPORun

        # 'module:function' rewards imported now: a typo stops the run before data and the model load
        check_reward_specs(trainer.cfg.grpo, given=trainer.rewards)
        return GRPORun()


register_objective(GRPO())
