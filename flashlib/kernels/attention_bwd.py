"""FlashAttention backward in Triton: a preprocess kernel, a dK/dV kernel and a dQ kernel.

The forward (:mod:`flashlib.kernels.attention_fwd`) saves O and the row
logsumexp ``L`` (natural log), never the N_q x N_k matrix P. With scores
``S = scale * Q K^T`` (masked entries -inf) and ``P = exp(S - L)`` the gradients
of ``O = P V`` are::

    dV = P^T dO                 dP = dO V^T
    D  = rowsum(dO * O)         dS = P * (dP - D)      (softmax's Jacobian, row by row)
    dQ = scale * dS K           dK = scale * dS^T Q

``D`` is ``rowsum(P * dP)`` rewritten: ``rowsum(P * (dO V^T)) = rowsum(dO * (P V))
= rowsum(dO * O)``, so it needs one pass over O and dO instead of a pass over P.

Three launches:

1. ``attention_bwd_preprocess_kernel``: ``D = rowsum(dO * O)`` in float32, one
   program per block of query rows.
2. ``attention_bwd_dkdv_kernel``: one program per block of BLOCK_N keys of one
   (batch, kv head). It keeps its K and V tiles and the dK, dV accumulators
   (float32) on chip and loops over the blocks of queries that see these keys,
   recomputing ``P^T = exp2(K Q^T * scale * log2(e) - L * log2(e))`` tile by tile
   from the saved L (P is never stored; exp2 with the folded scale, as in the
   forward).
3. ``attention_bwd_dq_kernel``: one program per block of BLOCK_M queries of one
   (batch, head), looping over key blocks exactly as the forward does, with its
   own recomputation of P, and a dQ accumulator in float32.

Why no atomics. FlashAttention-2's original backward computes dQ inside the
dK/dV loop and adds each program's share into dQ with atomic adds in float32:
one pass over P instead of two, but the order of the additions changes from run
to run (results are not bitwise reproducible) and dQ needs a float32 buffer and
a cast. Here every gradient element is owned by exactly one program, which adds
its terms in a fixed order and stores once: results are deterministic (bitwise
equal from run to run) at the cost of computing QK^T and dO V^T twice (once per
kernel). This is also what Triton's fused-attention tutorial does.

GQA/MQA: the dK/dV of a kv head is the sum over the ``KV_GROUP`` query heads
that read it. The dK/dV program loops over those query heads itself and keeps
summing into the same float32 accumulators, so the sum costs no extra memory
and no extra pass (writing per-query-head dK/dV and summing them in PyTorch
would allocate ``KV_GROUP`` times the K/V size and round each term to the
output dtype first). The price is fewer programs (B * H_kv key-block columns)
when the group is large; decoding-sized MQA problems have few keys anyway.

Masks, block skipping: every mask is a band (see the forward), so the query
rows that see a key block form one interval and the dK/dV program visits only
the query blocks in it, in three stages like the forward's::

    query blocks: [lo, full_lo)      [full_lo, full_hi)      [full_hi, hi)
                  masked             no mask                 masked
                  (diagonal, right   (every row sees every   (window's left edge,
                   window edge)       key of the block)       q_len tail, a key
                                                              block cut by k_len)

The dQ program uses the forward's key interval for its query block (the same
arithmetic, in ``key_block_range``; it and ``query_block_range`` live side by side
in :mod:`flashlib.kernels._common`). Rows that see no key, and padding rows
past ``seq_len``, have ``L = -inf``; the kernels read them as ``L = +inf`` so
that ``P = exp2(S - inf) = 0`` without ever computing ``-inf - (-inf)`` (NaN):
their gradients are exactly 0, and keys past ``seq_len`` get exactly 0 too.

Precision: all products accumulate in float32; with float16/bfloat16 inputs P
and dS are cast to the input dtype before their ``tl.dot`` (tensor cores), as in
every FlashAttention. float32 inputs run ``tl.dot`` at ``DOT_PRECISION``
(:func:`flashlib.runtime.dot_precision`): full float32 unless torch allows TF32.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources

from .. import runtime
from ..integer_math import ceil_div, power_of_two_at_least
from ..spec import AttentionSpec
from ._common import (INTERPRETER_BLOCKS, LOG2E, band_mask, descriptor_ready, descriptors_supported, key_block_range,
                      load_rows, packed_as_bhnd, query_block_range, row_stats_offset, sample_bounds, scores_log2,
                      set_block_shapes, tensor_of, tile_sources)
from . import attention_bwd_hopper as bwd_hopper
from .attention_fwd import full_float32_config, gluon_dropout_args, longest_first, modifier_args, smem_budget
from .attention_fwd_hopper import scores_of
from .dropout import dropout_keep, dropout_keep_t, dropout_stream_key, load_dropout_seed
from .launch import launch, launch_tuned


@triton.jit
def _score_constants(sm_scale, SOFTCAP, HAS_SOFTCAP: tl.constexpr):
    """``score_scale`` and ``softcap_scale`` of :func:`scores_log2` (the forward folds a sign in too)."""
    if HAS_SOFTCAP:
        return SOFTCAP * LOG2E, sm_scale / SOFTCAP
    else:
        return sm_scale * LOG2E, 1.0


# ---------------------------------------------------------------- 1. D = rowsum(dO * O)
@triton.jit
def attention_bwd_preprocess_kernel(
    O, DO, DELTA,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_dob, stride_doh, stride_don, stride_dod,
    H, N_CTX_Q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """DELTA[b, h, i] = sum_d dO[b, h, i, d] * O[b, h, i, d] in float32 (DELTA contiguous (B, H, N_q))."""
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    off_b = off_hz // H
    off_h = off_hz % H
    # 64-bit rows: packed sequences (varlen) run this over all total_q rows as one sample.
    offs_m = start_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < N_CTX_Q) & (offs_d[None, :] < HEAD_DIM)
    o_ptrs = (O + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
              + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od)
    do_ptrs = (DO + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh
               + offs_m[:, None] * stride_don + offs_d[None, :] * stride_dod)
    o = tl.load(o_ptrs, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + off_hz.to(tl.int64) * N_CTX_Q + offs_m, tl.sum(o * do, axis=1), mask=offs_m < N_CTX_Q)


# ---------------------------------------------------------------- 2. dK, dV over key blocks
@triton.jit
def _attn_bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, q_src, do_src, off_b, off_h,
                         lse_ptr, delta_ptr, start, end,
                         stride_qn, stride_qd, stride_don, stride_dod,
                         offs_n, n0, offs_d, k_len, q_len, offset, window_left, window_right,
                         score_scale, softcap_scale, slope_log2, dropout_key, dropout_p,
                         MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                         HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                         EVEN_D: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr,
                         TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_D: tl.constexpr, DP_AFTER_DV: tl.constexpr):
    """Add to (dk, dv) the terms of the query blocks [start, end) of one query head.

    Works on transposed tiles (keys along rows): ``P^T = exp2(K Q^T - L)`` (BLOCK_N, BLOCK_M),
    ``dV += P^T dO``, ``dP^T = V dO^T``, ``dS^T = P^T * (dP^T - D)``, ``dK += dS^T Q``
    (the scale is applied once at the end). Rows are loaded only below ``q_len``: padding
    past a sample's length never enters, whatever it holds (NaN included). Dropout: the
    forward's mask Z, ``dV += (P Z / (1 - p))^T dO`` and ``dP`` becomes ``dP Z / (1 - p)``;
    softcap: ``dS`` times ``1 - tanh^2``. ``TMA == "host"``: Q and dO tiles come through the
    host descriptors ``q_src``, ``do_src`` (rows past N_q read as 0; only for unpadded batches).
    ``DP_AFTER_DV``: the order of the products, not their values (see :data:`DKDV_DP_AFTER_DV_CONFIGS`).
    """
    offs_m = tl.arange(0, BLOCK_M)
    # Q^T tile (BLOCK_D, BLOCK_M) and dO tile (BLOCK_M, BLOCK_D) of the first block, through strides.
    qT_ptrs = q_base + (start + offs_m)[None, :] * stride_qn + offs_d[:, None] * stride_qd
    do_ptrs = do_base + (start + offs_m)[:, None] * stride_don + offs_d[None, :] * stride_dod
    for start_m in range(start, end, BLOCK_M):
        rows = start_m + offs_m
        if TMA == "host":
            qT = tl.trans(load_rows(q_src, off_b, off_h, start_m, TMA, BLOCK_M, BLOCK_D))
            do = load_rows(do_src, off_b, off_h, start_m, TMA, BLOCK_M, BLOCK_D)
            if MASKED:
                lse = tl.load(lse_ptr + rows, mask=rows < q_len, other=float("inf"))
                delta = tl.load(delta_ptr + rows, mask=rows < q_len, other=0.0)
            else:
                lse = tl.load(lse_ptr + rows)
                delta = tl.load(delta_ptr + rows)
        elif MASKED:
            qT = tl.load(qT_ptrs, mask=(rows[None, :] < q_len) & (offs_d[:, None] < HEAD_DIM), other=0.0)
            do = tl.load(do_ptrs, mask=(rows[:, None] < q_len) & (offs_d[None, :] < HEAD_DIM), other=0.0)
            lse = tl.load(lse_ptr + rows, mask=rows < q_len, other=float("inf"))
            delta = tl.load(delta_ptr + rows, mask=rows < q_len, other=0.0)
        else:
            if EVEN_D:
                qT = tl.load(qT_ptrs)
                do = tl.load(do_ptrs)
            else:
                qT = tl.load(qT_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
                do = tl.load(do_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
            lse = tl.load(lse_ptr + rows)
            delta = tl.load(delta_ptr + rows)
        # L = -inf (a row that sees no key, or padding) read as +inf: P = exp2(S - inf) = 0, never NaN.
        lse2 = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
        cols = offs_n[:, None]
        query_pos = rows[None, :] + offset  # i' = i + N_k - N_q (bottom-right alignment)
        # scores in log2 units, keys along rows
        qkT, tT = scores_log2(tl.dot(k, qT, input_precision=DOT_PRECISION), query_pos, cols,
                              score_scale, softcap_scale, slope_log2, HAS_SOFTCAP, HAS_ALIBI)
        if MASKED:
            visible = band_mask(query_pos, cols, k_len, window_left, window_right, HAS_LEFT, HAS_RIGHT)
            qkT = tl.where(visible, qkT, float("-inf"))
        pT = tl.math.exp2(qkT - lse2[None, :])
        if not DP_AFTER_DV:
            dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        if HAS_DROPOUT:  # the kept weights, unscaled: dK and dV are divided by 1 - p once, by the caller
            keepT = dropout_keep_t(dropout_key, start_m, n0, dropout_p, BLOCK_M, BLOCK_N)
            dv += tl.dot(tl.where(keepT, pT, 0.0).to(do.dtype), do, input_precision=DOT_PRECISION)
        else:
            dv += tl.dot(pT.to(do.dtype), do, input_precision=DOT_PRECISION)
        if DP_AFTER_DV:  # P^T's low-precision copy is dead before dP^T's float32 tile is live
            dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        if HAS_DROPOUT:  # dS (1 - p) = P (dP of the kept weights - (1 - p) D): one multiply a row, none a weight
            dpT = tl.where(keepT, dpT, 0.0)
            delta = delta * (1.0 - dropout_p)
        dsT = pT * (dpT - delta[None, :])
        if HAS_SOFTCAP:
            dsT = dsT * (1.0 - tT * tT)
        dk += tl.dot(dsT.to(qT.dtype), tl.trans(qT), input_precision=DOT_PRECISION)
        qT_ptrs += BLOCK_M * stride_qn
        do_ptrs += BLOCK_M * stride_don
    return dk, dv


@triton.jit
def attention_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, SEQ_LENS, CU_SEQLENS_Q, CU_SEQLENS_K, ALIBI, sm_scale, SOFTCAP,
    DROPOUT_P, DROPOUT_SEED,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_ab, stride_ah,
    H, KV_GROUP, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT,
    Q_BUCKET, K_BUCKET,  # only keys for the autotuner (N rounded up to a power of two)
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_SEQ_LENS: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DP_AFTER_DV: tl.constexpr = False,
):
    """dK, dV for key block ``program_id(0)`` of (batch, kv head) ``program_id(1)``.

    Q, DO (B, H, N_q, D), K, V, DK, DV (B, H // KV_GROUP, N_k, D), any strides.
    LSE, DELTA contiguous float32 (B, H, N_q). The program sums over the KV_GROUP
    query heads of its kv head (GQA) in float32 and stores every element of its
    block once (zeros for keys that no query sees). IS_VARLEN: packed sequences, as in
    the forward (batch strides 0, LSE and DELTA (H, total_q)). ``TMA == "host"``: Q and DO
    are (B, H, N_q, D) host tensor descriptors with (1, 1, BLOCK_M, BLOCK_D) tiles.
    """
    start_n = tl.program_id(0)
    off_hkv = tl.program_id(1)
    kv_heads = H // KV_GROUP
    off_b = off_hkv // kv_heads
    off_kvh = off_hkv % kv_heads
    q_start, n_q, q_len, k_start, n_k, k_len = sample_bounds(
        off_b, SEQ_LENS, CU_SEQLENS_Q, CU_SEQLENS_K, N_CTX_Q, N_CTX_K, HAS_SEQ_LENS, IS_VARLEN)
    offset = n_k - n_q
    if IS_VARLEN:
        if start_n * BLOCK_N >= n_k:  # a block past this sequence's end (grid sized for the longest)
            return

    n0 = start_n * BLOCK_N
    lo, full_lo, full_hi, hi = query_block_range(n0, q_len, k_len, offset, WINDOW_LEFT, WINDOW_RIGHT,
                                                  HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    kv_mask = (offs_n[:, None] < n_k) & (offs_d[None, :] < HEAD_DIM)
    # 64-bit offsets (sample, head, and the sequence's first row when packed).
    k_base = K + off_b.to(tl.int64) * stride_kb + off_kvh.to(tl.int64) * stride_kh + k_start * stride_kn
    v_base = V + off_b.to(tl.int64) * stride_vb + off_kvh.to(tl.int64) * stride_vh + k_start * stride_vn
    # Keys past k_len (padding) are read as 0 whatever they hold; their dK, dV are stored as 0.
    load_mask = (offs_n[:, None] < k_len) & (offs_d[None, :] < HEAD_DIM)
    k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd, mask=load_mask, other=0.0)
    v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd, mask=load_mask, other=0.0)

    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    score_scale, softcap_scale = _score_constants(sm_scale, SOFTCAP, HAS_SOFTCAP)
    seed = load_dropout_seed(DROPOUT_SEED, HAS_DROPOUT)  # the forward's
    for g in range(0, KV_GROUP):  # GQA: the query heads that read this kv head
        off_h = off_kvh * KV_GROUP + g
        slope_log2 = 0.0
        if HAS_ALIBI:
            slope_log2 = tl.load(ALIBI + off_b * stride_ab + off_h * stride_ah).to(tl.float32) * LOG2E
        dropout_key = dropout_stream_key(seed, off_b * H + off_h)
        if TMA == "host":  # the pointers are unused: tiles come through the descriptors
            q_base, do_base = LSE, LSE
        else:
            q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh + q_start * stride_qn
            do_base = DO + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh + q_start * stride_don
        row_base = row_stats_offset(off_b, off_h, H, N_CTX_Q, q_start, IS_VARLEN)
        lse_ptr = LSE + row_base
        delta_ptr = DELTA + row_base
        if HAS_RIGHT:  # stage 1: the diagonal / the window's right edge
            dk, dv = _attn_bwd_dkdv_inner(
                dk, dv, k, v, q_base, do_base, Q, DO, off_b, off_h, lse_ptr, delta_ptr, lo, full_lo,
                stride_qn, stride_qd, stride_don, stride_dod, offs_n, n0, offs_d, k_len, q_len, offset,
                WINDOW_LEFT, WINDOW_RIGHT, score_scale, softcap_scale, slope_log2, dropout_key, DROPOUT_P,
                True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, EVEN_D, HEAD_DIM,
                DOT_PRECISION, TMA, BLOCK_M, BLOCK_N, BLOCK_D, DP_AFTER_DV)
        # stage 2: query blocks that see the whole key block, no mask
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, k, v, q_base, do_base, Q, DO, off_b, off_h, lse_ptr, delta_ptr, full_lo, full_hi,
            stride_qn, stride_qd, stride_don, stride_dod, offs_n, n0, offs_d, k_len, q_len, offset,
            WINDOW_LEFT, WINDOW_RIGHT, score_scale, softcap_scale, slope_log2, dropout_key, DROPOUT_P,
            False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, EVEN_D, HEAD_DIM,
            DOT_PRECISION, TMA, BLOCK_M, BLOCK_N, BLOCK_D, DP_AFTER_DV)
        # stage 3: the window's left edge, the q_len tail, a key block cut by k_len
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, k, v, q_base, do_base, Q, DO, off_b, off_h, lse_ptr, delta_ptr, full_hi, hi,
            stride_qn, stride_qd, stride_don, stride_dod, offs_n, n0, offs_d, k_len, q_len, offset,
            WINDOW_LEFT, WINDOW_RIGHT, score_scale, softcap_scale, slope_log2, dropout_key, DROPOUT_P,
            True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, EVEN_D, HEAD_DIM,
            DOT_PRECISION, TMA, BLOCK_M, BLOCK_N, BLOCK_D, DP_AFTER_DV)

    dk_scale = sm_scale
    if HAS_DROPOUT:  # the kept weights' 1 / (1 - p), left out of every term
        dk_scale = sm_scale / (1.0 - DROPOUT_P)
        dv *= 1.0 / (1.0 - DROPOUT_P)
    dk *= dk_scale
    dk_base = DK + off_b.to(tl.int64) * stride_dkb + off_kvh.to(tl.int64) * stride_dkh + k_start * stride_dkn
    dv_base = DV + off_b.to(tl.int64) * stride_dvb + off_kvh.to(tl.int64) * stride_dvh + k_start * stride_dvn
    tl.store(dk_base + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd,
             dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(dv_base + offs_n[:, None] * stride_dvn + offs_d[None, :] * stride_dvd,
             dv.to(DV.dtype.element_ty), mask=kv_mask)


# ---------------------------------------------------------------- 3. dQ over query blocks
@triton.jit
def _attn_bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base, k_src, v_src, off_b, off_kvh, start, end,
                       stride_kn, stride_kd, stride_vn, stride_vd,
                       offs_m, m0, offs_d, k_len, offset, window_left, window_right,
                       score_scale, softcap_scale, slope_log2, dropout_key, dropout_p,
                       MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                       HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                       EVEN_D: tl.constexpr, HEAD_DIM: tl.constexpr, DOT_PRECISION: tl.constexpr,
                       TMA: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """Add to dq the terms of the key blocks [start, end): ``P = exp2(Q K^T - L)``,
    ``dP = dO V^T``, ``dS = P * (dP - D)``, ``dQ += dS K`` (scale applied at the end).
    ``TMA == "host"``: K and V tiles come through the host descriptors ``k_src``, ``v_src``."""
    offs_n = tl.arange(0, BLOCK_N)
    # K^T and V^T tiles (BLOCK_D, BLOCK_N) of the first block, through strides.
    kT_ptrs = k_base + (start + offs_n)[None, :] * stride_kn + offs_d[:, None] * stride_kd
    vT_ptrs = v_base + (start + offs_n)[None, :] * stride_vn + offs_d[:, None] * stride_vd
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        if TMA == "host":  # rows past N_k read as 0, as the pointer path's mask gives
            kT = tl.trans(load_rows(k_src, off_b, off_kvh, start_n, TMA, BLOCK_N, BLOCK_D))
            vT = tl.trans(load_rows(v_src, off_b, off_kvh, start_n, TMA, BLOCK_N, BLOCK_D))
        elif MASKED:
            kv_mask = (cols[None, :] < k_len) & (offs_d[:, None] < HEAD_DIM)
            kT = tl.load(kT_ptrs, mask=kv_mask, other=0.0)
            vT = tl.load(vT_ptrs, mask=kv_mask, other=0.0)
        elif EVEN_D:
            kT = tl.load(kT_ptrs)
            vT = tl.load(vT_ptrs)
        else:
            kT = tl.load(kT_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
            vT = tl.load(vT_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
        query_pos = offs_m[:, None] + offset  # i' = i + N_k - N_q
        qk, t = scores_log2(tl.dot(q, kT, input_precision=DOT_PRECISION), query_pos, cols[None, :],
                            score_scale, softcap_scale, slope_log2, HAS_SOFTCAP, HAS_ALIBI)  # log2 units
        if MASKED:
            visible = band_mask(query_pos, cols[None, :], k_len, window_left, window_right, HAS_LEFT, HAS_RIGHT)
            qk = tl.where(visible, qk, float("-inf"))
        p = tl.math.exp2(qk - lse2[:, None])
        dp = tl.dot(do, vT, input_precision=DOT_PRECISION)
        if HAS_DROPOUT:  # the kept weights' dP, unscaled; ``delta`` is D (1 - p), dQ is divided by 1 - p at the end
            keep = dropout_keep(dropout_key, m0, start_n, dropout_p, offs_m.shape[0], BLOCK_N)
            dp = tl.where(keep, dp, 0.0)
        ds = p * (dp - delta[:, None])
        if HAS_SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq += tl.dot(ds.to(kT.dtype), tl.trans(kT), input_precision=DOT_PRECISION)
        kT_ptrs += BLOCK_N * stride_kn
        vT_ptrs += BLOCK_N * stride_vn
    return dq


@triton.jit
def attention_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, SEQ_LENS, CU_SEQLENS_Q, CU_SEQLENS_K, ALIBI, sm_scale, SOFTCAP,
    DROPOUT_P, DROPOUT_SEED,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_don, stride_dod,
    stride_dqb, stride_dqh, stride_dqn, stride_dqd,
    stride_ab, stride_ah,
    H, KV_GROUP, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT,
    Q_BUCKET, K_BUCKET,  # only keys for the autotuner
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_SEQ_LENS: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    DOT_PRECISION: tl.constexpr, TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    LONGEST_FIRST: tl.constexpr = False,
):
    """dQ for query block ``program_id(0)`` of (batch, head) ``program_id(1)``: the forward's
    loop (same key interval, same three stages), with dQ in place of O. ``TMA == "host"``: K and
    V are (B, H_kv, N_k, D) host tensor descriptors with (1, 1, BLOCK_N, BLOCK_D) tiles.
    ``LONGEST_FIRST``: query blocks last to first, as the forward's (``attention_fwd.LONGEST_FIRST``;
    the dK/dV kernel's longest key blocks, the first ones under a causal mask, start first already)."""
    start_m = tl.program_id(0)
    if LONGEST_FIRST:
        start_m = tl.num_programs(0) - 1 - start_m
    off_hz = tl.program_id(1)
    off_b = off_hz // H
    off_h = off_hz % H
    off_kvh = off_h // KV_GROUP
    q_start, n_q, q_len, k_start, n_k, k_len = sample_bounds(
        off_b, SEQ_LENS, CU_SEQLENS_Q, CU_SEQLENS_K, N_CTX_Q, N_CTX_K, HAS_SEQ_LENS, IS_VARLEN)
    offset = n_k - n_q
    if IS_VARLEN:
        if start_m * BLOCK_M >= n_q:  # a block past this sequence's end (grid sized for the longest)
            return

    m0 = start_m * BLOCK_M
    lo, full_lo, full_hi, hi = key_block_range(m0, q_len, k_len, offset, WINDOW_LEFT, WINDOW_RIGHT,
                                                HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    row_mask = offs_m < q_len  # rows past the sample's length are never read (whatever they hold)
    tile_mask = row_mask[:, None] & (offs_d[None, :] < HEAD_DIM)
    # 64-bit offsets (sample, head, and the sequence's first row when packed).
    q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh + q_start * stride_qn
    do_base = DO + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh + q_start * stride_don
    if TMA == "host":  # the pointers are unused: tiles come through the descriptors
        k_base, v_base = LSE, LSE
    else:
        k_base = K + off_b.to(tl.int64) * stride_kb + off_kvh.to(tl.int64) * stride_kh + k_start * stride_kn
        v_base = V + off_b.to(tl.int64) * stride_vb + off_kvh.to(tl.int64) * stride_vh + k_start * stride_vn
    q = tl.load(q_base + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd, mask=tile_mask, other=0.0)
    do = tl.load(do_base + offs_m[:, None] * stride_don + offs_d[None, :] * stride_dod, mask=tile_mask, other=0.0)
    row_base = row_stats_offset(off_b, off_h, H, N_CTX_Q, q_start, IS_VARLEN)
    lse = tl.load(LSE + row_base + offs_m, mask=row_mask, other=float("inf"))
    delta = tl.load(DELTA + row_base + offs_m, mask=row_mask, other=0.0)
    if HAS_DROPOUT:  # dS (1 - p) = P (dP of the kept weights - (1 - p) D): dQ is divided by 1 - p at the end
        delta = delta * (1.0 - DROPOUT_P)
    # L = -inf (no key, or padding row) read as +inf: P = 0 on the whole row, never NaN.
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse) * LOG2E

    dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    score_scale, softcap_scale = _score_constants(sm_scale, SOFTCAP, HAS_SOFTCAP)
    slope_log2 = 0.0
    if HAS_ALIBI:
        slope_log2 = tl.load(ALIBI + off_b * stride_ab + off_h * stride_ah).to(tl.float32) * LOG2E
    dropout_key = dropout_stream_key(load_dropout_seed(DROPOUT_SEED, HAS_DROPOUT), off_b * H + off_h)
    if HAS_LEFT:  # stage 1: blocks cut by the window's left edge
        dq = _attn_bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base, K, V, off_b, off_kvh, lo, full_lo,
                                stride_kn, stride_kd, stride_vn, stride_vd, offs_m, m0, offs_d, k_len, offset,
                                WINDOW_LEFT, WINDOW_RIGHT, score_scale, softcap_scale, slope_log2, dropout_key,
                                DROPOUT_P, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT,
                                EVEN_D, HEAD_DIM, DOT_PRECISION, TMA, BLOCK_N, BLOCK_D)
    # stage 2: blocks every row sees whole, no mask
    dq = _attn_bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base, K, V, off_b, off_kvh, full_lo, full_hi,
                            stride_kn, stride_kd, stride_vn, stride_vd, offs_m, m0, offs_d, k_len, offset,
                            WINDOW_LEFT, WINDOW_RIGHT, score_scale, softcap_scale, slope_log2, dropout_key,
                            DROPOUT_P, False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT,
                            EVEN_D, HEAD_DIM, DOT_PRECISION, TMA, BLOCK_N, BLOCK_D)
    # stage 3: the diagonal / window's right edge, and the key tail (N_k or seq_len)
    dq = _attn_bwd_dq_inner(dq, q, do, lse2, delta, k_base, v_base, K, V, off_b, off_kvh, full_hi, hi,
                            stride_kn, stride_kd, stride_vn, stride_vd, offs_m, m0, offs_d, k_len, offset,
                            WINDOW_LEFT, WINDOW_RIGHT, score_scale, softcap_scale, slope_log2, dropout_key,
                            DROPOUT_P, True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT,
                            EVEN_D, HEAD_DIM, DOT_PRECISION, TMA, BLOCK_N, BLOCK_D)

    if HAS_SEQ_LENS:  # padding rows (past seq_len, inside N_q): exactly 0. Selected in float32 before
        # the scale; after it the compiler moved the select past the packing of dQ to 16 bits (byte
        # permutes and selects per pair). Without seq_lens every stored row is valid.
        dq = tl.where(row_mask[:, None], dq, 0.0)
    dq_scale = sm_scale
    if HAS_DROPOUT:  # the kept weights' 1 / (1 - p), left out of every term
        dq_scale = sm_scale / (1.0 - DROPOUT_P)
    dq = dq * dq_scale
    dq_base = DQ + off_b.to(tl.int64) * stride_dqb + off_h.to(tl.int64) * stride_dqh + q_start * stride_dqn
    tl.store(dq_base + offs_m[:, None] * stride_dqn + offs_d[None, :] * stride_dqd,
             dq.to(DQ.dtype.element_ty), mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < HEAD_DIM))


# ---------------------------------------------------------------- launch configuration
#: Autotune candidates (BLOCK_M, BLOCK_N, num_stages, num_warps). The dK/dV kernel keeps a
#: BLOCK_N tile of K, V, dK, dV on chip and streams BLOCK_M query blocks, so it wants a wide
#: BLOCK_N; the dQ kernel is the other way round (as in Triton's fused-attention tutorial).
#: The lists hold the winners of a sweep of every config that fits, on an H100 (benchmarks/TUNING.md).
DKDV_GPU_CONFIGS = [
    (32, 64, 3, 4), (64, 64, 3, 4), (32, 128, 3, 4), (64, 128, 3, 8), (64, 128, 2, 8), (32, 128, 3, 8),
    (64, 64, 2, 4), (32, 32, 2, 4), (16, 64, 2, 4),
]
#: dK/dV configs that issue dP^T = V dO^T after dV's product instead of before it (``DP_AFTER_DV``),
#: tried only where the rounded head_dim is at least :data:`DP_AFTER_DV_MIN_BLOCK_D` and the band has no
#: right bound (:func:`dp_after_dv`). The values are the same; what changes is which tiles are live
#: together. At D = 128 the usual order left 64 x 64 tiles at 255 registers with spills; after dV they
#: take 244 and none, and without a mask they ran 3-7% faster than the list's best (32 x 64); with a
#: causal mask, and at D = 64, every config ran 1-6% slower in that order (benchmarks/TUNING.md,
#: nineteenth finding).
DKDV_DP_AFTER_DV_CONFIGS = [(64, 64, 2, 4)]
DP_AFTER_DV_MIN_BLOCK_D = 128


def dp_after_dv(block_d: int, has_right: bool) -> bool:
    """Whether the dK/dV kernel may issue dP^T after dV's product (see :data:`DKDV_DP_AFTER_DV_CONFIGS`)."""
    return block_d >= DP_AFTER_DV_MIN_BLOCK_D and not has_right

DQ_GPU_CONFIGS = [
    (128, 64, 3, 8), (128, 32, 3, 8), (128, 32, 3, 4), (128, 64, 2, 8), (64, 64, 3, 4), (64, 64, 2, 4),
    (64, 32, 3, 4), (32, 32, 2, 4), (64, 16, 2, 4),
]

#: The smallest head_dim (rounded up to a power of two) whose backward takes descriptors by default.
#: Same-process A/B on the H100 (fp16, FA2 shapes, CUDA-graph timing): at D = 128 descriptors were
#: level or faster at all six points (+1% to +6%, most for causal); at D = 64 they lost 4-7% without
#: a causal mask and won 1-4% with one.
TMA_MIN_BLOCK_D = 128
#: Rows per program of the preprocess kernel (memory bound: no tuning).
PREPROCESS_BLOCK_M = 64


def smem_bytes(kernel: str, block_m: int, block_n: int, block_d: int, stages: int, elem_bytes: int) -> int:
    """Shared memory one program needs, estimated: the tiles held for the whole program,
    ``stages`` buffers of the two streamed tiles, and one (BLOCK_M, BLOCK_N) float32 tile
    for the layout change of P/dS between its two ``tl.dot``.

    dK/dV holds K, V (BLOCK_N x D) and streams Q, dO (BLOCK_M x D); dQ holds Q, dO and
    streams K, V.
    """
    held, streamed = (block_n, block_m) if kernel == "dkdv" else (block_m, block_n)
    return elem_bytes * block_d * (2 * held + 2 * streamed * stages) + 4 * block_m * block_n


def _fits(kernel, bm, bn, stages, warps, block_d, elem_bytes, budget) -> bool:
    """Registers: float32 accumulators (dK and dV, or dQ) of at most 128 per thread; shared memory."""
    accumulators = 2 * bn * block_d if kernel == "dkdv" else bm * block_d
    if accumulators > 4096 * warps:
        return False
    return smem_bytes(kernel, bm, bn, block_d, stages, elem_bytes) <= budget


def _pruner(kernel):
    def prune(configs, named_args, **kwargs):
        """Triton's early_config_prune hook: drop configs that cannot fit this head_dim
        (full float32: the one config of ``full_float32_config``)."""
        args = {**named_args, **kwargs}
        only = full_float32_config(args, lambda bm, bn, stages: smem_bytes(kernel, bm, bn, args["BLOCK_D"], stages, 4))
        if only is not None:
            only.pre_hook = TILE_SHAPES[kernel]
            return [only]
        shape = (args["BLOCK_D"], tensor_of(args["Q"]).element_size(), smem_budget())
        kept = [c for c in configs
                if _fits(kernel, c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_stages, c.num_warps, *shape)
                and (not c.kwargs.get("DP_AFTER_DV") or dp_after_dv(args["BLOCK_D"], args["HAS_RIGHT"]))]
        return kept or [triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}, num_stages=1, num_warps=4,
                                      pre_hook=TILE_SHAPES[kernel])]
    return prune


#: Which block size the rows of each streamed tile take, per kernel: the arguments that are host
#: descriptors when ``TMA == "host"`` (dK/dV streams Q and dO, dQ streams K and V).
TILE_ROWS = {"dkdv": {"Q": "BLOCK_M", "DO": "BLOCK_M"}, "dq": {"K": "BLOCK_N", "V": "BLOCK_N"}}


def _set_dkdv_tiles(nargs):
    set_block_shapes(nargs, TILE_ROWS["dkdv"])


def _set_dq_tiles(nargs):
    set_block_shapes(nargs, TILE_ROWS["dq"])


#: The configs' pre_hook per kernel: gives host descriptors the config's tile.
TILE_SHAPES = {"dkdv": _set_dkdv_tiles, "dq": _set_dq_tiles}


def _autotuned(kernel, name, configs, dp_after_dv_configs=()):
    return triton.autotune(
        configs=[triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=s, num_warps=w,
                               pre_hook=TILE_SHAPES[name]) for bm, bn, s, w in configs]
        + [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "DP_AFTER_DV": True}, num_stages=s, num_warps=w,
                         pre_hook=TILE_SHAPES[name]) for bm, bn, s, w in dp_after_dv_configs],
        key=["Q_BUCKET", "K_BUCKET", "HEAD_DIM", "HAS_SEQ_LENS", "IS_VARLEN", "HAS_LEFT", "HAS_RIGHT", "KV_GROUP",
             "HAS_SOFTCAP", "HAS_ALIBI", "HAS_DROPOUT", "DOT_PRECISION", "TMA"],
        prune_configs_by={"early_config_prune": _pruner(name)},
    )(kernel)


#: The two main kernels with block sizes, warps and stages chosen by benchmarking on the GPU.
#: They only store (no accumulation into their outputs), so the autotuner's repeated runs are harmless.
attention_bwd_dkdv_kernel_autotuned = _autotuned(attention_bwd_dkdv_kernel, "dkdv", DKDV_GPU_CONFIGS,
                                                  DKDV_DP_AFTER_DV_CONFIGS)
attention_bwd_dq_kernel_autotuned = _autotuned(attention_bwd_dq_kernel, "dq", DQ_GPU_CONFIGS)


def _launch_fixed(kernel, grid, positional, args, block_m, block_n, block_d, elem_bytes):
    """Launch with given block sizes: the deepest pipeline (3 stages at most) that fits shared memory.

    ``smem_bytes`` is an estimate; should Triton still refuse a config for shared memory
    (it does so when compiling, before anything runs), the next shallower one is tried.
    """
    fn = attention_bwd_dkdv_kernel if kernel == "dkdv" else attention_bwd_dq_kernel
    accumulators = 2 * block_n * block_d if kernel == "dkdv" else block_m * block_d
    budget = smem_budget()
    stages = [s for s in (3, 2) if smem_bytes(kernel, block_m, block_n, block_d, s, elem_bytes) <= budget] + [1]
    TILE_SHAPES[kernel](dict(zip(("Q", "K", "V", "DO"), positional), BLOCK_M=block_m, BLOCK_N=block_n,
                             BLOCK_D=block_d))
    if kernel == "dkdv":  # fixed blocks (the interpreter, tests): the order by head dim, as the autotuner's
        args = dict(args, DP_AFTER_DV=dp_after_dv(block_d, args["HAS_RIGHT"]))
    for i, num_stages in enumerate(stages):
        try:
            launch(fn, grid, *positional, **args, BLOCK_M=block_m, BLOCK_N=block_n,
                   num_stages=num_stages, num_warps=4 if accumulators <= 4096 * 4 else 8)
            return
        except OutOfResources:
            if i == len(stages) - 1:
                raise


def _gluon_preferred(rule, q: torch.Tensor, k: torch.Tensor, causal: bool, dropout: bool) -> bool:
    """``rule`` (:func:`.attention_bwd_hopper.preferred` or :func:`.attention_bwd_hopper.dq_preferred`) for
    (B, H, N, D) q and k on a GPU, with dropout or not."""
    batch, heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    return rule(head_dim, n_q, n_k, scores_of(batch, heads, n_q, n_k, causal), dropout=dropout)


def launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec: AttentionSpec = AttentionSpec(), *,
                              seq_lens: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
                              block_m: int | None = None, block_n: int | None = None,
                              cu_seqlens_q: torch.Tensor | None = None, cu_seqlens_k: torch.Tensor | None = None,
                              max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                              use_tma: bool | None = None, dropout_seed: torch.Tensor | None = None,
                              use_gluon: bool | None = None):
    """Fill dq (if not None) and dk, dv (if not None) for checked (B, H, N, D) tensors, any strides.

    q, o, do, dq: (B, H, N_q, D); k, v, dk, dv: (B, H_kv, N_k, D); lse: (B, H, N_q) contiguous
    float32 from the forward; ``spec``, ``alibi_slopes`` and ``dropout_seed`` those of the forward (the
    same seed recomputes the forward's dropout mask; see ``launch_attention_forward``). Arguments are *not* checked
    here (:mod:`flashlib.attention` does it).
    Block sizes: given ones (for both kernels), else the interpreter's fixed ones, else
    autotuned on the GPU (each kernel its own). Returns D = rowsum(dO * O) (B, H, N_q) float32.

    Packed sequences (``cu_seqlens_q`` given), as in ``launch_attention_forward``: q, o, do, dq
    (total_q, H, D), k, v, dk, dv (total_k, H_kv, D), lse (H, total_q); returns D (H, total_q).

    ``use_tma``: the streamed tiles (Q and dO of dK/dV, K and V of dQ) come through host tensor
    descriptors, by default where head_dim >= 128 (:data:`TMA_MIN_BLOCK_D`), the device and the tensors
    allow it and the batch is not padded or packed (a host descriptor bounds rows by N only; padded rows must not be
    read).
    ``False`` forces the pointer path (tests compare the two).

    ``use_gluon``: dK and dV, and dQ, of a plain call (no mask or a causal one, dropout or not, nothing else) that
    :func:`.attention_bwd_hopper.can_run` accepts come from the warp-specialized Gluon kernels of
    :mod:`.attention_bwd_hopper` where each is the faster one (:func:`.attention_bwd_hopper.preferred`,
    :func:`.attention_bwd_hopper.dq_preferred`) by default; ``True`` wherever they can run, ``False`` never
    (``use_tma=False`` also keeps the Triton kernels). D always comes from the Triton preprocess kernel. Either way
    no atomics: gradients repeat bitwise.
    """
    varlen = cu_seqlens_q is not None
    # asked before use_tma and block_m take their defaults below (a Gluon kernel covers neither choice)
    plain = use_gluon is not False and bwd_hopper.covers(spec, use_tma, cu_seqlens_q, seq_lens, alibi_slopes, block_m)
    o_rows, do_rows = o, do  # what the preprocess reads, (B, H, N_q, D)
    if varlen:
        # D = rowsum(dO * O) is per row, blind to sequences: one sample of all the packed rows.
        o_rows, do_rows = packed_as_bhnd(o, 1), packed_as_bhnd(do, 1)
        q, k, v, do, dq, dk, dv = (None if t is None else packed_as_bhnd(t, cu_seqlens_q.shape[0] - 1)
                                   for t in (q, k, v, do, dq, dk, dv))
    batch, heads, n_q, head_dim = q.shape
    kv_heads, n_k = k.shape[1], k.shape[2]
    rows_q, rows_k = (max_seqlen_q, max_seqlen_k) if varlen else (n_q, n_k)  # per (batch, head)
    left, right = spec.bounds(max(n_q, n_k))  # packed: n_q, n_k are the totals, past every sequence
    alibi, alibi_strides, scalars, flags = modifier_args(spec, alibi_slopes, head_dim, lse, dropout_seed)
    block_d = max(16, power_of_two_at_least(head_dim))
    if use_tma is None:  # measured: a gain from head_dim 128 only (benchmarks/TUNING.md, sixth finding)
        use_tma = (block_d >= TMA_MIN_BLOCK_D and descriptors_supported(q.device)
                   and all(descriptor_ready(t) for t in (q, k, v, do)))
    tma = "host" if use_tma and seq_lens is None and not varlen else "none"

    delta = torch.empty((o_rows.shape[0], heads, n_q), dtype=torch.float32, device=q.device)
    launch(attention_bwd_preprocess_kernel, (ceil_div(n_q, PREPROCESS_BLOCK_M), o_rows.shape[0] * heads),
        o_rows, do_rows, delta, *o_rows.stride(), *do_rows.stride(), heads, n_q,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=PREPROCESS_BLOCK_M, num_warps=4 if block_d <= 128 else 8)
    if varlen:
        delta = delta[0]  # (H, total_q), the layout of lse

    args = dict(
        H=heads, KV_GROUP=heads // kv_heads, N_CTX_Q=n_q, N_CTX_K=n_k,
        WINDOW_LEFT=left or 0, WINDOW_RIGHT=right or 0,
        Q_BUCKET=power_of_two_at_least(rows_q), K_BUCKET=power_of_two_at_least(rows_k),
        HEAD_DIM=head_dim, BLOCK_D=block_d,
        HAS_SEQ_LENS=seq_lens is not None, IS_VARLEN=varlen,
        HAS_LEFT=left is not None, HAS_RIGHT=right is not None, **flags,
        DOT_PRECISION=runtime.dot_precision(q.dtype), TMA=tma,
    )
    modifiers = (alibi, *scalars)
    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())
    if (plain and dk is not None and bwd_hopper.can_run(q, k, v, do, dk, dv, scale=spec.scale(head_dim))
            and (use_gluon or _gluon_preferred(bwd_hopper.preferred, q, k, right == 0, spec.dropout_p > 0))):
        bwd_hopper.launch_attention_dkdv_hopper(q, k, v, do, lse, delta, dk, dv, scale=spec.scale(head_dim),
                                                causal=right == 0, **gluon_dropout_args(spec, dropout_seed, lse))
        dk = None  # done
    if (plain and dq is not None and bwd_hopper.can_run(q, k, v, do, dq, scale=spec.scale(head_dim))
            and (use_gluon or _gluon_preferred(bwd_hopper.dq_preferred, q, k, right == 0, spec.dropout_p > 0))):
        bwd_hopper.launch_attention_dq_hopper(q, k, v, do, lse, delta, dq, scale=spec.scale(head_dim),
                                              causal=right == 0, **gluon_dropout_args(spec, dropout_seed, lse))
        dq = None  # done
    if block_m is None and runtime.INTERPRET:
        block_m, block_n = INTERPRETER_BLOCKS["BLOCK_M"], INTERPRETER_BLOCKS["BLOCK_N"]
    jobs = []
    if dk is not None:
        q_src, do_src = tile_sources(tma, (q, do))
        jobs.append(("dkdv", (q_src, k, v, do_src, lse, delta, dk, dv, seq_lens, cu_seqlens_q, cu_seqlens_k,
                              *modifiers, *strides, *dk.stride(), *dv.stride(), *alibi_strides),
                     lambda bn: (ceil_div(rows_k, bn), batch * kv_heads)))
    if dq is not None:
        k_src, v_src = tile_sources(tma, (k, v))
        jobs.append(("dq", (q, k_src, v_src, do, lse, delta, dq, seq_lens, cu_seqlens_q, cu_seqlens_k,
                            *modifiers, *strides, *dq.stride(), *alibi_strides),
                     lambda bm: (ceil_div(rows_q, bm), batch * heads)))
    dq_args = dict(args, LONGEST_FIRST=longest_first(left, right))  # dQ's query blocks, as the forward's
    for kernel, positional, grid_of in jobs:
        program_block = "BLOCK_N" if kernel == "dkdv" else "BLOCK_M"
        kernel_args = args if kernel == "dkdv" else dq_args
        if block_m is not None:
            grid = grid_of(block_n if kernel == "dkdv" else block_m)
            _launch_fixed(kernel, grid, positional, kernel_args, block_m, block_n, block_d, q.element_size())
        else:
            tuned = attention_bwd_dkdv_kernel_autotuned if kernel == "dkdv" else attention_bwd_dq_kernel_autotuned
            launch_tuned(tuned, lambda meta, g=grid_of, b=program_block: g(meta[b]), *positional, **kernel_args)
    return delta
