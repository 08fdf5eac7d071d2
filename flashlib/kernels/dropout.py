"""The dropout mask of an attention call, written out: a debugging and testing aid.

The attention kernels never store their dropout mask; each of them (forward, dK/dV,
dQ) recomputes it from the seed with :func:`flashlib.kernels.attention_fwd.dropout_keep`.
This kernel calls that same function over the whole (N_q, N_k) grid of every (sample,
head), so a test can check the kernels against a reference that applies exactly this
mask. It costs O(B H N_q N_k) memory: never use it in a model.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attention_fwd import dropout_keep


@triton.jit(do_not_specialize=["seed"])
def dropout_mask_kernel(MASK, seed, dropout_p, N_Q, N_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """MASK[stream, i, j] = whether weight (i, j) of stream ``b * H + h`` is kept (int8 0/1, contiguous)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    stream = tl.program_id(2)
    keep = dropout_keep(seed, stream, rows[:, None], cols[None, :], dropout_p)
    ptrs = MASK + (stream.to(tl.int64) * N_Q + rows[:, None]) * N_K + cols[None, :]
    tl.store(ptrs, keep.to(tl.int8), mask=(rows[:, None] < N_Q) & (cols[None, :] < N_K))


def dropout_mask(seed: int, dropout_p: float, batch: int, heads: int, n_q: int, n_k: int,
                 device: torch.device) -> torch.Tensor:
    """(B, H, N_q, N_k) bool: True where the attention kernels with this seed and p keep a weight."""
    mask = torch.empty((batch, heads, n_q, n_k), dtype=torch.int8, device=device)
    if mask.numel():
        grid = (triton.cdiv(n_q, 32), triton.cdiv(n_k, 32), batch * heads)
        dropout_mask_kernel[grid](mask, seed, float(dropout_p), n_q, n_k, BLOCK_M=32, BLOCK_N=32)
    return mask.bool()
