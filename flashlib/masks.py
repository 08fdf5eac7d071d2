"""Mask arithmetic: which keys a query sees, which key blocks a program must visit.

Every mask flashlib supports is a *band* (semantics of :mod:`flashlib.reference`):
query row ``i``, placed at key position ``i' = i + N_k - N_q`` (bottom-right
alignment), sees the keys ``i' - left <= j <= i' + right`` with ``j < seq_len``,
and a query ``i >= seq_len`` (padding) sees nothing. The keys a *block* of query
rows sees therefore form one interval, and the key blocks its program must visit
are one range of block indices ``[lo, hi)``; inside it, the blocks ``[full_lo,
full_hi)`` are seen whole by every row and need no element mask. The rest of the
score matrix is never loaded: block early exit.

This module computes those ranges in plain Python, and classifies the tiles of
any boolean mask as computed (whole), masked (partly visible) or skipped, so that a
notebook, a check and a test can compare what the kernel *should* do with what it
records (``launch_attention_forward(..., tiles=...)``). Block indices throughout:
key block ``j`` holds keys ``j * block_n`` to ``(j + 1) * block_n - 1``.
"""
from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np
import torch

from .integer_math import ceil_div
from .spec import window_bounds
from .tiles import TILE_COMPUTED, TILE_MASKED, TILE_SKIPPED


def _check_ints(positive=(), non_negative=(), **values) -> None:
    for name, value in values.items():
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
        if name in positive and value <= 0:
            raise ValueError(f"{name} must be a positive int, got {name}={value}")
        if name in non_negative and value < 0:
            raise ValueError(f"{name} must be >= 0, got {name}={value}")


def _check_block(start_m: int, block_m: int, block_n: int, n_q: int, n_k: int) -> None:
    _check_ints(positive=("block_m", "block_n", "n_q"), non_negative=("start_m", "n_k"),
                start_m=start_m, block_m=block_m, block_n=block_n, n_q=n_q, n_k=n_k)
    if start_m >= ceil_div(n_q, block_m):
        raise ValueError(f"start_m must be a query block index in [0, cdiv(n_q, block_m)) = "
                         f"[0, {ceil_div(n_q, block_m)}), got start_m={start_m}")


def causal_block_range(start_m: int, block_m: int, block_n: int, n_q: int, n_k: int) -> tuple[int, int]:
    """Key blocks ``[lo, hi)`` the causal program of query block ``start_m`` must visit.

    Its rows are ``start_m * block_m`` to the last one, ``min((start_m + 1) * block_m, n_q) - 1``
    (the query tail may cut the block). That last row sees the most keys: up to
    ``last_row + n_k - n_q`` inclusive (bottom-right alignment), which lies in key block
    ``last_key // block_n``; every block up to and including it is visited, the
    diagonal block too. Where no row sees a key (more queries than keys): ``(0, 0)``.
    """
    _check_block(start_m, block_m, block_n, n_q, n_k)
    last_row = min((start_m + 1) * block_m, n_q) - 1
    last_key = last_row + n_k - n_q  # the last key the block's last row sees (j <= i + n_k - n_q)
    if last_key < 0:
        return 0, 0
    return 0, last_key // block_n + 1  # the block holding last_key is visited: +1, not cdiv(last_key)


class BlockRange(NamedTuple):
    """Key blocks of one program: visited ``[lo, hi)``; seen whole by every row ``[full_lo, full_hi)``."""

    lo: int
    full_lo: int
    full_hi: int
    hi: int

    @property
    def visited(self) -> range:
        """Every key block the program loads, in loop order."""
        return range(self.lo, self.hi)

    @property
    def masked(self) -> list[int]:
        """Visited blocks that need an element mask (a band edge or a tail cuts them)."""
        return [j for j in self.visited if not self.full_lo <= j < self.full_hi]


def block_range(start_m: int, block_m: int, block_n: int, n_q: int, n_k: int, *, causal: bool = False,
                window=None, seq_len: int | None = None) -> BlockRange:
    """The key blocks query block ``start_m`` must visit under any flashlib mask, and those it sees whole.

    ``causal`` and ``window=(left, right)`` as in :func:`flashlib.reference.attention_mask`
    (-1 or None: unbounded); ``seq_len`` pads the sample: queries and keys from
    ``seq_len`` on are padding. An empty range is ``BlockRange(0, 0, 0, 0)``.
    """
    _check_block(start_m, block_m, block_n, n_q, n_k)
    if seq_len is not None:
        _check_ints(non_negative=("seq_len",), seq_len=seq_len)
    left, right = window_bounds(causal, window)
    q_len = n_q if seq_len is None else min(seq_len, n_q)
    k_len = n_k if seq_len is None else min(seq_len, n_k)
    offset = n_k - n_q
    first = start_m * block_m + offset  # key position i' of the block's first row
    last = min((start_m + 1) * block_m, q_len) - 1 + offset  # ... and of its last valid row
    if last < first:  # the block holds only padding queries
        return BlockRange(0, 0, 0, 0)
    # Keys some row sees: [key_lo, key_hi). Bounds grow with the row: the first row has the
    # lowest, the last row the highest, and consecutive rows' bands overlap, so it is one interval.
    key_lo = 0 if left is None else max(first - left, 0)
    key_hi = k_len if right is None else min(last + right + 1, k_len)
    if key_hi <= key_lo:
        return BlockRange(0, 0, 0, 0)
    # Keys every row sees: from the last row's left bound to the first row's right bound.
    all_lo = 0 if left is None else max(last - left, 0)
    all_hi = k_len if right is None else min(first + right + 1, k_len)
    lo, hi = key_lo // block_n, ceil_div(key_hi, block_n)
    full_lo = min(max(ceil_div(all_lo, block_n), lo), hi)  # first block starting at or after all_lo
    full_hi = min(max(all_hi // block_n, full_lo), hi)  # last block ending at or before all_hi
    return BlockRange(lo, full_lo, full_hi, hi)


def predicted_tiles(n_q: int, n_k: int, block_m: int, block_n: int, *, causal: bool = False,
                    window=None, seq_len: int | None = None) -> np.ndarray:
    """(cdiv(n_q, block_m), cdiv(n_k, block_n)) tile status from :func:`block_range`, per query block.

    :data:`~flashlib.tiles.TILE_COMPUTED` (1) for blocks seen whole, :data:`~flashlib.tiles.TILE_MASKED`
    (2) for the other visited ones, :data:`~flashlib.tiles.TILE_SKIPPED` (0) elsewhere: the
    record the forward kernel should write.
    """
    _check_ints(positive=("n_q", "block_m", "block_n"), non_negative=("n_k",),
                n_q=n_q, n_k=n_k, block_m=block_m, block_n=block_n)
    status = np.full((ceil_div(n_q, block_m), ceil_div(n_k, block_n)), TILE_SKIPPED, dtype=int)
    for i in range(status.shape[0]):
        r = block_range(i, block_m, block_n, n_q, n_k, causal=causal, window=window, seq_len=seq_len)
        status[i, r.lo:r.hi] = TILE_MASKED
        status[i, r.full_lo:r.full_hi] = TILE_COMPUTED
    return status


def tile_status(allowed, block_m: int, block_n: int, *, q_len: int | None = None) -> np.ndarray:
    """Classify the tiles of any boolean mask ``allowed`` (N_q, N_k): skipped, computed or masked.

    A tile is skipped when no valid query row sees any of its keys, computed (no element
    mask needed) when every valid row sees all of them and the tile lies inside N_k, and
    masked otherwise. Rows from ``q_len`` on are padding queries: no program computes
    them, so they do not count.
    """
    allowed = allowed.cpu().numpy() if isinstance(allowed, torch.Tensor) else np.asarray(allowed)
    if allowed.ndim != 2 or allowed.dtype != bool:
        raise TypeError(f"allowed must be a 2-D boolean mask (N_q, N_k), got {allowed.dtype} of shape "
                        f"{allowed.shape}")
    _check_ints(positive=("block_m", "block_n"), block_m=block_m, block_n=block_n)
    n_q, n_k = allowed.shape
    q_len = n_q if q_len is None else min(q_len, n_q)
    rows, cols = ceil_div(n_q, block_m), ceil_div(n_k, block_n)
    padded = np.zeros((rows * block_m, cols * block_n), dtype=bool)  # keys past N_k: never allowed
    padded[:q_len, :n_k] = allowed[:q_len]
    tiles = padded.reshape(rows, block_m, cols, block_n).transpose(0, 2, 1, 3)
    valid = (np.arange(rows * block_m) < q_len).reshape(rows, 1, block_m, 1)
    seen_any = tiles.any(axis=(2, 3))
    seen_all = (tiles | ~valid).all(axis=(2, 3)) & valid.any(axis=(2, 3))
    return np.where(seen_all, TILE_COMPUTED, np.where(seen_any, TILE_MASKED, TILE_SKIPPED))


def padding_mask(seq_lens: torch.Tensor, n_q: int, n_k: int) -> torch.Tensor:
    """Boolean mask (B, 1, n_q, n_k), True where query i of sample b may attend to key j.

    Sample b holds ``seq_lens[b]`` real tokens followed by padding: key j is real when
    ``j < seq_lens[b]``, and so is query i. A padding query attends to nothing: its row is
    fully masked, so attention gives it output 0 (the library's rule for empty rows).
    """
    if not isinstance(seq_lens, torch.Tensor) or seq_lens.dim() != 1:
        raise TypeError(f"seq_lens must be a 1-D tensor of lengths (B,), got {seq_lens!r:.60}")
    _check_ints(non_negative=("n_q", "n_k"), n_q=n_q, n_k=n_k)
    lens = seq_lens.to(torch.long).view(-1, 1, 1, 1)
    queries = torch.arange(n_q, device=seq_lens.device).view(1, 1, -1, 1) < lens
    keys = torch.arange(n_k, device=seq_lens.device).view(1, 1, 1, -1) < lens
    return queries & keys
