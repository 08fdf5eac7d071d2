"""Is a kernel right? Compare it with a float64 reference on fresh random inputs.

The error metric is the *relative* error: the largest absolute difference divided
by the largest absolute value of the reference. It means the same thing for a
matmul of size 64 and of size 8192, and for fp16 and fp32, which an absolute
tolerance does not.
"""
from __future__ import annotations

import torch

from . import runtime
from .reference import naive_attention

#: Relative-error tolerance per input dtype. float32 on a GPU allows for TF32, tl.dot's default,
#: which the course's teaching kernels and learners' kernels use (flashlib's attention kernels
#: follow torch's float32 matmul precision: full float32 unless TF32 is allowed).
_TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 3e-2, torch.float32: 1e-5, torch.float64: 1e-10}
_TF32_TOLERANCE = 5e-3


def tolerance(dtype: torch.dtype, interpreter: bool | None = None) -> float:
    """Relative-error tolerance for results computed from ``dtype`` inputs, on a GPU or in the
    interpreter (``interpreter``; default: where this process runs)."""
    interpreter = runtime.INTERPRET if interpreter is None else interpreter
    if dtype == torch.float32 and not interpreter:
        return _TF32_TOLERANCE
    return _TOLERANCE[dtype]


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|, in float64; inf if out has NaN/inf or a wrong shape."""
    if tuple(out.shape) != tuple(ref.shape):
        return float("inf")
    out64, ref64 = out.detach().double().cpu(), ref.detach().double().cpu()
    if not torch.isfinite(out64).all():
        return float("inf")
    scale = ref64.abs().max().clamp_min(torch.finfo(torch.float64).tiny)
    return ((out64 - ref64).abs().max() / scale).item()


#: Below this relative error, float32 results differ from float64 by rounding alone.
ROUNDING_ERROR = 1e-6


def relative_error_text(out: torch.Tensor, ref: torch.Tensor) -> str:
    """:func:`relative_error` as a notebook prints it: two digits where the error says something, and
    ``"< 1e-06"`` where it is float32 rounding alone (:data:`ROUNDING_ERROR`). The digits of a rounding error
    depend on the CPU (its BLAS kernels sum in another order), so a notebook that printed them would compare
    equal on one machine and differ on the next."""
    err = relative_error(out, ref)
    return f"{err:.1e}" if err >= ROUNDING_ERROR else f"< {ROUNDING_ERROR:.0e}"


def max_abs_diff(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| in float64 (inf for NaN or a wrong shape)."""
    if tuple(out.shape) != tuple(ref.shape):
        return float("inf")
    diff = (out.detach().double().cpu() - ref.detach().double().cpu()).abs()
    return float("inf") if not torch.isfinite(diff).all() else diff.max().item()


def validate_matmul(fn, m: int, n: int, k: int, dtype: torch.dtype = torch.float16,
                    seed: int | None = None, rtol: float | None = None):
    """Run ``fn(a, b)`` on fresh random (m, k) @ (k, n) inputs; return (is_valid, max_diff).

    ``is_valid`` means relative error within the dtype's tolerance (or ``rtol``);
    ``max_diff`` is the largest absolute difference from the float64 product.
    """
    gen = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    a = torch.randn(m, k, generator=gen, dtype=torch.float64)
    b = torch.randn(k, n, generator=gen, dtype=torch.float64)
    a_in, b_in = a.to(runtime.DEVICE, dtype), b.to(runtime.DEVICE, dtype)
    ref = a_in.double().cpu() @ b_in.double().cpu()  # reference on the rounded inputs
    out = fn(a_in, b_in)
    limit = tolerance(dtype) if rtol is None else rtol
    return relative_error(out, ref) <= limit, max_abs_diff(out, ref)


def validate_attention(fn, batch: int, heads: int, seq_len: int, head_dim: int,
                       dtype: torch.dtype = torch.float16, causal: bool = False,
                       seed: int | None = None, rtol: float | None = None):
    """Run ``fn(q, k, v)`` (or ``fn(q, k, v, causal=True)``) on fresh (B, H, N, D) inputs.

    Returns (is_valid, max_diff) against :func:`flashlib.reference.naive_attention`
    in float64.
    """
    gen = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    shape = (batch, heads, seq_len, head_dim)
    q, k, v = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(3))
    q_in, k_in, v_in = (t.to(runtime.DEVICE, dtype) for t in (q, k, v))
    ref = naive_attention(*(t.double().cpu() for t in (q_in, k_in, v_in)), causal=causal)
    out = fn(q_in, k_in, v_in, causal=True) if causal else fn(q_in, k_in, v_in)
    limit = tolerance(dtype) if rtol is None else rtol
    return relative_error(out, ref) <= limit, max_abs_diff(out, ref)
