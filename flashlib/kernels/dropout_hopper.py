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
registers. That is a blocked layout (``words`` in :func:`_square_words`) over the (ROWS / 2, COLS / 2) words. Its
bytes, joined and permuted into the tile as :func:`.dropout._squares` does, land in registers of
the thread that holds those weights in the accumulator, so the final ``convert_layout`` moves no
data (the compiled kernel has no extra shared-memory round trip; ``benchmarks/sass_counts.py``
shows it). Each word is hashed once, by the one thread that uses its four bytes.
"""
from __future__ import annotations

from .dropout import KEY_MULTIPLIER, QUERY_MULTIPLIER, STREAM_OFFSET, kept_bytes, lowbias32

try:  # Gluon ships with Triton 3.5 and later (see .attention_fwd_hopper)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - older Triton
    HAVE_GLUON = False

if HAVE_GLUON:
    mix32 = gluon.jit(lowbias32)
    mark_kept = gluon.jit(kept_bytes)

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
    def _square_words(key, q_start, k_start, ROWS: gl.constexpr, COLS: gl.constexpr, KEYS_ALONG_ROWS: gl.constexpr):
        """(ROWS / 2, COLS / 2) uint32: the word of each square of the tile, in the blocked layout whose words land
        in the accumulator's threads (the module's docstring)."""
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
        return mix32((qg.to(gl.uint32) * QUERY_MULTIPLIER + key) ^ (kg.to(gl.uint32) * KEY_MULTIPLIER))

    @gluon.jit
    def kept_words(key, q_start, k_start, threshold, ROWS: gl.constexpr, COLS: gl.constexpr,
                   KEYS_ALONG_ROWS: gl.constexpr):
        """(ROWS / 2, COLS / 2) uint32, the word of each square of the tile (see :func:`dropout_keep`) with bit 7
        of byte b set where that byte's weight is kept (:func:`.dropout.kept_bytes`: four compares in three word
        operations). Eight words a thread hold the draws of its 32 weights of a 64 x 64 tile, so a kernel can keep
        them across its products instead of 32 flags (:func:`keep_from_words`, :func:`kept_weights_operand`)."""
        return mark_kept(_square_words(key, q_start, k_start, ROWS, COLS, KEYS_ALONG_ROWS), threshold)

    @gluon.jit
    def _spread(b00, b01, b10, b11, ROWS: gl.constexpr, COLS: gl.constexpr, layout: gl.constexpr):
        """(ROWS, COLS) tile in ``layout`` from four (ROWS / 2, COLS / 2) tensors of word (u, w): ``b_xy`` goes to
        row 16 (u // 8) + 8x + u % 8, column 16 (w // 8) + 8y + w % 8 (:func:`.dropout._squares`); each lands in
        the thread that holds it in ``layout``, so the conversion moves no data."""
        t = gl.join(gl.join(b00, b01), gl.join(b10, b11))  # (u, w, y, x)
        t = gl.reshape(t, [ROWS // 16, 8, COLS // 16, 8, 2, 2])  # (s, r, G, c, y, x)
        t = gl.reshape(gl.permute(t, [0, 5, 1, 2, 4, 3]), [ROWS, COLS])  # (s, x, r, G, y, c)
        return gl.convert_layout(t, layout)

    @gluon.jit
    def _square_byte(place: gl.constexpr, KEYS_ALONG_ROWS: gl.constexpr):
        """Which byte of a square's word :func:`_spread`'s ``place``-th tensor (0 to 3: b00, b01, b10, b11) takes:
        byte 2 * [row + 8] + [column + 8], or with keys along rows 2 * [column + 8] + [row + 8] (the middle two
        swap)."""
        return (3 - place) if (KEYS_ALONG_ROWS and place % 3 != 0) else place

    @gluon.jit
    def keep_from_words(y, ROWS: gl.constexpr, COLS: gl.constexpr, KEYS_ALONG_ROWS: gl.constexpr,
                        layout: gl.constexpr):
        """(ROWS, COLS) bool in ``layout`` from :func:`kept_words`'s words: each weight's test is one bit of its
        word."""
        R: gl.constexpr = KEYS_ALONG_ROWS
        t = _spread(y & (0x80 << 8 * _square_byte(0, R)), y & (0x80 << 8 * _square_byte(1, R)),
                    y & (0x80 << 8 * _square_byte(2, R)), y & (0x80 << 8 * _square_byte(3, R)), ROWS, COLS, layout)
        return t != 0

    @gluon.jit
    def _sign_selector(byte: gl.constexpr):
        """``prmt``'s selector that fills the low half of its result with the sign of byte ``byte`` of its first
        operand and the high half with that of its second."""
        return (8 + byte) * 0x11 + (12 + byte) * 0x1100

    @gluon.jit
    def _byte_sign_masks(y, byte: gl.constexpr):
        """Per word of ``y``: all ones where bit 7 of its byte ``byte`` is set, else 0 (one ``prmt`` over ``y`` twice,
        :func:`_sign_selector`)."""
        selector = gl.full(y.shape, _sign_selector(byte), gl.uint32, y.type.layout)
        return gl.inline_asm_elementwise("prmt.b32 $0, $1, $1, $2;", "=r,r,r", [y, selector], dtype=gl.uint32,
                                         is_pure=True, pack=1)

    @gluon.jit
    def zero_dropped(x, y, ROWS: gl.constexpr, COLS: gl.constexpr, KEYS_ALONG_ROWS: gl.constexpr):
        """``x`` (float32, (ROWS, COLS), an accumulator's layout) with the dropped weights set to +0.0, from
        :func:`kept_words`' words ``y``: a ``prmt`` turns a weight's kept bit into a 32-bit mask and an ``and``
        applies it: two instructions a weight, where :func:`dropout_keep`'s byte extraction, compare and select take
        three (Triton 3.6, sm_90a: the dQ kernel's key-block loop at head_dim 64 goes from 779 to 713 instructions,
        and the kernel runs 1.03-1.06x faster on an H100). Bitwise what ``gl.where(kept, x, 0.0)`` gives."""
        R: gl.constexpr = KEYS_ALONG_ROWS
        layout: gl.constexpr = x.type.layout
        masks = _spread(_byte_sign_masks(y, _square_byte(0, R)), _byte_sign_masks(y, _square_byte(1, R)),
                        _byte_sign_masks(y, _square_byte(2, R)), _byte_sign_masks(y, _square_byte(3, R)), ROWS, COLS,
                        layout)
        return (x.to(gl.uint32, bitcast=True) & masks).to(gl.float32, bitcast=True)

    @gluon.jit
    def kept_weights_operand(p, y, dtype: gl.constexpr, ROWS: gl.constexpr, COLS: gl.constexpr,
                             KEYS_ALONG_ROWS: gl.constexpr):
        """``p`` (float32, (ROWS, COLS), an accumulator's layout) in ``dtype`` (float16 or bfloat16) with the dropped
        weights zeroed, from :func:`kept_words`'s words ``y``. Two neighbours along a row are packed into one
        register by the conversion, and their kept bits sit in the same byte of two words: one ``prmt`` spreads
        both bits over a 32-bit mask, one ``and`` applies it, two instructions a pair. Written as a select, the
        compiler moved the select past the conversion and selected each half-word apart (a byte permute and a
        select a weight, and the flags kept across the products in packed bits)."""
        gl.static_assert((dtype == gl.float16) or (dtype == gl.bfloat16), "P V takes 16-bit weights here")
        layout: gl.constexpr = p.type.layout
        words_layout: gl.constexpr = y.type.layout
        shape: gl.constexpr = [ROWS // 2, COLS // 2]
        R: gl.constexpr = KEYS_ALONG_ROWS
        selector = _spread(gl.full(shape, _sign_selector(_square_byte(0, R)), gl.uint32, words_layout),
                           gl.full(shape, _sign_selector(_square_byte(1, R)), gl.uint32, words_layout),
                           gl.full(shape, _sign_selector(_square_byte(2, R)), gl.uint32, words_layout),
                           gl.full(shape, _sign_selector(_square_byte(3, R)), gl.uint32, words_layout), ROWS, COLS,
                           layout)
        words = _spread(y, y, y, y, ROWS, COLS, layout)
        if dtype == gl.bfloat16:
            return gl.inline_asm_elementwise(
                "{ .reg .b32 h, m; cvt.rn.bf16x2.f32 h, $2, $1; prmt.b32 m, $3, $4, $5; and.b32 $0, h, m; }",
                "=r,r,r,r,r,r,r", [p, words, selector], dtype=dtype.value, is_pure=True, pack=2)
        return gl.inline_asm_elementwise(
            "{ .reg .b32 h, m; cvt.rn.f16x2.f32 h, $2, $1; prmt.b32 m, $3, $4, $5; and.b32 $0, h, m; }",
            "=r,r,r,r,r,r,r", [p, words, selector], dtype=dtype.value, is_pure=True, pack=2)

    @gluon.jit
    def dropout_keep(key, q_start, k_start, threshold, ROWS: gl.constexpr, COLS: gl.constexpr,
                     KEYS_ALONG_ROWS: gl.constexpr, layout: gl.constexpr):
        """(ROWS, COLS) bool in ``layout`` (a four-warp version 3 accumulator of that shape): whether weight
        (q_start + i, k_start + j) is kept, or with ``KEYS_ALONG_ROWS`` weight (q_start + j, k_start + i), the
        dK/dV kernel's orientation. ``key``: :func:`stream_key`; starts are multiples of 16; ``threshold``:
        :func:`keep_threshold`. Each byte is extracted and compared: where the flags are used once, as a select
        of float32 values, this takes fewer instructions than :func:`kept_words`' compare (Triton 3.6, sm_90a: 426
        against 445 a key block of the dQ kernel at head_dim 128)."""
        x = _square_words(key, q_start, k_start, ROWS, COLS, KEYS_ALONG_ROWS)
        R: gl.constexpr = KEYS_ALONG_ROWS
        t = _spread((x >> 8 * _square_byte(0, R)) & 0xFF, (x >> 8 * _square_byte(1, R)) & 0xFF,
                    (x >> 8 * _square_byte(2, R)) & 0xFF, (x >> 8 * _square_byte(3, R)) & 0xFF, ROWS, COLS, layout)
        return t >= threshold
