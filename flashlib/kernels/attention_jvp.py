"""Forward-mode derivative of attention (a JVP) in Triton: O's tangent in one pass, from the forward's L.

Forward-mode AD (``torch.func.jvp``, ``torch.autograd.forward_ad``, ``torch.func.jacfwd``) pushes tangents
``(dQ, dK, dV)`` of the inputs to the tangent ``dO`` of the output. With ``P = softmax(S)`` and the
scores' tangent ``dS``, ``dP = P * (dS - c)`` with ``c_i = sum_j P_ij dS_ij``, so

    dO_i = sum_j P_ij (dV_j + dS_ij V_j) - c_i O_i,      dS = scale (dQ K^T + Q dK^T)

(times ``1 - tanh^2`` of the softcap where there is one; ALiBi's bias has no tangent). The forward already
wrote L, the row logsumexp, so ``P = exp(S - L)`` is exact block by block: unlike the forward, this pass
needs no running max and no rescaling. It is the forward's loop with two more products per block for
``dS`` and one more for ``P dV``, in the forward's three stages (masked, whole, masked) and with its masks,
lengths, packing, GQA and score modifiers (:mod:`._common`).

With dropout the forward's kept weights ``M / (1 - p)`` multiply P in both sums of ``dO`` and O, but not in
``c``, which is the softmax's own: ``dO_i = (sum_j M_ij P_ij (dV_j + dS_ij V_j)) / (1 - p) - c_i O_i``, the
mask redrawn from the forward's seed (:mod:`.dropout`).

Rows that see no key (padding, an empty window) have O = 0 and L = -inf: their tangent is 0, even where their
inputs hold a NaN; a NaN in a key that a row does not see stays out of that row's tangent, as in PyTorch. The
pointer path only, with fixed blocks: a JVP is rare next to the forward and the backward, and nobody has timed it
yet.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime
from ..integer_math import ceil_div, power_of_two_at_least
from ..spec import AttentionSpec
from ._common import (INTERPRETER_BLOCKS, LOG2E, band_mask, key_block_range, packed_as_bhnd, row_stats_offset,
                      sample_bounds, score_scales, scores_log2)
from .attention_fwd import modifier_args
from .dropout import dropout_keep, dropout_stream_key, load_dropout_seed
from .launch import launch


@triton.jit
def _tile_ptrs(base, row0, stride_n, stride_d, offs_n, offs_d, TRANSPOSED: tl.constexpr):
    """Pointers of a tile of rows ``row0 + offs_n``: (rows, D), or (D, rows) when ``TRANSPOSED``."""
    if TRANSPOSED:  # one return for both shapes: the compiler refuses returns of two types in one function
        ptrs = base + (row0 + offs_n)[None, :] * stride_n + offs_d[:, None] * stride_d
    else:
        ptrs = base + (row0 + offs_n)[:, None] * stride_n + offs_d[None, :] * stride_d
    return ptrs


@triton.jit
def _jvp_inner(acc, c_i, q, q_t, l2, k_base, v_base, kt_base, vt_base, start, end, strides,
               offs_m, m0, offs_d, k_len, offset, window_left, window_right,
               sm_scale, score_scale, softcap_scale, slope_log2, dropout_key, dropout_p,
               MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
               HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr,
               DOT_PRECISION: tl.constexpr, BLOCK_N: tl.constexpr):
    """Add key blocks [start, end) to ``acc`` (sum of kept P (dV + dS V)) and ``c_i`` (sum of P dS).

    ``l2`` is L in log2 units, +inf for rows that see no key (their P is then 0). ``strides``: (row, column) of K,
    V, dK, dV in turn. ``MASKED`` blocks get the band's element mask and loads bounded by ``k_len``; the others are
    read whole, as in the forward."""
    stride_kn, stride_kd, stride_vn, stride_vd = strides[0], strides[1], strides[2], strides[3]
    stride_ktn, stride_ktd, stride_vtn, stride_vtd = strides[4], strides[5], strides[6], strides[7]
    offs_n = tl.arange(0, BLOCK_N)
    rows = offs_m[:, None] + offset  # i' = i + N_k - N_q (bottom-right alignment)
    d_ok = offs_d < HEAD_DIM
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        load_t = d_ok[:, None]  # (D, keys) tiles: K^T and its tangent
        load_r = d_ok[None, :]  # (keys, D) tiles: V and its tangent
        if MASKED:
            load_t = load_t & (cols[None, :] < k_len)
            load_r = load_r & (cols[:, None] < k_len)
        k = tl.load(_tile_ptrs(k_base, start_n, stride_kn, stride_kd, offs_n, offs_d, True), mask=load_t, other=0.0)
        k_t = tl.load(_tile_ptrs(kt_base, start_n, stride_ktn, stride_ktd, offs_n, offs_d, True), mask=load_t,
                      other=0.0)
        v = tl.load(_tile_ptrs(v_base, start_n, stride_vn, stride_vd, offs_n, offs_d, False), mask=load_r, other=0.0)
        v_t = tl.load(_tile_ptrs(vt_base, start_n, stride_vtn, stride_vtd, offs_n, offs_d, False), mask=load_r,
                      other=0.0)
        qk = tl.dot(q, k, input_precision=DOT_PRECISION)
        s, t = scores_log2(qk, rows, cols[None, :], score_scale, softcap_scale, slope_log2, HAS_SOFTCAP, HAS_ALIBI)
        # the scores' tangent, natural units: scale (dQ K^T + Q dK^T), through the softcap's tanh
        ds = tl.dot(q_t, k, input_precision=DOT_PRECISION)
        ds = tl.dot(q, k_t, ds, input_precision=DOT_PRECISION) * sm_scale
        if HAS_SOFTCAP:
            ds = ds * (1.0 - t * t)
        p = tl.math.exp2(s - l2[:, None])
        p_ds = p * ds
        if MASKED:  # both masked, not p alone: 0 * ds is NaN where an unseen key (or its tangent) holds a NaN
            visible = band_mask(rows, cols[None, :], k_len, window_left, window_right, HAS_LEFT, HAS_RIGHT)
            p = tl.where(visible, p, 0.0)
            p_ds = tl.where(visible, p_ds, 0.0)
        c_i += tl.sum(p_ds, 1)
        if HAS_DROPOUT:  # the forward's kept weights (their 1 / (1 - p) comes at the end)
            keep = dropout_keep(dropout_key, m0, start_n, dropout_p, offs_m.shape[0], BLOCK_N)
            p = tl.where(keep, p, 0.0)
            p_ds = tl.where(keep, p_ds, 0.0)
        acc = tl.dot(p.to(v_t.dtype), v_t, acc, input_precision=DOT_PRECISION)
        acc = tl.dot(p_ds.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    return acc, c_i


@triton.jit
def attention_jvp_kernel(
    Q, K, V, O, LSE, QT, KT, VT, OT, SEQ_LENS, CU_SEQLENS_Q, CU_SEQLENS_K, ALIBI,
    sm_scale, SOFTCAP, DROPOUT_P, DROPOUT_SEED,
    stride_qb, stride_qh, stride_qn, stride_qd, stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_ob, stride_oh, stride_on, stride_od,
    stride_qtb, stride_qth, stride_qtn, stride_qtd, stride_ktb, stride_kth, stride_ktn, stride_ktd,
    stride_vtb, stride_vth, stride_vtn, stride_vtd, stride_otb, stride_oth, stride_otn, stride_otd,
    stride_ab, stride_ah,
    H, KV_GROUP, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_SEQ_LENS: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """OT, the tangent of O, for query block ``program_id(0)`` of (batch, head) ``program_id(1)``.

    Q, K, V, O and the tangents QT, KT, VT, OT are (B, H, N, D) through their own strides (K, V, KT, VT with
    ``H // KV_GROUP`` heads); LSE, SEQ_LENS, CU_SEQLENS_*, ALIBI and the dropout arguments as in
    :func:`.attention_fwd.attention_fwd_kernel` (packed sequences with ``IS_VARLEN``), O and LSE the forward's.
    """
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_b = off_hz // H
    off_h = off_hz % H
    off_kvh = off_h // KV_GROUP
    b64, h64, kvh64 = off_b.to(tl.int64), off_h.to(tl.int64), off_kvh.to(tl.int64)
    q_base = Q + b64 * stride_qb + h64 * stride_qh
    o_base = O + b64 * stride_ob + h64 * stride_oh
    qt_base = QT + b64 * stride_qtb + h64 * stride_qth
    ot_base = OT + b64 * stride_otb + h64 * stride_oth
    k_base = K + b64 * stride_kb + kvh64 * stride_kh
    v_base = V + b64 * stride_vb + kvh64 * stride_vh
    kt_base = KT + b64 * stride_ktb + kvh64 * stride_kth
    vt_base = VT + b64 * stride_vtb + kvh64 * stride_vth

    q_start, n_q, q_len, k_start, n_k, k_len = sample_bounds(
        off_b, SEQ_LENS, CU_SEQLENS_Q, CU_SEQLENS_K, N_CTX_Q, N_CTX_K, HAS_SEQ_LENS, IS_VARLEN)
    offset = n_k - n_q
    if IS_VARLEN:
        if start_m * BLOCK_M >= n_q:  # a block past this sequence's end (grid sized for the longest)
            return
        q_base += q_start * stride_qn
        o_base += q_start * stride_on
        qt_base += q_start * stride_qtn
        ot_base += q_start * stride_otn
        k_base += k_start * stride_kn
        v_base += k_start * stride_vn
        kt_base += k_start * stride_ktn
        vt_base += k_start * stride_vtn

    m0 = start_m * BLOCK_M
    lo, full_lo, full_hi, hi = key_block_range(m0, q_len, k_len, offset, WINDOW_LEFT, WINDOW_RIGHT,
                                                HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    rows_ok = (offs_m[:, None] < n_q) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(_tile_ptrs(q_base, m0, stride_qn, stride_qd, tl.arange(0, BLOCK_M), offs_d, False), mask=rows_ok,
                other=0.0)
    q_t = tl.load(_tile_ptrs(qt_base, m0, stride_qtn, stride_qtd, tl.arange(0, BLOCK_M), offs_d, False),
                  mask=rows_ok, other=0.0)
    lse_base = LSE + row_stats_offset(off_b, off_h, H, N_CTX_Q, q_start, IS_VARLEN)
    lse = tl.load(lse_base + offs_m, mask=offs_m < n_q, other=float("-inf"))
    # A row that sees no key has L = -inf: read it as +inf, so that its P is exactly 0 (a NaN L stays NaN).
    l2 = tl.where((offs_m < q_len) & (lse != float("-inf")), lse * LOG2E, float("inf"))

    score_scale, softcap_scale = score_scales(sm_scale, SOFTCAP, HAS_SOFTCAP)
    slope_log2 = 0.0
    if HAS_ALIBI:
        slope_log2 = tl.load(ALIBI + off_b * stride_ab + off_h * stride_ah).to(tl.float32) * LOG2E
    dropout_key = dropout_stream_key(load_dropout_seed(DROPOUT_SEED, HAS_DROPOUT), off_b * H + off_h)

    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    c_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    strides = (stride_kn, stride_kd, stride_vn, stride_vd, stride_ktn, stride_ktd, stride_vtn, stride_vtd)
    if HAS_LEFT:  # blocks cut by the window's left edge
        acc, c_i = _jvp_inner(acc, c_i, q, q_t, l2, k_base, v_base, kt_base, vt_base, lo, full_lo, strides,
                              offs_m, m0, offs_d, k_len, offset, WINDOW_LEFT, WINDOW_RIGHT, sm_scale, score_scale,
                              softcap_scale, slope_log2, dropout_key, DROPOUT_P, True, HAS_LEFT, HAS_RIGHT,
                              HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    acc, c_i = _jvp_inner(acc, c_i, q, q_t, l2, k_base, v_base, kt_base, vt_base, full_lo, full_hi, strides,
                          offs_m, m0, offs_d, k_len, offset, WINDOW_LEFT, WINDOW_RIGHT, sm_scale, score_scale,
                          softcap_scale, slope_log2, dropout_key, DROPOUT_P, False, HAS_LEFT, HAS_RIGHT,
                          HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, HEAD_DIM, DOT_PRECISION, BLOCK_N)
    acc, c_i = _jvp_inner(acc, c_i, q, q_t, l2, k_base, v_base, kt_base, vt_base, full_hi, hi, strides,
                          offs_m, m0, offs_d, k_len, offset, WINDOW_LEFT, WINDOW_RIGHT, sm_scale, score_scale,
                          softcap_scale, slope_log2, dropout_key, DROPOUT_P, True, HAS_LEFT, HAS_RIGHT,
                          HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, HEAD_DIM, DOT_PRECISION, BLOCK_N)

    o = tl.load(_tile_ptrs(o_base, m0, stride_on, stride_od, tl.arange(0, BLOCK_M), offs_d, False), mask=rows_ok,
                other=0.0).to(tl.float32)
    if HAS_DROPOUT:
        acc = acc / (1.0 - DROPOUT_P)
    o_t = acc - c_i[:, None] * o
    # Rows that see no key and rows past the sample's length: exactly 0, as the forward's O there, whatever their
    # q, q_t or the keys hold (a NaN there would give 0 * NaN above; the forward never reads padding either).
    # Asked of l2 (+inf exactly there), already live, not of lse: keeping lse live too spilled at D = 256.
    o_t = tl.where((l2 != float("inf"))[:, None], o_t, 0.0)
    tl.store(_tile_ptrs(ot_base, m0, stride_otn, stride_otd, tl.arange(0, BLOCK_M), offs_d, False),
             o_t.to(OT.dtype.element_ty), mask=rows_ok)


def jvp_blocks(head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) of the JVP kernel: the interpreter's blocks there; on a GPU four warps, with
    64 x 64 blocks up to head_dim 64, 64 x 32 up to 128 and 32 x 32 above. Q, its tangent and O's accumulator stay
    in registers all along, so the blocks shrink as D grows: these are the largest that compiled for sm_90a
    (Triton 3.6) without a spill among the products (64 x 64 at D = 128, and every 64-row block at D = 256,
    spilled). Not timed; checked against float64 on an H100 at head dim 256 and 64 (fp16) (session 53)."""
    if runtime.INTERPRET:
        return INTERPRETER_BLOCKS["BLOCK_M"], INTERPRETER_BLOCKS["BLOCK_N"], 4
    if head_dim <= 64:
        return 64, 64, 4
    return (64, 32, 4) if head_dim <= 128 else (32, 32, 4)


def launch_attention_jvp(q, k, v, o, lse, q_t, k_t, v_t, o_t, spec: AttentionSpec = AttentionSpec(), *,
                         seq_lens=None, alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None,
                         max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                         dropout_seed: torch.Tensor | None = None) -> torch.Tensor:
    """Fill ``o_t`` with the tangent of the forward's O for tangents ``q_t``, ``k_t``, ``v_t`` of q, k, v.

    Shapes, layouts and the other arguments as :func:`.attention_fwd.launch_attention_forward` takes them (not
    checked here); o and lse are that forward's outputs, each tangent has its primal's shape and dtype (any
    strides). Packed sequences: (total, H, D) tensors with ``cu_seqlens_q``. Returns ``o_t``.
    """
    filled = o_t
    varlen = cu_seqlens_q is not None
    if varlen:
        q, k, v, o, q_t, k_t, v_t, o_t = (packed_as_bhnd(t, cu_seqlens_q.shape[0] - 1)
                                          for t in (q, k, v, o, q_t, k_t, v_t, o_t))
    batch, heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    left, right = spec.bounds(max(n_q, n_k))  # packed: n_q, n_k are the totals, past every sequence
    alibi, alibi_strides, scalars, flags = modifier_args(spec, alibi_slopes, head_dim, lse, dropout_seed)
    block_m, block_n, warps = jvp_blocks(head_dim)
    rows_q = max_seqlen_q if varlen else n_q
    strides = tuple(s for t in (q, k, v, o, q_t, k_t, v_t, o_t) for s in t.stride())
    launch(attention_jvp_kernel, (ceil_div(rows_q, block_m), batch * heads),
           q, k, v, o, lse, q_t, k_t, v_t, o_t, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi, *scalars,
           *strides, *alibi_strides,
           heads, heads // k.shape[1], n_q, n_k, left or 0, right or 0,
           HEAD_DIM=head_dim, BLOCK_D=max(16, power_of_two_at_least(head_dim)),
           HAS_SEQ_LENS=seq_lens is not None, IS_VARLEN=varlen, HAS_LEFT=left is not None,
           HAS_RIGHT=right is not None, **flags, DOT_PRECISION=runtime.dot_precision(q.dtype),
           BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps, num_stages=2)
    return filled
