"""Dropout inside the attention kernels: which weights are kept, from a seed, recomputable anywhere.

The kernels never store a dropout mask. Each of them (forward, dK/dV, dQ) recomputes the
mask of the tile it works on with :func:`dropout_keep`, a pure function of (seed, sample
and head, query row, key column): the backward drops exactly what the forward dropped.

Cost. Philox-4x32 (Salmon et al., 2011, the generator of cuRAND and of torch's CUDA
dropout) gives 128 random bits per call, and each call is about a hundred integer
operations. One call per attention weight made a forward 4.9x slower on an H100
(benchmarks/results/front_door_*.json). Here one call serves 8 consecutive keys of a
row, 16 bits each, and runs 7 rounds (Philox4x32-7 passes BigCrush; 10 is the default
safety margin): about 1/11 of the work. The price of 16 bits: ``dropout_p`` is rounded
to a multiple of 1/65536 (:func:`effective_dropout_p`), and the kept weights are scaled
by 1 / (1 - that p), so the expectation stays exact. (flash-attn keeps 8 bits, 1/256.)

:func:`dropout_mask` writes the mask out for tests (O(B H N_q N_k) memory: never in a model).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

#: Random bits per weight, and Philox rounds (see the module's docstring).
DROPOUT_BITS = 16
PHILOX_ROUNDS = tl.constexpr(7)


def effective_dropout_p(dropout_p: float) -> float:
    """The probability the kernels really drop with: ``dropout_p`` rounded to a multiple of 2^-16
    (at most 1 - 2^-16)."""
    levels = 1 << DROPOUT_BITS
    return min(round(dropout_p * levels), levels - 1) / levels


@triton.jit
def dropout_keep(seed, stream, q_pos, k_start, dropout_p, BLOCK_N: tl.constexpr):
    """(len(q_pos), BLOCK_N) bool: whether weight (q_pos[i], k_start + j) of ``stream`` is kept.

    ``stream`` is ``batch * H + head``; positions are rows and columns within the sample;
    ``k_start`` is a multiple of 8. One Philox call on the counter (key group of 8, query
    row, stream, 0) gives the 8 keys of a group their 16-bit draws; a weight is kept
    when its draw is at least ``dropout_p * 65536`` (``dropout_p`` is the effective p).
    """
    BLOCK_M: tl.constexpr = q_pos.shape[0]
    groups = k_start // 8 + tl.arange(0, BLOCK_N // 8)
    zero = (q_pos[:, None] * 0 + groups[None, :] * 0).to(tl.uint32)
    r0, r1, r2, r3 = tl.philox(seed, zero + groups[None, :].to(tl.uint32), zero + q_pos[:, None].to(tl.uint32),
                               zero + stream.to(tl.uint32), zero, PHILOX_ROUNDS)
    low = 0xFFFF
    draws = tl.join(tl.join(tl.join(r0 & low, r0 >> 16), tl.join(r1 & low, r1 >> 16)),
                    tl.join(tl.join(r2 & low, r2 >> 16), tl.join(r3 & low, r3 >> 16)))
    draws = tl.reshape(draws, (BLOCK_M, BLOCK_N))
    return draws.to(tl.float32) >= dropout_p * 65536.0  # exact: both are integers below 2^24


@triton.jit(do_not_specialize=["seed"])
def dropout_mask_kernel(MASK, seed, dropout_p, N_Q, N_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """MASK[stream, i, j] = whether weight (i, j) of stream ``b * H + h`` is kept (int8 0/1, contiguous)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    k_start = tl.program_id(1) * BLOCK_N
    cols = k_start + tl.arange(0, BLOCK_N)
    stream = tl.program_id(2)
    keep = dropout_keep(seed, stream, rows, k_start, dropout_p, BLOCK_N)
    ptrs = MASK + (stream.to(tl.int64) * N_Q + rows[:, None]) * N_K + cols[None, :]
    tl.store(ptrs, keep.to(tl.int8), mask=(rows[:, None] < N_Q) & (cols[None, :] < N_K))


def dropout_mask(seed: int, dropout_p: float, batch: int, heads: int, n_q: int, n_k: int,
                 device: torch.device) -> torch.Tensor:
    """(B, H, N_q, N_k) bool: True where the attention kernels with this seed and p keep a weight."""
    mask = torch.empty((batch, heads, n_q, n_k), dtype=torch.int8, device=device)
    if mask.numel():
        grid = (triton.cdiv(n_q, 32), triton.cdiv(n_k, 32), batch * heads)
        dropout_mask_kernel[grid](mask, seed, effective_dropout_p(dropout_p), n_q, n_k, BLOCK_M=32, BLOCK_N=32)
    return mask.bool()
