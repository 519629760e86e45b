"""Notebook UI on top of the headless `workbench` package: ipywidgets panels and plotly dashboards.

- `ConfigPanel` (widgets.config_panel): tune a `WorkbenchConfig` with live memory and bucketing previews.
- `Dashboard` (widgets.dashboard): a trainer callback that plots throughput, MFU, step time, loss,
  compiles and memory live, and exports a self-contained HTML report.
- `mesh_view` (widgets.mesh_view): the sharding map of a model on a device mesh.
"""

from __future__ import annotations

from widgets.config_panel import ConfigPanel
from widgets.dashboard import Dashboard

# Imported last and by name: the function `mesh_view` replaces the submodule of the same name
# as the package attribute, so `from widgets import mesh_view` always gives the function.
from widgets.mesh_view import mesh_view

__all__ = ["ConfigPanel", "Dashboard", "mesh_view"]
