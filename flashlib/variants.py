"""Which forward kernel suits a problem: FlashAttention-2's or split-KV (seed 003's ``variant="auto"``).

The FlashAttention-2 forward (:mod:`flashlib.kernels.attention_fwd`) gives one program
to each block of 128 queries of each (sample, query head). That fills a GPU when there
are many queries: training and prefill. When a model decodes there are only a few new
queries per sequence, so the grid is ``B * H`` programs that each walk the whole
cache, and with GQA each K/V head is read once per query head of its group. The
split-KV kernel (:mod:`flashlib.kernels.decode`) packs a group's query heads into one
program and spreads the keys over many programs.

:func:`select_variant` makes the choice from the problem's shape alone, and says why
in one line. The rule comes from measurements on an H100 (``benchmarks/decode_variants.py``,
stored in ``benchmarks/results/decode_variants_*.json``); see :data:`SPLITKV_MAX_QUERIES`.
"""
from __future__ import annotations

from typing import NamedTuple

from .kernels.attention_fwd import MAX_HEAD_DIM, MIN_HEAD_DIM

VARIANTS = ("auto", "fa2", "splitkv")

#: Split-KV is chosen up to this many queries per sequence. Its programs hold every query
#: row of a K/V group (64 rows per program, 128 for long MQA chunks; more rows take more programs), so a
#: problem of few queries reads each K/V block once; past a few dozen queries per sequence
#: the problem is compute-bound and FlashAttention-2's larger query tiles win. Measured on the
#: H100 (fp16, D = 128, FA2 time / split-KV time at N_q = 16, 32, 64): one sequence with GQA
#: (B 1, H_kv 8, N_k 32k) 6.8, 6.4, 3.1; B 64, H_kv 8, N_k 2k: 1.9, 1.5, 0.85; B 8, H_kv 8,
#: N_k 16k: 1.4, 1.3, 0.87; B 8 with full heads (H_kv 32, N_k 4k): 1.00, 0.98, 0.99. 16 keeps
#: split-KV where it never lost.
SPLITKV_MAX_QUERIES = 16


def preferred_variant(n_q: int) -> str:
    """The rule of :func:`select_variant` alone, without checks or reason (the front door asks it per call)."""
    return "splitkv" if n_q <= SPLITKV_MAX_QUERIES else "fa2"


class VariantChoice(NamedTuple):
    """The forward kernel chosen for a problem and the reason, in one line."""

    variant: str
    reason: str


def select_variant(batch: int, heads_q: int, heads_kv: int, n_q: int, n_k: int, head_dim: int,
                   device=None) -> VariantChoice:
    """``("fa2" | "splitkv", reason)`` for attention of ``n_q`` queries per sequence over ``n_k`` keys.

    ``device`` is accepted for the signature of seed 003's BackendSelector; the rule,
    measured on an H100, depends on the shape only (the split count, which adapts to the
    GPU's SM count, is chosen later, at launch).

    >>> select_variant(1, 32, 8, 1, 131072, 128).variant
    'splitkv'
    >>> select_variant(4, 16, 16, 2048, 2048, 64).variant
    'fa2'
    """
    for name, value, low in (("batch", batch, 0), ("heads_q", heads_q, 1), ("heads_kv", heads_kv, 1),
                             ("n_q", n_q, 0), ("n_k", n_k, 0), ("head_dim", head_dim, MIN_HEAD_DIM)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"select_variant: {name} must be an int >= {low}; got {value!r}")
        if value < low:
            raise ValueError(f"select_variant: {name} must be an int >= {low}; got {value}")
    if head_dim > MAX_HEAD_DIM:
        raise ValueError(f"select_variant: head_dim must be at most {MAX_HEAD_DIM} (the kernels take "
                         f"{MIN_HEAD_DIM} to {MAX_HEAD_DIM}); got {head_dim}")
    if heads_q % heads_kv:
        raise ValueError(f"select_variant: heads_q ({heads_q}) must be a multiple of heads_kv ({heads_kv})")
    group = heads_q // heads_kv
    if preferred_variant(n_q) == "splitkv":
        return VariantChoice("splitkv", f"{n_q} quer{'y' if n_q == 1 else 'ies'} per sequence "
                             f"(<= {SPLITKV_MAX_QUERIES}): decoding-shaped, so split-KV reads each K/V head "
                             f"once for its {group} query head{'s' if group > 1 else ''} and spreads the "
                             f"{n_k} keys over many programs")
    return VariantChoice("fa2", f"{n_q} queries per sequence (> {SPLITKV_MAX_QUERIES}): enough query blocks "
                         f"to fill the GPU, where FlashAttention-2's 128-query tiles are fastest")
