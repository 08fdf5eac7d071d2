"""FlashAttention forward in Triton (FlashAttention-2 loop order).

One program computes one BLOCK_M block of query rows of one (batch, head). It
loops over blocks of BLOCK_N keys, keeping for every row a running max ``m``, a
running sum ``l`` and an unnormalised output ``acc``, all in float32 (the
online softmax). At the end ``O = acc / l`` and the row logsumexp
``L = m + log(l)`` (natural log, as ``flashlib.reference`` and the backward use)
are written. The exponentials use ``exp2`` with ``log2(e) * scale`` folded into
the scores, which saves one multiply per score.

Masks (semantics of :mod:`flashlib.reference`): every mask used here is a band,
query row ``i`` (at key position ``i' = i + N_k - N_q``, bottom-right aligned)
sees keys ``i' - left <= j <= i' + right`` and ``j < seq_len``. So for a block of
rows, the visible keys form one interval and the kernel never visits a key
block outside it (block early exit: blocks above the causal diagonal, left of a
sliding window, or past a sample's length are not loaded). Inside that interval
the blocks that every row sees whole need no element mask; only the blocks that
cut the band's edges do. The loop is therefore split in three stages::

    key blocks:  [lo, full_lo)    [full_lo, full_hi)    [full_hi, hi)
                 masked           no mask at all        masked
                 (window's left   (the fast path)       (diagonal, window's
                  edge)                                  right edge, N_k or
                                                         seq_len tail)

Precision: q @ k^T and p @ v accumulate in float32. With float16/bfloat16
inputs ``p`` is cast to v's dtype before the second ``tl.dot``, as every
FlashAttention does (tensor cores take 16-bit operands). With float32 inputs
``tl.dot`` runs at ``DOT_PRECISION`` (:func:`flashlib.runtime.dot_precision`): full
float32 unless torch's float32 matmul setting allows TF32 (10-bit mantissa).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime
from ..integer_math import ceil_div, power_of_two_at_least
from ..spec import AttentionSpec
from ._common import (INTERPRETER_BLOCKS, LN2, LOG2E, band_mask, descriptor_mode, descriptor_ready,
                      descriptors_supported, key_block_range, load_rows, packed_as_bhnd, row_stats_offset,
                      sample_bounds, scores_log2, set_block_shapes, store_rows, tensor_of, tile_sources,
                      use_torch_scratch)
from . import attention_fwd_hopper as hopper
from .dropout import dropout_keep, dropout_stream_key, effective_dropout_p, load_dropout_seed
from .launch import launch, launch_tuned


@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, k_src, v_src, off_b, off_kvh, start, end,
                    stride_kn, stride_kd, stride_vn, stride_vd,
                    offs_m, m0, offs_d, k_len, offset, window_left, window_right,
                    score_scale, softcap_scale, slope_log2, dropout_key, dropout_p,
                    tile_ptr,
                    MASKED: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                    EVEN_D: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, RECORD_TILES: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, TMA: tl.constexpr, NEGATIVE_SCALE: tl.constexpr,
                    BLOCK_N: tl.constexpr, V_TRANSPOSED: tl.constexpr = False):
    """Online-softmax update of (acc, l_i, m_i) over the key blocks [start, end).

    ``MASKED`` blocks get an element mask (band edges, key tail) and loads masked
    on ``j < k_len``; unmasked blocks are read and used as they are. ``l_i`` sums the
    weights before dropout (the softmax's denominator); ``acc`` sums only the kept ones.
    ``k_src``, ``v_src`` are K and V as the kernel's ``TMA`` mode has them (see
    :func:`load_rows`); with descriptors the copy engine zero-fills past the rows, so
    masked and unmasked blocks load alike. Pointers are walked through the strides.
    ``V_TRANSPOSED`` (FP8 with host descriptors): ``v_src`` is a (B, H, D, N) descriptor, V stored with
    N contiguous, as FP8 tensor cores need P V's reduction dimension contiguous; tiles are read
    (BLOCK_D, BLOCK_N) and transposed in place.
    """
    offs_n = tl.arange(0, BLOCK_N)
    PLAIN: tl.constexpr = not (HAS_SOFTCAP or HAS_ALIBI)
    if TMA == "none":
        # K^T tile (BLOCK_D, BLOCK_N) and V tile (BLOCK_N, BLOCK_D) of the first block, through strides.
        k_ptrs = k_src + (start + offs_n)[None, :] * stride_kn + offs_d[:, None] * stride_kd
        v_ptrs = v_src + (start + offs_n)[:, None] * stride_vn + offs_d[None, :] * stride_vd
    rows = offs_m[:, None] + offset  # i' = i + N_k - N_q (bottom-right alignment)
    for start_n in range(start, end, BLOCK_N):
        cols = start_n + offs_n
        if TMA != "none":
            k = load_rows(k_src, off_b, off_kvh, start_n, TMA, BLOCK_N, BLOCK_D).T
            if V_TRANSPOSED:
                v = v_src.load([off_b, off_kvh, 0, start_n]).reshape(BLOCK_D, BLOCK_N).T
            else:
                v = load_rows(v_src, off_b, off_kvh, start_n, TMA, BLOCK_N, BLOCK_D)
        elif MASKED:
            k = tl.load(k_ptrs, mask=(cols[None, :] < k_len) & (offs_d[:, None] < HEAD_DIM), other=0.0)
            v = tl.load(v_ptrs, mask=(cols[:, None] < k_len) & (offs_d[None, :] < HEAD_DIM), other=0.0)
        elif EVEN_D:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        else:
            k = tl.load(k_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
            v = tl.load(v_ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)

        qk = tl.dot(q, k, input_precision=DOT_PRECISION)
        if MASKED or not PLAIN:
            # scores in log2 units, formed before the mask (a zero scale meets no -inf)
            qk, _ = scores_log2(qk, rows, cols[None, :], score_scale, softcap_scale, slope_log2,
                                HAS_SOFTCAP, HAS_ALIBI)
            if MASKED:
                visible = band_mask(rows, cols[None, :], k_len, window_left, window_right, HAS_LEFT, HAS_RIGHT)
                qk = tl.where(visible, qk, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            # A row with no visible key so far keeps m = -inf; subtract 0 instead so that
            # exp2(-inf - (-inf)) = NaN never happens: its p and alpha are then exactly 0.
            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)
            qk = qk - m_sub[:, None]
        else:
            # Every score is finite here. The max is taken on the raw scores and the scale
            # folded into one FMA per score: max(c * x) = c * max(x) for c >= 0, c * min(x) for c < 0.
            if NEGATIVE_SCALE:
                m_new = tl.maximum(m_i, tl.min(qk, 1) * score_scale)
            else:
                m_new = tl.maximum(m_i, tl.max(qk, 1) * score_scale)
            m_sub = m_new
            qk = qk * score_scale - m_sub[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_sub)  # rescale of what was accumulated so far
        l_i = l_i * alpha + tl.sum(p, 1)
        if HAS_DROPOUT:
            p = tl.where(dropout_keep(dropout_key, m0, start_n, dropout_p, offs_m.shape[0], BLOCK_N), p, 0.0)
        # Rescale, then let the tensor cores add P V into acc in place (no second accumulator).
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
        if RECORD_TILES:
            tl.store(tile_ptr + start_n // BLOCK_N, 2 if MASKED else 1)
        if TMA == "none":
            k_ptrs += BLOCK_N * stride_kn
            v_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i


@triton.jit
def attention_fwd_kernel(
    Q, K, V, O, LSE, SEQ_LENS, CU_SEQLENS_Q, CU_SEQLENS_K, ALIBI, TILES, DESCALE, sm_scale, SOFTCAP,
    DROPOUT_P, DROPOUT_SEED,
    stride_qb, stride_qh, stride_qn, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_on, stride_od,
    stride_ab, stride_ah,
    H, KV_GROUP, N_CTX_Q, N_CTX_K, WINDOW_LEFT, WINDOW_RIGHT, DESCALE_STRIDE,
    Q_BUCKET, K_BUCKET,  # only keys for the autotuner (N rounded up to a power of two)
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_SEQ_LENS: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    RECORD_TILES: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr, NEGATIVE_SCALE: tl.constexpr,
    K_MULTIPLE_OF_128: tl.constexpr, FP8: tl.constexpr, V_TRANSPOSED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    LONGEST_FIRST: tl.constexpr = False,
):
    """O, LSE for query block ``program_id(0)`` of (batch, head) ``program_id(1)``, or, with
    ``LONGEST_FIRST``, for block ``num_programs(0) - 1 - program_id(0)``: under a causal mask the
    last query blocks see the most keys, and programs start in grid order, so the longest run first
    and the short ones fill the tail (:data:`LONGEST_FIRST`).

    Q, K, V, O are (B, H, N, D) through their strides (any layout); K, V have
    ``H // KV_GROUP`` heads (GQA: query head h reads kv head h // KV_GROUP).
    LSE is (B, H, N_q) contiguous float32. SEQ_LENS (B,) int32 when HAS_SEQ_LENS.
    IS_VARLEN (packed sequences): Q, O hold total_q rows and K, V total_k rows, with
    batch strides 0; sequence b is rows cu_seqlens[b] to cu_seqlens[b + 1] (CU_SEQLENS_Q,
    CU_SEQLENS_K, (B + 1,) int32); N_CTX_Q = total_q; LSE is (H, total_q).
    TILES (B*H, cdiv(N_q, BLOCK_M), cdiv(N_k, BLOCK_N)) int8 when RECORD_TILES:
    1 for a block visited without mask, 2 with mask (skipped blocks untouched).
    Score modifiers (:class:`flashlib.spec.AttentionSpec`): SOFTCAP > 0 when HAS_SOFTCAP;
    ALIBI slopes float32 at ``b * stride_ab + h * stride_ah`` when HAS_ALIBI; dropout of
    probability DROPOUT_P when HAS_DROPOUT (:mod:`.dropout`), its seed the int64 at DROPOUT_SEED
    (read on the device, so a CUDA graph's replays can each draw their own).
    TMA (Hopper and later, 16-byte aligned rows, unit stride along D): Q, K, V, O move
    through tensor descriptors. ``"host"``: Q, K, V, O *are* (B, H, N, D) descriptors made
    by the launcher (no padding, nothing packed). ``"device"``: the program makes one per
    sample and head, bounded by the sample's rows (``n_q``, ``k_len``), so padding is
    never read. ``"none"``: pointers.
    FP8: Q, K, V are float8 (e4m3), O float16/bfloat16; DESCALE is float32 (3, B, H_kv) contiguous,
    the q, k and v descale factors of each (sample, kv head): scores are scaled by q's times k's,
    O by v's, and P enters the tensor cores as float8 too. V_TRANSPOSED: see :func:`_attn_fwd_inner`.
    """
    start_m = tl.program_id(0)
    if LONGEST_FIRST:
        start_m = tl.num_programs(0) - 1 - start_m
    off_hz = tl.program_id(1)
    off_b = off_hz // H
    off_h = off_hz % H
    off_kvh = off_h // KV_GROUP
    if TMA != "host":
        # 64-bit base offsets: B * H * N * D may exceed 2**31 elements.
        q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
        k_base = K + off_b.to(tl.int64) * stride_kb + off_kvh.to(tl.int64) * stride_kh
        v_base = V + off_b.to(tl.int64) * stride_vb + off_kvh.to(tl.int64) * stride_vh
        o_base = O + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh

    q_start, n_q, q_len, k_start, n_k, k_len = sample_bounds(
        off_b, SEQ_LENS, CU_SEQLENS_Q, CU_SEQLENS_K, N_CTX_Q, N_CTX_K, HAS_SEQ_LENS, IS_VARLEN)
    offset = n_k - n_q
    if IS_VARLEN:
        if start_m * BLOCK_M >= n_q:  # a block past this sequence's end (grid sized for the longest)
            return
        q_base += q_start * stride_qn
        o_base += q_start * stride_on
        k_base += k_start * stride_kn
        v_base += k_start * stride_vn

    # The key interval [lo, hi) seen by the valid rows of this block, and the part
    # [full_lo, full_hi) of it that every valid row sees whole.
    m0 = start_m * BLOCK_M
    lo, full_lo, full_hi, hi = key_block_range(m0, q_len, k_len, offset, WINDOW_LEFT, WINDOW_RIGHT,
                                                HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N)

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    EVEN_D: tl.constexpr = BLOCK_D == HEAD_DIM
    if TMA == "host":
        k_src = K
        v_src = V
        q = load_rows(Q, off_b, off_h, m0, TMA, BLOCK_M, BLOCK_D)
    elif TMA == "device":
        # Descriptor shapes are at least 1 row: a sample with no keys never loads any.
        k_src = tl.make_tensor_descriptor(k_base, shape=[tl.maximum(k_len, 1), HEAD_DIM], strides=[stride_kn, 1],
                                          block_shape=[BLOCK_N, BLOCK_D])
        v_src = tl.make_tensor_descriptor(v_base, shape=[tl.maximum(k_len, 1), HEAD_DIM], strides=[stride_vn, 1],
                                          block_shape=[BLOCK_N, BLOCK_D])
        q_desc = tl.make_tensor_descriptor(q_base, shape=[tl.maximum(n_q, 1), HEAD_DIM], strides=[stride_qn, 1],
                                           block_shape=[BLOCK_M, BLOCK_D])
        q = load_rows(q_desc, off_b, off_h, m0, TMA, BLOCK_M, BLOCK_D)
    else:
        k_src = k_base
        v_src = v_base
        q_ptrs = q_base + offs_m[:, None] * stride_qn + offs_d[None, :] * stride_qd
        q = tl.load(q_ptrs, mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < HEAD_DIM), other=0.0)

    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    v_descale = 1.0
    if FP8:  # S = (q_descale q8)(k_descale k8)^T: fold both into the softmax scale
        descale = DESCALE + off_b * (H // KV_GROUP) + off_kvh
        sm_scale = sm_scale * tl.load(descale) * tl.load(descale + DESCALE_STRIDE)
        v_descale = tl.load(descale + 2 * DESCALE_STRIDE)
    if HAS_SOFTCAP:
        score_scale = SOFTCAP * LOG2E
        softcap_scale = sm_scale / SOFTCAP
    else:
        # q stays as loaded (in shared memory, where the tensor cores read it): a negative
        # scale is handled in the row max instead (NEGATIVE_SCALE).
        score_scale = sm_scale * LOG2E
        softcap_scale = 1.0
    slope_log2 = 0.0
    if HAS_ALIBI:
        slope_log2 = tl.load(ALIBI + off_b * stride_ab + off_h * stride_ah).to(tl.float32) * LOG2E
    # dropout's key: one per (sample, head)
    dropout_key = dropout_stream_key(load_dropout_seed(DROPOUT_SEED, HAS_DROPOUT), off_b * H + off_h)
    tile_ptr = TILES
    if RECORD_TILES:
        tile_ptr = TILES + (off_hz * tl.cdiv(N_CTX_Q, BLOCK_M) + start_m) * tl.cdiv(N_CTX_K, BLOCK_N)

    if HAS_LEFT:  # stage 1: blocks cut by the window's left edge
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_src, v_src, off_b, off_kvh, lo, full_lo, stride_kn, stride_kd, stride_vn, stride_vd,
            offs_m, m0, offs_d, k_len, offset, WINDOW_LEFT, WINDOW_RIGHT,
            score_scale, softcap_scale, slope_log2, dropout_key, DROPOUT_P, tile_ptr,
            True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, EVEN_D, HEAD_DIM, BLOCK_D, RECORD_TILES,
            DOT_PRECISION, TMA, NEGATIVE_SCALE, BLOCK_N, V_TRANSPOSED)
    # stage 2: blocks every row sees whole, no mask
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, k_src, v_src, off_b, off_kvh, full_lo, full_hi, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, m0, offs_d, k_len, offset, WINDOW_LEFT, WINDOW_RIGHT,
        score_scale, softcap_scale, slope_log2, dropout_key, DROPOUT_P, tile_ptr,
        False, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, EVEN_D, HEAD_DIM, BLOCK_D, RECORD_TILES,
        DOT_PRECISION, TMA, NEGATIVE_SCALE, BLOCK_N, V_TRANSPOSED)
    # stage 3: the diagonal / window's right edge, and the key tail (N_k or seq_len). With no
    # right edge and N_k a multiple of 128 (so of a BLOCK_N that divides 128) it is empty: it is
    # then not even compiled, which spares its registers (the masked loop needs more than the plain one).
    if HAS_RIGHT or HAS_SEQ_LENS or IS_VARLEN or not K_MULTIPLE_OF_128 or 128 % BLOCK_N != 0:
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, k_src, v_src, off_b, off_kvh, full_hi, hi, stride_kn, stride_kd, stride_vn, stride_vd,
            offs_m, m0, offs_d, k_len, offset, WINDOW_LEFT, WINDOW_RIGHT,
            score_scale, softcap_scale, slope_log2, dropout_key, DROPOUT_P, tile_ptr,
            True, HAS_LEFT, HAS_RIGHT, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, EVEN_D, HEAD_DIM, BLOCK_D, RECORD_TILES,
            DOT_PRECISION, TMA, NEGATIVE_SCALE, BLOCK_N, V_TRANSPOSED)

    # Rows with no visible key (l = 0) and rows past the sample's length: O = 0, L = -inf.
    # A NaN score makes l NaN, and NaN != 0: it reaches O and L, as in PyTorch.
    valid = (offs_m < q_len) & (l_i != 0.0)
    l_safe = tl.where(valid, l_i, 1.0)
    if HAS_DROPOUT:
        l_safe = l_safe * (1.0 - DROPOUT_P)  # kept weights are scaled by 1 / (1 - p)
    # The zeros of such rows are selected in float32, before the division: selected after it, the
    # compiler moved the select past the packing of O to 16 bits, at two byte permutes and two
    # selects per pair of elements. Without a mask or lengths every stored row sees every key
    # (l >= 1, or NaN), and there is nothing to select (benchmarks/TUNING.md, twenty-first finding).
    EVERY_ROW_SEES_KEYS: tl.constexpr = not (HAS_LEFT or HAS_RIGHT or HAS_SEQ_LENS or IS_VARLEN)
    if not EVERY_ROW_SEES_KEYS:
        acc = tl.where(valid[:, None], acc, 0.0)
    if FP8:
        out = acc * (v_descale / l_safe)[:, None]
    else:
        out = acc / l_safe[:, None]
    lse = tl.where(valid, (m_i + tl.math.log2(tl.where(valid, l_i, 1.0))) * LN2, float("-inf"))
    if TMA == "host":
        store_rows(O, off_b, off_h, m0, out.to(O.dtype), TMA, BLOCK_M, BLOCK_D)
    elif TMA == "device":
        o_desc = tl.make_tensor_descriptor(o_base, shape=[tl.maximum(n_q, 1), HEAD_DIM], strides=[stride_on, 1],
                                           block_shape=[BLOCK_M, BLOCK_D])
        store_rows(o_desc, off_b, off_h, m0, out.to(O.dtype.element_ty), TMA, BLOCK_M, BLOCK_D)
    else:
        o_ptrs = o_base + offs_m[:, None] * stride_on + offs_d[None, :] * stride_od
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < HEAD_DIM))
    lse_base = LSE + row_stats_offset(off_b, off_h, H, N_CTX_Q, q_start, IS_VARLEN)
    tl.store(lse_base + offs_m, lse, mask=offs_m < n_q)


#: Autotune candidates (BLOCK_M, BLOCK_N, num_stages, num_warps), fourteen points of the
#: space of Triton's fused-attention tutorial (BLOCK_M 64/128, BLOCK_N 32..128, 2-4
#: stages, 4/8 warps) that do well on Ampere and Hopper; few, since each one compiles.
#: 128 x 64 with 4 warps joined when Q stopped taking registers (benchmarks/TUNING.md).
GPU_CONFIGS = [
    (128, 128, 3, 8), (128, 128, 2, 8), (128, 128, 4, 8),
    (128, 64, 3, 8), (128, 64, 4, 8), (128, 64, 4, 4), (128, 64, 3, 4), (128, 64, 2, 4), (64, 128, 3, 4),
    (128, 32, 4, 4),
    (64, 64, 4, 4), (64, 64, 3, 4), (64, 64, 2, 4),
    (64, 32, 4, 4),
]


#: Which block size each tile argument's rows take (host descriptors get their block shapes from it).
TILE_ROWS = {"Q": "BLOCK_M", "K": "BLOCK_N", "V": "BLOCK_N", "O": "BLOCK_M"}


def _set_tile_shapes(nargs):
    set_block_shapes(nargs, TILE_ROWS)
    if nargs.get("V_TRANSPOSED") and hasattr(nargs["V"], "block_shape"):  # a (B, H, D, N) descriptor
        nargs["V"].block_shape = [1, 1, nargs["BLOCK_D"], nargs["BLOCK_N"]]


#: Autotune candidates compiled with at most :data:`REGISTER_CAP` registers a thread, so that two programs of
#: 8 warps share an SM: while one program's two warpgroups run their softmax, the other's can keep the tensor
#: cores busy, the overlap FlashAttention-3 builds from two ping-ponging warpgroups. Measured on the H100 (fp16,
#: FA2 shapes, each config alone in a CUDA graph: ``benchmarks/fwd_two_per_sm.py``, TUNING twenty-seventh
#: finding): at D = 64 without a mask, 128 x 128 tiles with 2 stages take 156 registers uncapped (one program an
#: SM: 249-329 TFLOP/s) and 124 capped, without a spill (390-443, 1.06-1.09x the autotuned forward of the same
#: run); causal, they spill 8 registers and tie or lose (0.95-1.02x the best uncapped config). At D = 128 the same
#: cap spills 128 x 128 tiles (1184 B) and makes 128 x 64 ones slower than the 128 x 128 tiles the autotuner picks
#: there. Causal at D = 64 again in session 67 (Triton 3.6, H100; TUNING sixtieth finding): still 8 registers spilled,
#: alone 1.01-1.05x the autotuned forward from 4k rows and 0.90x at 1k, and offered to the autotuner it left the
#: causal grid where it was. So these configs are tried only where they won: head dims up to 64, 2-byte types, no
#: band (no causal mask or window: :func:`_prune_configs`).
REGISTER_CAPPED_CONFIGS = [(128, 128, 2, 8)]
REGISTER_CAP = 128
REGISTER_CAPPED_MAX_HEAD_DIM = 64


def _gpu_configs():
    plain = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=stages, num_warps=warps,
                           pre_hook=_set_tile_shapes)
             for bm, bn, stages, warps in GPU_CONFIGS]
    capped = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_stages=stages, num_warps=warps,
                            maxnreg=REGISTER_CAP, pre_hook=_set_tile_shapes)
              for bm, bn, stages, warps in REGISTER_CAPPED_CONFIGS]
    return plain + capped


def smem_budget() -> int:
    """Shared memory one program may use: the GPU's opt-in limit, else 160 KB (fits an A100)."""
    if runtime.INTERPRET or not torch.cuda.is_available():
        return 160 * 1024
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(props, "shared_memory_per_block_optin", 160 * 1024)


def smem_bytes(block_m: int, block_n: int, block_d: int, stages: int, elem_bytes: int) -> int:
    """Shared memory of one program: the Q tile and ``stages`` buffers of K and V tiles.

    (Triton 3.6 on an H100 asked for exactly this: 262144 bytes for float32, d=256,
    64 x 32 blocks, 3 stages.)
    """
    return elem_bytes * block_d * (block_m + 2 * block_n * stages)


def _fits(bm, bn, stages, warps, block_d, elem_bytes, q_bucket, budget) -> bool:
    """Whether a config fits registers and shared memory for this head_dim, and fits N_q."""
    if bm * block_d > 4096 * warps:  # acc alone would take > 128 fp32 registers per thread
        return False
    if smem_bytes(bm, bn, block_d, stages, elem_bytes) > budget:
        return False
    return bm <= max(64, q_bucket)  # no 128-row blocks for short queries (decoding)


#: Full-float32 ``tl.dot`` ("ieee") runs on the CUDA cores, not the tensor cores: large tiles
#: spill registers and take minutes to compile. On an H100, 32 x 32 blocks compiled in 3-7 s
#: and ran fastest or within 10% of the fastest at head_dim 32-128, forward and backward, while
#: 128 x 128 took 20-150 s and ran 5-20x slower (benchmarks/TUNING.md). Full float32 uses them alone.
FULL_FLOAT32_BLOCKS = (32, 32)


def full_float32_config(args: dict, smem_of) -> triton.Config | None:
    """The one config of a full-float32 launch (no autotuning), or None for tensor-core dots.

    ``smem_of(block_m, block_n, stages)`` is the kernel's shared memory: the deepest
    pipeline (3 stages at most) that fits is taken.
    """
    if args["DOT_PRECISION"] != "ieee" or tensor_of(args["Q"]).element_size() != 4:
        return None
    block_m, block_n = FULL_FLOAT32_BLOCKS
    stages = next((s for s in (3, 2) if smem_of(block_m, block_n, s) <= smem_budget()), 1)
    return triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_stages=stages, num_warps=4)


def _prune_configs(configs, named_args, **kwargs):
    """Triton's early_config_prune hook: drop configs that cannot fit or do not fit N_q.

    Triton passes positional arguments in ``named_args`` and keyword ones in ``kwargs``.
    """
    args = {**named_args, **kwargs}
    only = full_float32_config(args, lambda bm, bn, stages: smem_bytes(bm, bn, args["BLOCK_D"], stages, 4))
    if only is not None:
        only.pre_hook = _set_tile_shapes
        return [only]
    shape = (args["BLOCK_D"], tensor_of(args["Q"]).element_size(), args["Q_BUCKET"], smem_budget())
    # register-capped configs only where they were measured to win (REGISTER_CAPPED_CONFIGS)
    capped_wins = (shape[0] <= REGISTER_CAPPED_MAX_HEAD_DIM and shape[1] == 2
                   and not (args.get("HAS_LEFT") or args.get("HAS_RIGHT")))
    kept = [c for c in configs
            if _fits(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_stages, c.num_warps, *shape)
            and (c.maxnreg is None or capped_wins)]
    return kept or [triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_stages=1, num_warps=4,
                                  pre_hook=_set_tile_shapes)]


#: The kernel with BLOCK_M, BLOCK_N, warps and stages chosen by benchmarking on the GPU,
#: once per (N_q and N_k rounded to powers of two, head_dim, mask kind, float32 precision, dtype).
attention_fwd_kernel_autotuned = triton.autotune(
    configs=_gpu_configs(),
    key=["Q_BUCKET", "K_BUCKET", "HEAD_DIM", "HAS_SEQ_LENS", "IS_VARLEN", "HAS_LEFT", "HAS_RIGHT", "HAS_SOFTCAP",
         "HAS_ALIBI", "HAS_DROPOUT", "DOT_PRECISION", "TMA", "NEGATIVE_SCALE",
         "K_MULTIPLE_OF_128", "FP8", "V_TRANSPOSED"],
    prune_configs_by={"early_config_prune": _prune_configs},
)(attention_fwd_kernel)

MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256

#: Whether grids with a right bound (causal, or a window's right edge without a left one) run their
#: query blocks last to first: those see the most keys, and programs start in grid order, so the
#: longest are dispatched first and the short ones fill the GPU's tail (FlashAttention's "longest
#: processing time first"). benchmarks/schedule_ab.py measures it against grid order.
LONGEST_FIRST = True


def longest_first(left: int | None, right: int | None) -> bool:
    """Whether a grid over query blocks runs them last to first for the band (left, right) of
    ``AttentionSpec.bounds``: with a right bound and no left one, under :data:`LONGEST_FIRST`."""
    return LONGEST_FIRST and right is not None and left is None


def modifier_args(spec: AttentionSpec, alibi_slopes: torch.Tensor | None, head_dim: int, dummy: torch.Tensor,
                  dropout_seed: torch.Tensor | None = None):
    """The kernel arguments of the score modifiers and dropout, shared by the forward and backward launchers:
    ``(ALIBI, (stride_ab, stride_ah), (sm_scale, SOFTCAP, DROPOUT_P, DROPOUT_SEED), flags)`` in the kernels'
    argument order; ``dummy`` stands in for absent slopes and seed. With dropout, DROPOUT_SEED is ``dropout_seed``,
    an int64 tensor on the device whose first element is the seed, or else ``spec.dropout_seed`` copied to one;
    without dropout ``dropout_seed`` is ignored."""
    if alibi_slopes is None:
        alibi, alibi_strides = dummy, (0, 0)
    else:  # (H,) or (B, H) float32: a batch stride of 0 for (H,)
        alibi = alibi_slopes
        alibi_strides = (0, alibi.stride(0)) if alibi.dim() == 1 else tuple(alibi.stride())
    seed = dropout_seed_tensor(spec, dropout_seed, dummy)
    scalars = (spec.scale(head_dim), float(spec.softcap), effective_dropout_p(spec.dropout_p), seed)
    flags = dict(HAS_SOFTCAP=spec.softcap > 0, HAS_ALIBI=alibi_slopes is not None, HAS_DROPOUT=spec.dropout_p > 0)
    return alibi, alibi_strides, scalars, flags


def dropout_seed_tensor(spec: AttentionSpec, dropout_seed: torch.Tensor | None, dummy: torch.Tensor) -> torch.Tensor:
    """The tensor whose first element the kernels read as the dropout seed: ``dropout_seed`` if given, else
    ``spec.dropout_seed`` copied to ``dummy``'s device; ``dummy`` (never read) without dropout."""
    if spec.dropout_p <= 0:
        return dummy
    if dropout_seed is not None:
        return dropout_seed
    return torch.full((1,), spec.dropout_seed, dtype=torch.int64, device=dummy.device)


def gluon_dropout_args(spec: AttentionSpec, dropout_seed: torch.Tensor | None, dummy: torch.Tensor) -> dict:
    """The dropout arguments of the Gluon launchers (:mod:`.attention_fwd_hopper`, :mod:`.attention_bwd_hopper`):
    none without dropout, else the effective p and the seed's tensor, as :func:`modifier_args` gives the Triton
    kernels (the same draws)."""
    if spec.dropout_p <= 0:
        return {}
    return dict(dropout_p=effective_dropout_p(spec.dropout_p),
                dropout_seed=dropout_seed_tensor(spec, dropout_seed, dummy))


def _gluon_preferred(q: torch.Tensor, k: torch.Tensor, causal: bool, dropout: bool, fp8: bool) -> bool:
    """:func:`.attention_fwd_hopper.preferred` for (B, H, N, D) q and k on a GPU, with dropout or not, FP8 or not."""
    batch, heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    scores = hopper.scores_of(batch, heads, n_q, n_k, causal)
    return hopper.preferred(head_dim, n_q, n_k, scores, causal, dropout=dropout, fp8=fp8)


def launch_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             o: torch.Tensor, lse: torch.Tensor, spec: AttentionSpec = AttentionSpec(), *,
                             seq_lens: torch.Tensor | None = None, alibi_slopes: torch.Tensor | None = None,
                             block_m: int | None = None, block_n: int | None = None,
                             tiles: torch.Tensor | None = None,
                             cu_seqlens_q: torch.Tensor | None = None, cu_seqlens_k: torch.Tensor | None = None,
                             max_seqlen_q: int | None = None, max_seqlen_k: int | None = None,
                             use_tma: bool | None = None, descale: torch.Tensor | None = None,
                             dropout_seed: torch.Tensor | None = None, use_gluon: bool | None = None):
    """Run the forward kernel on checked (B, H, N, D) tensors (any strides); fill o and lse.

    q, o: (B, H, N_q, D); k, v: (B, H_kv, N_k, D); lse: (B, H, N_q) contiguous float32.
    ``spec`` says what each query sees and how scores are formed (``alibi_slopes``, (H,)
    or (B, H) float32, comes with ``spec.has_alibi``; ``dropout_seed``, an int64 tensor on q's device,
    overrides ``spec.dropout_seed`` with its first element, read by the kernel: :mod:`flashlib.ops`
    draws it on the device, so the seed never visits the host). Arguments are *not* checked here
    (:mod:`flashlib.attention` does it). Block sizes: given ones, else the interpreter's
    fixed ones, else autotuned on the GPU. ``tiles`` (int8, zeros, (B*H, cdiv(N_q,
    block_m), cdiv(N_k, block_n))) records which key blocks each program visited:
    1 unmasked, 2 masked, 0 skipped.

    Packed sequences (``cu_seqlens_q`` given, :mod:`flashlib.varlen` checks them): q, o are
    (total_q, H, D), k, v (total_k, H_kv, D), any strides; lse (H, total_q); cu_seqlens_q/k
    (B + 1,) int32 on q's device; the grid covers ``max_seqlen_q`` rows per sequence.

    ``use_tma``: move tiles through tensor descriptors (:mod:`flashlib.kernels._common`);
    by default wherever the device and the tensors allow it. ``False`` forces the pointer
    path (tests compare the two).

    ``descale`` (FP8, :mod:`flashlib.fp8` checks it): q, k, v float8_e4m3fn, o float16 or bfloat16,
    descale float32 (3, B, H_kv) contiguous (q, k, v factors). V is best stored with N contiguous
    (``v.stride(2) == 1``): host descriptors then read it as the FP8 tensor cores want it.

    ``use_gluon``: a plain call (no mask or a causal one, dropout or not, FP8 or not; none of the arguments above
    beyond q, k, v, o, lse, ``dropout_seed``, ``descale`` and ``spec``'s mask, scale and dropout) that
    :func:`.attention_fwd_hopper.can_run` accepts runs the warp-specialized Gluon forward of
    :mod:`.attention_fwd_hopper` where it is the faster one (:func:`.attention_fwd_hopper.preferred`, which also
    weighs dropout and FP8) by default; ``True`` wherever it can run, ``False`` never (``use_tma=False`` also keeps
    this kernel). An FP8 V must then be stored keys innermost.
    """
    filled = (o, lse)  # returned as the caller gave them (packed, when varlen)
    causal = spec.bounds()[1] == 0
    fp8 = descale is not None
    plain = hopper.covers(spec, use_tma, cu_seqlens_q, seq_lens, alibi_slopes, tiles, block_m)
    if (use_gluon is not False and plain
            and hopper.can_run(q, k, v.transpose(2, 3) if fp8 else v, o, scale=spec.scale(q.shape[-1]), fp8=fp8)
            and (use_gluon or _gluon_preferred(q, k, causal, spec.dropout_p > 0, fp8))):
        hopper.launch_attention_forward_hopper(q, k, v, o, lse, scale=spec.scale(q.shape[-1]), causal=causal,
                                               descale=descale, **gluon_dropout_args(spec, dropout_seed, lse))
        return filled
    varlen = cu_seqlens_q is not None
    if varlen:
        if tiles is not None:
            raise ValueError("tiles is not recorded for packed sequences (cu_seqlens_q given)")
        q, k, v, o = (packed_as_bhnd(t, cu_seqlens_q.shape[0] - 1) for t in (q, k, v, o))
    batch, heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    rows_q, rows_k = (max_seqlen_q, max_seqlen_k) if varlen else (n_q, n_k)  # per (batch, head)
    left, right = spec.bounds(max(n_q, n_k))  # packed: n_q, n_k are the totals, past every sequence
    alibi, alibi_strides, scalars, flags = modifier_args(spec, alibi_slopes, head_dim, lse, dropout_seed)
    v_transposed = fp8 and v.stride(2) == 1 and v.stride(3) != 1
    v_tiles = v.transpose(2, 3) if v_transposed else v  # what a V descriptor covers
    if use_tma is None:
        use_tma = descriptors_supported(q.device) and all(descriptor_ready(t) for t in (q, k, v_tiles, o))
    tma = descriptor_mode(use_tma, padded=seq_lens is not None or varlen)
    v_transposed = v_transposed and tma == "host"  # pointers read any strides
    if tma == "device":
        use_torch_scratch()
    args = dict(
        H=heads, KV_GROUP=heads // k.shape[1], N_CTX_Q=n_q, N_CTX_K=n_k,
        WINDOW_LEFT=left or 0, WINDOW_RIGHT=right or 0, DESCALE_STRIDE=batch * k.shape[1],
        Q_BUCKET=power_of_two_at_least(rows_q), K_BUCKET=power_of_two_at_least(rows_k),
        HEAD_DIM=head_dim, BLOCK_D=max(16, power_of_two_at_least(head_dim)),
        HAS_SEQ_LENS=seq_lens is not None, IS_VARLEN=varlen,
        HAS_LEFT=left is not None, HAS_RIGHT=right is not None, **flags,
        RECORD_TILES=tiles is not None, DOT_PRECISION=runtime.dot_precision(q.dtype), TMA=tma,
        NEGATIVE_SCALE=scalars[0] < 0, K_MULTIPLE_OF_128=n_k % 128 == 0, FP8=fp8, V_TRANSPOSED=v_transposed,
        LONGEST_FIRST=longest_first(left, right),
    )
    q_src, k_src, v_src, o_src = tile_sources(tma, (q, k, v_tiles if v_transposed else v, o))
    tensors = (q_src, k_src, v_src, o_src, lse, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi, tiles,
               lse if descale is None else descale)
    strides = (*q.stride(), *k.stride(), *v.stride(), *o.stride(), *alibi_strides)
    positional = (*tensors, *scalars, *strides)
    if block_m is None and runtime.INTERPRET:
        block_m, block_n = INTERPRETER_BLOCKS["BLOCK_M"], INTERPRETER_BLOCKS["BLOCK_N"]
    if block_m is not None:
        # Fixed blocks: the deepest pipeline (3 stages at most) that fits shared memory.
        block_d, budget = args["BLOCK_D"], smem_budget()
        stages = next((s for s in (3, 2) if smem_bytes(block_m, block_n, block_d, s, q.element_size()) <= budget), 1)
        grid = (ceil_div(rows_q, block_m), batch * heads)
        _set_tile_shapes(dict(zip("QKVO", positional), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d,
                              V_TRANSPOSED=v_transposed))
        launch(attention_fwd_kernel, grid, *positional, **args, BLOCK_M=block_m, BLOCK_N=block_n,
               num_stages=stages, num_warps=4 if block_m * block_d <= 4096 * 4 else 8)
    else:
        if tiles is not None:
            raise ValueError("tiles needs fixed block sizes: pass block_m and block_n")

        def grid(meta):
            return (ceil_div(rows_q, meta["BLOCK_M"]), batch * heads)

        launch_tuned(attention_fwd_kernel_autotuned, grid, *positional, **args)
    return filled
