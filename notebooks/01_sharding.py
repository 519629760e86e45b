# %% [markdown]
# # Sharding a model over a device mesh
#
# Name the mesh axes (`data × fsdp × model`), see where every parameter goes before anything runs,
# shard a real model with SPMD and train it a few steps. Without a TPU this runs on 8 virtual
# XLA:CPU devices.

# %% shared="install"

# %% tags=["parameters"]
cpu_xla_devices = 8  # no TPU/GPU: virtual XLA:CPU devices to build the mesh on
data = 2
fsdp = 2
model_parallel = 2
target = "v5e-8"  # the chip slice to price the step's communication on and rank meshes for
hidden_size = 64
num_layers = 2
steps = 6
max_examples = None  # cap the corpus (None: all of it)
max_buckets = 4

# %% shared="doctor"

# %% shared="xla_on_cpu"

# %%
from workbench import WorkbenchConfig, detect
from workbench.parallel import MeshSpec
from workbench.parallel.mesh import mesh_preset

hw = detect("xla") if presence.xla_installed() else detect()
requested = MeshSpec(data=data, fsdp=fsdp, model=model_parallel)
# The requested mesh when it matches the devices; otherwise the preset for this hardware. None
# without torch_xla driving the devices: only XLA's SPMD applies a mesh.
matches = hw.via_xla and requested.num_devices == hw.num_devices
spec = mesh_preset(hw, requested if matches else None)
print(hw.device_kind, hw.num_devices, "device(s); mesh:", spec)

# %% [markdown]
# ## The plan, before anything runs
#
# Pure Python, shapes only: it works for any mesh size, even one this machine does not have.

# %%
from workbench.models import build_model
from workbench.parallel import plan_sharding, rules_for

cfg = WorkbenchConfig().with_overrides({"model.hidden_size": hidden_size, "model.num_layers": num_layers})
model = build_model(cfg.model)
params = [(name, tuple(p.shape), p.dtype) for name, p in model.named_parameters()]
plan = plan_sharding(params, requested.axis_sizes, rules_for(model))
print(plan.table())

# %%
from widgets import mesh_view

mesh_view(plan)

# %% [markdown]
# ## What a step sends, and which mesh to pick
#
# The collectives of one training step on this mesh, predicted from shapes (bytes each device sends
# per mesh axis, and their time on the target's interconnect against the step's compute), beside
# the target's mesh plan: every `data × fsdp × model` shape ranked by estimated step time, and why
# the first wins.

# %%
from workbench.analysis.comm_model import predict_communication
from workbench.analysis.mesh_plan import plan_mesh

batch = 2 * requested.dp_size  # as the run below: two sequences per data-parallel shard
seq_len = cfg.data.max_length
communication = predict_communication(cfg.model, requested.axis_sizes, batch_size=batch, seq_len=seq_len)
mesh_plan = plan_mesh(cfg.model, target, seq_len, batch)
print(mesh_plan.reason)
mesh_view(plan, communication=communication, plan=mesh_plan)

# %% [markdown]
# ## Shard the real model with SPMD and train a few steps

# %%
from workbench.train import Trainer

if spec is not None:
    run_cfg = cfg.with_overrides(
        {
            "mesh.enabled": True,
            "mesh.data": spec.data,
            "mesh.fsdp": spec.fsdp,
            "mesh.model": spec.model,
            "train.device_type": hw.device_string,  # "xla": a mesh exists only under XLA
            "train.steps": steps,
            "train.log_every": max(1, steps // 2),
            "train.batch_size": 2 * spec.dp_size,  # two sequences per data-parallel shard
            "train.progress_bar": False,
            "data.max_examples": max_examples,
            "bucketing.max_buckets": max_buckets,
        }
    )
    trainer = Trainer(run_cfg, hardware=hw)
    print(trainer.sharding_report.table(max_rows=12))
    result = trainer.fit()
    print(f"loss {result.final_loss:.4f}; compiles after warm-up: {result.compiles_after_warmup}")
else:
    print("one device: nothing to shard; the plan above shows what a mesh would do")

# %%
if spec is not None:
    display(mesh_view(trainer.sharding_report))
    assert trainer.sharding_report.bytes_per_device <= trainer.sharding_report.total_bytes
