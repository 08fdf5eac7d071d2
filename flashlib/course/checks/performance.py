"""Checks for notebook 07 (performance): reading a profile in FLOPs, TFLOP/s and a roofline.

Exercise signatures (stated in the notebook; plain Python numbers in and out):

* ``attention_flops(batch, heads, n, d, causal=False, mode="fwd") -> float``: the
  floating-point operations of attention over ``n`` queries and ``n`` keys, counted
  as FlashAttention's benchmarks (and ``python -m flashlib.bench``) count them:
  ``4 * batch * heads * n**2 * d`` for the forward (two matrix products, S = Q K^T and
  O = P V, of 2 n^2 d each), halved when causal; the backward ``2.5x`` the forward,
  training (forward + backward) ``3.5x``.
* ``achieved_tflops(flops, ms) -> float``: TFLOP/s (10^12 per second) of ``flops`` done
  in ``ms`` milliseconds.
* ``roofline_time_ms(flops, bytes_moved, peak_tflops, hbm_gb_per_s) -> float``: the
  least time the work can take, in ms, on a machine with those two ceilings
  (TFLOP/s = 10^12 FLOP/s, GB/s = 10^9 bytes/s): arithmetic and memory traffic
  overlap, so the slower of the two sets it, ``max(flops / peak, bytes / bandwidth)``.

Each case is a list of calls; the compared tensor has one value per call (float64,
relative tolerance 1e-9: these are exact formulas). The first cases of each check
are fixed (the same calls whatever the seed), so that every wrong answer below fails
one of them in every run; seeded random calls follow. The wrong answers it names:
no causal halving (or only in the forward), N(N+1)/2 instead of half, 2 n^2 d (one
product) or n^2 d (multiply-adds as one FLOP), the backward not 2.5x, training not
3.5x, the mode ignored, batch or heads left out; for TFLOP/s, by the factor the
result is off: 1000x too small (ms used as seconds, or divided by 1e15: PFLOP/s),
1000x too large (divided by 1e9: GFLOP/s, or ms -> s by 1e-6), 10^6 too small (ms
multiplied by 1000 instead of divided), binary (2^40) tera, multiplied by the
time; the sum or the min of the two times instead of the max, one ceiling only,
GiB/s or 2^40 units, seconds or microseconds instead of ms, TFLOP/s taken as
GFLOP/s, GB/s taken as TB/s, units dropped.
"""
from __future__ import annotations

import math
import numbers

import torch

from .framework import Case, Check, Mistake, WrongReturn, register, run_check

NOTEBOOK = "07_performance"
ATTENTION_FLOPS = register(NOTEBOOK, "attention_flops", 2,
                           "FLOPs of attention: 4·B·H·N²·D forward, halved when causal, bwd 2.5x, train 3.5x")
ACHIEVED_TFLOPS = register(NOTEBOOK, "achieved_tflops", 1,
                           "TFLOP/s achieved: FLOPs over milliseconds, in units of 10^12 per second")
ROOFLINE_TIME = register(NOTEBOOK, "roofline_time_ms", 2,
                         "The roofline: the least time set by the slower of arithmetic and memory traffic")

#: Relative tolerance: the answers are formulas, exact up to float64 rounding.
TOLERANCE = 1e-9

#: How many forward passes' worth of FLOPs each mode does (FlashAttention-2's convention).
MODE_FACTOR = {"fwd": 1.0, "bwd": 2.5, "train": 3.5}


# --------------------------------------------------------------------- helpers

def _as_number(got, call: str) -> float:
    """The learner's value as a float, or a WrongReturn that says what came back."""
    if isinstance(got, torch.Tensor) and got.numel() == 1:
        got = got.item()
    if isinstance(got, bool) or not isinstance(got, numbers.Real):
        raise WrongReturn(f"{call} returned {got!r:.60} ({type(got).__name__}); expected a number (float or int)")
    return float(got)


def _values(fn, calls) -> torch.Tensor:
    """float64 tensor of ``fn(*args, **kwargs)`` for every (args, kwargs) in ``calls``."""
    return torch.tensor([float(fn(*args, **kwargs)) for args, kwargs in calls], dtype=torch.float64)


def _call_text(name: str, args, kwargs) -> str:
    parts = [repr(a) if not isinstance(a, float) else f"{a:.4g}" for a in args]
    parts += [f"{key}={value!r}" for key, value in kwargs.items()]
    return f"{name}({', '.join(parts)})"


def _call_all(name: str):
    """A check's ``call``: the learner's function on every call of the case, as one tensor."""
    def call(learner, case: Case):
        values = []
        for args, kwargs in case.args[0]:
            got = learner(*args, **kwargs)
            if got is None:
                return None
            values.append(_as_number(got, _call_text(name, args, kwargs)))
        return torch.tensor(values, dtype=torch.float64)
    return call


def _explain(name: str):
    """A check's ``explain``: the first wrong call in words, with the factor it is off by."""
    def explain(case: Case, out: torch.Tensor) -> list[str]:
        calls, want = case.args[0], case.expected
        bad = (~torch.isclose(out, want, rtol=TOLERANCE, atol=0.0)).nonzero()
        if not len(bad):
            return []
        row = int(bad[0])
        args, kwargs = calls[row]
        ratio = out[row].item() / want[row].item() if want[row].item() else math.inf
        return [f"call {row}: {_call_text(name, args, kwargs)}: expected {want[row].item():.6g}, "
                f"got {out[row].item():.6g} ({ratio:.4g} x the right value)"]
    return explain


def _mistake(name: str, message: str, *variants) -> Mistake:
    """A wrong answer given as functions with the exercise's signature (one or more variants)."""
    return Mistake(name, message, lambda calls: [_values(v, calls) for v in variants])


def _randint(gen, low: int, high: int) -> int:
    """An int in [low, high], inclusive."""
    return int(torch.randint(low, high + 1, (1,), generator=gen))


def _uniform_log(gen, low: float, high: float) -> float:
    """A float spread evenly in log scale between low and high."""
    u = torch.rand(1, generator=gen, dtype=torch.float64).item()
    return math.exp(math.log(low) + u * (math.log(high) - math.log(low)))


def _choice(gen, options):
    return options[_randint(gen, 0, len(options) - 1)]


# ------------------------------------------------------------------ attention FLOPs

def attention_flops(batch, heads, n, d, causal=False, mode="fwd", *, per_product=2.0, products=2,
                    causal_fraction=None, factors=None, use_batch=True, use_heads=True) -> float:
    """The right count, or (with the keywords) what a typical bug counts."""
    factors = MODE_FACTOR if factors is None else factors
    flops = per_product * products * (batch if use_batch else 1) * (heads if use_heads else 1)
    flops *= n * n * d
    if causal:
        flops *= 0.5 if causal_fraction is None else causal_fraction(n, mode)
    return flops * factors[mode]


def _flops_variant(**bug):
    return lambda b, h, n, d, causal=False, mode="fwd": attention_flops(b, h, n, d, causal, mode, **bug)


FLOPS_MISTAKES = (
    _mistake("no causal halving",
             "causal attention is not halved: a causal query sees only the keys up to its own position, "
             "so only the N x N scores on and below the diagonal are computed (the kernel skips the key "
             "blocks above it): half the work. Multiply by 0.5 when causal, in every mode (the backward "
             "skips the same blocks)",
             _flops_variant(causal_fraction=lambda n, mode: 1.0),
             _flops_variant(causal_fraction=lambda n, mode: 0.5 if mode == "fwd" else 1.0)),
    _mistake("causal N(N+1)/2",
             "the convention (FlashAttention's benchmarks, PyTorch's and flashlib's) counts causal "
             "attention as exactly half the non-causal FLOPs, 0.5 x 4·B·H·N²·D, not N(N+1)/2 (query, key) "
             "pairs: the diagonal's extra N/2 pairs are noise, and one convention keeps numbers comparable",
             _flops_variant(causal_fraction=lambda n, mode: (n + 1) / (2 * n)),
             _flops_variant(causal_fraction=lambda n, mode: (n - 1) / (2 * n))),
    _mistake("2·N²·D",
             "too few FLOPs per (batch, head): the forward has two matrix products, S = Q Kᵀ and O = P V, "
             "each N·N·D multiply-adds, and a multiply-add is two floating-point operations (a multiply "
             "and an add): 2·N²·D per product, 4·N²·D in all",
             _flops_variant(products=1), _flops_variant(per_product=1.0),
             _flops_variant(per_product=1.0, products=1),
             _flops_variant(products=1, causal_fraction=lambda n, mode: 1.0)),
    _mistake("backward factor",
             "the backward is 2.5x the forward's FLOPs: it recomputes S = Q Kᵀ, then computes dV = Pᵀ dO, "
             "dP = dO Vᵀ, dQ = dS K and dK = dSᵀ Q: five N x N x D products against the forward's two",
             _flops_variant(factors={"fwd": 1.0, "bwd": 1.0, "train": 3.5}),
             _flops_variant(factors={"fwd": 1.0, "bwd": 2.0, "train": 3.5}),
             _flops_variant(factors={"fwd": 1.0, "bwd": 3.5, "train": 3.5}),
             _flops_variant(factors={"fwd": 1.0, "bwd": 2.0, "train": 3.0}),
             _flops_variant(factors={"fwd": 1.0, "bwd": 1.5, "train": 2.5})),
    _mistake("train factor",
             "a training step runs the forward and then the backward: 1 + 2.5 = 3.5x the forward's FLOPs "
             "(not the backward's 2.5x alone)",
             _flops_variant(factors={"fwd": 1.0, "bwd": 2.5, "train": 2.5}),
             _flops_variant(factors={"fwd": 1.0, "bwd": 2.5, "train": 3.0}),
             _flops_variant(factors={"fwd": 1.0, "bwd": 2.5, "train": 2.0}),
             _flops_variant(factors={"fwd": 1.0, "bwd": 2.5, "train": 1.0})),
    _mistake("mode ignored",
             "mode is ignored: 'bwd' counts the backward, 2.5x the forward's FLOPs, and 'train' the forward "
             "and the backward, 3.5x",
             _flops_variant(factors={"fwd": 1.0, "bwd": 1.0, "train": 1.0})),
    _mistake("batch or heads left out",
             "every (batch, head) pair is a separate attention problem: multiply by batch * heads",
             _flops_variant(use_batch=False), _flops_variant(use_heads=False),
             _flops_variant(use_batch=False, use_heads=False)),
)


def _fa2_shape(n: int, d: int) -> tuple[int, int, int, int]:
    """FlashAttention-2's benchmark shapes: batch * n = 16384, heads * d = 2048."""
    return max(1, 16384 // n), max(1, 2048 // d), n, d


def _flops_case(description: str, calls) -> Case:
    calls = tuple(calls)
    return Case(description, (calls,), _values(attention_flops, calls), TOLERANCE,
                shape_words="one value per call")


def _flops_cases(gen):
    # Fixed: FA2's benchmark shapes (batch >= 2 for these n, so a missing batch shows), then causal,
    # then the modes, then the modes with causal (a halving done in the forward only shows there).
    picked, dims = [512, 2048, 8192], (64, 128)
    cases = [_flops_case(f"forward, not causal, FA2 benchmark shapes (batch = 16384 // n, heads = 2048 // d), "
                         f"n in {picked}, d in {list(dims)}",
                         [(_fa2_shape(n, d), {"causal": False, "mode": "fwd"}) for n in picked for d in dims])]
    cases.append(_flops_case(
        f"forward, causal and not, n in {picked}, d in {list(dims)}",
        [(_fa2_shape(n, d), {"causal": causal, "mode": "fwd"}) for n in picked for d in dims
         for causal in (True, False)]))
    cases.append(_flops_case(
        f"the three modes 'fwd', 'bwd', 'train', not causal, n in {picked}, d = 64",
        [(_fa2_shape(n, 64), {"causal": False, "mode": mode}) for n in picked for mode in MODE_FACTOR]))
    cases.append(_flops_case(
        f"the three modes, causal: the backward skips the same blocks as the forward, n in {picked}, d = 128",
        [(_fa2_shape(n, 128), {"causal": True, "mode": mode}) for n in picked for mode in MODE_FACTOR]))
    calls = []
    for _ in range(24):
        shape = (_randint(gen, 1, 8), _randint(gen, 1, 32), _randint(gen, 1, 8192), _choice(gen, (16, 32, 64, 128, 256)))
        calls.append((shape, {"causal": _choice(gen, (True, False)), "mode": _choice(gen, tuple(MODE_FACTOR))}))
    cases.append(_flops_case("24 random (batch, heads, n, d, causal, mode), batch 1..8, heads 1..32, n 1..8192",
                             calls))
    return cases


ATTENTION_FLOPS_CHECK = Check(ATTENTION_FLOPS, _flops_cases, FLOPS_MISTAKES,
                              call=_call_all("attention_flops"), explain=_explain("attention_flops"))


def check_attention_flops(fn, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check ``fn(batch, heads, n, d, causal=False, mode="fwd") -> FLOPs`` (FlashAttention's convention)."""
    return run_check(ATTENTION_FLOPS_CHECK, fn, seed=seed, time_limit_s=time_limit_s)


# ------------------------------------------------------------------ achieved TFLOP/s

def achieved_tflops(flops, ms, *, seconds_per_ms=1e-3, unit=1e12) -> float:
    """The right rate, or (with the keywords) what a typical bug computes."""
    return flops / (ms * seconds_per_ms) / unit


def _tflops_variant(**bug):
    return lambda flops, ms: achieved_tflops(flops, ms, **bug)


TFLOPS_MISTAKES = (
    # The same output can come from two slips (a factor of 1000 is a factor of 1000): each factor has
    # a mistake per slip, so that the verdict names both ("likely mistake: ... or: ...").
    _mistake("ms as seconds",
             "the result is 1000x too small: the time was used as if it were in seconds. It is in "
             "milliseconds: FLOP/s = flops / (ms * 1e-3)",
             _tflops_variant(seconds_per_ms=1.0)),
    _mistake("PFLOP/s",
             "the result is 1000x too small: dividing the FLOP/s by 1e15 gives PFLOP/s (peta); TFLOP/s "
             "divides by 1e12",
             _tflops_variant(unit=1e15)),
    _mistake("GFLOP/s",
             "the result is 1000x too large: dividing the FLOP/s by 1e9 gives GFLOP/s (giga); TFLOP/s "
             "divides by 1e12 (tera)",
             _tflops_variant(unit=1e9)),
    _mistake("ms as microseconds",
             "the result is 1000x too large: the time was converted with 1e-6 (microseconds to seconds); "
             "milliseconds to seconds is ms * 1e-3",
             _tflops_variant(seconds_per_ms=1e-6)),
    _mistake("ms converted the wrong way",
             "the result is 10^6 times too small: milliseconds were multiplied by 1000 (ms * 1e3, or "
             "ms / 1e-3), which makes the time 10^6 times too long; seconds = ms * 1e-3 (or ms / 1e3)",
             _tflops_variant(seconds_per_ms=1e3)),
    _mistake("binary tera",
             "tera is 10^12 in FLOP/s (decimal), not 2^40 = 1.0995e12: GPU datasheets and benchmarks use "
             "powers of ten",
             _tflops_variant(unit=2.0 ** 40)),
    _mistake("multiplied by the time",
             "a rate is work per time: divide the FLOPs by the seconds, flops / (ms * 1e-3) / 1e12",
             lambda flops, ms: flops * ms * 1e-3 / 1e12, lambda flops, ms: flops * ms / 1e12,
             lambda flops, ms: flops / 1e12),
)


def _tflops_case(description: str, calls) -> Case:
    calls = tuple(calls)
    return Case(description, (calls,), _values(achieved_tflops, calls), TOLERANCE,
                shape_words="one value per call")


def _tflops_cases(gen):
    first = [((attention_flops(*_fa2_shape(n, 64)), ms), {}) for n, ms in ((1024, 0.35), (4096, 1.7))]
    cases = [_tflops_case("two forward passes at FA2 benchmark shapes: n = 1024 in 0.35 ms, n = 4096 in 1.7 ms",
                          first)]
    calls = [((_uniform_log(gen, 1e6, 1e16), _uniform_log(gen, 1e-3, 1e4)), {}) for _ in range(12)]
    cases.append(_tflops_case("12 random (flops, ms), flops 1e6..1e16, ms 0.001..10000", calls))
    return cases


ACHIEVED_TFLOPS_CHECK = Check(ACHIEVED_TFLOPS, _tflops_cases, TFLOPS_MISTAKES,
                              call=_call_all("achieved_tflops"), explain=_explain("achieved_tflops"))


def check_achieved_tflops(fn, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check ``fn(flops, ms) -> TFLOP/s``."""
    return run_check(ACHIEVED_TFLOPS_CHECK, fn, seed=seed, time_limit_s=time_limit_s)


# ------------------------------------------------------------------------- roofline

def roofline_time_ms(flops, bytes_moved, peak_tflops, hbm_gb_per_s, *, combine=max, flop_unit=1e12,
                     byte_unit=1e9, to_result=1e3) -> float:
    """The right bound, or (with the keywords) what a typical bug computes."""
    compute_s = flops / (peak_tflops * flop_unit)
    memory_s = bytes_moved / (hbm_gb_per_s * byte_unit)
    return combine(compute_s, memory_s) * to_result


def _roofline_variant(**bug):
    return lambda f, b, p, h: roofline_time_ms(f, b, p, h, **bug)


ROOFLINE_MISTAKES = (
    _mistake("sum",
             "the compute time and the memory time were added: a GPU overlaps loads with arithmetic "
             "(while one warp waits for memory, another computes), so the roofline bound is the slower "
             "of the two, max(flops / peak, bytes / bandwidth), not their sum",
             _roofline_variant(combine=lambda a, b: a + b)),
    _mistake("min",
             "that is the faster of the two times: the work needs both, so the slower one bounds it: "
             "max(flops / peak, bytes / bandwidth), not min",
             _roofline_variant(combine=min)),
    _mistake("compute only",
             "only the arithmetic time: the memory traffic takes bytes / bandwidth, and when that is longer "
             "(low arithmetic intensity: memory-bound) it sets the time. Take the max of the two",
             _roofline_variant(combine=lambda a, b: a)),
    _mistake("memory only",
             "only the memory time: the arithmetic takes flops / peak, and when that is longer (high "
             "arithmetic intensity: compute-bound) it sets the time. Take the max of the two",
             _roofline_variant(combine=lambda a, b: b)),
    _mistake("GiB",
             "GB/s is 10^9 bytes per second (bandwidths are quoted in decimal units), not 2^30 (GiB/s); "
             "and TFLOP/s is 10^12, not 2^40",
             _roofline_variant(byte_unit=2.0 ** 30), _roofline_variant(flop_unit=2.0 ** 40),
             _roofline_variant(byte_unit=2.0 ** 30, flop_unit=2.0 ** 40)),
    _mistake("not milliseconds",
             "the result is 1000x too small: it is in seconds, and the time must be in milliseconds: "
             "flops / (peak_tflops * 1e12) is in seconds, multiply by 1e3",
             _roofline_variant(to_result=1.0)),
    _mistake("microseconds",
             "the result is 1000x too large: multiplying the seconds by 1e6 gives microseconds; "
             "milliseconds are seconds * 1e3",
             _roofline_variant(to_result=1e6)),
    _mistake("seconds divided by 1000",
             "the result is 10^6 times too small: the seconds were divided by 1e3; milliseconds are "
             "seconds * 1e3 (there are 1000 ms in a second)",
             _roofline_variant(to_result=1e-3)),
    _mistake("TFLOP/s as GFLOP/s",
             "the compute time is 1000x too long: peak_tflops was multiplied by 1e9, which reads it as GFLOP/s; "
             "TFLOP/s is 10^12 FLOP/s, so compute_s = flops / (peak_tflops * 1e12)",
             _roofline_variant(flop_unit=1e9)),
    _mistake("GB/s as TB/s",
             "the memory time is 1000x too short: hbm_gb_per_s was multiplied by 1e12, which reads it as TB/s; "
             "GB/s is 10^9 bytes/s, so memory_s = bytes_moved / (hbm_gb_per_s * 1e9)",
             _roofline_variant(byte_unit=1e12)),
    _mistake("units dropped",
             "peak_tflops is in 10^12 FLOP/s and hbm_gb_per_s in 10^9 bytes/s: convert both to per-second "
             "rates (x 1e12, x 1e9) before dividing",
             _roofline_variant(flop_unit=1.0, byte_unit=1.0), _roofline_variant(flop_unit=1e9, byte_unit=1e12),
             _roofline_variant(flop_unit=1.0), _roofline_variant(byte_unit=1.0)),
)

#: Ceilings to draw cases from: (name, dense fp16 TFLOP/s, HBM GB/s) of datasheets.
CEILINGS = (("H100 SXM", 989.4, 3350.0), ("A100 SXM", 312.0, 2039.0), ("H200", 989.4, 4800.0))


def _roofline_case(description: str, calls) -> Case:
    calls = tuple(calls)
    return Case(description, (calls,), _values(roofline_time_ms, calls), TOLERANCE,
                shape_words="one value per call")


def _roofline_cases(gen):
    name, peak, hbm = CEILINGS[0]
    ridge = peak * 1e12 / (hbm * 1e9)  # FLOP per byte where the two times are equal

    def call(intensity, bytes_moved):
        return (intensity * bytes_moved, bytes_moved, peak, hbm), {}

    # Fixed: two compute-bound calls and three memory-bound ones, 3x to 2000x away from the ridge; the
    # last, an elementwise op (about 0.15 FLOP per byte), is so memory-bound that even a memory time
    # 1000x too short (or a compute time 1000x too long) leaves it memory-bound, so that those slips
    # cannot pass for "compute only" or for each other.
    first = [call(ridge * 3.0, 2.5e8), call(ridge * 40.0, 6.0e6), call(ridge / 4.0, 3.2e9), call(ridge / 25.0, 7.5e7),
             call(ridge / 2000.0, 4.0e9)]
    cases = [_roofline_case(f"{name} ceilings ({peak} TFLOP/s, {hbm} GB/s): two compute-bound calls (arithmetic "
                            "intensity 3x and 40x the ridge), then three memory-bound ones (1/4, 1/25 and 1/2000 of "
                            "it: an elementwise op)", first)]
    # Random ceilings and sizes, six calls 3x to 1000x above their own ridge and six as far below it, in turn:
    # drawn free, all twelve could fall on one side, and then "memory only" or "compute only" would pass.
    calls = []
    for number in range(12):
        peak, hbm = _uniform_log(gen, 10.0, 2000.0), _uniform_log(gen, 100.0, 8000.0)
        bytes_moved = _uniform_log(gen, 1e3, 1e11)
        away = _uniform_log(gen, 3.0, 1000.0)
        intensity = peak * 1e12 / (hbm * 1e9) * (away if number % 2 == 0 else 1.0 / away)
        calls.append(((bytes_moved * intensity, bytes_moved, peak, hbm), {}))
    cases.append(_roofline_case("12 random (flops, bytes_moved, peak_tflops, hbm_gb_per_s): six compute-bound calls "
                                "and six memory-bound ones, 3x to 1000x from their ridge", calls))
    return cases


ROOFLINE_TIME_CHECK = Check(ROOFLINE_TIME, _roofline_cases, ROOFLINE_MISTAKES,
                            call=_call_all("roofline_time_ms"), explain=_explain("roofline_time_ms"))


def check_roofline_time_ms(fn, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check ``fn(flops, bytes_moved, peak_tflops, hbm_gb_per_s) -> ms``, the roofline's lower bound."""
    return run_check(ROOFLINE_TIME_CHECK, fn, seed=seed, time_limit_s=time_limit_s)
