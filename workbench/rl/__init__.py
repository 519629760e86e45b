"""Reinforcement learning with verifiable rewards (GRPO, ``train.objective: grpo``).

The RL room (the GRPO objective, `workbench.objectives.grpo`, runs it; its ``grpo`` config section is
`workbench.config_grpo`): the trainer's side of a GRPO run (`workbench.rl.wiring.GRPORun`), the GRPO loss
(`workbench.rl.loss`), rewards turned into group-relative advantages (`workbench.rl.advantages`),
reward functions, and the rollouts that sample completions on the device with the live policy.
Importing this package imports nothing heavy: each module is imported where it is used.
"""
