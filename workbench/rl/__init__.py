"""Reinforcement learning with verifiable rewards (GRPO, ``train.objective: grpo``).

The RL room: the ``grpo`` config section (`workbench.rl.settings`), the GRPO loss and its objective
(`workbench.rl.loss`), rewards turned into group-relative advantages (`workbench.rl.advantages`),
reward functions, and the rollouts that sample completions on the device with the live policy.
Importing this package imports nothing heavy: each module is imported where it is used.
"""
