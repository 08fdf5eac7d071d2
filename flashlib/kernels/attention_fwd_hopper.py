"""A Hopper forward written in Gluon, warp-specialized as FlashAttention-3: the softmax of one warpgroup
runs while the tensor cores compute another's products.

Why a second forward. :mod:`.attention_fwd` is written in Triton's tile language, whose compiler
decides when each warpgroup matrix multiply (``wgmma``) is waited for. It waits for ``S = Q K^T``
and for ``O += P V`` right where their results are used, so in every iteration the tensor cores
sit idle while the warps compute the softmax (the exponentials, row max and sum), and the
softmax units sit idle during the two products (benchmarks/TUNING.md, twenty-seventh finding).
Gluon, Triton's lower-level language, lets a kernel say when each product is waited for, which
warps do what, and how many registers each group of warps gets. A program here has three partitions:

* a **loading warp** issues the copy engine's (TMA) loads: the Q tiles, then K and V of every key
  block into a ring of ``STAGES`` shared-memory slots, each refilled once every consumer released it
  ("full" and "empty" barriers per slot, ``mbarrier``);
* two **consumer warpgroups**, 64 query rows each (240 registers a thread), run the online softmax::

      round j:  issue S_j = Q K_j^T, then O += P_{j-1} V_{j-1}   (tensor cores)
                wait for S_j; release K_j; softmax of S_j -> P_j  (while P_{j-1} V_{j-1} runs)
                wait for O; release V_{j-1}

  and take turns issuing their rounds (**ping-pong**, :data:`PINGPONG`), so one warpgroup's products
  run while the other computes its softmax. A program may run three consumers instead (``consumers=3``,
  192-row tiles, turns taken round robin or none, 160-168 registers each), as FlashAttention-3 does at head_dim 64;
  the default takes them only where they were measured faster (:data:`THREE_CONSUMER_MIN_ROWS`).

A program is **persistent** (:data:`PERSISTENT`): one per SM, it walks work items of 2 (or 3) x 64 query rows (under a
causal mask, a long tile paired with a short one, :func:`_item_head_and_tiles`), and the loader's ring runs on from one
tile into the next, so the next tile's Q, K and V arrive while this tile's last products and its epilogue run
(O leaves through its own shared-memory slot, not Q's). At 1024 rows a program walks only 8 key blocks, and
those ends were a tenth of its time (benchmarks/TUNING.md, thirty-second finding).

The wait for O inside a round is where FlashAttention-3's *intra*-warpgroup overlap would come from;
ptxas moves that wait above the exponentials (TUNING.md, thirty-first finding), so the overlap that
counts here is the one between the consumers, which the SM's warp schedulers make.

Scope: the plain forward (no mask or a causal one, bottom-right aligned as everywhere in
flashlib; GQA/MQA; 2-byte types; head_dim 64 or 128; a positive scale) and its dropout, whose draws
(:mod:`.dropout_hopper`) are the Triton kernels', on Hopper. **FP8** (float8 e4m3 q, k, v with descale factors, O
in 16 bits) runs the same partitions: both products take e4m3 operands, 32 of them a step; FP8 tensor cores read
both operands along the reduction, so V arrives as V^T tiles (keys innermost), P reaches P V through a
shared-memory slot of each consumer rather than registers (:func:`_weights_operand`), and Q stays in registers. It is
taken by default at :data:`FP8_HEAD_DIMS` (128, measured faster there). Everything else (windows, lengths,
packed sequences, score modifiers, other head dims, float32) runs in :mod:`.attention_fwd`, which is also the only
forward of the interpreter: Gluon has no interpreter. :func:`can_run` says which calls this kernel can take and
:func:`preferred` where it is the faster forward; GPU tests compare it with the float64 reference and with
:mod:`.attention_fwd`.
"""
from __future__ import annotations

import functools

import torch
import triton

from ._common import LN2, LOG2E, cuda_index, descriptor_ready, multiprocessor_count
from .launch import launch

try:  # Gluon ships with Triton 3.5 and later; its Hopper API is what this kernel is written against.
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    # The copy engine's load and store were renamed after Triton 3.6 (the H100 machine's version).
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    from .dropout_hopper import keep_threshold, kept_weights_operand, kept_words, stream_key
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older Triton
    HAVE_GLUON = False


#: (BLOCK_M, BLOCK_N, STAGES) per head_dim: BLOCK_M query rows for each consumer warpgroup, BLOCK_N
#: keys a block, STAGES slots of K and V.
CONFIGS = {64: (64, 128, 3), 128: (64, 128, 2)}
#: The same for FP8 inputs: their K and V tiles take half the bytes, which leaves room for more slots.
FP8_CONFIGS = {64: (64, 128, 4), 128: (64, 128, 3)}
#: Whether FP8 weights reach P V through a shared-memory slot of each consumer rather than registers
#: (:func:`_weights_operand`): 486 instructions a key block at head_dim 128 against 682 (Triton 3.6, compiled for
#: sm_90a); timed on an H100, P in registers runs 0.82-0.85x of this at 128, 0.79-0.83x at 64 (forty-first
#: finding). The launcher's ``fp8_weights_shared`` takes either.
FP8_WEIGHTS_SHARED = True
#: Where each consumer reads Q, the first operand of ``S = Q K^T`` in every key block of a tile, from registers
#: (loaded once a tile; its shared-memory slot is released to the loader at once) rather than from shared memory: a
#: product of both operands in shared memory reads 96 bytes a cycle at N = 128 keys, one with A in registers 64
#: (benchmarks/TUNING.md, thirty-ninth and fortieth findings). FP8 (:data:`FP8_Q_IN_REGISTERS`): on, as its P comes
#: from shared memory (Q from shared memory instead runs 0.96-0.98x at head_dim 128 on an H100, forty-first
#: finding); 16-bit without dropout (whose draws then spill): at the head dims in :data:`Q_IN_REGISTERS_HEAD_DIMS`,
#: 64, where it ran 1.000-1.033x Q from shared memory at every N from 1k to 16k, causal or not (H100, fp16, session
#: 53, forty-second finding; at 128 0.962-1.016x, so it stays in shared memory there). The route takes this kernel
#: at 64 under the causal mask from 2048 rows (:data:`MIN_ROWS`). The launcher's ``q_in_registers`` takes either.
FP8_Q_IN_REGISTERS = True
Q_IN_REGISTERS_HEAD_DIMS: tuple[int, ...] = (64,)
#: Registers a thread of each partition: the consumer warpgroups hold O, S and P (FlashAttention-3's 240),
#: the loading warp only addresses. The kernel is capped at KERNEL_REGISTERS so that its three warpgroups
#: fit the SM's 64K registers; the first consumer (the default partition) gets what the others leave.
CONSUMER_REGISTERS, LOADER_REGISTERS, KERNEL_REGISTERS = 240, 24, 168
#: Where a program runs three consumer warpgroups (192-row tiles) rather than two by default, as FlashAttention-3
#: does at head_dim 64 (16-bit inputs, no dropout): {head_dim: the least query and key rows}, without a mask and from
#: :data:`THREE_CONSUMER_MIN_SCORES` scores. At 64 a key block's two products take half the tensor cores' time they
#: take at 128 against the same exponentials, so with two consumers each one's softmax outlasts the other's products;
#: a third warpgroup has its products ready to issue in that gap (benchmarks/TUNING.md, sixty-second finding). Timed
#: on an H100 (FlashAttention-2 shapes, H = 32, B x N = 16384; each call alone in a CUDA graph): without a mask and
#: without turns they ran 1.07-1.08x the two consumers and 1.06-1.07x the Triton forward at 8k and 16k rows (fp16 and
#: bf16, session 69; 1.07x Triton at 16k in session 68 too), but only 1.00x the Triton forward at 4k and 0.99x at 2k;
#: under the causal mask 0.64-0.99x the Triton forward at 2k-8k (at 16k with turns 1.07x, but only 1.02-1.03x the two
#: consumers), with masked loops that spill (sixty-sixth finding). Batch x heads x N_q x N_k of 2^32 is the least
#: work timed. The launcher's ``consumers`` takes 2 or 3 at 64 wherever asked.
THREE_CONSUMER_MIN_ROWS: dict[int, int] = {64: 8192}
THREE_CONSUMER_MIN_SCORES = 2 ** 32
#: Registers a thread with three consumers: four warpgroups (the loading warp's own included) share the SM's 64K, so
#: the kernel starts at 128: the second and third consumers hold 160, the loading warp 24 and the first consumer the
#: 168 they leave (FlashAttention-3's split at head_dim 64).
THREE_CONSUMER_REGISTERS, THREE_KERNEL_REGISTERS = 160, 128
#: Whether the consumers take turns issuing their products (FlashAttention-3's ping-pong).
PINGPONG = True
#: Whether three consumers take turns without a mask: the SM's schedulers interleave three warpgroups well enough,
#: and at 8k-16k rows they ran 1.01-1.04x faster without (sixty-second and sixty-sixth findings); under the causal
#: mask turns help them 1-7%, so there they keep :data:`PINGPONG`.
THREE_CONSUMER_PINGPONG_UNMASKED = False
#: Whether a consumer whose rows see none of the second half of the tile's last key block computes that block at
#: half its width (:func:`_half_last_block`): under the causal mask at 128-key blocks, the first consumer's 64 rows
#: of every tile but the first end there, so a tile of n key blocks computes n - 1/4 blocks' products, not n (at
#: 1024 rows, 4.9% of a causal grid's products and exponentials; 16-bit inputs without dropout).
HALF_LAST_BLOCK = triton.language.constexpr(True)
#: Whether one program per SM walks the query tiles (the loading warp then fetches the next tile's Q, K and V
#: during this tile's last products and its epilogue) rather than one program per work item.
PERSISTENT = True

if HAVE_GLUON:

    @gluon.jit
    def operands_flag(IN_REGISTERS: gl.constexpr):
        """A scalar whose *type* tells consumer partitions whether to hold a loop-invariant operand in registers
        (int8: ``flag.dtype == gl.int8``) or read it from shared memory (int16). Partitions take no constexpr
        arguments (Triton 3.6 turns them into values), but a value's type reaches them, as block sizes reach them
        through shared memory's shapes."""
        if IN_REGISTERS:
            flag = gl.to_tensor(0).to(gl.int8)
        else:
            flag = gl.to_tensor(0).to(gl.int16)
        return flag

    @gluon.jit
    def register_operand(tile, acc_layout: gl.constexpr):
        """A shared-memory tile loaded into registers as the first operand of warpgroup products that accumulate in
        ``acc_layout``: 32 bits of it a register (2 elements in 16 bits, 4 in FP8)."""
        return tile.load(gl.DotOperandLayout(operand_index=0, parent=acc_layout,
                                             k_width=32 // tile.dtype.primitive_bitwidth))

    @gluon.jit
    def _softmax_step(s, m_i, l_i, start_n, rows, offset, N_K, qk_scale,
                      MASKED: gl.constexpr, causal, BLOCK_N: gl.constexpr, s_layout: gl.constexpr):
        """P (float32), the new row max, the new row sum and the rescale ``alpha`` of one block of scores.

        ``MASKED`` blocks hide keys past N_K and, if ``causal``, keys right of the diagonal; a row
        that has seen no key yet keeps m = -inf and gets p = alpha = 0 (never exp2(-inf + inf))."""
        if MASKED:
            # One compare a score: each row's last visible key, counted from the block's first, against the
            # block's key index (the same for every block; ptxas folds it into the lanes' constants).
            keys = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            last = N_K - 1 - start_n + rows * 0
            if causal:
                last = gl.minimum(last, rows + offset - start_n)
            visible = keys[None, :] <= last[:, None]
            s = gl.where(visible, s * qk_scale, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, 1))
            m_sub = gl.where(m_new == float("-inf"), 0.0, m_new)
            p = gl.exp2(s - m_sub[:, None])
        else:
            # every score is finite: the scale is folded into one FMA per score
            m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
            m_sub = m_new
            p = gl.exp2(s * qk_scale - m_sub[:, None])
        alpha = gl.exp2(m_i - m_sub)
        l_i = l_i * alpha + gl.sum(p, 1)
        return p, m_new, l_i, alpha

    @gluon.jit
    def _weights_operand(p_f32, p_slot, dtype: gl.constexpr, p_layout: gl.constexpr, drop, start_n,
                         DROPOUT: gl.constexpr):
        """The weights in ``dtype`` as P V's first operand: in registers (``p_layout``), or, where the kernel gave
        this consumer a (BLOCK_M, BLOCK_N) shared-memory slot ``p_slot`` (FP8 with ``P_SHARED``), stored there and
        read from there by the product; the caller has waited for the last product that read the slot. Under
        ``DROPOUT`` (16-bit types only), the weights that dropout drops are zeroed as they are converted
        (:func:`.dropout_hopper.kept_weights_operand`); ``drop``: (stream key, keep threshold, first query row) of
        :mod:`.dropout_hopper`, ``start_n`` the block's first key.

        Why a slot for FP8: the accumulator holds two neighbouring keys of a row per thread, an FP8 operand in
        registers four, so converting P to the operand's layout moves bytes between threads and packs them one by
        one (Triton 3.6: 230 instructions of a 682-instruction block at head_dim 128). Stored as the accumulator
        holds it, P costs 32 two-byte stores a thread, a fence and the warpgroup's barrier (benchmarks/TUNING.md,
        thirty-eighth finding)."""
        if DROPOUT:
            rows: gl.constexpr = p_f32.type.shape[0]
            cols: gl.constexpr = p_f32.type.shape[1]
            kept = kept_words(drop[0], drop[2], start_n, drop[1], rows, cols, False)
            return gl.convert_layout(kept_weights_operand(p_f32, kept, dtype, rows, cols, False), p_layout)
        elif len(p_slot.type.shape) == 2:
            p_slot.store(p_f32.to(dtype))
            fence_async_shared()
            return p_slot
        else:
            return gl.convert_layout(p_f32.to(dtype), p_layout)

    @gluon.jit
    def _item_head_and_tiles(item, sched, causal):
        """The (batch, head) index of work item ``item``, its first query tile, its second and how many it holds.
        Without a mask an item is one tile (CONSUMERS x BLOCK_M query rows). Under a causal mask tile ``t`` of ``n``
        costs about ``t + 1`` key blocks, so an item pairs tile ``n - 1 - k`` with tile ``k`` (one tile where they
        meet): every item costs about the same, and a static round-robin over the items balances the persistent
        programs (FlashAttention-3 takes a dynamic scheduler for this)."""
        items_per_head, n_tiles = sched[1], sched[2]
        hz = item // items_per_head
        k = item % items_per_head
        first = k
        if causal:
            first = n_tiles - 1 - k
        return hz, first, k, 1 + (first != k).to(gl.int32)

    @gluon.jit
    def _item_tile_count(item, sched, causal):
        """How many query tiles work item ``item`` holds (1, or 2 for a causal pair)."""
        return _item_head_and_tiles(item, sched, causal)[3]

    @gluon.jit
    def _item_tile(item, sub, sched, causal, TILE_M: gl.constexpr, BLOCK_N: gl.constexpr):
        """The ``sub``-th query tile of work item ``item``: its (batch, head) index and :func:`_tile`'s place."""
        hz, first, second, n_sub = _item_head_and_tiles(item, sched, causal)
        off_b, off_h, off_kvh, m0, n_blocks, n_full = _tile(hz, first - sub * (first - second), sched, causal,
                                                            TILE_M, BLOCK_N)
        return hz, off_b, off_h, off_kvh, m0, n_blocks, n_full

    @gluon.jit
    def _tile(hz, tile, sched, causal, TILE_M: gl.constexpr, BLOCK_N: gl.constexpr):
        """Where query tile ``tile`` (``TILE_M`` rows: BLOCK_M for each consumer) of (batch, head) ``hz`` reads and
        writes: (b, h, kv head, first row), and its key blocks: [0, n_blocks) hold a key some row sees, [0, n_full)
        are seen whole by every row."""
        H, KV_GROUP, N_Q, N_K = sched[3], sched[4], sched[5], sched[6]
        off_b = hz // H
        off_h = hz % H
        m0 = tile * TILE_M
        offset = N_K - N_Q  # query row i sits at key position i + offset
        hi = N_K
        n_full = N_K // BLOCK_N
        if causal:
            hi = gl.minimum(N_K, gl.maximum(m0 + TILE_M + offset, 0))
            n_full = gl.maximum(m0 + offset + 1, 0) // BLOCK_N
        n_blocks = gl.cdiv(hi, BLOCK_N)
        n_full = gl.minimum(n_full, n_blocks)
        return off_b, off_h, off_h // KV_GROUP, m0, n_blocks, n_full

    @gluon.jit
    def _load_partition(descs, smem, bars, sched, LSE, qk_scale, causal, pingpong, dropout, descale, operands):
        """One warp: for each query tile of the program, its Q tiles once the consumers released the last ones,
        then K and V of every key block into the ring of ``STAGES`` slots, each slot refilled once every consumer
        has released it. The ring runs on across tiles, so the next tile's first blocks load during this
        tile's last products and its epilogue. FP8 V tiles are (HEAD_DIM, BLOCK_N), keys innermost."""
        q_desc, k_desc, v_desc = descs[0], descs[1], descs[2]
        q_smem, k_smem, v_smem = smem[0], smem[1], smem[2]
        q_ready, q_empty, k_ready, v_ready, k_empty, v_empty = bars[0], bars[1], bars[2], bars[3], bars[4], bars[5]
        CONSUMERS: gl.constexpr = q_smem.type.shape[0]
        BLOCK_M: gl.constexpr = q_smem.type.shape[3]
        STAGES: gl.constexpr = k_smem.type.shape[0]
        BLOCK_N: gl.constexpr = k_smem.type.shape[3]
        FP8: gl.constexpr = q_smem.dtype.is_fp8()
        ring = 0  # K/V blocks loaded so far
        tiles = 0  # query tiles begun so far
        n_items, first_item, item_stride = sched[0], sched[7], sched[8]
        for item in range(first_item, n_items, item_stride):
            for sub in range(_item_tile_count(item, sched, causal)):
                hz, off_b, off_h, off_kvh, m0, n_blocks, n_full = _item_tile(item, sub, sched, causal,
                                                                             CONSUMERS * BLOCK_M, BLOCK_N)
                for consumer in gl.static_range(CONSUMERS):
                    # A fresh barrier counts as having completed the phase before its first: the first lap passes.
                    mbarrier.wait(q_empty.index(consumer), (tiles & 1) ^ 1)
                    mbarrier.expect(q_ready.index(consumer), q_desc.block_type.nbytes)
                    tma_load(q_desc, [off_b, off_h, m0 + consumer * BLOCK_M, 0], q_ready.index(consumer),
                             q_smem.index(consumer))
                for j in range(n_blocks):
                    slot = ring % STAGES
                    phase = (ring // STAGES) & 1
                    mbarrier.wait(k_empty.index(slot), phase ^ 1)
                    mbarrier.expect(k_ready.index(slot), k_desc.block_type.nbytes)
                    tma_load(k_desc, [off_b, off_kvh, j * BLOCK_N, 0], k_ready.index(slot), k_smem.index(slot))
                    mbarrier.wait(v_empty.index(slot), phase ^ 1)
                    mbarrier.expect(v_ready.index(slot), v_desc.block_type.nbytes)
                    if FP8:
                        tma_load(v_desc, [off_b, off_kvh, 0, j * BLOCK_N], v_ready.index(slot), v_smem.index(slot))
                    else:
                        tma_load(v_desc, [off_b, off_kvh, j * BLOCK_N, 0], v_ready.index(slot), v_smem.index(slot))
                    ring += 1
                tiles += 1

    @gluon.jit
    def _scores(q_tile, k_smem, k_ready, j, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, s_layout: gl.constexpr):
        """Issue S = Q K_j^T on the tensor cores (not waited for), over the first ``BLOCK_N`` keys of the slot (all of
        them but in :func:`_half_last_block`)."""
        slot = j % STAGES
        mbarrier.wait(k_ready.index(slot), (j // STAGES) & 1)
        SLOT_N: gl.constexpr = k_smem.type.shape[3]
        k_tile = k_smem.index(slot).reshape([SLOT_N, HEAD_DIM])
        if BLOCK_N < SLOT_N:
            k_tile = k_tile.slice(0, BLOCK_N)
        return warpgroup_mma(q_tile, k_tile.permute((1, 0)), gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout),
                             use_acc=False, is_async=True)

    @gluon.jit
    def _add_pv(o, p, v_smem, v_ready, j, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
        """Issue O += P V_j on the tensor cores (not waited for), over the keys P holds: the slot's BLOCK_N, or its
        first half (:func:`_half_last_block`, 16-bit only). FP8 tensor cores read V along the keys (the product's
        reduction), so FP8 V tiles are stored (HEAD_DIM, BLOCK_N) and read transposed."""
        slot = j % STAGES
        mbarrier.wait(v_ready.index(slot), (j // STAGES) & 1)
        KEYS: gl.constexpr = p.type.shape[1]
        if p.dtype.is_fp8():
            v_tile = v_smem.index(slot).reshape([HEAD_DIM, BLOCK_N]).permute((1, 0))
        else:
            v_tile = v_smem.index(slot).reshape([BLOCK_N, HEAD_DIM])
            if KEYS < BLOCK_N:
                v_tile = v_tile.slice(0, KEYS)
        return warpgroup_mma(p, v_tile, o, is_async=True)

    @gluon.jit
    def _wait_turn(turns, t, pingpong, CONSUMER: gl.constexpr):
        """Ping-pong (FlashAttention-3): a consumer issues its ``t``-th round of products only after the consumer
        before it (``CONSUMER - 1``, the last one before the first) issued its own, so one warpgroup's products run
        while the others compute their softmax. The first consumer's barrier is fresh for its first round (which
        passes); each other one waits for the one before it."""
        if pingpong:
            phase = t & 1
            if CONSUMER == 0:
                phase = phase ^ 1
            mbarrier.wait(turns.index(CONSUMER), phase)

    @gluon.jit
    def _pass_turn(turns, pingpong, CONSUMER: gl.constexpr):
        """Let the next consumer (round robin over ``turns``, one barrier a consumer) issue its round of products."""
        CONSUMERS: gl.constexpr = turns.type.shape[0]
        if pingpong:
            mbarrier.arrive(turns.index((CONSUMER + 1) % CONSUMERS), count=1)

    @gluon.jit
    def _overlapped_step(q_tile, k_smem, v_smem, bars, o, p, p_slot, alpha, m_i, l_i, j, ring, turn, rows, offset,
                         N_K, qk_scale, pingpong, drop, CONSUMER: gl.constexpr, MASKED: gl.constexpr, causal,
                         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                         DROPOUT: gl.constexpr, s_layout: gl.constexpr, p_layout: gl.constexpr,
                         o_layout: gl.constexpr):
        """Key block ``j`` (at place ``ring + j`` of the K/V ring, in round ``turn + j`` of the ping-pong): its S,
        overlapped with P V of block ``j - 1`` (``p``: that block's weights, in registers or in the consumer's
        shared-memory slot ``p_slot`` (:func:`_weights_operand`); ``alpha``: O's rescale to that block's max, applied
        while S is on the tensor cores). Returns O (through block j - 1), block j's weights and rescale, m and l."""
        k_ready, v_ready, k_empty, v_empty, turns = bars[2], bars[3], bars[4], bars[5], bars[6]
        _wait_turn(turns, turn + j, pingpong, CONSUMER)
        s = _scores(q_tile, k_smem, k_ready, ring + j, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, s_layout)
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        o = _add_pv(o, p, v_smem, v_ready, ring + j - 1, BLOCK_N, HEAD_DIM, STAGES)
        _pass_turn(turns, pingpong, CONSUMER)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
        mbarrier.arrive(k_empty.index((ring + j) % STAGES), count=1)
        p_f32, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, j * BLOCK_N, rows, offset, N_K, qk_scale,
                                               MASKED, causal, BLOCK_N, s_layout)
        if p.dtype.is_fp8():
            # The wait keeps no 8-bit registers (Triton's lowering of its dependencies stops at 16 bits); ptxas
            # keeps P's registers for the product it issued until this wait.
            o = warpgroup_mma_wait(num_outstanding=0, deps=(o, ))
        else:
            o, p = warpgroup_mma_wait(num_outstanding=0, deps=(o, p))
        mbarrier.arrive(v_empty.index((ring + j - 1) % STAGES), count=1)
        p = _weights_operand(p_f32, p_slot, q_tile.dtype, p_layout, drop, j * BLOCK_N, DROPOUT)
        return o, p, alpha, m_i, l_i

    @gluon.jit
    def _overlapped_blocks(q_tile, k_smem, v_smem, bars, o, p, p_slot, alpha, m_i, l_i, first, last, ring, turn,
                           rows, offset, N_K, qk_scale, pingpong, drop, CONSUMER: gl.constexpr, MASKED: gl.constexpr,
                           causal, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                           STAGES: gl.constexpr, DROPOUT: gl.constexpr, s_layout: gl.constexpr,
                           p_layout: gl.constexpr, o_layout: gl.constexpr):
        """Key blocks ``first`` to ``last - 1``."""
        for j in range(first, last):
            o, p, alpha, m_i, l_i = _overlapped_step(q_tile, k_smem, v_smem, bars, o, p, p_slot, alpha, m_i, l_i, j,
                                                     ring, turn, rows, offset, N_K, qk_scale, pingpong, drop, CONSUMER,
                                                     MASKED, causal, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, DROPOUT,
                                                     s_layout, p_layout, o_layout)
        return o, p, alpha, m_i, l_i

    @gluon.jit
    def _last_pv(o, p, alpha, v_smem, bars, j, turn, pingpong, CONSUMER: gl.constexpr, BLOCK_N: gl.constexpr,
                 HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, o_layout: gl.constexpr):
        """P V of a tile's last key block (at place ``j`` of the K/V ring, in round ``turn``), O rescaled first;
        waited for, and its V slot released."""
        v_empty, turns = bars[5], bars[6]
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        _wait_turn(turns, turn, pingpong, CONSUMER)
        o = _add_pv(o, p, v_smem, bars[3], j, BLOCK_N, HEAD_DIM, STAGES)
        _pass_turn(turns, pingpong, CONSUMER)
        o = warpgroup_mma_wait(num_outstanding=0, deps=(o, ))
        mbarrier.arrive(v_empty.index(j % STAGES), count=1)
        return o

    @gluon.jit
    def _half_last_block(q_tile, k_smem, v_smem, bars, o, p, alpha, m_i, l_i, j, ring, turn, rows, offset, N_K,
                         qk_scale, pingpong, CONSUMER: gl.constexpr, causal, BLOCK_M: gl.constexpr,
                         BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, RELEASE_Q: gl.constexpr,
                         s_layout: gl.constexpr, p_layout: gl.constexpr, o_layout: gl.constexpr):
        """The tile's last key block ``j`` for a consumer that sees no key of its second half (the causal
        diagonal of the first consumer's rows: 64 rows against a 128-key block): S of its first BLOCK_N // 2 keys
        only, overlapped with P V of block ``j - 1`` (``p``, ``alpha``), then P V of those keys. Half the products
        and exponentials of a block the full width would spend on scores the mask hides. The same barriers and
        rounds as :func:`_overlapped_step` and the last P V, so the loader and the other consumers see no
        difference. With ``RELEASE_Q`` (Q read from its shared-memory slot) the slot is released to the loader once
        S, the tile's last product to read it, is done. Returns O (unnormalized), m and l, in the layouts of the
        full-width blocks."""
        q_empty, v_ready, k_empty, v_empty, turns = bars[1], bars[3], bars[4], bars[5], bars[6]
        HALF: gl.constexpr = BLOCK_N // 2
        h_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HALF, 16])
        row_layout: gl.constexpr = gl.SliceLayout(1, h_layout)
        _wait_turn(turns, turn + j, pingpong, CONSUMER)
        s = _scores(q_tile, k_smem, bars[2], ring + j, BLOCK_M, HALF, HEAD_DIM, STAGES, h_layout)
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        o = _add_pv(o, p, v_smem, v_ready, ring + j - 1, BLOCK_N, HEAD_DIM, STAGES)
        _pass_turn(turns, pingpong, CONSUMER)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
        mbarrier.arrive(k_empty.index((ring + j) % STAGES), count=1)
        if RELEASE_Q:  # Q is read by no more product: the loader may bring the next tile's.
            mbarrier.arrive(q_empty.index(CONSUMER), count=1)
        p_f32, m_h, l_h, alpha_h = _softmax_step(s, gl.convert_layout(m_i, row_layout),
                                                 gl.convert_layout(l_i, row_layout), j * BLOCK_N,
                                                 gl.convert_layout(rows, row_layout), offset, N_K, qk_scale, True,
                                                 causal, HALF, h_layout)
        o, p = warpgroup_mma_wait(num_outstanding=0, deps=(o, p))
        mbarrier.arrive(v_empty.index((ring + j - 1) % STAGES), count=1)
        # P V of the half: its round, as the last P V of a tile takes one.
        p_half = gl.convert_layout(p_f32.to(q_tile.dtype), p_layout)
        o = o * gl.convert_layout(alpha_h, gl.SliceLayout(1, o_layout))[:, None]
        _wait_turn(turns, turn + j + 1, pingpong, CONSUMER)
        o = _add_pv(o, p_half, v_smem, v_ready, ring + j, BLOCK_N, HEAD_DIM, STAGES)
        _pass_turn(turns, pingpong, CONSUMER)
        o = warpgroup_mma_wait(num_outstanding=0, deps=(o, p_half))[0]
        mbarrier.arrive(v_empty.index((ring + j) % STAGES), count=1)
        return o, gl.convert_layout(m_h, gl.SliceLayout(1, s_layout)), gl.convert_layout(l_h, gl.SliceLayout(1,
                                                                                                          s_layout))

    @gluon.jit
    def _consume_tile(descs, smem, bars, q_tile, tile_at, ring, turn, tiles, LSE, qk_scale, descale_at, causal,
                      pingpong, dropout, operands, CONSUMER: gl.constexpr, DROPOUT: gl.constexpr):
        """O and LSE of the ``CONSUMER``-th BLOCK_M query rows of one query tile (``tile_at``: its place from
        :func:`_tile` and its (batch, head) ``hz``), whose key blocks start at place ``ring`` of the K/V ring and
        round ``turn`` of the ping-pong; ``tiles``: query tiles this consumer finished before. With ``DROPOUT``,
        ``dropout`` is (seed, p): the weights P V sums are dropped as :mod:`.dropout` draws them. FP8 inputs fold
        their descale factors (:func:`_descale_factor` of ``descale_at``) into ``qk_scale`` (S = (dq q8)(dk k8)^T)
        and into O (dv); the factor of O is read in the epilogue, so that no register holds it across the loop."""
        o_desc = descs[3]
        o_smem = smem[3]
        q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns = bars
        off_b, off_h, hz, m0, n_blocks, n_full, offset, N_Q, N_K = tile_at
        BLOCK_M: gl.constexpr = q_tile.type.shape[0]
        HEAD_DIM: gl.constexpr = q_tile.type.shape[1]
        STAGES: gl.constexpr = smem[1].type.shape[0]
        BLOCK_N: gl.constexpr = smem[1].type.shape[3]
        k_smem, v_smem = smem[1], smem[2]
        # A wgmma instruction reduces 32 bytes of each row: 16 elements in 16 bits, 32 in FP8.
        INSTR_K: gl.constexpr = 256 // q_tile.dtype.primitive_bitwidth
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, BLOCK_N, INSTR_K])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                           instr_shape=[16, HEAD_DIM, INSTR_K])
        # P enters the tensor cores from registers, 32 bits of it a register: 2 elements in 16 bits, 4 in FP8.
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                     k_width=32 // q_tile.dtype.primitive_bitwidth)
        FP8: gl.constexpr = q_tile.dtype.is_fp8()
        if FP8:
            qk_scale = qk_scale * _descale_factor(descale_at, 0) * _descale_factor(descale_at, 1)
        row0 = m0 + CONSUMER * BLOCK_M
        rows_s = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))
        drop = (0, 0, row0)  # (stream key, keep threshold, first row) of the draws
        if DROPOUT:
            drop = (stream_key(dropout[0], hz), keep_threshold(dropout[1]), row0)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
        o = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
        mbarrier.wait(q_ready.index(CONSUMER), tiles & 1)
        q_slot = q_tile
        Q_IN_REGISTERS: gl.constexpr = operands.dtype == gl.int8
        if Q_IN_REGISTERS:  # once a tile; the slot is free for the loader to bring the next tile's Q at once
            q_tile = register_operand(q_slot, s_layout)
            fence_async_shared()  # these reads (generic proxy) before the copy engine's next write (async proxy)
            mbarrier.arrive(q_empty.index(CONSUMER), count=1)

        if n_blocks > 0:
            # Block 0: its scores alone (always through the mask: cheap once, right for every block).
            _wait_turn(turns, turn, pingpong, CONSUMER)
            s = _scores(q_tile, k_smem, k_ready, ring, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, s_layout)
            _pass_turn(turns, pingpong, CONSUMER)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
            mbarrier.arrive(k_empty.index(ring % STAGES), count=1)
            p_f32, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, 0, rows_s, offset, N_K, qk_scale,
                                                   True, causal, BLOCK_N, s_layout)
            p_slot = smem[4].index(CONSUMER)
            p = _weights_operand(p_f32, p_slot, q_tile.dtype, p_layout, drop, 0, DROPOUT)
            # Blocks every row of the program sees whole, then the ones cut by the diagonal or N_K.
            split = gl.maximum(n_full, 1)
            o, p, alpha, m_i, l_i = _overlapped_blocks(q_tile, k_smem, v_smem, bars, o, p, p_slot, alpha, m_i, l_i,
                                                       1, split, ring, turn, rows_s, offset, N_K, qk_scale, pingpong,
                                                       drop, CONSUMER, False, causal, BLOCK_M, BLOCK_N, HEAD_DIM,
                                                       STAGES, DROPOUT, s_layout, p_layout, o_layout)
            # The last block at half its width where this consumer's rows see none of its second half
            # (:data:`HALF_LAST_BLOCK`; decided at compile time first, so that other kernels hold no such code).
            TWO_CONSUMERS: gl.constexpr = smem[0].type.shape[0] == 2
            if HALF_LAST_BLOCK and TWO_CONSUMERS and CONSUMER == 0 and BLOCK_N == 2 * BLOCK_M and not DROPOUT \
                    and not FP8:
                # the end of this consumer's keys: its last row's last visible key, plus one
                seen = gl.minimum(N_K, row0 + BLOCK_M + offset)
                half = (causal != 0) & (n_blocks - 1 >= split) & (seen <= (n_blocks - 1) * BLOCK_N + BLOCK_N // 2)
                o, p, alpha, m_i, l_i = _overlapped_blocks(q_tile, k_smem, v_smem, bars, o, p, p_slot, alpha, m_i,
                                                           l_i, split, n_blocks - half.to(gl.int32), ring, turn,
                                                           rows_s, offset, N_K, qk_scale, pingpong, drop, CONSUMER,
                                                           True, causal, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, DROPOUT,
                                                           s_layout, p_layout, o_layout)
                if half:  # its S reads Q, which it releases
                    o, m_i, l_i = _half_last_block(q_tile, k_smem, v_smem, bars, o, p, alpha, m_i, l_i, n_blocks - 1,
                                                   ring, turn, rows_s, offset, N_K, qk_scale, pingpong, CONSUMER,
                                                   causal, BLOCK_M, BLOCK_N, HEAD_DIM, STAGES, not Q_IN_REGISTERS,
                                                   s_layout, p_layout, o_layout)
                else:
                    if not Q_IN_REGISTERS:  # Q is read by no more product: the loader may bring the next tile's.
                        mbarrier.arrive(q_empty.index(CONSUMER), count=1)
                    o = _last_pv(o, p, alpha, v_smem, bars, ring + n_blocks - 1, turn + n_blocks, pingpong, CONSUMER,
                                 BLOCK_N, HEAD_DIM, STAGES, o_layout)
            else:
                o, p, alpha, m_i, l_i = _overlapped_blocks(q_tile, k_smem, v_smem, bars, o, p, p_slot, alpha, m_i,
                                                           l_i, split, n_blocks, ring, turn, rows_s, offset, N_K,
                                                           qk_scale, pingpong, drop, CONSUMER, True, causal, BLOCK_M,
                                                           BLOCK_N, HEAD_DIM, STAGES, DROPOUT, s_layout, p_layout,
                                                           o_layout)
                if not Q_IN_REGISTERS:  # Q is read by no more product: the loader may bring the next tile's.
                    mbarrier.arrive(q_empty.index(CONSUMER), count=1)
                o = _last_pv(o, p, alpha, v_smem, bars, ring + n_blocks - 1, turn + n_blocks, pingpong, CONSUMER,
                             BLOCK_N, HEAD_DIM, STAGES, o_layout)
        elif not Q_IN_REGISTERS:
            mbarrier.arrive(q_empty.index(CONSUMER), count=1)

        # Rows with no visible key (l = 0): O = 0, L = -inf. A NaN score makes l NaN and reaches O and L.
        valid = l_i != 0.0
        l_safe = gl.where(valid, l_i, 1.0)
        lse = gl.where(valid, (m_i + gl.log2(l_safe)) * LN2, float("-inf"))
        if DROPOUT:
            l_safe = l_safe * (1.0 - dropout[1])  # kept weights are scaled by 1 / (1 - p)
        if FP8:
            l_safe = l_safe / _descale_factor(descale_at, 2)  # O = dv (P V8) / l
        out = o / gl.convert_layout(l_safe, gl.SliceLayout(1, o_layout))[:, None]
        gl.store(LSE + hz.to(gl.int64) * N_Q + rows_s, lse, mask=rows_s < N_Q)
        # O leaves through this consumer's O slot, once the copy engine has read the last tile's out of it; the
        # store runs on while the next tile begins. The copy engine drops rows past N_Q.
        tma.store_wait(pendings=0)
        o_smem.index(CONSUMER).reshape([BLOCK_M, HEAD_DIM]).store(out.to(o_desc.dtype))
        fence_async_shared()
        tma_store(o_desc, [off_b, off_h, row0, 0], o_smem.index(CONSUMER))

    @gluon.jit
    def _descale_factor(descale_at, which: gl.constexpr):
        """FP8's descale factor of q (``which`` 0), k (1) or v (2) for one (sample, K/V head): ``descale_at`` is
        (DESCALE, DESCALE_STRIDE, that (sample, K/V head)'s index), DESCALE the (3, B, H_kv) float32 factors."""
        return gl.load(descale_at[0] + which * descale_at[1] + descale_at[2])

    @gluon.jit
    def _consume(descs, smem, bars, sched, LSE, qk_scale, causal, pingpong, dropout, descale, operands,
                 CONSUMER: gl.constexpr, DROPOUT: gl.constexpr):
        """One warpgroup: O and LSE of the ``CONSUMER``-th BLOCK_M query rows of each of the program's query tiles.
        Partitions take no constexpr arguments (Triton 3.6 turns them into values), so the block sizes come from
        the shared memory's shapes, FP8 from its type, and ``causal`` is a value. ``dropout``: (the seed's
        pointer, p), read with ``DROPOUT`` only; ``descale``: (DESCALE, DESCALE_STRIDE) of FP8 inputs."""
        q_smem, k_smem = smem[0], smem[1]
        CONSUMERS: gl.constexpr = q_smem.type.shape[0]
        BLOCK_M: gl.constexpr = q_smem.type.shape[3]
        HEAD_DIM: gl.constexpr = q_smem.type.shape[4]
        BLOCK_N: gl.constexpr = k_smem.type.shape[3]
        N_Q, N_K = sched[5], sched[6]
        q_tile = q_smem.index(CONSUMER).reshape([BLOCK_M, HEAD_DIM])
        ring = 0  # K/V blocks consumed so far
        turn = 0  # ping-pong rounds so far
        tiles = 0
        seed_and_p = (0, 0.0)
        if DROPOUT:
            seed_and_p = (gl.load(dropout[0]), dropout[1])
        n_items, first_item, item_stride = sched[0], sched[7], sched[8]
        for item in range(first_item, n_items, item_stride):
            for sub in range(_item_tile_count(item, sched, causal)):
                hz, off_b, off_h, off_kvh, m0, n_blocks, n_full = _item_tile(item, sub, sched, causal,
                                                                             CONSUMERS * BLOCK_M, BLOCK_N)
                tile_at = (off_b, off_h, hz, m0, n_blocks, n_full, N_K - N_Q, N_Q, N_K)
                descale_at = (descale[0], descale[1], off_b * (sched[3] // sched[4]) + off_kvh)
                _consume_tile(descs, smem, bars, q_tile, tile_at, ring, turn, tiles, LSE, qk_scale, descale_at,
                              causal, pingpong, seed_and_p, operands, CONSUMER, DROPOUT)
                ring += n_blocks
                turn += n_blocks + (n_blocks > 0).to(gl.int32)
                tiles += 1
        tma.store_wait(pendings=0)

    @gluon.jit
    def _first_consumer(descs, smem, bars, sched, LSE, qk_scale, causal, pingpong, dropout, descale, operands):
        _consume(descs, smem, bars, sched, LSE, qk_scale, causal, pingpong, dropout, descale, operands, 0, False)

    @gluon.jit
    def _second_consumer(descs, smem, bars, sched, LSE, qk_scale, causal, pingpong, dropout, descale, operands):
        _consume(descs, smem, bars, sched, LSE, qk_scale, causal, pingpong, dropout, descale, operands, 1, False)

    @gluon.jit
    def _third_consumer(descs, smem, bars, sched, LSE, qk_scale, causal, pingpong, dropout, descale, operands):
        _consume(descs, smem, bars, sched, LSE, qk_scale, causal, pingpong, dropout, descale, operands, 2, False)

    @gluon.jit
    def _first_consumer_dropout(descs, smem, bars, sched, LSE, qk_scale, causal, pingpong, dropout, descale, operands):
        _consume(descs, smem, bars, sched, LSE, qk_scale, causal, pingpong, dropout, descale, operands, 0, True)

    @gluon.jit
    def _second_consumer_dropout(descs, smem, bars, sched, LSE, qk_scale, causal, pingpong, dropout, descale, operands):
        _consume(descs, smem, bars, sched, LSE, qk_scale, causal, pingpong, dropout, descale, operands, 1, True)

    @gluon.jit
    def attention_fwd_hopper_kernel(q_desc, k_desc, v_desc, o_desc, LSE, qk_scale, H, KV_GROUP, N_Q, N_K,
                                    n_items, items_per_head, n_tiles, pingpong, DROPOUT_SEED, dropout_p,
                                    DESCALE, DESCALE_STRIDE, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
                                    BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr,
                                    DROPOUT: gl.constexpr, P_SHARED: gl.constexpr, Q_IN_REGISTERS: gl.constexpr,
                                    CONSUMERS: gl.constexpr, CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr,
                                    num_warps: gl.constexpr):
        """O and LSE of work items ``program_id(0)``, ``program_id(0) + num_programs(0)``, ... of ``n_items``
        (:func:`_item_head_and_tiles`: ``items_per_head`` per (batch, head), over ``n_tiles`` query tiles of
        CONSUMERS x BLOCK_M rows each), ``CONSUMERS`` consumer warpgroups (2, or 3 for 16-bit inputs without
        dropout, at head_dim 64) of BLOCK_M rows each and one loading warp. A grid of one program per item runs
        each program once; a grid of one program per SM is persistent. q/k/v/o_desc:
        (B, H, N, D) descriptors with (1, 1, rows, D) tiles (K and V with ``H // KV_GROUP`` heads);
        LSE (B, H, N_Q) float32; ``qk_scale`` = scale * log2(e) > 0. With ``DROPOUT``, weights are dropped with
        probability ``dropout_p`` (a multiple of 1/256) from the int64 seed at ``DROPOUT_SEED`` (:mod:`.dropout`).
        FP8 (q, k, v descriptors of float8 e4m3, o of 16 bits): v_desc covers V^T, (B, H_kv, D, N) with (1, 1, D,
        BLOCK_N) tiles, and DESCALE holds the (3, B, H_kv) float32 factors of q, k and v, DESCALE_STRIDE = B H_kv
        apart; P enters P V in FP8 too (its values lie in [0, 1]), from a shared-memory slot of each consumer with
        ``P_SHARED``, else from registers. ``Q_IN_REGISTERS``: each consumer holds its Q in registers for the tile
        (:data:`FP8_Q_IN_REGISTERS`, :data:`Q_IN_REGISTERS_HEAD_DIMS`)."""
        gl.static_assert(num_warps == 4)
        gl.static_assert(CONSUMERS == 2 or (CONSUMERS == 3 and not DROPOUT and not q_desc.dtype.is_fp8()),
                         "three consumers take 16-bit inputs without dropout")
        q_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, 1, 1, BLOCK_M, HEAD_DIM], q_desc.layout)
        o_smem = gl.allocate_shared_memory(o_desc.dtype, [CONSUMERS, 1, 1, BLOCK_M, HEAD_DIM], o_desc.layout)
        p_smem = o_smem  # a stand-in of another shape: P stays in registers (:func:`_weights_operand`)
        if P_SHARED:
            gl.static_assert(q_desc.dtype.is_fp8(), "P goes through shared memory for FP8 inputs only")
            p_smem = gl.allocate_shared_memory(q_desc.dtype, [CONSUMERS, BLOCK_M, BLOCK_N],
                                               gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], q_desc.dtype))
        k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], k_desc.layout)
        if q_desc.dtype.is_fp8():
            v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, 1, 1, HEAD_DIM, BLOCK_N], v_desc.layout)
        else:
            v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, 1, 1, BLOCK_N, HEAD_DIM], v_desc.layout)
        q_ready = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        q_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        turns = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(CONSUMERS):
            mbarrier.init(q_ready.index(i), count=1)
            mbarrier.init(q_empty.index(i), count=1)  # released by its consumer
            mbarrier.init(turns.index(i), count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=1)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=CONSUMERS)  # released by every consumer
            mbarrier.init(v_empty.index(i), count=CONSUMERS)

        CAUSAL_FLAG = gl.to_tensor(CAUSAL)
        # sched: the work items (how many, per head, over how many query tiles), the sizes, and this program's
        # first item and stride between its items.
        args = ((q_desc, k_desc, v_desc, o_desc), (q_smem, k_smem, v_smem, o_smem, p_smem),
                (q_ready, q_empty, k_ready, v_ready, k_empty, v_empty, turns),
                (n_items, items_per_head, n_tiles, H, KV_GROUP, N_Q, N_K, gl.program_id(0), gl.num_programs(0)),
                LSE, qk_scale, CAUSAL_FLAG, pingpong, (DROPOUT_SEED, dropout_p), (DESCALE, DESCALE_STRIDE),
                operands_flag(Q_IN_REGISTERS))
        if CONSUMERS == 3:
            gl.warp_specialize([(_first_consumer, args), (_second_consumer, args), (_third_consumer, args),
                                (_load_partition, args)], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])
        elif DROPOUT:
            gl.warp_specialize([(_first_consumer_dropout, args), (_second_consumer_dropout, args),
                                (_load_partition, args)], [4, 1], [CONSUMER_REGS, LOADER_REGS])
        else:
            gl.warp_specialize([(_first_consumer, args), (_second_consumer, args), (_load_partition, args)],
                               [4, 1], [CONSUMER_REGS, LOADER_REGS])


#: Where :func:`flashlib.kernels.attention_fwd.launch_attention_forward` takes this kernel with two consumers on its
#: own, {head_dim: (the least query and key rows without a mask, under the causal mask)}, None where the Triton
#: forward stays the faster; from :data:`MIN_SCORES` scores. Measured against the Triton forward (fp16 and bf16,
#: FlashAttention-2 shapes, same process, ``benchmarks/gluon_fwd_ab.py``, benchmarks/TUNING.md): head_dim 128 from
#: 1024 rows without a mask (1.07-1.08x at 1024 rows once persistent, session 40, H200) and with the causal mask
#: (1.12-1.20x from 2048 rows; at 1024 rows 0.98x in session 40, 1.01x once the mask took one compare a score, and
#: 1.05-1.06x once the first consumer's diagonal block ran at half width, :data:`HALF_LAST_BLOCK`: its first form,
#: H100, fp16, two runs in one call, session 70, sixty-ninth finding; this form 1.05x fp16 and 1.06x bf16, H100,
#: session 71, seventieth finding). Head_dim 64 under the causal mask from 2048 rows: 1.02-1.06x at 4k-16k in five
#: calls on H100s (sessions 53, 68, twice 69 and 71, fp16 and bf16), at 2048 1.00-1.03x before the half block and
#: 1.02-1.04x with it (sessions 70 and 71), and at 1024 0.81-0.89x before it and 0.92-0.95x with it (sixty-eighth
#: to seventieth findings); without a mask two consumers run 0.96-0.99x there, and three take it
#: from 8192 rows (:func:`three_consumers_preferred`).
MIN_ROWS: dict[int, tuple[int | None, int | None]] = {128: (1024, 1024), 64: (None, 2048)}
MIN_SCORES = 2 ** 27
#: The query and key rows from which a call with dropout takes this kernel, per head_dim: (without a mask, under the
#: causal mask). Measured against the Triton forward with the same dropout (H100, fp16, p = 0.1, FlashAttention-2
#: shapes, N 1k-16k, session 57, benchmarks/TUNING.md forty-sixth finding, after the draws were compared a word at a
#: time and the dropped weights zeroed as P is packed): at 128 it takes 0.82-0.85x the Triton forward's time
#: without a mask and 0.91-0.98x causal (with :data:`DROPOUT_CAUSAL_CONFIGS`) from 1024 rows; at 64 0.86-0.91x from
#: 1024 rows without a mask, and causal 0.88-0.89x from 4096 rows but 1.34x at 1024 (2048 unmeasured). bf16 takes
#: the same routes; its dropout was timed against its plain calls only (the same ratios as fp16's).
DROPOUT_MIN_ROWS = {128: (1024, 1024), 64: (1024, 4096)}
#: (BLOCK_M, BLOCK_N, STAGES) of a causal call with dropout, per head_dim, where it differs from :data:`CONFIGS`: at
#: 128, 64-key blocks (0.238 / 0.669 / 2.476 ms at N = 1k / 4k / 16k, against 0.290 / 0.716 / 2.597 in 128-key blocks
#: and the Triton forward's 0.246 / 0.736 / 2.521; without a mask 128-key blocks stay faster, 0.319 / 1.125 / 4.365
#: against 0.341 / 1.262 / 4.907).
DROPOUT_CAUSAL_CONFIGS = {128: (64, 64, 3)}
#: The head dims at which an FP8 call is routed here by default. Written and compiled without a GPU (session 46,
#: benchmarks/TUNING.md thirty-sixth finding), then checked and timed on an H100 (session 52, forty-first finding):
#: at 128 it runs 1.05-1.16x the Triton FP8 forward (1.37-1.42x flashlib's fp16 forward, N >= 4k); at 64, where
#: exp2 bounds both, 0.92-0.99x, so Triton keeps it. Other head dims take it only with ``use_gluon=True``.
FP8_HEAD_DIMS: tuple[int, ...] = (128,)
#: The least query and key rows of a causal FP8 call routed here: :data:`MIN_ROWS`' causal rows from before the
#: half-width diagonal block (:data:`HALF_LAST_BLOCK`, which FP8 kernels do not run) took head_dim 128 down to 1024;
#: FP8 was timed from 4096 rows only (forty-first finding).
FP8_MIN_ROWS_CAUSAL = 2048


def scores_of(batch: int, heads: int, n_q: int, n_k: int, causal: bool) -> float:
    """The scores a call computes, the work its routes are measured by: B·H·N_q·N_k, halved under the causal
    mask."""
    return batch * heads * n_q * n_k * (0.5 if causal else 1.0)


def preferred(head_dim: int, n_q: int, n_k: int, scores: float, causal: bool, dropout: bool = False,
              fp8: bool = False) -> bool:
    """Whether this kernel is the faster forward for these sizes: the head dims and rows of :data:`MIN_ROWS` (with
    or without a ``causal`` mask) and :data:`MIN_SCORES` ``scores``, or where three consumers run
    (:func:`three_consumers_preferred`); with ``dropout``, the head dims and rows of :data:`DROPOUT_MIN_ROWS`; with
    ``fp8`` inputs, only at :data:`FP8_HEAD_DIMS`, and under the causal mask from :data:`FP8_MIN_ROWS_CAUSAL`."""
    if dropout:  # 16-bit only: FP8 is for inference (flashlib.fp8 refuses dropout)
        return (not fp8 and head_dim in DROPOUT_MIN_ROWS
                and min(n_q, n_k) >= DROPOUT_MIN_ROWS[head_dim][int(causal)] and scores >= MIN_SCORES)
    if three_consumers_preferred(head_dim, n_q, n_k, scores, causal, fp8=fp8):
        return True
    rows = MIN_ROWS.get(head_dim, (None, None))[int(causal)]
    if fp8 and causal and rows is not None:
        rows = max(rows, FP8_MIN_ROWS_CAUSAL)
    return (rows is not None and min(n_q, n_k) >= rows and scores >= MIN_SCORES
            and (not fp8 or head_dim in FP8_HEAD_DIMS))


def three_consumers_preferred(head_dim: int, n_q: int, n_k: int, scores: float, causal: bool, dropout: bool = False,
                              fp8: bool = False) -> bool:
    """Whether three consumer warpgroups are the faster forward for these sizes (and faster than the Triton
    forward, so :func:`preferred` routes here): 16-bit inputs without dropout or a mask, at the head dims and rows
    of :data:`THREE_CONSUMER_MIN_ROWS`, from :data:`THREE_CONSUMER_MIN_SCORES` scores."""
    return (not (causal or dropout or fp8) and head_dim in THREE_CONSUMER_MIN_ROWS
            and min(n_q, n_k) >= THREE_CONSUMER_MIN_ROWS[head_dim] and scores >= THREE_CONSUMER_MIN_SCORES)


def covers(spec, use_tma: bool | None, *unsupported) -> bool:
    """Whether a Gluon kernel covers a call of this ``spec`` (a :class:`flashlib.spec.AttentionSpec`): no mask or
    a causal one, dropout or not, no softcap, the copy engine not refused (``use_tma=False``), and none of the
    launcher's other arguments ``unsupported`` (lengths, packing, slopes, fixed blocks, ...) given."""
    left, right = spec.bounds()
    return (use_tma is not False and spec.softcap == 0 and left is None
            and right in (None, 0) and all(arg is None for arg in unsupported))


@functools.lru_cache(maxsize=None)
def _is_hopper(device_index: int) -> bool:
    """Asked once per GPU: ``wgmma`` and ``setmaxnreg`` are sm_90's own (Blackwell has neither)."""
    return torch.cuda.get_device_capability(device_index) == (9, 0)


def can_run(q: torch.Tensor, *others: torch.Tensor, scale: float, fp8: bool = False) -> bool:
    """Whether a Gluon Hopper kernel can take this call: Gluon present, a Hopper GPU, ``q`` float16 or bfloat16 (or
    float8 e4m3 with ``fp8``, which only the forward takes) with a head_dim of :data:`CONFIGS`, a positive scale,
    and ``q`` and every tensor of ``others`` readable by the copy engine (an FP8 V as V^T, keys innermost). The
    caller has checked that nothing but no mask or a causal one, and dropout, is asked for (no window, lengths,
    packing, score modifier)."""
    dtypes = (torch.float8_e4m3fn, ) if fp8 else (torch.float16, torch.bfloat16)
    if not (HAVE_GLUON and q.is_cuda and scale > 0 and q.dtype in dtypes and q.shape[-1] in CONFIGS):
        return False
    if not _is_hopper(cuda_index(q.device)):
        return False
    return all(descriptor_ready(t) for t in (q, *others))


@functools.lru_cache(maxsize=None)
def _tile_layout(rows: int, cols: int, dtype: torch.dtype):
    """The shared-memory layout of a (1, 1, rows, cols) tile (128-byte swizzle for the tensor cores)."""
    gluon_type = {torch.float16: gl.float16, torch.bfloat16: gl.bfloat16, torch.float8_e4m3fn: gl.float8e4nv}[dtype]
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, cols], gluon_type)


def tile_descriptor(t: torch.Tensor, rows: int, cols: int | None = None) -> "GluonDescriptor":
    """A Gluon descriptor of the 4-D tensor ``t`` with (1, 1, rows, cols) tiles, ``cols`` its last dimension
    whole by default: (1, 1, rows, D) tiles of a (B, H, N, D) tensor."""
    cols = t.shape[-1] if cols is None else cols
    return GluonDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows, cols], _tile_layout(rows, cols, t.dtype))


def launch_attention_forward_hopper(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                                    lse: torch.Tensor, *, scale: float, causal: bool, pingpong: bool | None = None,
                                    persistent: bool = PERSISTENT, dropout_p: float = 0.0,
                                    dropout_seed: torch.Tensor | None = None,
                                    descale: torch.Tensor | None = None,
                                    fp8_weights_shared: bool | None = None, q_in_registers: bool | None = None,
                                    consumers: int | None = None) -> None:
    """Fill o (B, H, N_q, D) and lse (B, H, N_q) float32 contiguous from q, k, v ((B, H[_kv], N, D)), a call
    :func:`can_run` accepts: no mask, or a causal one (bottom-right aligned) with ``causal``. ``pingpong``: the
    consumers take turns (None: :data:`PINGPONG`, or :data:`THREE_CONSUMER_PINGPONG_UNMASKED` for three consumers
    without a mask); ``persistent``: one program per SM walks the work items
    (:data:`PERSISTENT`), else one program per item. Either is off only to measure it. ``dropout_p`` > 0 (the
    effective p, :func:`.dropout.effective_dropout_p`) drops weights from the int64 seed in ``dropout_seed`` (on q's
    device), as the Triton forward does: the same seed drops the same weights. ``descale`` (FP8): q, k, v
    float8_e4m3fn, V stored keys innermost (``v.stride(2) == 1``, :func:`flashlib.fp8.keys_innermost`), o float16 or
    bfloat16, descale the (3, B, H_kv) float32 factors of q, k and v (:mod:`flashlib.fp8` checks them);
    ``fp8_weights_shared``: P enters P V from shared memory, else from registers (None: :data:`FP8_WEIGHTS_SHARED`).
    ``q_in_registers``: each consumer holds Q in registers (None: :data:`FP8_Q_IN_REGISTERS` for FP8,
    :data:`Q_IN_REGISTERS_HEAD_DIMS` for 16 bits without dropout). ``consumers``: consumer warpgroups a program, 2
    or 3 (16 bits without dropout at head_dim 64 only; None: 3 where :func:`three_consumers_preferred`, else 2)."""
    batch, heads, n_q, head_dim = q.shape
    fp8 = descale is not None
    if fp8_weights_shared is None:
        fp8_weights_shared = FP8_WEIGHTS_SHARED
    # Three consumers were compiled and checked at head_dim 64 only: at 128 their O and S alone fill 128 of the 160
    # registers and their slots most of shared memory.
    three_allowed = not fp8 and not dropout_p > 0 and head_dim == 64
    if consumers is None:
        consumers = 3 if three_allowed and three_consumers_preferred(
            head_dim, n_q, k.shape[2], scores_of(batch, heads, n_q, k.shape[2], causal), causal) else 2
    if consumers not in (2, 3) or (consumers == 3 and not three_allowed):
        raise ValueError(f"consumers: expected 2, or 3 for 16-bit inputs without dropout at head_dim 64; got "
                         f"{consumers!r} ({'fp8' if fp8 else q.dtype}, dropout_p={dropout_p}, head_dim={head_dim})")
    if pingpong is None:
        pingpong = THREE_CONSUMER_PINGPONG_UNMASKED if consumers == 3 and not causal else PINGPONG
    if q_in_registers is None:  # three consumers' 160 registers leave no room for Q (it spills)
        q_in_registers = FP8_Q_IN_REGISTERS if fp8 else (head_dim in Q_IN_REGISTERS_HEAD_DIMS and not dropout_p > 0
                                                          and consumers == 2)
    block_m, block_n, stages = (FP8_CONFIGS if fp8 else CONFIGS)[head_dim]
    if dropout_p > 0 and causal:
        block_m, block_n, stages = DROPOUT_CAUSAL_CONFIGS.get(head_dim, (block_m, block_n, stages))
    v_tiles = tile_descriptor(v.transpose(2, 3), head_dim, block_n) if fp8 else tile_descriptor(v, block_n)
    n_tiles = triton.cdiv(n_q, consumers * block_m)
    items_per_head = (n_tiles + 1) // 2 if causal else n_tiles
    n_items = batch * heads * items_per_head
    grid = (n_items, )
    if persistent:
        grid = (min(n_items, multiprocessor_count(cuda_index(q.device))), )
    launch(attention_fwd_hopper_kernel, grid,
        tile_descriptor(q, block_m), tile_descriptor(k, block_n), v_tiles, tile_descriptor(o, block_m), lse,
        scale * LOG2E.value, heads, heads // k.shape[1], n_q, k.shape[2], n_items, items_per_head, n_tiles,
        int(pingpong), lse if dropout_seed is None else dropout_seed, float(dropout_p),
        lse if descale is None else descale, batch * k.shape[1], CAUSAL=causal,
        BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim, STAGES=stages, DROPOUT=dropout_p > 0,
        P_SHARED=fp8 and fp8_weights_shared, Q_IN_REGISTERS=bool(q_in_registers), CONSUMERS=consumers,
        CONSUMER_REGS=CONSUMER_REGISTERS if consumers == 2 else THREE_CONSUMER_REGISTERS, LOADER_REGS=LOADER_REGISTERS,
        num_warps=4, maxnreg=KERNEL_REGISTERS if consumers == 2 else THREE_KERNEL_REGISTERS)
