"""TorchTPU (google-pytorch/torch_tpu): PyTorch on TPUs without torch_xla. TPU-only, and small.

TorchTPU is the successor torch_xla's README names: the device is ``tpu`` (PyTorch's PrivateUse1
backend renamed), eager by default, graphs through ``torch.compile(backend="tpu")``, one process per
device joined by a ``tpu`` process group, DTensor meshes for data parallelism and FSDP2. It has no
GSPMD: the workbench's ``mesh.model`` (tensor parallelism by sharding annotations) stays torch_xla's.

What this room holds:

- `detect`: whether the ``torch_tpu`` module on the path is Google's TorchTPU, read from the
  metadata of the distribution that installs it (another vendor's package installs a ``torch_tpu``
  module too), and its pins (torch 2.11-2.15, libtpu >= 0.0.50).
- `plan`: what a run on TorchTPU uses: the device type, the process-group backend, the
  ``torch.compile`` backend, and the mesh settings it refuses.

The workbench routes a run here (`workbench.backend.routing`) when TorchTPU is installed, torch_xla
is not, and the host shows a TPU; torch_xla stays the TPU default whenever it is installed alone, and
both together are refused (their torch and libtpu pins exclude each other). None of this has run on a
TPU: the tests check the routing with stand-in packages (tests/test_torchtpu.py); what needs a chip is
marked ``tpu`` there and skipped by default.
"""
