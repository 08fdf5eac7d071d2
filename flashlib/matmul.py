"""``triton_matmul``: the tiled matmul kernel behind a checked Python function."""
from __future__ import annotations

import torch

from . import runtime
from .kernels.matmul import launch_matmul, launch_matmul_autotuned, matmul_kernel

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_block(name: str, value) -> None:
    if value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"Block sizes must be positive integers: {name}={value!r} ({type(value).__name__})")
    if value <= 0:
        raise ValueError(f"Block sizes must be positive: got {name}={value}")
    if value & (value - 1):
        raise ValueError(f"Block sizes must be powers of two (Triton's tl.arange needs it): got {name}={value}")


def check_matmul_args(a, b, block_m=None, block_n=None, block_k=None) -> None:
    """Raise a ValueError/TypeError naming the argument that is wrong."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"Expected 2D tensors: {name} is a {type(t).__name__}, not a torch.Tensor")
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"Expected 2D tensors: got a.shape={tuple(a.shape)} and b.shape={tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"Incompatible dimensions: a is {tuple(a.shape)} (M, K) and b is {tuple(b.shape)} (K, N); "
            f"a.shape[1]={a.shape[1]} must equal b.shape[0]={b.shape[0]}")
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype: got a.dtype={a.dtype}, b.dtype={b.dtype}")
    if a.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"Unsupported dtype {a.dtype}: expected one of float16, bfloat16, float32")
    if a.device != b.device:
        raise ValueError(f"a and b must be on the same device: got a on {a.device}, b on {b.device}")
    if a.device.type != runtime.DEVICE.type:
        raise ValueError(f"Tensors must be on {runtime.DEVICE.type} ({runtime.mode_description()}); got {a.device}")
    explicit = [block_m, block_n, block_k]
    for name, value in zip(("block_m", "block_n", "block_k"), explicit):
        _check_block(name, value)
    if any(v is not None for v in explicit) and any(v is None for v in explicit):
        raise ValueError(f"Give all three block sizes or none: got block_m={block_m}, block_n={block_n}, block_k={block_k}")
    if block_k is not None and block_k < 16:
        raise ValueError(f"block_k must be at least 16 (the smallest tl.dot): got block_k={block_k}")
    if block_m is not None and (block_m < 16 or block_n < 16):
        raise ValueError(f"block_m and block_n must be at least 16 (tl.dot): got block_m={block_m}, block_n={block_n}")


def triton_matmul(a: torch.Tensor, b: torch.Tensor, block_m: int | None = None,
                  block_n: int | None = None, block_k: int | None = None,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B with the tiled Triton kernel (float32 accumulation).

    a: (M, K), b: (K, N), float16/bfloat16/float32, any sizes (tails are masked).
    With no block sizes the GPU kernel is autotuned; give all three to fix them.
    ``out`` (M, N), optional, receives the result. Returns C in a's dtype.
    """
    check_matmul_args(a, b, block_m, block_n, block_k)
    m, n = a.shape[0], b.shape[1]
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    elif out.shape != (m, n) or out.dtype != a.dtype or out.device != a.device:
        raise ValueError(f"out must be ({m}, {n}) {a.dtype} on {a.device}; got {tuple(out.shape)} {out.dtype} on {out.device}")
    a_run, b_run = runtime.upcast_for_interpreter(a, b)
    c_run = out if a_run.dtype == a.dtype else torch.empty((m, n), dtype=a_run.dtype, device=a.device)
    if block_m is None:
        launch_matmul_autotuned(a_run, b_run, c_run)
    else:
        launch_matmul(matmul_kernel, a_run, b_run, c_run, block_m, block_n, block_k)
    if c_run is not out:
        out.copy_(c_run)
    return out
