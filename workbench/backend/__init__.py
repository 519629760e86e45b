"""What the run executes on: the torch_xla seam (`runtime`), hardware detection (`hardware`), which
execution backend a run takes and why (`routing`), TorchTPU (`torchtpu`, TPU-only), the machines a
config can be planned for (`targets`) and multi-host processes (`multihost`).

The bottom layer: it uses only `workbench.units` and `workbench.config` of the rest of the
workbench, and `runtime` is the one module that imports torch_xla (with `tpu_attention` beside it,
the TPU-only call into torch_xla's Pallas attention kernels).
"""
