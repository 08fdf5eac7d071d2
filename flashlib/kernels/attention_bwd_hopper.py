"""The backward's kernels for Hopper in Gluon, warp-specialized as the forward of :mod:`.attention_fwd_hopper`:
dK/dV, and dQ.

Status: both are the backward's kernels at head_dim 128; at 64 the dK/dV kernel from 1024 rows, with 128 query rows
a step, and the dQ kernel from 4096 (routed by :func:`preferred` and :func:`dq_preferred`). With 64 query rows a
step the dK/dV kernel makes the whole backward 1.04-1.07x faster than the Triton dK/dV kernel does, on an H200 at
every FlashAttention-2 shape from N = 512, fp16 and bf16, causal or not (benchmarks/TUNING.md, thirty-third finding;
at head_dim 64 1.06-1.18x on an H100 from N = 1024, fp16, fifty-fourth and fifty-fifth findings); the dQ kernel
runs 1.09-1.32x the Triton dQ kernel from N = 1024 at head_dim 128 and takes the whole backward a further
1.04-1.13x (1.00-1.05x at head_dim 64 from N = 4096; thirty-fourth finding).
:func:`flashlib.kernels.attention_bwd.launch_attention_backward` takes them for a plain call that the rules
pick, or wherever they can run with ``use_gluon=True``; ``benchmarks/gluon_bwd_ab.py`` and
``benchmarks/gluon_dq_ab.py`` check and time them. Why they exist: the forward gained 5-14% from the same structure
(thirty-first finding), and the backward's Triton kernels wait on each product in turn.

A dK/dV program owns 2 x 64 keys of one (sample, kv head); three partitions:

* a **loading warp**: K and V of both halves once, then Q and dO of every query block of every query head of the
  kv head (GQA) into a ring of ``STAGES`` slots, each refilled once both consumers released it, and with Q its
  rows' L and D (:func:`rows_descriptor`): queries run along the columns of S^T, so a thread needs a quarter of a
  block's values of each (16 of 64), which it reads from shared memory when it uses them (loaded from global memory
  instead, every step, they cost the backward 2-13%: benchmarks/TUNING.md, fifty-second finding);
* two **consumer warpgroups**, 64 keys each, with dK and dV in float32 registers (240 registers a thread), per
  query block: ``S^T = K Q^T``, ``P^T = exp2(S^T - L)``, ``dV += P^T dO``, ``dP^T = V dO^T``,
  ``dS^T = P^T (dP^T - D)``, ``dK += dS^T Q``, the products through ``warpgroup_mma`` with P^T and dS^T as
  register operands. dK is scaled once at the end; dK and dV leave through the copy engine.

A dQ program owns 2 x 64 query rows of one (sample, head), the forward's shape: the loading warp brings Q and dO
of both halves once, then K and V of every key block either half sees into the ring; each consumer adds
``dS K`` of a block to dQ in float32 registers (``S = Q K^T`` and ``dP = dO V^T`` issued together, P while dP
is on the tensor cores, dS as a register operand). Under a causal mask the first half releases the blocks only
the second sees, unread, and the longest tiles run first. No atomics: each dQ row is summed by one warpgroup in a
fixed order, so gradients repeat bitwise.

Each consumer multiplies the same two tiles as first operands in every step (K and V, or Q and dO); both kernels can
hold them in registers instead of reading them from shared memory each time (:data:`DKDV_REGISTER_OPERANDS`,
:data:`DKDV_DROPOUT_REGISTER_OPERANDS` for the dK/dV kernel's calls with dropout, :data:`DQ_REGISTER_OPERANDS`;
each where measured faster, with dropout for the dropout calls' tuple).

Scope: the plain backward (no mask or a causal one, bottom-right aligned; GQA; 2-byte types; head_dim 64 or 128;
no window, lengths, packing, score modifier) and its dropout, whose draws (:mod:`.dropout_hopper`) recompute the
forward's. D = rowsum(dO * O) stays with the Triton preprocess kernel.
"""
from __future__ import annotations

import torch
import triton

from ._common import LOG2E
from .attention_fwd_hopper import CONSUMER_REGISTERS, HAVE_GLUON, KERNEL_REGISTERS, LOADER_REGISTERS, tile_descriptor
# the same tests as the forward's, asked here by launch_attention_backward
from .attention_fwd_hopper import can_run, covers  # noqa: F401
from .launch import launch

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

    from .attention_fwd_hopper import operands_flag, register_operand, tma_load, tma_store
    from .dropout_hopper import (dropout_keep, keep_from_words, keep_threshold, kept_weights_operand, kept_words,
                                 stream_key, zero_dropped)

    #: The shared-memory layout of a block of L or D (:func:`rows_descriptor`): float32 rows, unswizzled.
    ROWS_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)

#: (BLOCK_M query rows a step, BLOCK_N keys of each consumer, STAGES Q/dO slots) per head_dim. At 128, 64 rows a
#: step leave ptxas a few loop scalars to keep on the stack, none of them a tile, and beat 32 rows by 7-12% on the
#: H200 (thirty-third finding); two slots, as a third measured no faster (fifty-fourth). At 64, 128 rows a step
#: with K and V in shared memory: about 10% fewer instructions a query row than 64 rows, no spill, and 1.00-1.03x
#: 64 rows with K and V in registers at every FlashAttention-2 point (H100, fp16, session 62, fifty-fifth finding).
CONFIGS = {64: (128, 64, 2), 128: (64, 64, 2)}
#: The same with dropout, whose draws take registers: at 64, 128 rows a step store 12-33 words to the stack a step
#: in the loops (STL; sm_90a, Triton 3.6) and ran 0.89-0.99x 64 rows under the causal mask (fifty-sixth finding),
#: so its calls keep the 64 rows and three slots that its route was measured with (forty-sixth finding).
DROPOUT_CONFIGS = {64: (64, 64, 3), 128: CONFIGS[128]}
#: The dQ kernel's (BLOCK_M query rows of each consumer, BLOCK_N keys a step, STAGES K/V slots) per head_dim: dQ in
#: float32 registers is 64 of a thread's 240 at head_dim 128, which leaves room for S and dP of 64 keys.
DQ_CONFIGS = {64: (64, 128, 2), 128: (64, 64, 3)}
#: The head_dim at which the dQ kernel zeroes dP's dropped weights with a byte permute and an AND
#: (:func:`.dropout_hopper.zero_dropped`) rather than a byte compare and a select. H100, fp16, p = 0.1, N 4k and 16k,
#: causal or not (session 65, benchmarks/TUNING.md fifty-eighth finding): at 64 the dQ kernel runs 1.03-1.06x faster
#: (its loop 779 -> 713 instructions); at 128, where its loop keeps its length (426 -> 423), 0.97-1.00x.
DQ_ZERO_DROPPED_HEAD_DIM = triton.language.constexpr(64)
#: Where this kernel is the backward's dK/dV kernel by default (:func:`preferred`): from these query and key rows per
#: head_dim, and :data:`MIN_SCORES` scores (as the forward's). At 128, 512 rows: the smallest length measured, 1.05x
#: the Triton kernel there. At 64, 1024 rows: with L and D staged and K and V in registers (64 rows a step, before
#: :data:`CONFIGS` took 128) the whole backward ran 1.04-1.17x Triton's at every FlashAttention-2 point from
#: 1k (H100, fp16 and bf16, session 61, benchmarks/TUNING.md fifty-fourth finding; before, 0.91-1.01x). That A/B
#: ran the Gluon dQ kernel too, level with Triton's at 1k, where the default keeps Triton's (:data:`DQ_MIN_ROWS`).
MIN_ROWS = {128: 512, 64: 1024}
ROUTED_HEAD_DIMS = tuple(sorted(MIN_ROWS))
MIN_SCORES = 2 ** 27
#: Where the dQ kernel is the backward's by default (:func:`dq_preferred`), from these query and key rows per
#: head_dim and :data:`MIN_SCORES` scores (thirty-fourth finding, H200): at 128 it ran 1.09-1.32x the Triton dQ
#: kernel from 1024 rows (the smallest length measured); at 64 0.99-1.00x at 1024 rows, 1.02-1.12x from 4096.
DQ_MIN_ROWS = {128: 1024, 64: 4096}
#: The query and key rows from which the backward with dropout takes both kernels, per head_dim. Measured against the
#: Triton kernels with the same dropout (H100, fp16, p = 0.1, FlashAttention-2 shapes, N 1k-16k, causal or not,
#: session 57, benchmarks/TUNING.md forty-sixth finding): at 128 0.84-0.92x their time from 1024 rows (the smallest
#: length measured); at 64 0.95-0.98x from 4096 rows, but 0.98-1.01x without a mask and 1.08x causal at 1024 (2048
#: unmeasured; that was before L and D were staged). Elsewhere a call with dropout keeps the Triton kernels: at 128
#: from 512 to 1023 rows and at 64 from 1024 to 4095 too, where the dK/dV kernel takes the plain call (not measured
#: with dropout since).
#: bf16 takes the same routes; its dropout was timed against its plain calls only (the same ratios as fp16's).
DROPOUT_MIN_ROWS = {128: 1024, 64: 4096}
#: Head dims at which each kernel reads its loop-invariant first operands from registers rather than shared memory
#: (:func:`_first_operands`): K and V for the dK/dV kernel (``S^T = K Q^T``, ``dP^T = V dO^T``), Q and dO for the
#: dQ kernel (``S = Q K^T``, ``dP = dO V^T``). Why: a warpgroup product of N = 64 columns with both operands in
#: shared memory reads 128 bytes a cycle at the tensor cores' rate, the whole of an SM's shared-memory bandwidth,
#: and these are such products; from registers it reads 64 (benchmarks/TUNING.md, thirty-ninth finding). Compiled
#: for sm_90a, the operands fit in registers without a spill at head_dim 64 (both kernels) and 128 (dQ); the dK/dV
#: kernel at 128 spills 55 registers a block. ``benchmarks/gluon_dq_ab.py`` and ``gluon_bwd_ab.py`` check and time
#: both ways. The dK/dV kernel at 64: with 64 query rows a step, 1.01-1.02x its shared-memory operands at every
#: FlashAttention-2 point (H100, fp16 and bf16, session 61, fifty-fourth finding), but 128 rows a step in shared
#: memory beat both (:data:`CONFIGS`), and with 128 rows the operands in registers spill: off. The dQ kernel's
#: ran 0.97-1.01x its shared-memory operands (H100, forty-first finding): off.
DKDV_REGISTER_OPERANDS: tuple[int, ...] = ()
DQ_REGISTER_OPERANDS: tuple[int, ...] = ()
#: The same for a dK/dV call with dropout, whose blocks are :data:`DROPOUT_CONFIGS`: at 64 its 64 query rows a step
#: keep K and V in registers without a spill (sm_90a, Triton 3.6), the placement session 61 measured faster at
#: those blocks without dropout and whose route the GPU tests ran in session 62. With dropout it ran 1.013-1.025x
#: K and V from shared memory at every FlashAttention-2 point, gradients bitwise equal (H100, fp16, p = 0.1, session
#: 64, benchmarks/TUNING.md fifty-seventh finding).
DKDV_DROPOUT_REGISTER_OPERANDS: tuple[int, ...] = (64,)
#: Head dims at which the dK/dV kernel with dropout draws each query block's mask one step ahead, while the step
#: before waits for its dK product (:func:`_dkdv_step`), instead of after its S^T product's wait. Why: that kernel
#: carries 61-68% of dropout's extra backward time at head_dim 64, and its draws (about 120 integer instructions a
#: thread a step at 64 x 64 blocks) ran where nothing of this warpgroup's products was in flight (benchmarks/TUNING.md,
#: fifty-ninth finding); a step's dK product had its wait right after its issue. Written and compiled for sm_90a in
#: session 67 (sixty-first finding); checked and timed on an H100 in session 68 (sixty-third finding): the gradients
#: are bitwise the default's, but the kernel ran at 0.990-1.010x the default's speed at 64 and 0.987x (slower) at
#: 128, so it is off.
DKDV_DRAWS_AHEAD: tuple[int, ...] = ()
#: The same for the dQ kernel with dropout: each key block's draws drawn while the step before waits for its dQ
#: product. It carries the other 32-39% of dropout's extra backward time at head_dim 64. Timed as above: 0.955-0.989x
#: the default's speed at 64 (slower), 1.015x at the one point measured at 128; off.
DQ_DRAWS_AHEAD: tuple[int, ...] = ()

if HAVE_GLUON:

    @gluon.jit
    def _first_operands(a_tile, b_tile, flag, acc_layout: gl.constexpr):
        """The two shared-memory tiles a consumer multiplies as first operands in every step (K and V, or Q and
        dO), kept where they are, or loaded once into registers in the operand layout of products accumulating in
        ``acc_layout`` when ``flag`` (:func:`.attention_fwd_hopper.operands_flag`) says so. The caller has waited
        for the tiles."""
        if flag.dtype == gl.int8:
            return register_operand(a_tile, acc_layout), register_operand(b_tile, acc_layout)
        else:
            return a_tile, b_tile

    @gluon.jit
    def _bwd_load_partition(descs, smem, bars, coords, counts, sm_scale, causal, dropout, operands):
        """One warp: K and V of both consumers, then Q (with its rows' L and D) and dO of every query block of
        every query head of this kv head into the ring, each slot refilled once both consumers released it."""
        q_desc, k_desc, v_desc, do_desc = descs[0], descs[1], descs[2], descs[3]
        lse_desc, delta_desc = descs[6], descs[7]
        q_smem, k_smem, v_smem, do_smem, lse_smem, delta_smem = smem
        H, ROWS_STRIDE = coords[4], coords[7]
        kv_bar, q_ready, do_ready, q_empty, do_empty = bars[0], bars[1], bars[2], bars[3], bars[4]
        off_b, off_kvh, n0, KV_GROUP = coords[0], coords[1], coords[2], coords[3]
        lo, hi = counts[0], counts[3]
        BLOCK_M: gl.constexpr = q_smem.type.shape[3]
        BLOCK_N: gl.constexpr = k_smem.type.shape[3]
        STAGES: gl.constexpr = q_smem.type.shape[0]
        mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes)
        for half in gl.static_range(2):
            tma_load(k_desc, [off_b, off_kvh, n0 + half * BLOCK_N, 0], kv_bar, k_smem.index(half))
            tma_load(v_desc, [off_b, off_kvh, n0 + half * BLOCK_N, 0], kv_bar, v_smem.index(half))
        t = 0
        for g in range(KV_GROUP):
            off_h = off_kvh * KV_GROUP + g
            for m in range(lo, hi, BLOCK_M):
                slot = t % STAGES
                phase = (t // STAGES) & 1
                mbarrier.wait(q_empty.index(slot), phase ^ 1)
                row = (off_b * H + off_h) * ROWS_STRIDE + m  # of the flattened L and D
                mbarrier.expect(q_ready.index(slot), q_desc.block_type.nbytes + lse_desc.block_type.nbytes
                                + delta_desc.block_type.nbytes)
                tma_load(lse_desc, [row], q_ready.index(slot), lse_smem.index(slot))
                tma_load(delta_desc, [row], q_ready.index(slot), delta_smem.index(slot))
                tma_load(q_desc, [off_b, off_h, m, 0], q_ready.index(slot), q_smem.index(slot))
                mbarrier.wait(do_empty.index(slot), phase ^ 1)
                mbarrier.expect(do_ready.index(slot), do_desc.block_type.nbytes)
                tma_load(do_desc, [off_b, off_h, m, 0], do_ready.index(slot), do_smem.index(slot))
                t += 1

    @gluon.jit
    def _dkdv_step(k_tile, v_tile, q_smem, do_smem, rows_smem, bars, dk, dv, kept, t, m, keys, offset, N_Q,
                   score_scale, causal, drop, MASKED: gl.constexpr, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr,
                   DROPOUT: gl.constexpr, AHEAD: gl.constexpr, st_layout: gl.constexpr, acc_layout: gl.constexpr,
                   op_layout: gl.constexpr):
        """The terms of query block ``m`` (ring position ``t``) added to dK and dV (keys along rows); returns dK,
        dV and ``kept``. With ``DROPOUT``, ``drop`` is (stream key, keep threshold, 1 - p, first key) of the
        forward's draws: the kept weights enter dV and dS unscaled, dS = P (dP - (1 - p) D) for kept weights, and
        the caller divides dK and dV by 1 - p once, at the end (one multiply a row of D here instead of two a
        weight). The draws of this block are drawn here, or with ``AHEAD`` come in ``kept`` (:func:`kept_words`),
        drawn by the step before while its dK product ran; this step then draws the next block's (``m +
        BLOCK_M``) while its own dK product runs, and returns them. L and D come from ``rows_smem`` (L's and D's
        slots beside Q's), each read once its product is done, and past N_Q as +inf and 0."""
        kv_bar, q_ready, do_ready, q_empty, do_empty = bars[0], bars[1], bars[2], bars[3], bars[4]
        lse_smem, delta_smem = rows_smem
        STAGES: gl.constexpr = q_smem.type.shape[0]
        BLOCK_N: gl.constexpr = k_tile.type.shape[0]
        slot = t % STAGES
        phase = (t // STAGES) & 1
        mbarrier.wait(q_ready.index(slot), phase)
        q_tile = q_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
        s_t = warpgroup_mma(k_tile, q_tile.permute((1, 0)), gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout),
                            use_acc=False, is_async=True)
        rows = m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))  # queries, along columns
        s_t = warpgroup_mma_wait(num_outstanding=0, deps=(s_t, ))
        lse = lse_smem.index(slot).load(gl.SliceLayout(0, st_layout))
        if MASKED:  # the copy engine read past this head's rows
            lse = gl.where(rows < N_Q, lse, float("inf"))
        # L = -inf (a row that sees no key) read as +inf: P = exp2(S - inf) = 0, never NaN.
        lse2 = gl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
        s_t = s_t * score_scale
        if MASKED:
            visible = (rows[None, :] + offset >= keys[:, None]) | (causal == 0)
            s_t = gl.where(visible, s_t, float("-inf"))
        p_t = gl.exp2(s_t - lse2[None, :])
        mbarrier.wait(do_ready.index(slot), phase)
        do_tile = do_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
        if DROPOUT:  # dV sums the weights the forward kept (its 1 / (1 - p) comes at the end)
            words = kept
            if not AHEAD:
                words = kept_words(drop[0], m, drop[3], drop[1], BLOCK_N, BLOCK_M, True)
            p_op = gl.convert_layout(kept_weights_operand(p_t, words, q_tile.dtype, BLOCK_N, BLOCK_M, True), op_layout)
        else:
            p_op = gl.convert_layout(p_t.to(q_tile.dtype), op_layout)
        dv = warpgroup_mma(p_op, do_tile, dv, is_async=True)
        dp_t = warpgroup_mma(v_tile, do_tile.permute((1, 0)), gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout),
                             use_acc=False, is_async=True)
        dv, dp_t, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dp_t, p_op))
        delta = delta_smem.index(slot).load(gl.SliceLayout(0, st_layout))
        if MASKED:
            delta = gl.where(rows < N_Q, delta, 0.0)
        mbarrier.arrive(do_empty.index(slot), count=1)
        if DROPOUT:  # dP of the kept weights only, against D scaled by 1 - p
            dp_t = gl.where(keep_from_words(words, BLOCK_N, BLOCK_M, True, st_layout), dp_t, 0.0)
            delta = delta * drop[2]
        ds_op = gl.convert_layout((p_t * (dp_t - delta[None, :])).to(q_tile.dtype), op_layout)
        dk = warpgroup_mma(ds_op, q_tile, dk, is_async=True)
        if AHEAD:  # the next block's draws, while the tensor cores compute dK
            kept = kept_words(drop[0], m + BLOCK_M, drop[3], drop[1], BLOCK_N, BLOCK_M, True)
        dk, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dk, ds_op))
        mbarrier.arrive(q_empty.index(slot), count=1)
        return dk, dv, kept

    @gluon.jit
    def _dkdv_consume(descs, smem, bars, coords, counts, sm_scale, causal, dropout, operands, HALF: gl.constexpr,
                      DROPOUT: gl.constexpr, AHEAD: gl.constexpr):
        """One warpgroup: dK and dV of the program's ``HALF``-th BLOCK_N keys, summed over the kv head's query
        heads. Block sizes come from the shared memory's shapes (partitions take no constexpr arguments).
        ``dropout``: (the seed's pointer, p), read with ``DROPOUT`` only, each block's draws drawn one step ahead
        with ``AHEAD`` (:func:`_dkdv_step`); ``operands`` (:func:`.attention_fwd_hopper.operands_flag`): whether K
        and V are read from registers."""
        dk_desc, dv_desc = descs[4], descs[5]
        q_smem, k_smem, v_smem, do_smem = smem[0], smem[1], smem[2], smem[3]
        rows_smem = (smem[4], smem[5])
        kv_bar = bars[0]
        off_b, off_kvh, n0, KV_GROUP, H, N_Q = coords[0], coords[1], coords[2], coords[3], coords[4], coords[5]
        lo, full_lo, full_hi, hi = counts
        BLOCK_M: gl.constexpr = q_smem.type.shape[3]
        HEAD_DIM: gl.constexpr = q_smem.type.shape[4]
        BLOCK_N: gl.constexpr = k_smem.type.shape[3]
        st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, BLOCK_M, 16])
        acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                             instr_shape=[16, HEAD_DIM, 16])
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        key0 = n0 + HALF * BLOCK_N
        keys = key0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
        offset = coords[6]
        score_scale = sm_scale * LOG2E
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, acc_layout)
        mbarrier.wait(kv_bar, 0)
        k_tile = k_smem.index(HALF).reshape([BLOCK_N, HEAD_DIM])
        v_tile = v_smem.index(HALF).reshape([BLOCK_N, HEAD_DIM])
        k_op, v_op = _first_operands(k_tile, v_tile, operands, st_layout)
        seed = 0
        if DROPOUT:
            seed = gl.load(dropout[0])
        t = 0
        for g in range(KV_GROUP):
            off_h = off_kvh * KV_GROUP + g
            drop = (0, 0, 1.0, key0)  # (stream key, keep threshold, 1 - p, first key)
            kept = 0
            if DROPOUT:
                drop = (stream_key(seed, off_b * H + off_h), keep_threshold(dropout[1]), 1.0 - dropout[1], key0)
                if AHEAD:  # the first block's draws; each step draws the next one's
                    kept = kept_words(drop[0], lo, drop[3], drop[1], BLOCK_N, BLOCK_M, True)
            # the diagonal's query blocks, then the ones that see every key whole, then the N_Q tail
            for m in range(lo, full_lo, BLOCK_M):
                dk, dv, kept = _dkdv_step(k_op, v_op, q_smem, do_smem, rows_smem, bars, dk, dv, kept, t, m, keys,
                                          offset, N_Q, score_scale, causal, drop, True, BLOCK_M, HEAD_DIM, DROPOUT,
                                          AHEAD, st_layout, acc_layout, op_layout)
                t += 1
            for m in range(full_lo, full_hi, BLOCK_M):
                dk, dv, kept = _dkdv_step(k_op, v_op, q_smem, do_smem, rows_smem, bars, dk, dv, kept, t, m, keys,
                                          offset, N_Q, score_scale, causal, drop, False, BLOCK_M, HEAD_DIM, DROPOUT,
                                          AHEAD, st_layout, acc_layout, op_layout)
                t += 1
            for m in range(full_hi, hi, BLOCK_M):
                dk, dv, kept = _dkdv_step(k_op, v_op, q_smem, do_smem, rows_smem, bars, dk, dv, kept, t, m, keys,
                                          offset, N_Q, score_scale, causal, drop, True, BLOCK_M, HEAD_DIM, DROPOUT,
                                          AHEAD, st_layout, acc_layout, op_layout)
                t += 1
        # dK and dV leave through this half's K and V slots (read by no product now); rows past N_K are dropped.
        dk_scale = sm_scale
        if DROPOUT:  # the kept weights' 1 / (1 - p), left out of every term
            dk_scale = sm_scale / (1.0 - dropout[1])
            dv = dv * (1.0 / (1.0 - dropout[1]))
        k_tile.store((dk * dk_scale).to(dk_desc.dtype))
        v_tile.store(dv.to(dv_desc.dtype))
        fence_async_shared()
        tma_store(dk_desc, [off_b, off_kvh, key0, 0], k_smem.index(HALF))
        tma_store(dv_desc, [off_b, off_kvh, key0, 0], v_smem.index(HALF))
        tma.store_wait(pendings=0)

    @gluon.jit
    def _dkdv_consume_first_half(descs, smem, bars, coords, counts, sm_scale, causal, dropout, operands):
        _dkdv_consume(descs, smem, bars, coords, counts, sm_scale, causal, dropout, operands, 0, False, False)

    @gluon.jit
    def _dkdv_consume_second_half(descs, smem, bars, coords, counts, sm_scale, causal, dropout, operands):
        _dkdv_consume(descs, smem, bars, coords, counts, sm_scale, causal, dropout, operands, 1, False, False)

    @gluon.jit
    def _dkdv_consume_first_half_dropout(descs, smem, bars, coords, counts, sm_scale, causal, dropout, operands):
        _dkdv_consume(descs, smem, bars, coords, counts, sm_scale, causal, dropout, operands, 0, True, False)

    @gluon.jit
    def _dkdv_consume_second_half_dropout(descs, smem, bars, coords, counts, sm_scale, causal, dropout, operands):
        _dkdv_consume(descs, smem, bars, coords, counts, sm_scale, causal, dropout, operands, 1, True, False)

    @gluon.jit
    def _dkdv_consume_first_half_dropout_ahead(descs, smem, bars, coords, counts, sm_scale, causal, dropout,
                                               operands):
        _dkdv_consume(descs, smem, bars, coords, counts, sm_scale, causal, dropout, operands, 0, True, True)

    @gluon.jit
    def _dkdv_consume_second_half_dropout_ahead(descs, smem, bars, coords, counts, sm_scale, causal, dropout,
                                                operands):
        _dkdv_consume(descs, smem, bars, coords, counts, sm_scale, causal, dropout, operands, 1, True, True)

    @gluon.jit
    def attention_bwd_dkdv_hopper_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse_desc, delta_desc,
                                         sm_scale, H, KV_GROUP, N_Q, N_K, ROWS_STRIDE, DROPOUT_SEED, dropout_p,
                                         CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                                         HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, DROPOUT: gl.constexpr,
                                         REGISTER_OPERANDS: gl.constexpr, DRAWS_AHEAD: gl.constexpr,
                                         CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr,
                                         num_warps: gl.constexpr):
        """dK, dV of keys ``2 * BLOCK_N * program_id(0)`` on of (sample, kv head) ``program_id(1)``. Descriptors:
        (B, H, N_q, D) q/do with (1, 1, BLOCK_M, D) tiles, (B, H_kv, N_k, D) k/v/dk/dv with (1, 1, BLOCK_N, D)
        tiles; ``lse_desc``, ``delta_desc`` L and D of (B, H, N_q) flattened, each head's rows ``ROWS_STRIDE``
        after the last one's, in BLOCK_M tiles (:func:`rows_descriptor`). ``DROPOUT``: the forward's dropout of
        probability ``dropout_p`` from the int64 seed at ``DROPOUT_SEED``, with ``DRAWS_AHEAD`` each block's draws
        drawn during the step before (:data:`DKDV_DRAWS_AHEAD`). ``REGISTER_OPERANDS``: K and V read from registers
        (:data:`DKDV_REGISTER_OPERANDS`, :data:`DKDV_DROPOUT_REGISTER_OPERANDS` with dropout)."""
        gl.static_assert(num_warps == 4)
        gl.static_assert(BLOCK_M % 4 == 0)  # with ROWS_STRIDE, every block of L and D starts 16-byte aligned
        off_hkv = gl.program_id(1)
        kv_heads = H // KV_GROUP
        off_b = off_hkv // kv_heads
        off_kvh = off_hkv % kv_heads
        n0 = gl.program_id(0) * 2 * BLOCK_N
        offset = N_K - N_Q  # query row i sits at key position i + offset
        # Query blocks [lo, hi) see a key of this program; [full_lo, full_hi) see all of them (no mask).
        lo = 0
        full_lo = 0
        if CAUSAL:  # key j is seen by rows i with i + offset >= j
            lo = gl.maximum(n0 - offset, 0) // BLOCK_M * BLOCK_M
            full_lo = gl.cdiv(gl.maximum(n0 + 2 * BLOCK_N - 1 - offset, 0), BLOCK_M) * BLOCK_M
        hi = gl.maximum(N_Q, lo)  # lo >= N_Q: no row sees these keys, and their dK, dV are stored as 0
        full_lo = gl.minimum(gl.maximum(full_lo, lo), hi)
        full_hi = gl.minimum(gl.maximum(N_Q // BLOCK_M * BLOCK_M, full_lo), hi)

        q_smem = gl.allocate_shared_memory(q_desc.dtype, [STAGES, 1, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
        do_smem = gl.allocate_shared_memory(do_desc.dtype, [STAGES, 1, 1, BLOCK_M, HEAD_DIM], do_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [2, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [2, 1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
        lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], lse_desc.layout)
        delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], delta_desc.layout)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        do_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(do_ready.index(i), count=1)
            mbarrier.init(q_empty.index(i), count=2)  # released by both consumers
            mbarrier.init(do_empty.index(i), count=2)

        causal = gl.to_tensor(CAUSAL)
        args = ((q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse_desc, delta_desc),
                (q_smem, k_smem, v_smem, do_smem, lse_smem, delta_smem), (kv_bar, q_ready, do_ready, q_empty, do_empty),
                (off_b, off_kvh, n0, KV_GROUP, H, N_Q, offset, ROWS_STRIDE), (lo, full_lo, full_hi, hi), sm_scale,
                causal, (DROPOUT_SEED, dropout_p), operands_flag(REGISTER_OPERANDS))
        if DROPOUT and DRAWS_AHEAD:
            gl.warp_specialize([(_dkdv_consume_first_half_dropout_ahead, args),
                                (_dkdv_consume_second_half_dropout_ahead, args),
                                (_bwd_load_partition, args)], [4, 1], [CONSUMER_REGS, LOADER_REGS])
        elif DROPOUT:
            gl.warp_specialize([(_dkdv_consume_first_half_dropout, args), (_dkdv_consume_second_half_dropout, args),
                                (_bwd_load_partition, args)], [4, 1], [CONSUMER_REGS, LOADER_REGS])
        else:
            gl.warp_specialize([(_dkdv_consume_first_half, args), (_dkdv_consume_second_half, args),
                                (_bwd_load_partition, args)], [4, 1], [CONSUMER_REGS, LOADER_REGS])


    @gluon.jit
    def _dq_load_partition(descs, smem, bars, coords, bounds, LSE, DELTA, sm_scale, causal, dropout, operands):
        """One warp: Q and dO of both consumers once, then K and V of every key block any of them sees into the
        ring, each slot refilled once both consumers released it."""
        q_desc, k_desc, v_desc, do_desc = descs[0], descs[1], descs[2], descs[3]
        q_smem, k_smem, v_smem, do_smem = smem
        qdo_bar, k_ready, v_ready, k_empty, v_empty = bars[0], bars[1], bars[2], bars[3], bars[4]
        off_b, off_h, off_kvh, m0 = coords[0], coords[1], coords[2], coords[3]
        hi = bounds[3]
        BLOCK_M: gl.constexpr = q_smem.type.shape[3]
        BLOCK_N: gl.constexpr = k_smem.type.shape[3]
        STAGES: gl.constexpr = k_smem.type.shape[0]
        mbarrier.expect(qdo_bar, 2 * q_desc.block_type.nbytes + 2 * do_desc.block_type.nbytes)
        for half in gl.static_range(2):
            tma_load(q_desc, [off_b, off_h, m0 + half * BLOCK_M, 0], qdo_bar, q_smem.index(half))
            tma_load(do_desc, [off_b, off_h, m0 + half * BLOCK_M, 0], qdo_bar, do_smem.index(half))
        for n in range(0, hi, BLOCK_N):
            t = n // BLOCK_N
            slot = t % STAGES
            phase = (t // STAGES) & 1
            mbarrier.wait(k_empty.index(slot), phase ^ 1)
            mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
            tma_load(k_desc, [off_b, off_kvh, n, 0], k_ready.index(slot), k_smem.index(slot))
            mbarrier.wait(v_empty.index(slot), phase ^ 1)
            mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
            tma_load(v_desc, [off_b, off_kvh, n, 0], v_ready.index(slot), v_smem.index(slot))

    @gluon.jit
    def _dq_step(q_tile, do_tile, k_smem, v_smem, bars, dq, kept, n, rows, lse2, delta, offset, N_K, score_scale,
                 causal, drop, MASKED: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                 DROPOUT: gl.constexpr, AHEAD: gl.constexpr, s_layout: gl.constexpr, op_layout: gl.constexpr):
        """The terms of key block ``n`` added to dQ (queries along rows); returns dQ and ``kept``. With ``DROPOUT``,
        ``drop`` is (stream key, keep threshold, 1 - p, first query row) of the forward's draws, ``delta`` is D
        scaled by 1 - p, and the caller divides dQ by 1 - p at the end: dS = P (dP - (1 - p) D) for kept weights.
        With ``AHEAD`` the block's draws come in ``kept`` (:func:`kept_words`), drawn by the step before while its
        dQ product ran, and this step draws the next block's (``n + BLOCK_N``) while its own runs, as
        :func:`_dkdv_step` does."""
        k_ready, v_ready, k_empty, v_empty = bars[1], bars[2], bars[3], bars[4]
        STAGES: gl.constexpr = k_smem.type.shape[0]
        BLOCK_M: gl.constexpr = q_tile.type.shape[0]
        t = n // BLOCK_N
        slot = t % STAGES
        phase = (t // STAGES) & 1
        mbarrier.wait(k_ready.index(slot), phase)
        k_tile = k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM])
        s = warpgroup_mma(q_tile, k_tile.permute((1, 0)), gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout),
                          use_acc=False, is_async=True)
        mbarrier.wait(v_ready.index(slot), phase)
        v_tile = v_smem.index(slot).reshape([BLOCK_N, HEAD_DIM])
        dp = warpgroup_mma(do_tile, v_tile.permute((1, 0)), gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout),
                           use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
        s = s * score_scale
        if MASKED:
            keys = n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            visible = (keys[None, :] < N_K) & ((rows[:, None] + offset >= keys[None, :]) | (causal == 0))
            s = gl.where(visible, s, float("-inf"))
        p = gl.exp2(s - lse2[:, None])
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp, ))
        mbarrier.arrive(v_empty.index(slot), count=1)
        if DROPOUT:  # dP of the kept weights only (their 1 / (1 - p) comes at the end)
            if AHEAD or HEAD_DIM == DQ_ZERO_DROPPED_HEAD_DIM:  # the draws as words, one bit a weight
                words = kept
                if not AHEAD:
                    words = kept_words(drop[0], drop[3], n, drop[1], BLOCK_M, BLOCK_N, False)
                if HEAD_DIM == DQ_ZERO_DROPPED_HEAD_DIM:
                    dp = zero_dropped(dp, words, BLOCK_M, BLOCK_N, False)
                else:
                    dp = gl.where(keep_from_words(words, BLOCK_M, BLOCK_N, False, s_layout), dp, 0.0)
            else:
                dp = gl.where(dropout_keep(drop[0], drop[3], n, drop[1], BLOCK_M, BLOCK_N, False, s_layout), dp, 0.0)
        ds_op = gl.convert_layout((p * (dp - delta[:, None])).to(q_tile.dtype), op_layout)
        dq = warpgroup_mma(ds_op, k_tile, dq, is_async=True)
        if AHEAD:  # the next block's draws, while the tensor cores compute dQ
            kept = kept_words(drop[0], drop[3], n + BLOCK_N, drop[1], BLOCK_M, BLOCK_N, False)
        dq, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ds_op))
        mbarrier.arrive(k_empty.index(slot), count=1)
        return dq, kept

    @gluon.jit
    def _dq_consume(descs, smem, bars, coords, bounds, LSE, DELTA, sm_scale, causal, dropout, operands,
                    HALF: gl.constexpr, DROPOUT: gl.constexpr, AHEAD: gl.constexpr):
        """One warpgroup: dQ of the program's ``HALF``-th BLOCK_M query rows. ``dropout``: (the seed's pointer,
        p), read with ``DROPOUT`` only, each block's draws drawn one step ahead with ``AHEAD`` (:func:`_dq_step`);
        ``operands`` (:func:`.attention_fwd_hopper.operands_flag`): whether Q and dO are read from registers."""
        dq_desc = descs[4]
        q_smem, k_smem, v_smem, do_smem = smem
        qdo_bar, k_ready, v_ready, k_empty, v_empty = bars[0], bars[1], bars[2], bars[3], bars[4]
        off_b, off_h, m0, H, N_Q, N_K, offset = coords[0], coords[1], coords[3], coords[4], coords[5], coords[6], \
            coords[7]
        BLOCK_M: gl.constexpr = q_smem.type.shape[3]
        HEAD_DIM: gl.constexpr = q_smem.type.shape[4]
        BLOCK_N: gl.constexpr = k_smem.type.shape[3]
        STAGES: gl.constexpr = k_smem.type.shape[0]
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, 16])
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, HEAD_DIM, 16])
        op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
        m = m0 + HALF * BLOCK_M
        rows = m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        row_base = (off_b * H + off_h).to(gl.int64) * N_Q
        lse = gl.load(LSE + row_base + rows, mask=rows < N_Q, other=float("inf"))
        # L = -inf (a row that sees no key) read as +inf: P = exp2(S - inf) = 0, never NaN.
        lse2 = gl.where(lse == float("-inf"), float("inf"), lse) * LOG2E
        delta = gl.load(DELTA + row_base + rows, mask=rows < N_Q, other=0.0)
        score_scale = sm_scale * LOG2E
        # key blocks [0, full) are seen whole by every row of this half, [full, hi) in part; the loader walks to the
        # second half's hi, so the first half releases the blocks between its hi and that one unread.
        full, hi, hi_all = bounds[HALF * 2], bounds[HALF * 2 + 1], bounds[3]
        drop = (0, 0, 1.0, m)  # (stream key, keep threshold, 1 - p, first row)
        dq_scale = sm_scale
        if DROPOUT:  # the kept weights' 1 / (1 - p) is left out of every term: D is scaled by 1 - p instead
            drop = (stream_key(gl.load(dropout[0]), off_b * H + off_h), keep_threshold(dropout[1]), 1.0 - dropout[1],
                    m)
            delta = delta * (1.0 - dropout[1])
            dq_scale = sm_scale / (1.0 - dropout[1])
        kept = 0
        if AHEAD:  # the first block's draws; each step draws the next one's
            kept = kept_words(drop[0], drop[3], 0, drop[1], BLOCK_M, BLOCK_N, False)
        dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
        mbarrier.wait(qdo_bar, 0)
        q_tile = q_smem.index(HALF).reshape([BLOCK_M, HEAD_DIM])
        do_tile = do_smem.index(HALF).reshape([BLOCK_M, HEAD_DIM])
        q_op, do_op = _first_operands(q_tile, do_tile, operands, s_layout)
        for n in range(0, full, BLOCK_N):
            dq, kept = _dq_step(q_op, do_op, k_smem, v_smem, bars, dq, kept, n, rows, lse2, delta, offset, N_K,
                                score_scale, causal, drop, False, BLOCK_N, HEAD_DIM, DROPOUT, AHEAD, s_layout,
                                op_layout)
        for n in range(full, hi, BLOCK_N):
            dq, kept = _dq_step(q_op, do_op, k_smem, v_smem, bars, dq, kept, n, rows, lse2, delta, offset, N_K,
                                score_scale, causal, drop, True, BLOCK_N, HEAD_DIM, DROPOUT, AHEAD, s_layout,
                                op_layout)
        for n in range(hi, hi_all, BLOCK_N):
            t = n // BLOCK_N
            slot = t % STAGES
            phase = (t // STAGES) & 1
            mbarrier.wait(k_ready.index(slot), phase)
            mbarrier.wait(v_ready.index(slot), phase)
            mbarrier.arrive(k_empty.index(slot), count=1)
            mbarrier.arrive(v_empty.index(slot), count=1)
        # dQ leaves through this half's Q slot (read by no product now); rows past N_Q are dropped.
        q_tile.store((dq * dq_scale).to(dq_desc.dtype))
        fence_async_shared()
        tma_store(dq_desc, [off_b, off_h, m, 0], q_smem.index(HALF))
        tma.store_wait(pendings=0)

    @gluon.jit
    def _dq_consume_first_half(descs, smem, bars, coords, bounds, LSE, DELTA, sm_scale, causal, dropout,
                               operands):
        _dq_consume(descs, smem, bars, coords, bounds, LSE, DELTA, sm_scale, causal, dropout, operands, 0, False, False)

    @gluon.jit
    def _dq_consume_second_half(descs, smem, bars, coords, bounds, LSE, DELTA, sm_scale, causal, dropout,
                                operands):
        _dq_consume(descs, smem, bars, coords, bounds, LSE, DELTA, sm_scale, causal, dropout, operands, 1, False, False)

    @gluon.jit
    def _dq_consume_first_half_dropout(descs, smem, bars, coords, bounds, LSE, DELTA, sm_scale, causal, dropout,
                                       operands):
        _dq_consume(descs, smem, bars, coords, bounds, LSE, DELTA, sm_scale, causal, dropout, operands, 0, True, False)

    @gluon.jit
    def _dq_consume_second_half_dropout(descs, smem, bars, coords, bounds, LSE, DELTA, sm_scale, causal, dropout,
                                        operands):
        _dq_consume(descs, smem, bars, coords, bounds, LSE, DELTA, sm_scale, causal, dropout, operands, 1, True, False)

    @gluon.jit
    def _dq_consume_first_half_dropout_ahead(descs, smem, bars, coords, bounds, LSE, DELTA, sm_scale, causal,
                                             dropout, operands):
        _dq_consume(descs, smem, bars, coords, bounds, LSE, DELTA, sm_scale, causal, dropout, operands, 0, True, True)

    @gluon.jit
    def _dq_consume_second_half_dropout_ahead(descs, smem, bars, coords, bounds, LSE, DELTA, sm_scale, causal,
                                              dropout, operands):
        _dq_consume(descs, smem, bars, coords, bounds, LSE, DELTA, sm_scale, causal, dropout, operands, 1, True, True)

    @gluon.jit
    def attention_bwd_dq_hopper_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, LSE, DELTA, sm_scale, H,
                                       KV_GROUP, N_Q, N_K, DROPOUT_SEED, dropout_p, CAUSAL: gl.constexpr,
                                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                                       STAGES: gl.constexpr, DROPOUT: gl.constexpr, REGISTER_OPERANDS: gl.constexpr,
                                       DRAWS_AHEAD: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                                       LOADER_REGS: gl.constexpr, num_warps: gl.constexpr):
        """dQ of query rows ``2 * BLOCK_M`` times a query tile on of (sample, head) ``program_id(1)``; under a
        causal mask the longest tiles (the last rows) first. Descriptors: (B, H, N_q, D) q/do/dq with
        (1, 1, BLOCK_M, D) tiles, (B, H_kv, N_k, D) k/v with (1, 1, BLOCK_N, D) tiles; LSE, DELTA (B, H, N_q)
        float32 contiguous. ``DROPOUT``: the forward's dropout of probability ``dropout_p`` from the int64 seed at
        ``DROPOUT_SEED``, with ``DRAWS_AHEAD`` each block's draws drawn during the step before
        (:data:`DQ_DRAWS_AHEAD`). ``REGISTER_OPERANDS``: Q and dO read from registers (:data:`DQ_REGISTER_OPERANDS`)."""
        gl.static_assert(num_warps == 4)
        off_bh = gl.program_id(1)
        off_b = off_bh // H
        off_h = off_bh % H
        off_kvh = off_h // KV_GROUP
        tile = gl.program_id(0)
        if CAUSAL:
            tile = gl.num_programs(0) - 1 - tile
        m0 = tile * 2 * BLOCK_M
        offset = N_K - N_Q  # query row i sits at key position i + offset
        # Per half: key blocks [0, full) seen whole by its rows, [full, hi) in part (rounded up to a block).
        full0 = N_K // BLOCK_N * BLOCK_N
        full1 = full0
        hi0 = gl.cdiv(N_K, BLOCK_N) * BLOCK_N
        hi1 = hi0
        if CAUSAL:  # key j is seen by rows i with i + offset >= j
            full0 = gl.minimum(gl.maximum(m0 + offset + 1, 0) // BLOCK_N * BLOCK_N, full0)
            full1 = gl.minimum(gl.maximum(m0 + BLOCK_M + offset + 1, 0) // BLOCK_N * BLOCK_N, full1)
            hi0 = gl.minimum(gl.cdiv(gl.maximum(m0 + BLOCK_M + offset, 0), BLOCK_N) * BLOCK_N, hi0)
            hi1 = gl.minimum(gl.cdiv(gl.maximum(m0 + 2 * BLOCK_M + offset, 0), BLOCK_N) * BLOCK_N, hi1)

        q_smem = gl.allocate_shared_memory(q_desc.dtype, [2, 1, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
        do_smem = gl.allocate_shared_memory(do_desc.dtype, [2, 1, 1, BLOCK_M, HEAD_DIM], do_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
        qdo_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        mbarrier.init(qdo_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)  # released by both consumers
            mbarrier.init(v_empty.index(i), count=2)

        causal = gl.to_tensor(CAUSAL)
        args = ((q_desc, k_desc, v_desc, do_desc, dq_desc), (q_smem, k_smem, v_smem, do_smem),
                (qdo_bar, k_ready, v_ready, k_empty, v_empty), (off_b, off_h, off_kvh, m0, H, N_Q, N_K, offset),
                (full0, hi0, full1, hi1), LSE, DELTA, sm_scale, causal, (DROPOUT_SEED, dropout_p),
                operands_flag(REGISTER_OPERANDS))
        if DROPOUT and DRAWS_AHEAD:
            gl.warp_specialize([(_dq_consume_first_half_dropout_ahead, args),
                                (_dq_consume_second_half_dropout_ahead, args),
                                (_dq_load_partition, args)], [4, 1], [CONSUMER_REGS, LOADER_REGS])
        elif DROPOUT:
            gl.warp_specialize([(_dq_consume_first_half_dropout, args), (_dq_consume_second_half_dropout, args),
                                (_dq_load_partition, args)], [4, 1], [CONSUMER_REGS, LOADER_REGS])
        else:
            gl.warp_specialize([(_dq_consume_first_half, args), (_dq_consume_second_half, args),
                                (_dq_load_partition, args)], [4, 1], [CONSUMER_REGS, LOADER_REGS])


def _dropout_preferred(head_dim: int, n_q: int, n_k: int, scores: float) -> bool:
    """Whether both kernels take a call with dropout: the head dims and rows of :data:`DROPOUT_MIN_ROWS`, and
    :data:`MIN_SCORES` ``scores``."""
    return (head_dim in DROPOUT_MIN_ROWS and min(n_q, n_k) >= DROPOUT_MIN_ROWS[head_dim]
            and scores >= MIN_SCORES)


def preferred(head_dim: int, n_q: int, n_k: int, scores: float, dropout: bool = False) -> bool:
    """Whether this kernel is the faster dK/dV kernel for these sizes: :data:`MIN_ROWS` at this head_dim, and
    :data:`MIN_SCORES` ``scores`` (those a mask leaves); with ``dropout``, :func:`_dropout_preferred`."""
    if dropout:
        return _dropout_preferred(head_dim, n_q, n_k, scores)
    return head_dim in MIN_ROWS and min(n_q, n_k) >= MIN_ROWS[head_dim] and scores >= MIN_SCORES


def dq_preferred(head_dim: int, n_q: int, n_k: int, scores: float, dropout: bool = False) -> bool:
    """Whether the dQ kernel is the faster one for these sizes: :data:`DQ_MIN_ROWS` at this head_dim, and
    :data:`MIN_SCORES` ``scores`` (those a mask leaves); with ``dropout``, :func:`_dropout_preferred`."""
    if dropout:
        return _dropout_preferred(head_dim, n_q, n_k, scores)
    return head_dim in DQ_MIN_ROWS and min(n_q, n_k) >= DQ_MIN_ROWS[head_dim] and scores >= MIN_SCORES


#: The copy engine reads from 16-byte aligned global addresses only, block starts included: each head's rows of L
#: and D start a multiple of this many float32 values apart (:func:`rows_in_aligned_heads`).
ROWS_ALIGN = 4


def _copy_engine_reads(rows: torch.Tensor, stride: int) -> bool:
    """Whether the copy engine can read every query block of the (B, H, N_q) float32 ``rows`` in place: unit row
    stride, heads ``stride`` apart (a multiple of :data:`ROWS_ALIGN`) and batches ``H stride``, 16-byte aligned."""
    return (rows.dtype == torch.float32 and rows.dim() == 3 and stride % ROWS_ALIGN == 0
            and rows.stride() == (rows.shape[1] * stride, stride, 1) and rows.data_ptr() % 16 == 0)


def rows_in_aligned_heads(lse: torch.Tensor, delta: torch.Tensor) -> tuple:
    """L and D (B, H, N_q) float32 as the dK/dV kernel's copy engine can read them, and their common head stride:
    the tensors themselves where they share a head stride that is a multiple of :data:`ROWS_ALIGN`, from 16-byte
    aligned addresses; else both copied into zeroed (B, H, N_q rounded up) buffers. (With N_q = 77, head 1's first
    block would start 308 bytes in: an illegal instruction on the H100, sticky for the process.)"""
    stride = lse.stride(1)
    if _copy_engine_reads(lse, stride) and _copy_engine_reads(delta, stride):
        return lse, delta, stride
    stride = triton.cdiv(lse.shape[2], ROWS_ALIGN) * ROWS_ALIGN
    padded = (rows.new_zeros(*rows.shape[:2], stride)[..., :rows.shape[2]].copy_(rows) for rows in (lse, delta))
    return (*padded, stride)


def rows_descriptor(rows: torch.Tensor, block: int) -> "GluonDescriptor":
    """A 1-D Gluon descriptor of float32 (B, H, N_q) ``rows`` (L or D, as :func:`rows_in_aligned_heads` gives
    them) flattened, in tiles of ``block`` rows (unswizzled): the copy engine reads a query block's rows of one head
    from ``(b H + h) stride + m``, and past the head's last row into padding or the next head's (the kernel masks
    them), or zeros past the tensor."""
    stride = rows.stride(1) if rows.dim() == 3 else 0
    if not _copy_engine_reads(rows, stride):
        raise ValueError(f"rows: expected L or D as a float32 (B, H, N_q) tensor of unit row stride, each head's "
                         f"rows a multiple of 16 bytes apart, from a 16-byte aligned address; got {rows.dtype} of "
                         f"shape {tuple(rows.shape)}, strides {rows.stride()}, {rows.data_ptr() % 16} bytes past a "
                         f"16-byte boundary")
    batch, heads, n_q = rows.shape
    flat = rows.as_strided(((batch * heads - 1) * stride + n_q,), (1,))
    return GluonDescriptor(flat, [flat.numel()], [1], [block], ROWS_LAYOUT)


def launch_attention_dkdv_hopper(q, k, v, do, lse, delta, dk, dv, *, scale: float, causal: bool, dropout_p: float = 0.0,
                                 dropout_seed=None, register_operands: bool | None = None,
                                 draws_ahead: bool | None = None) -> None:
    """Fill dk, dv (B, H_kv, N_k, D) from q, do (B, H, N_q, D), k, v, and lse and delta (B, H, N_q) float32 (any
    strides: :func:`rows_in_aligned_heads` copies them where the copy engine cannot read them in place), for a call
    :func:`.attention_fwd_hopper.can_run` accepts (all six tensors, and head_dim in this module's
    :data:`CONFIGS`, or :data:`DROPOUT_CONFIGS` with dropout): no mask, or a causal one with ``causal``.
    ``dropout_p`` and ``dropout_seed``: the forward's (:func:`.attention_fwd_hopper.launch_attention_forward_hopper`).
    ``register_operands``: K and V read from registers (None: where :data:`DKDV_REGISTER_OPERANDS` says, or
    :data:`DKDV_DROPOUT_REGISTER_OPERANDS` with dropout). ``draws_ahead``: with dropout, each block's draws drawn
    during the step before (None: where :data:`DKDV_DRAWS_AHEAD` says)."""
    batch, heads, n_q, head_dim = q.shape
    kv_heads, n_k = k.shape[1], k.shape[2]
    if register_operands is None:
        register_operands = head_dim in (DKDV_DROPOUT_REGISTER_OPERANDS if dropout_p > 0 else DKDV_REGISTER_OPERANDS)
    if draws_ahead is None:
        draws_ahead = head_dim in DKDV_DRAWS_AHEAD
    lse, delta, rows_stride = rows_in_aligned_heads(lse, delta)
    block_m, block_n, stages = (DROPOUT_CONFIGS if dropout_p > 0 else CONFIGS)[head_dim]
    grid = (triton.cdiv(n_k, 2 * block_n), batch * kv_heads)
    launch(attention_bwd_dkdv_hopper_kernel, grid,
        tile_descriptor(q, block_m), tile_descriptor(k, block_n), tile_descriptor(v, block_n),
        tile_descriptor(do, block_m), tile_descriptor(dk, block_n), tile_descriptor(dv, block_n),
        rows_descriptor(lse, block_m), rows_descriptor(delta, block_m), scale,
        heads, heads // kv_heads, n_q, n_k, rows_stride, lse if dropout_seed is None else dropout_seed,
        float(dropout_p), CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim, STAGES=stages,
        DROPOUT=dropout_p > 0, REGISTER_OPERANDS=bool(register_operands),
        DRAWS_AHEAD=dropout_p > 0 and bool(draws_ahead), CONSUMER_REGS=CONSUMER_REGISTERS,
        LOADER_REGS=LOADER_REGISTERS, num_warps=4, maxnreg=KERNEL_REGISTERS)


def launch_attention_dq_hopper(q, k, v, do, lse, delta, dq, *, scale: float, causal: bool, dropout_p: float = 0.0,
                               dropout_seed=None, register_operands: bool | None = None,
                               draws_ahead: bool | None = None) -> None:
    """Fill dq (B, H, N_q, D) from q, do (B, H, N_q, D), k, v (B, H_kv, N_k, D), lse and delta (B, H, N_q) float32
    contiguous, for a call :func:`.attention_fwd_hopper.can_run` accepts (all six tensors, and head_dim in
    :data:`DQ_CONFIGS`): no mask, or a causal one with ``causal``. ``dropout_p`` and ``dropout_seed``: the
    forward's. ``register_operands``: Q and dO read from registers (None: where :data:`DQ_REGISTER_OPERANDS`
    says). ``draws_ahead``: with dropout, each block's draws drawn during the step before (None: where
    :data:`DQ_DRAWS_AHEAD` says)."""
    batch, heads, n_q, head_dim = q.shape
    kv_heads, n_k = k.shape[1], k.shape[2]
    if register_operands is None:
        register_operands = head_dim in DQ_REGISTER_OPERANDS
    if draws_ahead is None:
        draws_ahead = head_dim in DQ_DRAWS_AHEAD
    block_m, block_n, stages = DQ_CONFIGS[head_dim]
    grid = (triton.cdiv(n_q, 2 * block_m), batch * heads)
    launch(attention_bwd_dq_hopper_kernel, grid,
        tile_descriptor(q, block_m), tile_descriptor(k, block_n), tile_descriptor(v, block_n),
        tile_descriptor(do, block_m), tile_descriptor(dq, block_m), lse, delta, scale,
        heads, heads // kv_heads, n_q, n_k, lse if dropout_seed is None else dropout_seed, float(dropout_p),
        CAUSAL=causal, BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim, STAGES=stages, DROPOUT=dropout_p > 0,
        REGISTER_OPERANDS=bool(register_operands), DRAWS_AHEAD=dropout_p > 0 and bool(draws_ahead),
        CONSUMER_REGS=CONSUMER_REGISTERS, LOADER_REGS=LOADER_REGISTERS, num_warps=4, maxnreg=KERNEL_REGISTERS)
