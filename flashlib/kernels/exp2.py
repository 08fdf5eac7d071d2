"""Exponentials split between the special-function unit and the FMA units.

Every weight of the forward's online softmax costs one ``exp2``, which the GPU computes on its
special-function unit (SFU, ``MUFU.EX2``): 16 results per clock per SM on Hopper, against 128 fused
multiply-adds. When the tensor cores are fast (FP8 doubles their rate) the SFU can become the
limit of a key block's iteration. FlashAttention-4 computes part of the exponentials as a
polynomial on the FMA units instead; this module does the same in Triton:

* :func:`exp2_polynomial`: ``2^x = 2^floor(x) * 2^frac(x)``, with ``2^frac`` a cubic on [0, 1)
  (coefficients fitted here by minimising the relative error: at most 8.4e-5, below a float16
  rounding of 4.9e-4) and ``2^floor`` added to the float's exponent bits. Finite inputs only
  (the forward uses it on key blocks without a mask, where every score is finite); a NaN stays NaN.
* :func:`exp2_shared`: a (M, N) tile's even columns through the SFU, its odd ones through the
  polynomial. On the tensor cores' accumulator layout a thread holds column pairs (2c, 2c + 1), so
  the split and the join back stay in each thread's registers.

Whether it pays is measured, not assumed: ``benchmarks/schedule_ab.py --variants longest,exp2``
(benchmarks/TUNING.md). float32 inputs never use it (their P is not rounded to 16 bits).
"""
from __future__ import annotations

import triton
import triton.language as tl

#: 2^f on [0, 1) as C0 + f (C1 + f (C2 + f C3)): the float32 minimax fit of the relative error.
C0 = tl.constexpr(0.9999414682388306)
C1 = tl.constexpr(0.6957336068153381)
C2 = tl.constexpr(0.2261248677968979)
C3 = tl.constexpr(0.07808297872543335)
#: The smallest exponent kept: with 2^frac(x) just below 1 at frac(x) = 0, -125 keeps every result a
#: normal float32 (weights this small are 0 in 16 bits anyway).
MIN_EXPONENT = tl.constexpr(-125.0)


@triton.jit
def exp2_polynomial(x):
    """2^x for finite float32 ``x`` on the FMA units, relative error below 8.4e-5 (about 2^-125 for x <= -125)."""
    clamped = tl.maximum(x, MIN_EXPONENT)
    whole = tl.floor(clamped)
    f = clamped - whole
    fraction = C0 + f * (C1 + f * (C2 + f * C3))  # 2^f, in [1, 2)
    bits = fraction.to(tl.int32, bitcast=True) + (whole.to(tl.int32) << 23)
    return tl.where(x == x, bits.to(tl.float32, bitcast=True), x)  # NaN in, NaN out


@triton.jit
def exp2_shared(x):
    """2^x of a (M, N) float32 tile: even columns by the SFU, odd ones by :func:`exp2_polynomial`."""
    M: tl.constexpr = x.shape[0]
    N: tl.constexpr = x.shape[1]
    even, odd = tl.split(tl.reshape(x, (M, N // 2, 2)))
    return tl.reshape(tl.join(tl.math.exp2(even), exp2_polynomial(odd)), (M, N))
