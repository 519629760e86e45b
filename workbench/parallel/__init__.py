"""SPMD parallelism as data: the mesh (`mesh`), sharding rules per family (`rules`), a plan over a
model's parameters (`plan`, pure Python) and applying it with torch_xla (`apply`)."""

from workbench.parallel.apply import batch_sharding, shard_batch, shard_model
from workbench.parallel.mesh import MeshError, MeshSpec, mesh_from_config
from workbench.parallel.plan import plan_sharding
from workbench.parallel.rules import rules_for
from workbench.parallel.sharding_report import ShardingReport
from workbench.parallel.sharding_rule import ShardingError

__all__ = [
    "MeshError",
    "MeshSpec",
    "ShardingError",
    "ShardingReport",
    "batch_sharding",
    "mesh_from_config",
    "plan_sharding",
    "rules_for",
    "shard_batch",
    "shard_model",
]
