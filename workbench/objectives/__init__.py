"""The objectives a run trains, each one implementation of `workbench.objective_registry.Objective`.

Importing this package registers them (``import workbench`` does): `sft` (next-token cross-entropy;
distillation when the trainer is given a teacher, `workbench.objectives.distillation`), `dpo`
(preference pairs: DPO, IPO, SimPO, ORPO, `workbench.objectives.dpo`) and `grpo` (rewards on sampled
completions, `workbench.rl`). Each module here is light: what an objective runs is imported when a
run starts (`Objective.start`), so the config and the estimate can ask an objective without torch.
This layer sits above the training loop: `workbench.train` never imports it.
"""

# isort: off
# registered in this order, the order train.objective's allowed values are listed in
from workbench.objectives.sft import NextToken
from workbench.objectives.preference import Preference
from workbench.objectives.grpo import GRPO
# isort: on

__all__ = ["GRPO", "NextToken", "Preference"]
