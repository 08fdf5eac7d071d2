"""What the GPU can do, so that kernels and notebooks can adapt to it.

``detect_gpu()`` answers with a :class:`GPUInfo`: on a CUDA device its name,
compute capability, architecture family and the features that matter for
attention kernels (bfloat16, FP8, TMA); without one, a description of the
interpreter mode so that callers never need a special case.
"""
from __future__ import annotations

import dataclasses
import platform

import torch

from . import runtime

# Compute capability (major, minor) → architecture family, newest first.
_FAMILIES = [
    ((12, 0), "Blackwell"),  # consumer Blackwell (RTX 50xx)
    ((10, 0), "Blackwell"),  # B100/B200
    ((9, 0), "Hopper"),
    ((8, 9), "Ada"),
    ((8, 0), "Ampere"),
    ((7, 5), "Turing"),
    ((7, 0), "Volta"),
]


def architecture_family(capability: tuple[int, int]) -> str:
    """Name the architecture family of a compute capability, e.g. (9, 0) → 'Hopper'."""
    for floor, family in _FAMILIES:
        if tuple(capability) >= floor:
            return family
    return "pre-Volta (unsupported by Triton)"


@dataclasses.dataclass(frozen=True)
class GPUInfo:
    """Capabilities of the device that flashlib runs on."""

    is_gpu: bool
    name: str
    mode: str  # "cuda" or "interpreter"
    compute_capability: tuple[int, int] | None = None
    architecture: str = "CPU"
    sm_count: int = 0
    memory_gb: float = 0.0
    supports_bf16: bool = False
    supports_fp8: bool = False
    supports_tma: bool = False
    supports_wgmma: bool = False
    torch_version: str = torch.__version__
    triton_version: str = ""
    cuda_version: str | None = None

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _triton_version() -> str:
    import triton

    return triton.__version__


def detect_gpu(index: int | None = None) -> GPUInfo:
    """Describe the CUDA device ``index`` (default: current), or the interpreter."""
    if runtime.INTERPRET or not torch.cuda.is_available():
        return GPUInfo(
            is_gpu=False,
            name=f"CPU ({platform.processor() or platform.machine()}), Triton interpreter",
            mode="interpreter",
            triton_version=_triton_version(),
        )
    index = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(index)
    capability = (props.major, props.minor)
    return GPUInfo(
        is_gpu=True,
        name=props.name,
        mode="cuda",
        compute_capability=capability,
        architecture=architecture_family(capability),
        sm_count=props.multi_processor_count,
        memory_gb=round(props.total_memory / 2**30, 1),
        supports_bf16=capability >= (8, 0),
        supports_fp8=capability >= (8, 9),
        supports_tma=capability >= (9, 0),
        supports_wgmma=capability[0] == 9,
        triton_version=_triton_version(),
        cuda_version=torch.version.cuda,
    )


def print_gpu_info(info: GPUInfo | None = None) -> None:
    """Print the capabilities as a short aligned table."""
    info = info or detect_gpu()
    yes = {True: "yes", False: "no"}
    rows = [("device", info.name), ("mode", runtime.mode_description())]
    if info.is_gpu:
        major, minor = info.compute_capability
        rows += [
            ("compute capability", f"{major}.{minor} ({info.architecture})"),
            ("SMs", str(info.sm_count)),
            ("memory", f"{info.memory_gb} GiB"),
            ("bfloat16", yes[info.supports_bf16]),
            ("FP8", yes[info.supports_fp8]),
            ("TMA (tensor memory accelerator)", yes[info.supports_tma]),
            ("wgmma (Hopper warpgroup MMA)", yes[info.supports_wgmma]),
            ("CUDA", str(info.cuda_version)),
        ]
    rows += [("torch", info.torch_version), ("triton", info.triton_version)]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    print_gpu_info()
