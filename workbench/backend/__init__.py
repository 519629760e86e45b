"""What the run executes on: the torch_xla seam (`runtime`), hardware detection and multi-host processes.

The bottom layer: nothing here imports the rest of the workbench, and `runtime` is the one
module that imports torch_xla.
"""
