"""Dropout's draws for the Gluon Hopper kernels, made in the tensor cores' accumulator layout.

The draw is :mod:`.dropout`'s, bit for bit: weight (i, j) of a stream is kept when byte
``2 * [row + 8] + [column + 8]`` of its square's 32-bit word reaches ``p * 256``, the word being
:func:`.dropout.lowbias32` of the query and key groups' Weyl sequences. Only the way the tile is
assembled is Gluon's, where every tensor names its layout.

**Why this layout.** A warpgroup's accumulator (``NVMMADistributedLayout`` version 3, four warps
along rows) gives warp w rows 16w to 16w + 15, and lane l rows ``16w + l // 4`` and that + 8, by
columns ``8k + 2 (l % 4)`` and that + 1 for every k. A square's word (query group a, key group b)
covers rows ``16 (a // 8) + a % 8`` (+ 8) and columns ``16 (b // 8) + b % 8`` (+ 8): those are
one thread's when warp = a // 8, lane = 4 (a % 8) + (b % 8) // 2, and b % 2 and b // 8 are
registers. That is a blocked layout (``words`` in :func:`dropout_keep`) over the (ROWS / 2, COLS / 2) words. Its
bytes, joined and permuted into the tile as :func:`.dropout._squares` does, land in registers of
the thread that holds those weights in the accumulator, so the final ``convert_layout`` moves no
data (the compiled kernel has no extra shared-memory round trip; ``benchmarks/sass_counts.py``
shows it). Each word is hashed once, by the one thread that uses its four bytes.
"""
from __future__ import annotations

from .dropout import KEY_MULTIPLIER, QUERY_MULTIPLIER, STREAM_OFFSET, lowbias32

try:  # Gluon ships with Triton 3.5 and later (see .attention_fwd_hopper)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older Triton
    HAVE_GLUON = False

if HAVE_GLUON:
    mix32 = gluon.jit(lowbias32)

    @gluon.jit
    def stream_key(seed, stream):
        """uint32 key of (seed, stream), :func:`.dropout.dropout_stream_key` in Gluon: ``seed`` the int64 read from
        the seed's tensor, ``stream`` = sample * H + head."""
        seed64 = seed.to(gl.uint64, bitcast=True)
        high = (seed64 >> 32).to(gl.uint32)
        low = (seed64 & 0xFFFFFFFF).to(gl.uint32)
        return mix32(mix32(mix32(stream.to(gl.uint32, bitcast=True) + STREAM_OFFSET) ^ high) ^ low)

    @gluon.jit
    def keep_threshold(dropout_p):
        """``dropout_p * 256`` as uint32 (exact: the launcher passes the effective p, a multiple of 1/256)."""
        return (dropout_p * 256.0).to(gl.uint32)

    @gluon.jit
    def dropout_keep(key, q_start, k_start, threshold, ROWS: gl.constexpr, COLS: gl.constexpr,
                     KEYS_ALONG_ROWS: gl.constexpr, layout: gl.constexpr):
        """(ROWS, COLS) bool in ``layout`` (a four-warp version 3 accumulator of that shape): whether weight
        (q_start + i, k_start + j) is kept, or with ``KEYS_ALONG_ROWS`` weight (q_start + j, k_start + i), the
        dK/dV kernel's orientation. ``key``: :func:`stream_key`; starts are multiples of 16; ``threshold``:
        :func:`keep_threshold`."""
        words: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 2], threads_per_warp=[8, 4],
                                               warps_per_cta=[4, 1], order=[1, 0])
        along_rows = gl.arange(0, ROWS // 2, layout=gl.SliceLayout(1, words))[:, None]
        along_cols = gl.arange(0, COLS // 2, layout=gl.SliceLayout(0, words))[None, :]
        if KEYS_ALONG_ROWS:
            qg = q_start // 2 + along_cols
            kg = k_start // 2 + along_rows
        else:
            qg = q_start // 2 + along_rows
            kg = k_start // 2 + along_cols
        x = mix32((qg.to(gl.uint32) * QUERY_MULTIPLIER + key) ^ (kg.to(gl.uint32) * KEY_MULTIPLIER))
        b0 = x & 0xFF
        b3 = x >> 24
        if KEYS_ALONG_ROWS:  # rows are keys: byte 2 * [column + 8] + [row + 8]
            b01 = (x >> 16) & 0xFF
            b10 = (x >> 8) & 0xFF
        else:  # byte 2 * [row + 8] + [column + 8]
            b01 = (x >> 8) & 0xFF
            b10 = (x >> 16) & 0xFF
        # b_xy goes to row 16 (u // 8) + 8x + u % 8, column 16 (w // 8) + 8y + w % 8 of word (u, w)
        t = gl.join(gl.join(b0, b01), gl.join(b10, b3))  # (u, w, y, x)
        t = gl.reshape(t, [ROWS // 16, 8, COLS // 16, 8, 2, 2])  # (s, r, G, c, y, x)
        t = gl.reshape(gl.permute(t, [0, 5, 1, 2, 4, 3]), [ROWS, COLS])  # (s, x, r, G, y, c)
        return gl.convert_layout(t >= threshold, layout)
