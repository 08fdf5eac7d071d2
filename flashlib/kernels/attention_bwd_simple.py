"""FlashAttention backward, the teaching version: the dK/dV kernel notebook 05 reads line by line.

The backward of ``O = softmax(Q K^T * scale) V``, for one (batch, head), given the
upstream gradient dO and the row logsumexp L that the forward saved::

    P  = exp(S - L)            S = Q K^T * scale, recomputed tile by tile (never stored)
    dV = P^T dO
    dP = dO V^T
    dS = P * (dP - D)          D = rowsum(dO * O), one float per query row
    dK = dS^T Q * scale
    dQ = dS K * scale          (the library's second kernel; not here)

:func:`flash_dkdv_kernel` computes dK and dV. One program owns one block of
BLOCK_N key rows of one (batch * head) and loops over *all* query blocks: it
recomputes each tile of P from q, k and L, and accumulates its own rows of dV and
dK in float32 registers. No other program writes those rows, so no atomics are
needed. Only the N tails are masked (no causal or other mask, no GQA): the finished
kernels in :mod:`flashlib.kernels.attention_bwd` add those.

:func:`delta_kernel` is the preprocess step: ``D = rowsum(dO * O)`` per query row.

The signature is fixed, because :func:`launch_simple_dkdv` launches *any* kernel that
has it (the notebook's exercise, the check, the tests)::

    kernel[grid](Q, K, V, DO, L, DELTA, DK, DV, sm_scale,
                 stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn,
                 stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
                 N_Q, N_K,
                 HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=block_n)
    grid = (cdiv(N_K, BLOCK_N), B * H)

* ``Q``, ``DO``: (B*H, N_Q, D); ``K``, ``V``, ``DK``, ``DV``: (B*H, N_K, D), through
  the two strides given (head, row); the last dimension is contiguous (stride 1).
* ``L``, ``DELTA``: float32, row ``i`` of head ``h`` at ``h * N_Q + i``: the forward's
  logsumexp (natural log) and D. The launcher passes flat buffers with BLOCK_M NaN
  entries after the last row, so that a load that forgets the query-tail mask stays
  inside the allocation and shows up as NaN.
* ``sm_scale``: the softmax scale of the forward (1/sqrt(D) by default).
* ``HEAD_DIM``, ``BLOCK_M``, ``BLOCK_N``: powers of two, at least 16 (``tl.dot``).

Offsets are 32-bit: tensors of more than 2**31 elements are refused by the launcher.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import runtime
from ..spec import softmax_scale_for
from .attention_fwd_simple import check_simple_arguments, rows_view


@triton.jit
def flash_dkdv_kernel(
    Q, K, V, DO, L, DELTA, DK, DV, sm_scale,
    stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn,
    stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
    N_Q, N_K,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dK and dV for key block ``program_id(0)`` of (batch * head) ``program_id(1)``."""
    # Which block of keys is mine, and of which (batch, head)?
    start_n = tl.program_id(0)
    off_h = tl.program_id(1)
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)  # my key rows
    offs_m = tl.arange(0, BLOCK_M)                       # query rows of the first query block
    offs_d = tl.arange(0, HEAD_DIM)

    # Load my blocks of K and V once, as K^T and V^T tiles (HEAD_DIM, BLOCK_N): they stay
    # in registers for the whole loop. Keys past N_K load as 0; their rows are never stored.
    kT = tl.load(K + off_h * stride_kh + offs_n[None, :] * stride_kn + offs_d[:, None],
                 mask=offs_n[None, :] < N_K, other=0.0)
    vT = tl.load(V + off_h * stride_vh + offs_n[None, :] * stride_vn + offs_d[:, None],
                 mask=offs_n[None, :] < N_K, other=0.0)
    # Pointers to the first query block of Q and dO, and of L and D (one float per query row).
    q_ptrs = Q + off_h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :]
    do_ptrs = DO + off_h * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :]
    l_ptrs = L + off_h * N_Q + offs_m
    delta_ptrs = DELTA + off_h * N_Q + offs_m

    # My rows of dK and dV, summed over every query block, in float32.
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)

    for start_m in range(0, N_Q, BLOCK_M):
        # One query block: recompute its tile of P, then add its share to dV and dK.
        rows = start_m + offs_m
        # Rows past N_Q load as 0: with dO = 0 and D = 0 their dV and dK terms are 0.
        q = tl.load(q_ptrs + start_m * stride_qn, mask=rows[:, None] < N_Q, other=0.0)
        do = tl.load(do_ptrs + start_m * stride_don, mask=rows[:, None] < N_Q, other=0.0)
        lse = tl.load(l_ptrs + start_m, mask=rows < N_Q, other=0.0)
        delta = tl.load(delta_ptrs + start_m, mask=rows < N_Q, other=0.0)

        s = tl.dot(q, kT) * sm_scale                            # S_ij (BLOCK_M, BLOCK_N), as in the forward
        p = tl.exp(s - lse[:, None])                             # P_ij = exp(S_ij - L_i): no max, no sum
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)               # dV_j += P_ij^T dO_i
        dp = tl.dot(do, vT)                                      # dP_ij = dO_i V_j^T
        ds = p * (dp - delta[:, None])                           # dS_ij = P_ij * (dP_ij - D_i)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q) * sm_scale     # dK_j += scale * dS_ij^T Q_i

    # Store my rows of dK and dV, once.
    dk_ptrs = DK + off_h * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :]
    dv_ptrs = DV + off_h * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :]
    tl.store(dk_ptrs, dk.to(DK.dtype.element_ty), mask=offs_n[:, None] < N_K)
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=offs_n[:, None] < N_K)


@triton.jit
def delta_kernel(O, DO, DELTA, stride_oh, stride_on, stride_doh, stride_don, N_Q,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """The preprocess: D_i = sum_d dO_id * O_id for query block ``program_id(0)`` of head ``program_id(1)``."""
    off_h = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    mask = offs_m[:, None] < N_Q
    o = tl.load(O + off_h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :], mask=mask, other=0.0)
    do = tl.load(DO + off_h * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :], mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)
    tl.store(DELTA + off_h * N_Q + offs_m, delta, mask=offs_m < N_Q)


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """The (B*H, N, D) view of a (B, H, N, D) tensor, copying only when its strides do not allow one."""
    rows = rows_view(t)
    return rows if rows is not None else rows_view(t.contiguous())


def _padded_rows(values: torch.Tensor | None, count: int, pad: int, device) -> torch.Tensor:
    """A flat float32 buffer of ``count + pad`` entries: ``values`` (or nothing yet), then NaN."""
    buffer = torch.full((count + pad,), math.nan, dtype=torch.float32, device=device)
    if values is not None:
        buffer[:count].copy_(values.reshape(-1))
    return buffer


def _check_like(name: str, t, shape, dtype=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape {tuple(shape)}; got a {type(t).__name__}")
    if tuple(t.shape) != tuple(shape) or (dtype is not None and t.dtype != dtype):
        want = f"{tuple(shape)}" + (f" {dtype}" if dtype is not None else "")
        raise ValueError(f"{name} must have shape {want}; got {tuple(t.shape)} {t.dtype}")


def launch_simple_dkdv(kernel, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       do: torch.Tensor, lse: torch.Tensor, block_m: int, block_n: int, *,
                       softmax_scale: float | None = None,
                       out: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Launch ``kernel`` (any kernel with :func:`flash_dkdv_kernel`'s signature); return (dK, dV).

    q, o, do: (B, H, N_q, D); k, v: (B, H, N_k, D), one dtype, any strides; lse:
    (B, H, N_q) float32, the forward's logsumexp (``flash_attention(...,
    return_lse=True)`` or ``naive_attention(..., return_lse=True)``). D = rowsum(dO * O)
    is computed first by :func:`delta_kernel`. dK, dV come back like k, in its dtype;
    ``out=(dk, dv)`` writes into given tensors of that shape and dtype (the check passes
    NaN-filled ones, to see every element written). In the interpreter bfloat16 is
    computed in float32 (``tl.dot`` would multiply bfloat16 bit patterns there).
    """
    check_simple_arguments(q, k, v, block_m, block_n)
    batch, heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    _check_like("o", o, q.shape, q.dtype)
    _check_like("do", do, q.shape, q.dtype)
    _check_like("lse", lse, (batch, heads, n_q), torch.float32)
    if out is None:
        out = (torch.empty_like(k, memory_format=torch.contiguous_format),
               torch.empty_like(v, memory_format=torch.contiguous_format))
    dk, dv = out
    _check_like("out[0]", dk, k.shape, k.dtype)
    _check_like("out[1]", dv, v.shape, v.dtype)

    q_run, k_run, v_run, o_run, do_run = runtime.upcast_for_interpreter(q, k, v, o, do)
    q3, k3, v3, o3, do3 = (_as_rows(t) for t in (q_run, k_run, v_run, o_run, do_run))
    rows = batch * heads * n_q
    lse_flat = _padded_rows(lse, rows, block_m, q.device)
    delta = _padded_rows(None, rows, block_m, q.device)
    delta_kernel[(triton.cdiv(n_q, block_m), batch * heads)](
        o3, do3, delta, o3.stride(0), o3.stride(1), do3.stride(0), do3.stride(1), n_q,
        HEAD_DIM=head_dim, BLOCK_M=block_m)

    outputs = []
    for given in (dk, dv):  # write in place when the kernel can, else into a scratch tensor
        view = rows_view(given) if given.dtype == k_run.dtype else None
        outputs.append(view if view is not None else
                       torch.empty_like(k_run, memory_format=torch.contiguous_format).view(-1, n_k, head_dim))
    dk3, dv3 = outputs
    sm_scale = softmax_scale_for(head_dim, softmax_scale)
    grid = (triton.cdiv(n_k, block_n), batch * heads)
    kernel[grid](q3, k3, v3, do3, lse_flat, delta, dk3, dv3, sm_scale,
                 q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1),
                 do3.stride(0), do3.stride(1), dk3.stride(0), dk3.stride(1), dv3.stride(0), dv3.stride(1),
                 n_q, n_k, HEAD_DIM=head_dim, BLOCK_M=block_m, BLOCK_N=block_n)
    for given, computed in ((dk, dk3), (dv, dv3)):
        if computed.data_ptr() != given.data_ptr():
            given.copy_(computed.view(given.shape))
    return dk, dv


def simple_dkdv(q, k, v, o, do, lse, *, block_m: int = 32, block_n: int = 32,
                softmax_scale: float | None = None):
    """dK, dV of the teaching kernel on (B, H, N, D) tensors: no mask, no GQA."""
    return launch_simple_dkdv(flash_dkdv_kernel, q, k, v, o, do, lse, block_m, block_n,
                              softmax_scale=softmax_scale)
