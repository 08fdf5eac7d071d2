"""FlashAttention forward, the teaching version: notebook 04 reads it line by line.

The same algorithm as :mod:`flashlib.kernels.attention_fwd` (FlashAttention-2 loop
order: one program per block of query rows, a loop over blocks of keys), with
everything that is not the algorithm left out: no causal or other mask (only the
tails, where N is not a multiple of a block), no GQA, natural ``exp`` with the
scale applied to the scores, no early exit. The finished kernel adds those.

The signature is fixed, because :func:`launch_simple_forward` launches *any*
kernel that has it (the notebook's exercise, the check, the tests)::

    kernel[grid](Q, K, V, O, L, sm_scale,
                 stride_qh, stride_qn, stride_kh, stride_kn,
                 stride_vh, stride_vn, stride_oh, stride_on,
                 N_Q, N_K,
                 HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    grid = (cdiv(N_Q, BLOCK_M), B * H)

* ``Q``, ``O``: (B*H, N_Q, D); ``K``, ``V``: (B*H, N_K, D), read through the two
  strides given (head, row); the last dimension is contiguous (stride 1).
* ``L``: (B*H, N_Q) float32, contiguous: the row logsumexp of the scaled scores,
  natural log, ``L = m + log(l)``.
* ``sm_scale``: the softmax scale (1/sqrt(D) by default).
* ``HEAD_DIM``, ``BLOCK_M``, ``BLOCK_N``: powers of two, at least 16 (``tl.dot``).

Offsets are 32-bit: tensors of more than 2**31 elements are refused by the launcher
(the library kernel uses 64-bit base offsets).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime
from ..spec import softmax_scale_for

MAX_ELEMENTS = 2**31 - 1


@triton.jit
def flash_forward_kernel(
    Q, K, V, O, L, sm_scale,
    stride_qh, stride_qn, stride_kh, stride_kn,
    stride_vh, stride_vn, stride_oh, stride_on,
    N_Q, N_K,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """O and L for query block ``program_id(0)`` of (batch * head) ``program_id(1)``."""
    # Which block of query rows is mine, and of which (batch, head)?
    start_m = tl.program_id(0)
    off_h = tl.program_id(1)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # my query rows
    offs_n = tl.arange(0, BLOCK_N)                       # key rows of the first key block
    offs_d = tl.arange(0, HEAD_DIM)

    # Load my block of Q once: it stays in registers for the whole loop.
    q_ptrs = Q + off_h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :]
    q = tl.load(q_ptrs, mask=offs_m[:, None] < N_Q, other=0.0)
    # K is read as K^T tiles (HEAD_DIM, BLOCK_N), V as (BLOCK_N, HEAD_DIM) tiles.
    k_ptrs = K + off_h * stride_kh + offs_n[None, :] * stride_kn + offs_d[:, None]
    v_ptrs = V + off_h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :]

    # The running state of the online softmax, one entry per query row, in float32.
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)                # running sum of exp(s - m)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)      # running sum of exp(s - m) v

    for start_n in range(0, N_K, BLOCK_N):
        # One key block: scores, online-softmax update, accumulate P V.
        cols = start_n + offs_n
        k = tl.load(k_ptrs + start_n * stride_kn, mask=cols[None, :] < N_K, other=0.0)
        v = tl.load(v_ptrs + start_n * stride_vn, mask=cols[:, None] < N_K, other=0.0)
        s = tl.dot(q, k) * sm_scale                        # (BLOCK_M, BLOCK_N) scores
        s = tl.where(cols[None, :] < N_K, s, float("-inf"))  # keys past N_K do not exist
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)                        # rescale of the old state, <= 1
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    # Normalise once, and keep the logsumexp for the backward pass.
    out = acc / l_i[:, None]
    lse = m_i + tl.log(l_i)

    o_ptrs = O + off_h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :]
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=offs_m[:, None] < N_Q)
    tl.store(L + off_h * N_Q + offs_m, lse, mask=offs_m < N_Q)


def _is_power_of_two_at_least_16(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 16 and value & (value - 1) == 0


def check_simple_arguments(q, k, v, block_m, block_n) -> None:
    """ValueError/TypeError naming the argument, what was expected and what came in."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"Expected 4D tensors (B, H, N, D): {name} is a {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"Expected 4D tensors (B, H, N, D): {name}.shape={tuple(t.shape)}")
    shapes = f"q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)}"
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"Q, K, V shapes must match (same B, H and D; k and v identical; "
                         f"no GQA in the teaching kernel); got {shapes}")
    if q.dtype != k.dtype or q.dtype != v.dtype or q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"q, k, v must share one dtype among float16, bfloat16, float32; got "
                        f"{q.dtype}, {k.dtype}, {v.dtype}")
    if not _is_power_of_two_at_least_16(q.shape[3]):
        raise ValueError(f"Unsupported head_dim {q.shape[3]}: the teaching kernel needs a power of "
                         "two >= 16 (flash_attention pads other sizes)")
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if not _is_power_of_two_at_least_16(value):
            raise ValueError(f"Block sizes must be positive powers of two >= 16 (tl.dot): "
                             f"{name}={value!r}")
    if q.shape[2] == 0 or k.shape[2] == 0:
        raise ValueError(f"the teaching kernel needs at least one query and one key; got {shapes}")
    if max(q.numel(), k.numel()) > MAX_ELEMENTS:
        raise ValueError(f"tensors of more than 2**31 elements need 64-bit offsets: use "
                         f"flash_attention; got {shapes}")


def rows_view(t: torch.Tensor) -> torch.Tensor | None:
    """The (B*H, N, D) view of a (B, H, N, D) tensor, or None if its strides do not allow one."""
    if t.stride(-1) != 1:
        return None
    try:
        return t.view(-1, t.shape[2], t.shape[3])
    except RuntimeError:  # B and H cannot be merged without a copy
        return None


def launch_simple_forward(kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          block_m: int, block_n: int, *, softmax_scale: float | None = None,
                          out: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Launch ``kernel`` (any kernel with :func:`flash_forward_kernel`'s signature); return (O, L).

    q: (B, H, N_q, D); k, v: (B, H, N_k, D), any strides. O: (B, H, N_q, D) in q's
    dtype; L: (B, H, N_q) float32 logsumexp. ``out=(o, lse)`` writes into given
    tensors of those shapes (the check passes NaN-filled ones, to see every
    element written). In the interpreter bfloat16 is computed in float32
    (``tl.dot`` would multiply bfloat16 bit patterns there).
    """
    check_simple_arguments(q, k, v, block_m, block_n)
    batch, heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    if out is None:
        out = (torch.empty_like(q, memory_format=torch.contiguous_format),
               torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device))
    o, lse = out
    if tuple(o.shape) != tuple(q.shape) or o.dtype != q.dtype:
        raise ValueError(f"out[0] must be like q: {tuple(q.shape)} {q.dtype}; got {tuple(o.shape)} {o.dtype}")
    if tuple(lse.shape) != (batch, heads, n_q) or lse.dtype != torch.float32 or not lse.is_contiguous():
        raise ValueError(f"out[1] must be a contiguous float32 tensor of shape {(batch, heads, n_q)}; "
                         f"got {tuple(lse.shape)} {lse.dtype}")
    if q.numel() == 0:  # no (batch, head): nothing to compute
        return o, lse
    q_run, k_run, v_run = runtime.upcast_for_interpreter(q, k, v)
    q3, k3, v3 = (rows_view(t) if rows_view(t) is not None else rows_view(t.contiguous())
                  for t in (q_run, k_run, v_run))
    o3 = rows_view(o) if o.dtype == q_run.dtype else None
    if o3 is None:  # bfloat16 in the interpreter, or an output whose heads cannot be merged
        o3 = torch.empty_like(q_run, memory_format=torch.contiguous_format).view(-1, n_q, head_dim)
    sm_scale = softmax_scale_for(head_dim, softmax_scale)
    grid = (triton.cdiv(n_q, block_m), batch * heads)
    kernel[grid](q3, k3, v3, o3, lse, sm_scale,
                 q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
                 v3.stride(0), v3.stride(1), o3.stride(0), o3.stride(1),
                 n_q, n_k, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n)
    if o3.data_ptr() != o.data_ptr():
        o.copy_(o3.view(o.shape))
    return o, lse


def simple_flash_attention(q, k, v, *, block_m: int = 32, block_n: int = 32,
                           softmax_scale: float | None = None):
    """O, L of the teaching kernel on (B, H, N, D) tensors: no mask, no GQA."""
    return launch_simple_forward(flash_forward_kernel, q, k, v, block_m, block_n,
                                 softmax_scale=softmax_scale)
