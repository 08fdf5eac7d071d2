"""Split-KV attention for decoding (the Flash-Decoding idea), over a contiguous or a paged KV cache.

When a model generates, each step brings one new query (or a few) per sequence and
attends to every cached key. The FlashAttention-2 forward gives one program to each
(batch, query head, block of 128 queries): with one query per sequence that is B·H
programs, and each walks the whole cache alone. One long sequence with 32 heads
is 32 programs on a GPU of 132 SMs, and with GQA every K/V head is read once per
query head of its group. Decoding is bound by the bytes of K/V it reads, so both
waste the GPU. This kernel fixes both:

* **GQA packing.** One program handles every query row of one K/V head: the
  ``GROUP = H // H_kv`` query heads of the group times the ``N_q`` new queries,
  ``ROWS = GROUP * N_q`` rows in all (row ``r`` is head ``r // N_q``, query ``r % N_q``).
  Each K/V block is then loaded once and used by all of them.
* **Split-KV.** The keys are cut into ``num_splits`` chunks of ``CHUNK`` keys, one
  program each. Every program runs the usual online softmax over its chunk and
  writes a *partial* result: its normalised O and its logsumexp. A second small
  kernel merges the partials of a row exactly, as notebook 03 teaches::

      L = log(sum_s exp(L_s))        O = sum_s exp(L_s - L) * O_s

  With one split there is nothing to merge: the kernel writes O and L itself.

Grid: ``(num_splits, cdiv(ROWS, BLOCK_M), B * H_kv)``.

Keys per sample: the cache holds ``K_LENS[b]`` valid keys (the KV-cache entry) and
the queries are its last ``N_q`` positions: query ``i`` sits at key position
``i + K_LENS[b] - N_q`` (causal aligned bottom-right, as flash-attn). Without
``K_LENS`` this is :func:`flashlib.flash_attention`'s padded batch: ``N_k`` keys
(``min(seq_len, N_k)`` with ``SEQ_LENS``), aligned on ``N_k - N_q``.

A paged cache (vLLM's PagedAttention layout) stores keys in pages of ``PAGE_SIZE``
tokens, ``(num_pages, PAGE_SIZE, H_kv, D)``; ``BLOCK_TABLE[b, j // PAGE_SIZE]`` is the
page of sample ``b``'s key ``j``, at row ``j % PAGE_SIZE`` of it. The kernel gathers
each key's row through the table, so pages may lie anywhere and in any order.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .. import runtime
from ..integer_math import ceil_div, power_of_two_at_least
from ..spec import window_bounds
from ._common import LN2, LOG2E, band_mask, multiprocessor_count, scores_log2
from .attention_fwd import smem_budget
from .launch import launch


@triton.jit
def splitkv_attention_kernel(
    Q, K, V, O, LSE, O_PART, LSE_PART, K_LENS, SEQ_LENS, BLOCK_TABLE, ALIBI, sm_scale, SOFTCAP,
    stride_qb, stride_qn, stride_qh, stride_qd,
    stride_kb, stride_kn, stride_kh, stride_kd,
    stride_vb, stride_vn, stride_vh, stride_vd,
    stride_ob, stride_on, stride_oh, stride_od,
    stride_tb, stride_ab, stride_ah,
    H, H_KV, N_Q, N_K, WINDOW_LEFT, WINDOW_RIGHT, CHUNK,
    PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    HAS_K_LENS: tl.constexpr, HAS_SEQ_LENS: tl.constexpr, PAGED: tl.constexpr,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    EARLY_MERGE: tl.constexpr = False, KV_EVICTION: tl.constexpr = "", KV_CACHE: tl.constexpr = "",
):
    """Rows ``[pid(1) * BLOCK_M, +BLOCK_M)`` of K/V head ``pid(2) % H_kv`` of sample ``pid(2) // H_kv``
    against the keys of chunk ``pid(0)``.

    Q, O are (B, N_q, H, D) and K, V (B, N_k, H_kv, D) through their strides (a paged
    cache: (pages, PAGE_SIZE, H_kv, D)). LSE is (B, H, N_q) float32, contiguous. With
    ``SPLIT`` the program writes its partial instead: O_PART (B, H_kv, splits, ROWS_PAD, D)
    and LSE_PART (B, H_kv, splits, ROWS_PAD), float32, contiguous, the logsumexp in
    log2 units (the merge works in them). ``EARLY_MERGE``: once its keys are done, the program lets
    the merge kernel, launched as its programmatic dependent (Hopper), start up (see
    :data:`MERGE_LAUNCHES_EARLY`). ``KV_EVICTION`` and ``KV_CACHE`` are the K/V loads' eviction policy and
    cache modifier (``tl.load``'s; empty: none), for experiments (``benchmarks/decode_configs.py --hints``).
    """
    split = tl.program_id(0)
    row_block = tl.program_id(1)
    off_bh = tl.program_id(2)
    off_b = off_bh // H_KV
    off_kvh = off_bh % H_KV
    group = H // H_KV

    if HAS_K_LENS:  # a KV cache: the queries are the last N_q of K_LENS[b] keys
        k_len = tl.load(K_LENS + off_b)
        q_len = N_Q
        offset = k_len - N_Q
    else:  # a padded batch, as flash_attention
        k_len = N_K
        q_len = N_Q
        offset = N_K - N_Q
        if HAS_SEQ_LENS:
            seq_len = tl.load(SEQ_LENS + off_b)
            k_len = tl.minimum(seq_len, N_K)
            q_len = tl.minimum(seq_len, N_Q)

    rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < group * N_Q
    head = off_kvh * group + rows // N_Q  # query head of each row
    query = rows % N_Q  # query index of each row
    pos = query + offset  # its key position (bottom-right alignment)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    q_ptrs = (Q + off_b.to(tl.int64) * stride_qb + query[:, None].to(tl.int64) * stride_qn
              + head[:, None].to(tl.int64) * stride_qh + offs_d[None, :] * stride_qd)
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    if HAS_SOFTCAP:
        score_scale = SOFTCAP * LOG2E
        softcap_scale = sm_scale / SOFTCAP
    else:
        score_scale = sm_scale * LOG2E
        softcap_scale = 1.0
    slope_log2 = tl.zeros((BLOCK_M, 1), dtype=tl.float32)
    if HAS_ALIBI:
        slopes = tl.load(ALIBI + off_b * stride_ab + head * stride_ah, mask=row_ok, other=0.0)
        slope_log2 = (slopes.to(tl.float32) * LOG2E)[:, None]

    # The keys of this chunk that some valid row of the block may see.
    lo = split * CHUNK
    hi = tl.minimum(lo + CHUNK, k_len)
    if HAS_RIGHT:  # the last valid query's reach
        hi = tl.minimum(hi, tl.minimum(q_len, N_Q) - 1 + offset + WINDOW_RIGHT + 1)
    if HAS_LEFT:  # the first query's reach, rounded down to a block
        lo = tl.maximum(lo, (tl.maximum(offset - WINDOW_LEFT, 0) // BLOCK_N) * BLOCK_N)

    k_head = off_kvh.to(tl.int64) * stride_kh
    v_head = off_kvh.to(tl.int64) * stride_vh
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    # The page of a block's keys is read one block ahead: a K/V load whose address waits on a table load
    # in the same iteration cannot be pipelined (paged ran 1.3-1.6x slower than contiguous that way on
    # the H100, 1.02-1.07x with the read ahead: benchmarks/decode_paged.py). A block inside one page
    # needs one table entry, a block over two pages two (a scalar each); a block over more pages (small
    # pages, long blocks) one per key. Per-key entries arrive in the table load's own layout and must be
    # moved through shared memory into each of K's and V's (4 layout conversions an iteration, and 1.10-1.30x
    # contiguous at D = 64: TUNING, twenty-fourth finding); scalars need none. A block starts at a multiple
    # of BLOCK_N, so a two-page block starts a page.
    ONE_PAGE_PER_BLOCK: tl.constexpr = PAGED and PAGE_SIZE % BLOCK_N == 0
    TWO_PAGES_PER_BLOCK: tl.constexpr = PAGED and BLOCK_N == 2 * PAGE_SIZE
    table_row = BLOCK_TABLE + off_b.to(tl.int64) * stride_tb
    next_page = 0
    next_upper_page = 0
    if ONE_PAGE_PER_BLOCK:
        next_page = tl.load(table_row + lo // PAGE_SIZE, mask=lo < hi, other=0).to(tl.int64)
    elif TWO_PAGES_PER_BLOCK:
        next_page = tl.load(table_row + lo // PAGE_SIZE, mask=lo < hi, other=0).to(tl.int64)
        next_upper_page = tl.load(table_row + lo // PAGE_SIZE + 1, mask=(lo < hi) & (lo + PAGE_SIZE < k_len),
                                  other=0).to(tl.int64)
    elif PAGED:
        next_page = tl.load(table_row + (lo + offs_n) // PAGE_SIZE, mask=lo + offs_n < k_len,
                            other=0).to(tl.int64)
    for start in range(lo, hi, BLOCK_N):
        cols = start + offs_n
        col_ok = cols < k_len
        following = start + BLOCK_N
        if ONE_PAGE_PER_BLOCK:
            page = next_page
            next_page = tl.load(table_row + following // PAGE_SIZE, mask=following < hi, other=0).to(tl.int64)
            k_rows = page * stride_kb + (start % PAGE_SIZE + offs_n) * stride_kn
            v_rows = page * stride_vb + (start % PAGE_SIZE + offs_n) * stride_vn
        elif TWO_PAGES_PER_BLOCK:
            page = tl.where(offs_n < PAGE_SIZE, next_page, next_upper_page)
            next_page = tl.load(table_row + following // PAGE_SIZE, mask=following < hi, other=0).to(tl.int64)
            next_upper_page = tl.load(table_row + following // PAGE_SIZE + 1,
                                      mask=(following < hi) & (following + PAGE_SIZE < k_len), other=0).to(tl.int64)
            k_rows = page * stride_kb + (offs_n % PAGE_SIZE) * stride_kn
            v_rows = page * stride_vb + (offs_n % PAGE_SIZE) * stride_vn
        elif PAGED:  # each key's page, read one block ahead
            page = next_page
            next_page = tl.load(table_row + (following + offs_n) // PAGE_SIZE, mask=following + offs_n < k_len,
                                other=0).to(tl.int64)
            k_rows = page * stride_kb + (cols % PAGE_SIZE) * stride_kn
            v_rows = page * stride_vb + (cols % PAGE_SIZE) * stride_vn
        else:
            k_rows = off_b.to(tl.int64) * stride_kb + cols.to(tl.int64) * stride_kn
            v_rows = off_b.to(tl.int64) * stride_vb + cols.to(tl.int64) * stride_vn
        k = tl.load(K + k_head + k_rows[None, :] + offs_d[:, None] * stride_kd,
                    mask=col_ok[None, :] & d_ok[:, None], other=0.0, cache_modifier=KV_CACHE,
                    eviction_policy=KV_EVICTION)
        v = tl.load(V + v_head + v_rows[:, None] + offs_d[None, :] * stride_vd,
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0, cache_modifier=KV_CACHE,
                    eviction_policy=KV_EVICTION)
        qk = tl.dot(q, k, input_precision=DOT_PRECISION)
        s, _ = scores_log2(qk, pos[:, None], cols[None, :], score_scale, softcap_scale, slope_log2,
                           HAS_SOFTCAP, HAS_ALIBI)
        visible = band_mask(pos[:, None], cols[None, :], k_len, WINDOW_LEFT, WINDOW_RIGHT, HAS_LEFT, HAS_RIGHT)
        s = tl.where(visible & (query < q_len)[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that saw nothing yet: p = alpha = 0
        p = tl.math.exp2(s - m_sub[:, None])
        alpha = tl.math.exp2(m_i - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    if EARLY_MERGE:  # the merge may launch now; it still waits for this grid to finish before reading
        gdc_launch_dependents()
    # A row that saw no key (an empty chunk, a masked row): O = 0, L = -inf. NaN != 0 propagates.
    seen = l_i != 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    out = tl.where(seen[:, None], acc / l_safe[:, None], 0.0)
    lse_log2 = tl.where(seen, m_i + tl.math.log2(l_safe), float("-inf"))
    if SPLIT:
        rows_pad = tl.num_programs(1) * BLOCK_M
        part = (off_bh.to(tl.int64) * tl.num_programs(0) + split) * rows_pad + rows
        tl.store(O_PART + part[:, None] * HEAD_DIM + offs_d[None, :], out, mask=row_ok[:, None] & d_ok[None, :])
        tl.store(LSE_PART + part, lse_log2, mask=row_ok)
    else:
        o_ptrs = (O + off_b.to(tl.int64) * stride_ob + query[:, None].to(tl.int64) * stride_on
                  + head[:, None].to(tl.int64) * stride_oh + offs_d[None, :] * stride_od)
        tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        tl.store(LSE + (off_b * H + head).to(tl.int64) * N_Q + query, lse_log2 * LN2, mask=row_ok)


@triton.jit
def merge_splits_kernel(O_PART, LSE_PART, O, LSE,
                        stride_ob, stride_on, stride_oh, stride_od,
                        H, H_KV, N_Q, NUM_SPLITS, ROWS_PAD,
                        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr,
                        EARLY: tl.constexpr = False):
    """Merge the ``NUM_SPLITS`` partials of row ``pid(0)`` of K/V head ``pid(1)`` into O and L.

    ``SPLITS`` is ``NUM_SPLITS`` rounded up to a power of two (absent splits count as
    empty: L = -inf). The partial logsumexps are in log2 units. ``EARLY``: launched as the
    split kernel's programmatic dependent, so it first waits until that grid has finished
    and its writes are visible (``griddepcontrol.wait``).
    """
    if EARLY:
        gdc_wait()
    row = tl.program_id(0)
    off_bh = tl.program_id(1)
    off_b = off_bh // H_KV
    off_kvh = off_bh % H_KV
    group = H // H_KV
    head = off_kvh * group + row // N_Q
    query = row % N_Q
    offs_s = tl.arange(0, SPLITS)
    offs_d = tl.arange(0, BLOCK_D)
    part = (off_bh.to(tl.int64) * NUM_SPLITS + offs_s) * ROWS_PAD + row
    lse = tl.load(LSE_PART + part, mask=offs_s < NUM_SPLITS, other=float("-inf"))
    m = tl.max(lse, 0)
    m_sub = tl.where(m == float("-inf"), 0.0, m)  # every split empty: weights 0, O = 0, L = -inf
    w = tl.math.exp2(lse - m_sub)
    total = tl.sum(w, 0)
    o_part = tl.load(O_PART + part[:, None] * HEAD_DIM + offs_d[None, :],
                     mask=(offs_s < NUM_SPLITS)[:, None] & (offs_d < HEAD_DIM)[None, :], other=0.0)
    seen = total != 0.0
    out = tl.sum(w[:, None] * o_part, 0) / tl.where(seen, total, 1.0)
    lse_out = tl.where(seen, (m_sub + tl.math.log2(tl.where(seen, total, 1.0))) * LN2, float("-inf"))
    o_ptrs = (O + off_b.to(tl.int64) * stride_ob + query.to(tl.int64) * stride_on
              + head.to(tl.int64) * stride_oh + offs_d * stride_od)
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=offs_d < HEAD_DIM)
    tl.store(LSE + (off_b * H + head).to(tl.int64) * N_Q + query, lse_out)


#: Launch the merge of a split grid as a programmatic dependent launch (PDL, Hopper and later): the
#: merge's programs are scheduled while the split kernel's last programs still run, and wait for its
#: results on the GPU, instead of starting only after the split grid has drained.
MERGE_LAUNCHES_EARLY = True

#: The K/V loads' hints ``launch_splitkv_attention`` accepts (``tl.load``'s ``eviction_policy`` and
#: ``cache_modifier``; empty: none), and the library's own: none (eviction hints changed nothing measurable:
#: TUNING, twenty-ninth finding).
EVICTION_POLICIES = ("", "evict_first", "evict_last")
CACHE_MODIFIERS = ("", ".ca", ".cg", ".cv")
NO_LOAD_HINTS = ("", "")
#: Keys per split come in multiples of this (so every BLOCK_N of the configs divides a chunk).
CHUNK_GRANULE = 128
#: At most this many splits (the merge kernel holds them all in registers).
MAX_SPLITS = 128
INTERPRETER_BLOCK_N = 32


def launch_config(programs: int, sms: int, block_m: int, block_d: int, elem: int,
                  chunk: int | None = None) -> tuple[int, int, int]:
    """(BLOCK_N, stages, warps) for a grid of ``programs`` programs on ``sms`` SMs; ``chunk`` is the keys of
    each split-KV program (None: the keys are not split). A paged cache gets the same config.

    Measured on the H100 (benchmarks/decode_configs.py; results ``decode_configs_*``), by programs
    per SM:

    * About one (a split grid of long chunks, or a grid of about one wave): K and V tiles of 16 KB
      (64 keys at D = 128 in fp16, 128 keys at D = 64) ran fastest; 32-key blocks were 5-20% slower,
      and 8 KB tiles up to 1.4x slower for MQA's 64-row programs. A finely split grid (up to four
      short chunks per SM) ran fastest with 16 KB tiles too, and with no more stages than a chunk
      has blocks (three stages over a chunk of two blocks ran up to 1.27x slower than two: the extra
      buffers only take shared memory from the other programs of the SM).
    * More, without a split: smaller tiles, so that more programs fit an SM at once. 8 KB tiles at
      about two per SM (16 KB tiles were 2-4% slower), 4 KB tiles from there on (8 KB ones were 5%
      slower at D = 64 with 4 and 16 per SM), and two stages from 8 per SM on (three were 4% slower
      at 16 per SM). Blocks keep at least 32 keys.
    * Except, from two per SM without a split, for narrow (16-row) programs with rows of 128 or 256 bytes
      (D = 64 and 128 in 2-byte types), where the grid's last, partial wave decides: :func:`choose_by_waves`
      picks among :data:`MANY_PROGRAM_CONFIGS` (TUNING, twenty-ninth finding).

    Three stages beat two and four elsewhere. The config is chosen here, not autotuned: an autotuner
    keyed on the first problem it meets tuned on a small, launch-bound one and kept a config 1.5x
    slower for long caches. Stages drop where shared memory runs out. A block may straddle the pages
    of a paged cache: the kernel then reads one table entry per key, a block ahead (capping blocks at
    64-token pages was 5-10% slower at D = 64).

    A program of :data:`WIDE_ROWS` query rows keeps its scores tile at 128 x 64 (64-key blocks) and runs
    8 warps once its accumulator is 128 x 128 (D = 128; 4 warps at D = 64), the best measured for such
    programs (``decode_configs.py --block-m 128``, ``results/decode_configs_wide_rows_*.json``), paged
    or not. (At one program an SM, 128-key blocks of two 64-token pages with 8 warps had been 1-7% faster
    paged at D = 64; at the two programs an SM that :func:`split_programs_per_sm` now asks for there,
    64-key blocks with 4 warps beat them, contiguous and paged: TUNING, twenty-sixth finding.)
    """
    per_sm = programs / sms
    candidates = MANY_PROGRAM_CONFIGS.get(block_d * elem)
    if chunk is None and per_sm >= 2 and block_m <= 16 and candidates:
        block_n, stages, warps = choose_by_waves(programs, sms, candidates)
        return _fit_shared_memory(block_m, block_d, elem, block_n, stages, warps)
    if chunk is not None or per_sm < 1.5:
        tile_bytes, stages = 16384, 3
    elif per_sm < 2:
        tile_bytes, stages = 8192, 3
    else:
        tile_bytes, stages = 4096, 3 if per_sm < 8 else 2
    block_n = max(32, min(128, tile_bytes // (block_d * elem)))
    warps = 4
    if block_m >= WIDE_ROWS:
        block_n = min(block_n, 64)
        warps = 8 if block_m * block_d >= WIDE_ROWS * 128 else 4
    if chunk is not None:  # no more stages than the chunk has blocks
        stages = max(1, min(stages, ceil_div(chunk, block_n)))
    return _fit_shared_memory(block_m, block_d, elem, block_n, stages, warps)


def _fit_shared_memory(block_m: int, block_d: int, elem: int, block_n: int, stages: int,
                       warps: int) -> tuple[int, int, int]:
    """The config with as many of ``stages`` as fit the shared memory of a program (32-key blocks and one
    stage where none does)."""
    budget = smem_budget()
    for fitting in range(stages, 0, -1):
        if elem * block_d * (block_m + 2 * block_n * fitting) <= budget:
            return block_n, fitting, warps
    return 32, 1, warps


#: Unsplit grids of narrow (16-row) programs at two or more an SM, by bytes of a key's row (block_d * element
#: size): the candidate configs (BLOCK_N, stages, warps), in order of preference, each with the programs an
#: H100 SM runs at once (Triton 3.6: a grid of one more program an SM than that ran as two waves) and whether
#: it may run more than one wave. Measured with ``benchmarks/decode_configs.py`` at B = 16-68, H_kv = 32 and 8
#: (``results/decode_waves_*``):
#:
#: * D = 64: 32-key blocks with three stages (six an SM) ran fastest in one wave (up to 6% ahead of two
#:   stages at 3.9 an SM), but up to 1.11x slower than the wave count predicts over several; with two stages
#:   (eight an SM) where three would need a second wave; 128-key blocks with three stages (three an SM) from
#:   there on, where 32-key blocks had run up to 1.3x slower (B = 34: 1985 against 1560 us).
#: * D = 128: 32-key blocks with two stages (six an SM) in one wave; 128-key blocks (32 KB tiles, three an
#:   SM) beyond (B = 26: 1431 against 1131 us; B = 64: 1406 against 1377).
MANY_PROGRAM_CONFIGS = {
    128: (((32, 3, 4), 6, False), ((32, 2, 4), 8, True), ((128, 3, 4), 3, True)),
    256: (((32, 2, 4), 6, True), ((128, 2, 4), 3, True)),
}
#: A grid's last, partial wave of f waves costs the time of max(f + PARTIAL_WAVE_EXTRA, PARTIAL_WAVE_LEAST)
#: waves (at most one), fitted to the grids measured for MANY_PROGRAM_CONFIGS: its few programs cannot keep the
#: memory busy.
PARTIAL_WAVE_EXTRA = 0.12
PARTIAL_WAVE_LEAST = 0.34
#: Candidates within this much of the cheapest count as level; the first of them in order of preference wins.
WAVE_COST_TOLERANCE = 0.01


def wave_cost(programs: int, slots: int) -> float:
    """Predicted time of ``programs`` equal, memory-bound programs on ``slots`` places at once, over the time
    with every place busy to the end: 1 for a grid of one wave, more where the last wave is partial."""
    waves = programs / slots
    whole = math.floor(waves)
    if waves <= 1 or waves == whole:
        return 1.0
    last = min(1.0, max(waves - whole + PARTIAL_WAVE_EXTRA, PARTIAL_WAVE_LEAST))
    return (whole + last) / waves


def choose_by_waves(programs: int, sms: int, candidates) -> tuple[int, int, int]:
    """The config of ``candidates`` ((config, programs an SM, whether it may run several waves), in order of
    preference) whose grid of ``programs`` on ``sms`` SMs :func:`wave_cost` predicts fastest, the first within
    :data:`WAVE_COST_TOLERANCE` of the cheapest. The last candidate must be allowed several waves."""
    costs = [wave_cost(programs, per_sm * sms) if several or programs <= per_sm * sms else math.inf
             for _, per_sm, several in candidates]
    cheapest = min(costs)
    return next(config for (config, _, _), cost in zip(candidates, costs) if cost <= cheapest + WAVE_COST_TOLERANCE)


@functools.lru_cache(maxsize=None)
def _pdl_supported(device_index: int) -> bool:
    """NVIDIA compute capability 9.0 or later (ROCm reports capabilities too, but has no PDL)."""
    return torch.version.hip is None and torch.cuda.get_device_capability(device_index)[0] >= 9


def merges_early(device: torch.device) -> bool:
    """Whether the merge goes out as a programmatic dependent launch: on a GPU of compute
    capability 9.0 or later (never in the interpreter or on ROCm), unless :data:`MERGE_LAUNCHES_EARLY` is off."""
    return (MERGE_LAUNCHES_EARLY and not runtime.INTERPRET and device.type == "cuda"
            and _pdl_supported(device.index or 0))


def rows_per_program(rows: int) -> int:
    """BLOCK_M for ``rows`` packed query rows: all of them up to 64 (at least 16, ``tl.dot``'s minimum)."""
    return max(16, min(64, power_of_two_at_least(rows)))


#: Query rows of a wide program: one K/V head with at least this many rows (MQA with 32 query heads
#: and 4 new queries, say) may run them all in one program that reads each K/V block once.
WIDE_ROWS = 128
#: Keys each wide program must walk for wide programs to be chosen: when 64-row programs would split the
#: keys anyway, and when they would not (wide ones then pay a split and a merge that narrow ones do not).
WIDE_MIN_KEYS_SPLIT = 1024
WIDE_MIN_KEYS_UNSPLIT = 8192


#: K and V bytes per chunk under which one wave of chunks is too short to keep an SM streaming, and the
#: chunk size that such grids are cut into instead (measured on the H100: see choose_num_splits).
SHORT_CHUNK_BYTES = 256 * 1024
FINE_CHUNK_BYTES = 64 * 1024
#: A finely split grid has at most this many programs per SM.
MAX_WAVES = 4


def choose_num_splits(programs: int, n_k: int, sms: int, head_dim: int = 128, elem: int = 2,
                      rows: int = 1, programs_per_sm: int = 1) -> int:
    """How many chunks to cut ``n_k`` keys into, when ``programs`` programs run without splitting.

    ``head_dim`` and ``elem`` (bytes per element) size the chunks' K/V bytes; ``rows`` is the query
    rows per K/V head (``H // H_kv * N_q``), which sizes the partial results the merge reads back.
    ``programs_per_sm`` is how many programs a wave puts on each SM (:func:`split_programs_per_sm`).

    One wave first: about ``programs_per_sm`` programs per SM. On the H100 the fastest split count of the long
    caches swept put the grid at 128-132 programs (a grid of 1.5 or 2.2 waves lost up to 15% to the
    last, partial wave: benchmarks/results/decode_configs_*.json). But a chunk of at most
    ``SHORT_CHUNK_BYTES`` of K and V is over before an SM's loads stream: there, chunks of
    ``FINE_CHUNK_BYTES`` over up to ``MAX_WAVES`` programs per SM ran 10-20% faster (D = 64 at
    4k-16k keys, D = 128 at 1k-8k keys; ``decode_configs_splits_and_tiles_*``), as
    an SM overlaps one program's start with another's stream. Every partial costs a float32 row
    written and read again, so the split count keeps those bytes under 1/8 of the K/V bytes.
    Chunks keep at least ``CHUNK_GRANULE`` keys, and at most ``MAX_SPLITS`` are merged.
    """
    slots = programs_per_sm * sms
    if programs >= slots:
        return 1
    most = min(ceil_div(n_k, CHUNK_GRANULE), MAX_SPLITS)
    one_wave = max(1, min(slots // programs, most))
    kv_bytes = 2 * n_k * head_dim * elem
    if kv_bytes > SHORT_CHUNK_BYTES * one_wave:
        return one_wave
    # partial bytes / K/V bytes = (rows * splits * D * 4 * 2) / (2 * n_k * D * elem) <= 1/8
    partial_cap = n_k * elem // (32 * rows)
    fine = min(ceil_div(kv_bytes, FINE_CHUNK_BYTES), MAX_WAVES * sms // programs, most, partial_cap)
    return max(one_wave, fine)


def split_programs_per_sm(block_m: int, block_d: int, elem: int) -> int:
    """Programs a split grid of ``block_m``-row programs at ``block_d`` (``elem`` bytes) aims to put on each SM.

    Two for :data:`WIDE_ROWS`-row programs of four warps (a 128 x 64 accumulator in 2-byte types): one
    warpgroup's softmax leaves its tensor cores and copies idle, and a second program on the SM fills
    them (64 KB of shared memory each, so two fit). Twice the split count ran 5-13% faster at D = 64
    (MQA with 4 new queries, B 8 and 64, 16k-128k keys, contiguous and paged), and 4-15% slower at
    D = 128, whose 128 x 128 programs already run two warpgroups (``decode_configs.py --block-m 128
    --splits 0,S,2S``, ``results/decode_configs_wide_splits_*.json``; TUNING, twenty-sixth finding).
    One for every other program.
    """
    return 2 if block_m >= WIDE_ROWS and block_m * block_d < WIDE_ROWS * 128 and elem <= 2 else 1


#: Registers per thread at which :data:`MAX_WAVES` programs of four warps share an SM's 65536.
REGISTERS_FOR_MAX_WAVES = 65536 // (MAX_WAVES * 4 * 32)


def register_cap(programs: int, sms: int, block_m: int, config: tuple[int, int, int], page_size: int = 0, *,
                 row_bytes: int) -> int | None:
    """``maxnreg`` for a grid of ``programs`` split-KV programs of ``block_m`` rows launched with ``config``
    (BLOCK_N, stages, warps) over pages of ``page_size`` tokens (0: a contiguous cache), with ``row_bytes``
    bytes per key (block_d * element size), or None (the compiler's own choice).

    A finely split grid puts up to :data:`MAX_WAVES` programs on each SM at once, but only if their registers
    fit: four programs of four warps may take :data:`REGISTERS_FOR_MAX_WAVES` (128) each. Programs of 16-32
    rows need about 100 (sm_90a, D = 64), but 135 when each 128-key block spans two 64-token pages, so only
    three fit, and grids of 3.9 programs per SM ran as two waves, 1.3-1.5x slower than the contiguous cache
    (``benchmarks/decode_paged_gap.py``; TUNING, twenty-fourth finding). Capped, the compiler keeps them at
    128 (two spilled words). The cap is for those launches alone: it is not only a ceiling, ptxas also
    allocates up to it, so 32-key programs that need 64 took 84 (eight programs an SM became six) and ran
    14-16% slower. Programs of 64 rows and more (wgmma, 240-255 registers) are never capped, nor tiles over
    16 KB (128-key blocks at D = 128 fit three an SM by their shared memory; the cap was measured at D = 64).
    """
    block_n, _, warps = config
    two_long_pages = page_size > 0 and block_n == 2 * page_size and block_n >= 128  # as measured
    if (two_long_pages and block_m <= 32 and warps == 4 and programs > (MAX_WAVES - 1) * sms
            and block_n * row_bytes <= 16384):
        return REGISTERS_FOR_MAX_WAVES
    return None


def choose_rows_per_program(rows: int, heads: int, n_k: int, sms: int, head_dim: int = 128, elem: int = 2) -> int:
    """BLOCK_M for ``rows`` query rows per K/V head, ``heads`` K/V heads over the batch (B * H_kv) and
    ``n_k`` keys: :data:`WIDE_ROWS` where wide programs walk long enough chunks, else
    :func:`rows_per_program`.

    With 128 rows (MQA, 32 query heads, 4 new queries) two 64-row programs each read the whole K/V
    head; one 128-row program reads it once and does twice the work per byte, as the forward's
    128-row tiles do. Measured on the H100, fp16, D = 64 and 128 (a sweep, ``decode_configs.py
    --block-m 128``, ``results/decode_configs_wide_rows_*.json``; then this rule against 64 rows,
    ``decode_wide_rows.py``, ``results/decode_wide_rows_*.json``): 1.02-1.35x faster contiguous and
    1.06-1.32x paged where each wide program walks 1k keys or more (8k where narrow ones run unsplit);
    slower where it would walk short chunks (B = 1, N_k = 8k: 128 keys, 10-15%), or where narrow
    programs fill the GPU unsplit and wide ones would need a split and a merge for chunks of 2k keys
    (B = 64, N_k = 4k: 4-17%; 1k: 1.4-1.6x).
    """
    narrow = rows_per_program(rows)
    if rows < WIDE_ROWS:
        return narrow
    narrow_splits = choose_num_splits(heads * ceil_div(rows, narrow), n_k, sms, head_dim, elem, rows)
    wide_splits = choose_num_splits(heads * ceil_div(rows, WIDE_ROWS), n_k, sms, head_dim, elem, rows)
    least = WIDE_MIN_KEYS_SPLIT if narrow_splits > 1 else WIDE_MIN_KEYS_UNSPLIT  # at one program an SM, as measured
    return WIDE_ROWS if n_k // wide_splits >= least else narrow


class SplitKVPlan(NamedTuple):
    """How :func:`launch_splitkv_attention` cuts one problem into programs."""

    block_m: int  #: query rows per program (BLOCK_M)
    row_blocks: int  #: programs along one K/V head's packed query rows
    num_splits: int  #: key chunks (1: not split, no merge)
    chunk: int  #: keys per chunk, whole :data:`CHUNK_GRANULE` s
    config: tuple[int, int, int]  #: (BLOCK_N, num_stages, num_warps) on a GPU
    maxnreg: int | None  #: the register cap on a GPU (:func:`register_cap`), or None


def plan_splitkv_launch(batch: int, heads: int, heads_kv: int, n_q: int, n_k: int, head_dim: int, elem: int,
                        sms: int, page_size: int = 0, *, block_m: int | None = None, num_splits: int | None = None,
                        config: tuple[int, int, int] | None = None) -> SplitKVPlan:
    """The split-KV launch for ``batch`` samples of ``heads`` query heads over ``heads_kv`` K/V heads, ``n_q``
    new queries and up to ``n_k`` keys of ``head_dim`` (``elem`` bytes each) on ``sms`` SMs, over pages of
    ``page_size`` tokens (0: a contiguous cache). ``block_m``, ``num_splits`` and ``config`` override the
    rules (:func:`choose_rows_per_program`, :func:`choose_num_splits`, :func:`launch_config`; an overridden
    config is never register-capped). Benchmarks and notebook 09 read their grids from here too.
    """
    rows = (heads // heads_kv) * n_q
    if block_m is None:
        block_m = choose_rows_per_program(rows, batch * heads_kv, n_k, sms, head_dim, elem)
    row_blocks = ceil_div(rows, block_m)
    block_d = max(16, power_of_two_at_least(head_dim))
    if num_splits is None:
        num_splits = choose_num_splits(batch * heads_kv * row_blocks, n_k, sms, head_dim, elem, rows,
                                       split_programs_per_sm(block_m, block_d, elem))
    chunk = ceil_div(ceil_div(max(n_k, 1), num_splits), CHUNK_GRANULE) * CHUNK_GRANULE
    num_splits = max(1, ceil_div(n_k, chunk))
    programs = batch * heads_kv * row_blocks * num_splits
    maxnreg = None
    if config is None:
        config = launch_config(programs, sms, block_m, block_d, elem, chunk if num_splits > 1 else None)
        if num_splits > 1:  # the cap was measured on finely split grids (register_cap)
            maxnreg = register_cap(programs, sms, block_m, config, page_size, row_bytes=block_d * elem)
    return SplitKVPlan(block_m, row_blocks, num_splits, chunk, config, maxnreg)


def launch_splitkv_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                             lse: torch.Tensor, *, scale: float, causal: bool = False,
                             window: tuple[int | None, int | None] = (None, None), softcap: float = 0.0,
                             alibi_slopes: torch.Tensor | None = None, k_lens: torch.Tensor | None = None,
                             seq_lens: torch.Tensor | None = None, block_table: torch.Tensor | None = None,
                             max_keys: int | None = None, num_splits: int | None = None,
                             config: tuple[int, int, int] | None = None, block_m: int | None = None,
                             kv_load_hints: tuple[str, str] = NO_LOAD_HINTS) -> None:
    """Fill ``o`` (q's shape) and ``lse`` ((B, H, N_q) float32) with split-KV attention; arguments unchecked.

    q, o: (B, N_q, H, D) through strides (pass ``.transpose(1, 2)`` views for (B, H, N, D)).
    k, v: (B, N_k, H_kv, D), or pages (num_pages, page_size, H_kv, D) with ``block_table``
    (B, max_pages) int32. ``k_lens`` (B,) int32: valid keys per sample (a KV cache,
    queries at the end); else ``seq_lens`` as :func:`flashlib.flash_attention`. ``window``
    is (left, right) with None unbounded, ``causal`` caps right at 0. ``max_keys`` bounds the
    keys of any sample (the grid is sized for it; default: what k can hold).
    ``num_splits``, ``config`` = (BLOCK_N, num_stages, num_warps) and ``block_m`` override the rules
    (experiments; see :func:`plan_splitkv_launch`), as does ``kv_load_hints`` = (eviction policy, cache
    modifier) of the K/V loads (``tl.load``'s ``eviction_policy`` and ``cache_modifier``; GPU only).
    """
    batch, n_q, heads, head_dim = q.shape
    heads_kv = k.shape[2]
    paged = block_table is not None
    page_size = k.shape[1] if paged else 0
    capacity = block_table.shape[1] * page_size if paged else k.shape[1]
    n_k = capacity if max_keys is None else min(max_keys, capacity)
    rows = (heads // heads_kv) * n_q
    sms = 16 if runtime.INTERPRET else multiprocessor_count(q.device.index or 0)
    if block_m is not None and (not isinstance(block_m, int) or isinstance(block_m, bool) or block_m < 16
                                or block_m & (block_m - 1)):
        raise ValueError(f"block_m must be None (the kernel chooses) or a power of two >= 16 (tl.dot's minimum); "
                         f"got {block_m!r}")
    if (not isinstance(kv_load_hints, tuple) or len(kv_load_hints) != 2 or kv_load_hints[0] not in EVICTION_POLICIES
            or kv_load_hints[1] not in CACHE_MODIFIERS):
        raise ValueError(f"kv_load_hints must be a pair (eviction policy, cache modifier) with the policy one of "
                         f"{EVICTION_POLICIES} and the modifier one of {CACHE_MODIFIERS}; got {kv_load_hints!r}")
    plan = plan_splitkv_launch(batch, heads, heads_kv, n_q, n_k, head_dim, q.element_size(), sms, page_size,
                               block_m=block_m, num_splits=num_splits, config=config)
    block_m, row_blocks, num_splits, chunk = plan.block_m, plan.row_blocks, plan.num_splits, plan.chunk
    split = num_splits > 1
    left, right = window_bounds(causal, window, max(n_q, capacity))  # no sample has more keys than the cache holds
    block_d = max(16, power_of_two_at_least(head_dim))
    if split:
        o_part = torch.empty((batch, heads_kv, num_splits, row_blocks * block_m, head_dim),
                             dtype=torch.float32, device=q.device)
        lse_part = torch.empty(o_part.shape[:-1], dtype=torch.float32, device=q.device)
    else:
        o_part = lse_part = lse
    dummy = lse
    alibi_strides = (0, 0)
    if alibi_slopes is not None:
        alibi_strides = (0, alibi_slopes.stride(0)) if alibi_slopes.dim() == 1 else tuple(alibi_slopes.stride())
    positional = (q, k, v, o, lse, o_part, lse_part,
                  dummy if k_lens is None else k_lens, dummy if seq_lens is None else seq_lens,
                  dummy if block_table is None else block_table, dummy if alibi_slopes is None else alibi_slopes,
                  float(scale), float(softcap),
                  *q.stride(), *k.stride(), *v.stride(), *o.stride(),
                  block_table.stride(0) if paged else 0, *alibi_strides,
                  heads, heads_kv, n_q, n_k, left or 0, right or 0, chunk)
    flags = dict(PAGE_SIZE=page_size, HEAD_DIM=head_dim, BLOCK_D=block_d, HAS_K_LENS=k_lens is not None,
                 HAS_SEQ_LENS=seq_lens is not None, PAGED=paged, HAS_LEFT=left is not None,
                 HAS_RIGHT=right is not None, HAS_SOFTCAP=softcap > 0, HAS_ALIBI=alibi_slopes is not None,
                 SPLIT=split, DOT_PRECISION=runtime.dot_precision(q.dtype), BLOCK_M=block_m)
    early = split and merges_early(q.device)
    grid = (num_splits, row_blocks, batch * heads_kv)
    if runtime.INTERPRET:
        splitkv_attention_kernel[grid](*positional, **flags, BLOCK_N=INTERPRETER_BLOCK_N)
    else:
        registers = {} if plan.maxnreg is None else {"maxnreg": plan.maxnreg}
        block_n, stages, warps = plan.config
        eviction, cache = kv_load_hints
        launch(splitkv_attention_kernel, grid, *positional, **flags, BLOCK_N=block_n, num_stages=stages,
               num_warps=warps, EARLY_MERGE=early, KV_EVICTION=eviction, KV_CACHE=cache, **registers)
    if split:
        pdl = {"EARLY": True, "launch_pdl": True} if early else {}
        launch(merge_splits_kernel, (rows, batch * heads_kv),
               o_part, lse_part, o, lse, *o.stride(), heads, heads_kv, n_q, num_splits, row_blocks * block_m,
               HEAD_DIM=head_dim, BLOCK_D=block_d, SPLITS=power_of_two_at_least(num_splits), **pdl)
