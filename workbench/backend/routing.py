"""Which execution backend a run uses, and the rule that picked it.

Four ways to run, decided from what is installed and what the host shows (`MachineFacts`; reading
them starts nothing and imports neither torch_xla nor TorchTPU):

- **torch_xla SPMD**: one process drives every device of the host through the XLA runtime; on a TPU
  whenever torch_xla is installed (it stays the TPU default while Colab's and Kaggle's images ship it),
  and on the CPU's virtual devices when ``PJRT_DEVICE=CPU`` asks for them.
- **TorchTPU**: the ``tpu`` device of plain torch (`workbench.backend.torchtpu`), one process per
  chip under torchrun, when TorchTPU is installed, torch_xla is not, and the host shows a TPU.
- **native CUDA**, **native CPU**: plain torch, one process per device under torchrun.

torch_xla and TorchTPU installed together is refused (`BackendConflictError`) for any run that would
touch a TPU or torch_xla: their pins exclude each other (torch_xla 2.9 needs torch 2.9 and libtpu
0.0.21, torch-tpu 0.2.0 torch 2.11-2.15 and libtpu >= 0.0.50), so one of the two is broken in that
environment, and both would drive the same chips.

`choose` is pure over `MachineFacts`, so every rule is tested without the hardware;
`workbench.backend.hardware.detect` follows it and ``python -m workbench info`` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from workbench.backend.torchtpu import plan as torchtpu_plan
from workbench.backend.torchtpu.detect import DISTRIBUTION, TorchTPUFinding

ExecutionBackend = Literal["torch_xla", "torchtpu", "native-cuda", "native-cpu"]

LABELS: dict[str, str] = {
    "torch_xla": "torch_xla SPMD",
    "torchtpu": "TorchTPU",
    "native-cuda": "native CUDA",
    "native-cpu": "native CPU",
}
"""How `info` and the docs name each execution backend."""


class BackendConflictError(RuntimeError):
    """torch_xla and TorchTPU in one environment for a run that needs either; the message says what to uninstall."""


@dataclass(frozen=True)
class MachineFacts:
    """What routing reads: packages present and the host's signs (`hardware.machine_facts` gathers them)."""

    xla_installed: bool
    torch_tpu: TorchTPUFinding | None
    """The ``torch_tpu`` module on the path and who installed it; None when there is none."""
    tpu_present: bool
    cuda_available: bool
    pjrt_device: str | None
    """``PJRT_DEVICE``, upper-cased; None when unset."""

    @property
    def torchtpu_installed(self) -> bool:
        """Google's TorchTPU (not merely a module named ``torch_tpu``)."""
        return self.torch_tpu is not None and self.torch_tpu.is_torchtpu

    def notices(self) -> tuple[str, ...]:
        """What routing leaves alone and why: a ``torch_tpu`` module that is not TorchTPU."""
        if self.torch_tpu is None or self.torch_tpu.is_torchtpu:
            return ()
        notice = self.torch_tpu.notice()
        return (notice,) if notice else ()


@dataclass(frozen=True)
class Route:
    """The execution backend of a run and why."""

    backend: ExecutionBackend
    device_type: Literal["tpu", "cuda", "xla", "cpu"]
    """The ``train.device_type`` this comes to (``xla`` for torch_xla on the CPU's devices)."""
    rule: str
    """The rule that picked it, in words."""
    notices: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return LABELS[self.backend]

    def describe(self) -> str:
        """``native CPU: no TPU, CUDA device or PJRT_DEVICE=CPU here``: the line `info` prints."""
        return f"{self.label}: {self.rule}"


def conflict_message(facts: MachineFacts) -> str:
    """What to uninstall when torch_xla and TorchTPU share the environment."""
    version = facts.torch_tpu.version if facts.torch_tpu is not None else None
    tpu = f"{DISTRIBUTION} {version}" if version else DISTRIBUTION
    return (
        f"torch_xla and TorchTPU ({tpu}) are both installed: they cannot share an environment (torch_xla 2.9 "
        "needs torch 2.9 and libtpu 0.0.21, torch-tpu torch 2.11-2.15 and libtpu >= 0.0.50, and both drive "
        f"the TPU chips): `pip uninstall -y {DISTRIBUTION}` to run on torch_xla, or `pip uninstall -y torch_xla` "
        "to run on TorchTPU, then restart Python"
    )


def tpu_runtime(facts: MachineFacts) -> Literal["torch_xla", "torchtpu"] | None:
    """Which runtime drives a TPU: torch_xla whenever it is installed alone, TorchTPU when it is installed
    and torch_xla is not, None when neither is; `BackendConflictError` when both are."""
    if facts.xla_installed and facts.torchtpu_installed:
        raise BackendConflictError(conflict_message(facts))
    if facts.xla_installed:
        return "torch_xla"
    if facts.torchtpu_installed:
        return "torchtpu"
    return None


def choose(device_type: str, facts: MachineFacts) -> Route:
    """The route ``train.device_type=device_type`` takes on a machine with `facts` (the first that
    applies for ``auto``: a TPU, CUDA, XLA on the CPU, the CPU). Does not check that an explicit
    device is really there: `hardware.detect` does, and says what was found."""
    notices = facts.notices()
    tpu_signs = facts.tpu_present and facts.pjrt_device in (None, "TPU")
    if device_type == "tpu" or (device_type == "auto" and tpu_signs and tpu_runtime(facts) is not None):
        runtime = tpu_runtime(facts)
        if runtime == "torchtpu":
            rule = (
                f"{facts.torch_tpu.describe() if facts.torch_tpu else DISTRIBUTION} is installed and torch_xla "
                "is not; one process per chip on the tpu device, process group 'tpu'"
            )
            return Route("torchtpu", "tpu", rule, notices)
        rule = "torch_xla is installed and this host shows a TPU; torch_xla stays the TPU default"
        return Route("torch_xla", "tpu", rule, notices)
    asked = f"train.device_type={device_type}" if device_type != "auto" else ""
    if device_type == "cuda" or (device_type == "auto" and facts.cuda_available):
        rule = f"{asked or 'torch sees a CUDA device'}; one process per GPU"
        return Route("native-cuda", "cuda", rule, notices)
    if device_type == "xla" or (device_type == "auto" and facts.xla_installed and facts.pjrt_device == "CPU"):
        if facts.xla_installed and facts.torchtpu_installed:
            raise BackendConflictError(conflict_message(facts))
        where = "" if asked else " on the CPU"
        rule = f"{asked or 'PJRT_DEVICE=CPU'}; one process drives torch_xla's devices{where}"
        return Route("torch_xla", "xla", rule, notices)
    if device_type == "cpu":
        return Route("native-cpu", "cpu", asked, notices)
    return Route("native-cpu", "cpu", "no TPU, CUDA device or PJRT_DEVICE=CPU here", notices)


def execution_backend(hw: Any) -> ExecutionBackend:
    """The execution backend a detected `HardwareInfo` runs on."""
    if hw.via_xla:
        return "torch_xla"
    if hw.backend == "tpu":
        return "torchtpu"
    return "native-cuda" if hw.backend == "cuda" else "native-cpu"


def compile_backend(hw: Any) -> str | None:
    """The ``torch.compile`` backend for the native step on `hw`: ``"tpu"`` on TorchTPU, ``"inductor"`` on
    CUDA and the CPU; None under torch_xla, which compiles its own programs (no Dynamo)."""
    backend = execution_backend(hw)
    if backend == "torch_xla":
        return None
    return torchtpu_plan.COMPILE_BACKEND if backend == "torchtpu" else "inductor"


def describe_run(hw: Any, route: Route) -> str:
    """What `info` prints: the backend `hw` runs on and the rule, or that ``auto`` fell back from the route."""
    actual = execution_backend(hw)
    if actual == route.backend:
        return route.describe()
    return f"{LABELS[actual]}: {route.label} came first ({route.rule}) but did not start; see notices"
