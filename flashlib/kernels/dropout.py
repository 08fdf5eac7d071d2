"""Dropout inside the attention kernels: which weights are kept, from a seed, recomputable anywhere.

The kernels never store a dropout mask. Each of them (forward, dK/dV, dQ) recomputes the
mask of the tile it works on, a pure function of (seed, sample and head, query row, key
column): the backward drops exactly what the forward dropped.

**The draw.** Weight (i, j) of stream ``s = sample * H + head`` is kept when its 8-bit draw
is at least ``p * 256`` (flash-attn's resolution): ``dropout_p`` is rounded to a multiple of
1/256 (:func:`effective_dropout_p`) and the kept weights are scaled by 1 / (1 - that p), so
the expectation stays exact. One 32-bit word serves the four weights

    (i, j), (i + 8, j), (i, j + 8), (i + 8, j + 8)     (i, j with bit 3 clear: a "square")

as its bytes ``8 * (2 * [row + 8] + [column + 8])``. The word of query group
``a = 8 (i // 16) + i % 8`` and key group ``b = 8 (j // 16) + j % 8`` is
``mix32((a * G_Q + key(seed, s)) ^ (b * G_K))``: two Weyl sequences (odd multipliers)
combined by XOR, then :func:`mix32`. ``key`` hashes the stream and both halves of the
64-bit seed. :func:`flashlib.reference.dropout_keep_reference` writes the same in PyTorch;
the tests hold the kernels to it bit for bit, and check the draws' statistics.

**Why squares.** On Hopper the tensor cores' accumulator gives each thread, of every 16 x 16
square of a tile, rows r and r + 8 by columns 2c, 2c + 1, 2c + 8 and 2c + 9. The four bytes
of a word therefore land in one thread, and the tile of draws, built with joins and a
permute, maps onto the accumulator's layout without moving data. The square is symmetric,
so the same holds for the dK/dV kernel, whose tiles have keys along rows
(:func:`dropout_keep_t`). The first version made one Philox-4x32-7 call per 8 keys of a row
(16-bit draws): its draws had to be rearranged through shared memory. At N = 4096, fp16, fixed
128 x 64 blocks, the forward with dropout took 2.2x (D = 64) and 2.5x (D = 128) the time without
it; with the squares 1.4x and 1.24x (benchmarks/TUNING.md, thirteenth finding).

:func:`dropout_mask` writes the mask out for tests (O(B H N_q N_k) memory: never in a model).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

#: Random bits per weight (see the module's docstring).
DROPOUT_BITS = 8
#: Odd multipliers of the query-group and key-group Weyl sequences, and the stream's offset.
QUERY_MULTIPLIER = tl.constexpr(0x9E3779B9)
KEY_MULTIPLIER = tl.constexpr(0x85EBCA6B)
STREAM_OFFSET = tl.constexpr(0x68E31DA4)


def effective_dropout_p(dropout_p: float) -> float:
    """The probability the kernels really drop with: ``dropout_p`` rounded to a multiple of 2^-8
    (at most 1 - 2^-8)."""
    levels = 1 << DROPOUT_BITS
    return min(round(dropout_p * levels), levels - 1) / levels


def lowbias32(x):
    """A bijective 32-bit hash: "lowbias32", two multiply-xorshift rounds (constants from Chris
    Wellons' hash prospector). ``x`` is uint32; every output bit depends on every input bit.
    Plain operators only, so that Triton (:func:`mix32`) and Gluon
    (:mod:`flashlib.kernels.dropout_hopper`) compile this one source."""
    x = x ^ (x >> 16)
    x = x * 0x21F0AAAD
    x = x ^ (x >> 15)
    x = x * 0x735A2D97
    return x ^ (x >> 15)


#: :func:`lowbias32` for Triton kernels.
mix32 = triton.jit(lowbias32)


def kept_bytes(x, threshold):
    """Bit 7 of each byte of the 32-bit word ``x`` set where that byte is at least ``threshold`` (0 to 255), the
    other bits meaningless: the four compares of a square's draws in three word operations (a kernel then tests one
    bit a weight). With t = threshold and d = (x | 0x80808080) - 0x01010101 (t & 0x7F), no byte of the
    subtraction borrows from the next (each byte of the first operand is at least 128, of the second at most 127),
    so bit 7 of d's byte says whether x's low seven bits reach t & 0x7F. x's byte then reaches t where x's bit 7 or
    d's is set if t < 128, where both are if t >= 128: the bitwise majority of x, d and c, with c = 0x80808080 if
    t < 128, else 0. Plain operators only, as :func:`lowbias32`: the Gluon kernels compile it
    (:mod:`.dropout_hopper`), and tests run it on integer tensors."""
    d = (x | 0x80808080) - (threshold & 0x7F) * 0x01010101
    c = ((threshold >> 7) ^ 1) * 0x80808080
    return (x & d) | (x & c) | (d & c)


@triton.jit
def dropout_stream_key(seed, stream):
    """uint32 key of (seed, stream): both 32-bit halves of the seed and the stream, hashed in turn.
    A kernel computes it once, before its loops, and passes it to :func:`dropout_keep`."""
    seed64 = tl.full((), 0, tl.uint64) + seed
    stream32 = tl.full((), 0, tl.uint32) + stream
    high = (seed64 >> 32).to(tl.uint32)
    low = (seed64 & 0xFFFFFFFF).to(tl.uint32)
    return mix32(mix32(mix32(stream32 + STREAM_OFFSET) ^ high) ^ low)


@triton.jit
def load_dropout_seed(SEED, HAS_DROPOUT: tl.constexpr):
    """The dropout seed, the int64 at ``SEED`` (drawn on the device by :mod:`flashlib.ops`, so a CUDA
    graph's replays each read their own), or 0 without dropout (``SEED`` is then never read)."""
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(SEED)
    return seed


@triton.jit
def _squares(b00, b01, b10, b11, ROWS: tl.constexpr, COLS: tl.constexpr):
    """(ROWS, COLS) tile from four (ROWS // 2, COLS // 2) byte tensors of word (u, w): ``b_xy`` goes to
    row 16 (u // 8) + 8x + u % 8, column 16 (w // 8) + 8y + w % 8."""
    t = tl.join(tl.join(b00, b01), tl.join(b10, b11))  # (u, w, y, x)
    t = tl.reshape(t, (ROWS // 16, 8, COLS // 16, 8, 2, 2))  # (s, r, G, c, y, x)
    return tl.reshape(tl.permute(t, (0, 5, 1, 2, 4, 3)), (ROWS, COLS))  # (s, x, r, G, y, c)


@triton.jit
def _square_words(key, q_start, k_start, ROWS: tl.constexpr, COLS: tl.constexpr, KEYS_ALONG_ROWS: tl.constexpr):
    """(ROWS // 2, COLS // 2) uint32 words of the squares of a tile (queries along rows unless
    ``KEYS_ALONG_ROWS``). Tile starts are multiples of 16, so a tile's groups are consecutive."""
    if KEYS_ALONG_ROWS:
        kg = (k_start // 2 + tl.arange(0, ROWS // 2))[:, None]
        qg = (q_start // 2 + tl.arange(0, COLS // 2))[None, :]
    else:
        qg = (q_start // 2 + tl.arange(0, ROWS // 2))[:, None]
        kg = (k_start // 2 + tl.arange(0, COLS // 2))[None, :]
    a = qg.to(tl.uint32) * QUERY_MULTIPLIER + key
    return mix32(a ^ (kg.to(tl.uint32) * KEY_MULTIPLIER))


@triton.jit
def _threshold(dropout_p):
    """``dropout_p * 256`` as uint32 (exact: ``dropout_p`` is a multiple of 1/256)."""
    return (tl.full((), 0.0, tl.float32) + dropout_p * 256.0).to(tl.uint32)


@triton.jit
def dropout_keep(key, q_start, k_start, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(BLOCK_M, BLOCK_N) bool: whether weight (q_start + i, k_start + j) is kept.

    ``key`` is :func:`dropout_stream_key` of the seed and the stream ``batch * H + head``;
    positions are rows and columns within the sample;
    ``q_start`` and ``k_start`` are multiples of 16, and so are the block sizes; ``dropout_p``
    is the effective p (see the module's docstring for the draw).
    """
    x = _square_words(key, q_start, k_start, BLOCK_M, BLOCK_N, False)
    # byte 2 * (row + 8) + (column + 8)
    draws = _squares(x & 0xFF, (x >> 8) & 0xFF, (x >> 16) & 0xFF, x >> 24, BLOCK_M, BLOCK_N)
    return draws >= _threshold(dropout_p)


@triton.jit
def dropout_keep_t(key, q_start, k_start, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(BLOCK_N, BLOCK_M) bool, keys along rows: the transpose of :func:`dropout_keep`'s tile, made in
    this orientation (the dK/dV kernel's tiles), so it needs no transpose of the draws."""
    x = _square_words(key, q_start, k_start, BLOCK_N, BLOCK_M, True)
    # rows are keys now: byte 2 * (column + 8) + (row + 8)
    draws = _squares(x & 0xFF, (x >> 16) & 0xFF, (x >> 8) & 0xFF, x >> 24, BLOCK_N, BLOCK_M)
    return draws >= _threshold(dropout_p)


@triton.jit(do_not_specialize=["seed"])
def dropout_mask_kernel(MASK, seed, dropout_p, N_Q, N_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """MASK[stream, i, j] = whether weight (i, j) of stream ``b * H + h`` is kept (int8 0/1, contiguous)."""
    q_start = tl.program_id(0) * BLOCK_M
    k_start = tl.program_id(1) * BLOCK_N
    rows = q_start + tl.arange(0, BLOCK_M)
    cols = k_start + tl.arange(0, BLOCK_N)
    stream = tl.program_id(2)
    keep = dropout_keep(dropout_stream_key(seed, stream), q_start, k_start, dropout_p, BLOCK_M, BLOCK_N)
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
