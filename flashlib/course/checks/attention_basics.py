"""Checks for notebook 01 (naive attention): attention from the formula, stable softmax.

Both run the learner's PyTorch function on float64 inputs (and one float32 case each, for the
output's dtype) and compare with
:mod:`flashlib.reference`. Each check's first case is fixed (the same values
whatever the exercise's seed; the grader draws it again for its hidden cases), so
that the wrong answers it is built to catch fail on every run; seeded random cases
follow. The wrong answers they recognise are the classic
ones: a missing or wrong 1/sqrt(d) scale (or d taken from the wrong dimension),
the softmax over the wrong axis, K used without transposing, P returned instead of
P @ V; a softmax without the max subtraction (inf/inf = NaN on large inputs),
shifted by the max of the whole tensor instead of each row's own (0/0 = NaN in a
row far below the others), divided by the max, shifted by the min. An answer that
changes its input in place fails too (the framework compares the inputs after the
call with the originals).
"""
from __future__ import annotations

import math

import torch

from ... import reference, runtime
from ...validation import tolerance
from .framework import Case, Check, Mistake, fixed_generator, register, run_check

NOTEBOOK = "01_naive_attention"
NAIVE_ATTENTION = register(NOTEBOOK, "naive_attention", 2,
                           "Naive attention: softmax(Q K^T / sqrt(d)) V for (B, H, N, D) tensors")
STABLE_SOFTMAX = register(NOTEBOOK, "stable_softmax", 2,
                          "Stable softmax over the last dim: subtract the row max before exp")


# ----------------------------------------------------------------- naive attention

#: The seed of the fixed cases: the same values in every run, whatever the exercise's seed
#: (the grader's hidden draw mixes it with its own: :func:`~.framework.fixed_generator`).
FIXED_SEED = 20240101


def _fixed_generator() -> torch.Generator:
    return fixed_generator(FIXED_SEED)


def _attention(q, k, v, *, scale=None, dim=-1, transpose_k=True, softmax=True, times_v=True):
    """Attention in float64 with one part done the way a typical bug does it."""
    q, k, v = q.double(), k.double(), v.double()
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ (k.transpose(-2, -1) if transpose_k else k)) * scale
    probs = torch.softmax(scores, dim=dim) if softmax else scores
    return probs @ v if times_v else probs


ATTENTION_MISTAKES = (
    Mistake("scale missing",
            "looks like the 1/sqrt(d) scale is missing: multiply the scores Q K^T by 1/sqrt(D) "
            "before the softmax",
            lambda q, k, v: _attention(q, k, v, scale=1.0)),
    Mistake("scale 1/d",
            "looks like the scores are scaled by 1/d instead of 1/sqrt(d): use 1 / math.sqrt(D)",
            lambda q, k, v: _attention(q, k, v, scale=1.0 / q.shape[-1])),
    Mistake("scale from N",
            "looks like the scale uses the sequence length instead of the head dim: d is the last "
            "dimension of q, q.shape[-1] (D), not q.shape[-2] (N)",
            lambda q, k, v: [_attention(q, k, v, scale=1.0 / math.sqrt(n)) for n in {q.shape[-2], k.shape[-2]}
                             if n != q.shape[-1]] or None),
    Mistake("scale sqrt(d)",
            "looks like the scores are multiplied by sqrt(d) instead of divided by it",
            lambda q, k, v: _attention(q, k, v, scale=math.sqrt(q.shape[-1]))),
    Mistake("softmax over the wrong dim",
            "looks like the softmax is over the wrong dimension: each query's row of scores "
            "must sum to 1, i.e. softmax over the keys (dim=-1)",
            lambda q, k, v: [_attention(q, k, v, dim=d) for d in (-2, 1, 0)]),
    Mistake("K not transposed",
            "looks like K is not transposed: the scores are Q @ K^T, i.e. q @ k.transpose(-2, -1) "
            "(this case has N_k = D, so q @ k ran without an error)",
            lambda q, k, v: _attention(q, k, v, transpose_k=False)),
    Mistake("returned P",
            "looks like you returned the attention probabilities P = softmax(Q K^T / sqrt(D)) "
            "(B, H, N_q, N_k) instead of the output P @ V (B, H, N_q, D)",
            lambda q, k, v: _attention(q, k, v, times_v=False)),
    Mistake("softmax missing",
            "looks like the softmax is missing: O = softmax(S) @ V, not S @ V",
            lambda q, k, v: _attention(q, k, v, softmax=False)),
)


def _attention_case(gen, description, q_shape, n_k, dtype=torch.float64) -> Case:
    batch, heads, _, head_dim = q_shape
    kv_shape = (batch, heads, n_k, head_dim)
    q = torch.randn(q_shape, generator=gen, dtype=torch.float64).to(dtype)
    k, v = (torch.randn(kv_shape, generator=gen, dtype=torch.float64).to(dtype) for _ in range(2))
    expected = reference.naive_attention(q.double(), k.double(), v.double())
    args = tuple(t.to(runtime.DEVICE) for t in (q, k, v))
    return Case(description, args, expected, tolerance(dtype),
                shape_words="(B, H, N_q, D)", out_dtype=dtype)


def _attention_cases(gen):
    # The first case is fixed, and square (N_k = D) so that "K not transposed" runs and can be named.
    return [
        _attention_case(_fixed_generator(), "q, k, v (1, 2, 16, 16), float64 (N = D = 16)", (1, 2, 16, 16), 16),
        _attention_case(gen, "q, k, v (2, 3, 24, 32), float64", (2, 3, 24, 32), 24),
        _attention_case(gen, "q (2, 2, 12, 16), k and v (2, 2, 40, 16), float64 (N_q != N_k)",
                        (2, 2, 12, 16), 40),
        _attention_case(gen, "q (1, 1, 1, 8), k and v (1, 1, 9, 8), float64 (a single query)",
                        (1, 1, 1, 8), 9),
        _attention_case(gen, "q, k, v (1, 4, 33, 64), float32 (D = 64)", (1, 4, 33, 64), 33,
                        dtype=torch.float32),
    ]


NAIVE_ATTENTION_CHECK = Check(NAIVE_ATTENTION, _attention_cases, ATTENTION_MISTAKES)


def check_naive_attention(fn, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check ``fn(q, k, v) -> softmax(q k^T / sqrt(D)) v`` for (B, H, N, D) tensors, no mask."""
    return run_check(NAIVE_ATTENTION_CHECK, fn, seed=seed, time_limit_s=time_limit_s)


# ------------------------------------------------------------------ stable softmax

def _no_max_softmax(x):
    e = torch.exp(x)
    return e / e.sum(dim=-1, keepdim=True)


def _shifted_softmax(x, shift, dim=-1, guard=False):
    """exp(x - shift) normalised over ``dim``; ``guard``: a row summing to 0 stays 0 (no 0/0)."""
    e = torch.exp(x - shift)
    total = e.sum(dim=dim, keepdim=True)
    return e / (torch.where(total > 0, total, torch.ones_like(total)) if guard else total)


SOFTMAX_MISTAKES = (
    Mistake("no max subtraction",
            "looks like the row max is not subtracted before exp: exp(x) overflows to inf for "
            "large x (and to 0 for very negative x), and inf/inf gives NaN. Compute "
            "exp(x - x.max(dim=-1, keepdim=True).values)",
            _no_max_softmax),
    Mistake("global max",
            "looks like the max of the whole tensor (x.max()) is subtracted, not each row's own max: "
            "a row far below the tensor's max then has exp(x - max) = 0 everywhere, and 0/0 gives NaN "
            "(or a row of zeros). Subtract each row's max: x.amax(dim=-1, keepdim=True)",
            lambda x: [_shifted_softmax(x, x.max()), _shifted_softmax(x, x.max(), guard=True)]),
    Mistake("max over the wrong dim",
            "looks like the max is taken over the wrong dimension (each column's max, not each row's): "
            "a row far below another then underflows to exp(...) = 0 everywhere, and 0/0 gives NaN. "
            "Subtract each row's own max: x.amax(dim=-1, keepdim=True)",
            lambda x: [_shifted_softmax(x, x.amax(dim=d, keepdim=True), guard=g)
                       for d in (0, -2) for g in (False, True)]),
    Mistake("softmax over the wrong dim",
            "looks like the softmax is over the wrong dimension: normalise over the last dim "
            "(dim=-1), so that every row sums to 1",
            lambda x: [reference.stable_softmax(x, dim=d) for d in (0, -2)]),
    Mistake("divided by the max",
            "looks like each row is divided by its max instead of its sum: the largest entry "
            "becomes 1 and the row sums to more than 1",
            lambda x: [torch.exp(x - x.amax(dim=-1, keepdim=True)),  # e / max(e), max(e) = 1
                       torch.exp(x) / torch.exp(x).amax(dim=-1, keepdim=True)]),
    Mistake("subtracted the min",
            "looks like the row min is subtracted instead of the max: exp(x - min) overflows "
            "when a row spans a wide range (and min is -inf when a row holds -inf). Subtract "
            "the max: then every exponent is <= 0",
            lambda x: _shifted_softmax(x, x.amin(dim=-1, keepdim=True))),
)


def _softmax_case(description, x) -> Case:
    expected = reference.stable_softmax(x.double(), dim=-1)
    return Case(description, (x.to(runtime.DEVICE),), expected, tolerance(x.dtype),
                shape_words="the shape of x", out_dtype=x.dtype)


def _softmax_cases(gen):
    def randn(*shape):
        return torch.randn(shape, generator=gen, dtype=torch.float64)

    masked = randn(5, 12)
    hidden = torch.rand(5, 12, generator=gen) < 0.4
    hidden[:, 0] = False  # every row keeps at least one visible entry
    masked = masked.masked_fill(hidden, float("-inf"))
    # Fixed: rows far apart. The whole tensor's max (800) leaves the rows near -300 and -800
    # with exp(x - 800) = 0 (0/0 = NaN); no max at all overflows the row near +800 (inf/inf).
    offsets = torch.tensor([800.0, 300.0, -300.0, -800.0], dtype=torch.float64).unsqueeze(-1)
    apart = torch.randn(4, 6, generator=_fixed_generator(), dtype=torch.float64) + offsets
    return [
        _softmax_case("x (4, 6), float64, rows at very different offsets: around +800, +300, -300 "
                      "and -800 (exp overflows, or underflows to 0 in a whole row, unless each row's "
                      "own max is subtracted)", apart),
        _softmax_case("x (4, 10), float64, standard normal values", randn(4, 10)),
        _softmax_case("x (2, 3, 7), float64, a 3-D input (softmax over the last dim only)",
                      randn(2, 3, 7)),
        _softmax_case("x (6, 16), float64, large values: standard normal x 1000 "
                           "(exp(x) overflows unless the row max is subtracted)", randn(6, 16) * 1000),
        _softmax_case("x (5, 12), float64, some entries -inf (masked scores)", masked),
        # the softmax in x's dtype: an answer that upcasts to float64 passed every float64 case
        _softmax_case("x (3, 9), float32, standard normal values x 3", (randn(3, 9) * 3).float()),
    ]


def _explain_row_sums(case: Case, out: torch.Tensor) -> list[str]:
    """Say which row does not sum to 1, the property a softmax must have."""
    sums = out.detach().double().cpu().sum(dim=-1)
    off = ~(torch.isfinite(sums) & ((sums - 1).abs() <= 1e-6))
    if not off.any():
        return []
    index = tuple(int(i) for i in off.nonzero()[0])
    return [f"every row must sum to 1; row {list(index)} sums to {sums[index].item():.4g}"]


STABLE_SOFTMAX_CHECK = Check(
    STABLE_SOFTMAX, _softmax_cases, SOFTMAX_MISTAKES, explain=_explain_row_sums,
    nonfinite_hint="NaN or inf usually means exp overflowed (subtract the row max first) "
                   "or 0/0 (a row whose every exp underflowed to 0)")


def check_stable_softmax(fn, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check ``fn(x) -> softmax over the last dim`` that survives x * 1000 and -inf entries."""
    return run_check(STABLE_SOFTMAX_CHECK, fn, seed=seed, time_limit_s=time_limit_s)
