"""HBM traffic of attention, counted: naive, FlashAttention-1 order and FlashAttention-2 order.

Attention at long sequence lengths is limited by memory traffic, not by arithmetic,
so the FlashAttention paper (Dao et al., 2022, Theorem 2) counts bytes moved between
HBM (the GPU's main memory) and SRAM (the on-chip shared memory, M bytes per SM):

* **naive** (the paper's Algorithm 0): S = Q K^T and P = softmax(S) are written to
  HBM and read back: Theta(N d + N^2) bytes.
* **FlashAttention**: Theta(N^2 d^2 / M) bytes. The tile that stays in SRAM while the
  other operand streams past can hold about M / (4 d) rows, so the streamed operand
  is read N / (M / 4d) times: N^2 d^2 / M in total, up to constants.

The functions here make those counts concrete, per (batch, head) and multiplied by
``batch * heads``, in bytes: inputs and outputs of ``dtype_bytes`` each, the running
statistics (m, l, L) in float32. Block sizes are given, or derived from the SRAM size
as in the paper (:func:`paper_block_sizes`). :func:`kernel_traffic` counts what
flashlib's kernel actually loads and stores, from the tiles it recorded as visited.
"""
from __future__ import annotations

import dataclasses

import numpy as np

#: Bytes of one float32 statistic (m, l or the logsumexp L).
STATS_BYTES = 4

#: Shared memory per streaming multiprocessor (bytes): the "M" of the paper.
SRAM_PER_SM = {"A100": 164 * 1024, "H100": 228 * 1024}


@dataclasses.dataclass(frozen=True)
class Traffic:
    """Bytes read from and written to HBM."""

    reads: int
    writes: int

    @property
    def total(self) -> int:
        return self.reads + self.writes


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _times(t: Traffic, count: int) -> Traffic:
    return Traffic(t.reads * count, t.writes * count)


_MAY_BE_ZERO = ("n_q", "n_k", "batch", "heads")


def _check_sizes(**values) -> None:
    """Ints: > 0, or >= 0 for the counts that may be empty (N, batch, heads)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
        least = 0 if name in _MAY_BE_ZERO else 1
        if value < least:
            raise ValueError(f"{name} must be >= {least}, got {name}={value}")


def paper_block_sizes(sram_bytes: int, head_dim: int, dtype_bytes: int = 2) -> tuple[int, int]:
    """(resident block, streamed block) for SRAM of ``sram_bytes``: the paper's Algorithm 1, line 1.

    The resident tile (K/V in FlashAttention-1, Q in FlashAttention-2's order) gets
    ``floor(M / (4 d s))`` rows, with ``s = dtype_bytes``: a quarter of SRAM for each of
    its tiles. The streamed block gets ``min(that, d)`` rows, so that a score tile also
    fits in M/4.
    """
    _check_sizes(sram_bytes=sram_bytes, head_dim=head_dim, dtype_bytes=dtype_bytes)
    resident = sram_bytes // (4 * head_dim * dtype_bytes)
    if resident < 1:
        raise ValueError(f"sram_bytes={sram_bytes} cannot hold one row of four tiles of head_dim={head_dim} "
                         f"({4 * head_dim * dtype_bytes} bytes)")
    return resident, min(resident, head_dim)


def naive_traffic(n_q: int, head_dim: int, *, n_k: int | None = None, batch: int = 1, heads: int = 1,
                  dtype_bytes: int = 2) -> Traffic:
    """Standard attention in three kernels: S = Q K^T, P = softmax(S), O = P V; S and P in HBM.

    reads Q, K (for S), S (for the softmax), P and V (for O); writes S, P and O.
    """
    n_k = n_q if n_k is None else n_k
    _check_sizes(n_q=n_q, n_k=n_k, head_dim=head_dim, batch=batch, heads=heads, dtype_bytes=dtype_bytes)
    qo, kv, scores = n_q * head_dim, n_k * head_dim, n_q * n_k
    reads = qo + kv + scores + scores + kv
    writes = scores + scores + qo
    per_head = Traffic(reads * dtype_bytes, writes * dtype_bytes)
    return _times(per_head, batch * heads)


def flash2_traffic(n_q: int, head_dim: int, *, n_k: int | None = None, block_m: int | None = None,
                   block_n: int | None = None, sram_bytes: int | None = None, causal: bool = False,
                   batch: int = 1, heads: int = 1, dtype_bytes: int = 2) -> Traffic:
    """FlashAttention-2 order (Q outer), as flashlib's kernel runs it.

    One program per block of ``block_m`` query rows: it reads its Q block once, reads
    every K and V block it visits, and writes its O block and L once. With ``causal``
    (bottom-right aligned), a program visits key blocks up to the one holding its last
    row's diagonal, and loads keys up to the end of that block (or N_k). Without block
    sizes, they come from ``sram_bytes`` (:func:`paper_block_sizes`, Q resident).
    """
    n_k = n_q if n_k is None else n_k
    _check_sizes(n_q=n_q, n_k=n_k, head_dim=head_dim, batch=batch, heads=heads, dtype_bytes=dtype_bytes)
    if block_m is None or block_n is None:
        if sram_bytes is None:
            raise ValueError("give block_m and block_n, or sram_bytes to derive them from")
        resident, streamed = paper_block_sizes(sram_bytes, head_dim, dtype_bytes)
        block_m = resident if block_m is None else block_m
        block_n = streamed if block_n is None else block_n
    _check_sizes(block_m=block_m, block_n=block_n)
    keys_read = 0
    for m0 in range(0, n_q, block_m):
        if causal:
            last_row = min(m0 + block_m, n_q) - 1
            hi = min(last_row + 1 + n_k - n_q, n_k)  # keys the last row sees
            keys_read += min(n_k, _cdiv(hi, block_n) * block_n) if hi > 0 else 0
        else:
            keys_read += n_k
    reads = (n_q + 2 * keys_read) * head_dim * dtype_bytes
    writes = n_q * head_dim * dtype_bytes + n_q * STATS_BYTES
    return _times(Traffic(reads, writes), batch * heads)


def flash1_traffic(n_q: int, head_dim: int, *, n_k: int | None = None, block_n: int | None = None,
                   sram_bytes: int | None = None, batch: int = 1, heads: int = 1,
                   dtype_bytes: int = 2) -> Traffic:
    """FlashAttention-1 order (K/V outer, the paper's Algorithm 1), no mask.

    O, l, m are initialised in HBM; for each of the cdiv(N_k, block_n) blocks of K and V
    (read once), every block of Q, O, l, m is read and O, l, m written back. The
    query block size does not change the bytes; without ``block_n`` it comes from
    ``sram_bytes`` (:func:`paper_block_sizes`, K/V resident).
    """
    n_k = n_q if n_k is None else n_k
    _check_sizes(n_q=n_q, n_k=n_k, head_dim=head_dim, batch=batch, heads=heads, dtype_bytes=dtype_bytes)
    if block_n is None:
        if sram_bytes is None:
            raise ValueError("give block_n, or sram_bytes to derive it from")
        block_n = paper_block_sizes(sram_bytes, head_dim, dtype_bytes)[0]
    _check_sizes(block_n=block_n)
    outer = _cdiv(n_k, block_n)
    rows = n_q * head_dim * dtype_bytes
    stats = 2 * n_q * STATS_BYTES  # m and l
    reads = 2 * n_k * head_dim * dtype_bytes + outer * (2 * rows + stats)  # K, V once; Q, O, m, l per block
    writes = (rows + stats) + outer * (rows + stats)  # the initial O = 0, l = 0, m = -inf, then per block
    return _times(Traffic(reads, writes), batch * heads)


def programs(loop_order: str, n_q: int, *, block_m: int, batch: int = 1, heads: int = 1) -> int:
    """Programs (thread blocks) launched: FA2 order, one per (query block, batch, head); FA1, one per (batch, head)."""
    _check_sizes(n_q=n_q, block_m=block_m, batch=batch, heads=heads)
    if loop_order == "fa2":
        return _cdiv(n_q, block_m) * batch * heads
    if loop_order == "fa1":
        return batch * heads
    raise ValueError(f"loop_order must be 'fa1' or 'fa2', got {loop_order!r}")


def kernel_traffic(tiles, n_q: int, n_k: int, head_dim: int, block_m: int, block_n: int, *,
                   dtype_bytes: int = 2, seq_lens=None) -> Traffic:
    """Bytes flashlib's forward kernel moves, from its record of visited tiles.

    ``tiles`` (B*H, cdiv(N_q, block_m), cdiv(N_k, block_n)), nonzero where a program
    visited a key block (see ``launch_attention_forward(tiles=...)``). Every program
    loads its Q rows (< N_q) and stores O and L for them; each visited key block loads
    the K and V rows that exist (< N_k, or < the sample's length with ``seq_lens``:
    masked lanes move nothing).
    """
    record = np.asarray(tiles.cpu() if hasattr(tiles, "cpu") else tiles)
    if record.ndim != 3 or record.shape[1:] != (_cdiv(n_q, block_m), _cdiv(n_k, block_n)):
        raise ValueError(f"tiles must have shape (B*H, cdiv(n_q, block_m), cdiv(n_k, block_n)) = "
                         f"(B*H, {_cdiv(n_q, block_m)}, {_cdiv(n_k, block_n)}); got {record.shape}")
    slices = record.shape[0]
    lens = None if seq_lens is None else [int(x) for x in (seq_lens.tolist() if hasattr(seq_lens, "tolist")
                                                            else seq_lens)]
    if lens is not None and (not lens or slices % len(lens)):
        raise ValueError(f"seq_lens must have one length per sample (B*H = {slices} "
                         f"must be a multiple of it); got {len(lens) if lens else 0} lengths")
    heads = 1 if lens is None else slices // len(lens)
    starts = np.arange(record.shape[2]) * block_n
    keys_read = 0
    for bh in range(slices):
        k_len = n_k if lens is None else min(lens[bh // heads], n_k)
        per_block = np.clip(k_len - starts, 0, block_n)  # keys that exist in each key block
        keys_read += int((record[bh] != 0).sum(axis=0) @ per_block)
    rows = slices * n_q
    reads = (rows + 2 * keys_read) * head_dim * dtype_bytes
    writes = rows * head_dim * dtype_bytes + rows * STATS_BYTES
    return Traffic(reads, writes)


__all__ = ["Traffic", "STATS_BYTES", "SRAM_PER_SM", "paper_block_sizes", "naive_traffic", "flash2_traffic",
           "flash1_traffic", "programs", "kernel_traffic"]
