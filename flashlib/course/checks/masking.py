"""Checks for notebook 06 (masking): the causal block range and the padding mask.

Exercise signatures (stated in the notebook):

* ``causal_block_range(start_m, block_m, block_n, n_q, n_k) -> (lo, hi)``: the key
  **blocks** ``lo, lo + 1, ..., hi - 1`` that the program of query block ``start_m``
  must visit under the causal mask, bottom-right aligned (query i sees key j when
  ``j <= i + n_k - n_q``); key block j holds keys ``j * block_n`` to
  ``(j + 1) * block_n - 1``. Every block holding a key that one of the block's rows
  sees, and no other. Where no row sees a key, any empty range (``hi <= lo``).
* ``padding_mask(seq_lens, n_q, n_k) -> mask``: boolean (B, 1, n_q, n_k), True where
  query i of sample b may attend to key j: ``i < seq_lens[b]`` and ``j < seq_lens[b]``
  (the keys of :func:`flashlib.reference.attention_mask`, and padding queries
  attend to nothing, so that attention gives them output 0).

The block range runs on every query block of several problems per case; the first
four cases are fixed (the same in every run, whatever the seed): square with no
tail, tails that are not a multiple of the block with block_m != block_n, fewer
queries than keys (the last key starting a key block, and one query decoding),
more queries than keys (query blocks that see no key at all); then 200 random
configurations. The compared tensor has one row (lo, hi) per query block. The wrong
answers it names: the diagonal block left out, an off-by-one at the diagonal
(``<`` for ``<=``, or cdiv of the last key's index instead of the count of keys),
the block's last row one past (no ``- 1``), top-left alignment (no ``n_k - n_q``),
no rounding up, every block visited (right output but nothing skipped), hi past
the last key block (the query tail ignored), a block that sees no key still
visiting one, query blocks counted as key blocks, key positions instead of block
indices. The padding mask (a fixed case with n_q != n_k, an empty sample and one
longer than n_q first, then random ones) names: only keys masked, only queries
masked (either also left at shape (B, 1, 1, N_k) or (B, 1, N_q, 1)), ``<=`` for
``<``, one length for the whole batch, an inverted mask, an additive (0 / -inf)
mask, a missing head axis and swapped axes.
"""
from __future__ import annotations

import numbers

import torch

from ... import reference
from ...integer_math import ceil_div
from .framework import Case, Check, Mistake, WrongReturn, register, run_check

NOTEBOOK = "06_masking"
CAUSAL_BLOCK_RANGE = register(NOTEBOOK, "causal_block_range", 2,
                              "The key blocks a causal query block visits: bottom-right aligned, nothing skipped "
                              "that is needed, nothing visited that is not")
PADDING_MASK = register(NOTEBOOK, "padding_mask", 2,
                        "The padding mask of a batch with seq_lens: keys and queries past each sample's length")


# ------------------------------------------------------------------ causal block range

def _last_key(start_m, block_m, block_n, n_q, n_k) -> int:
    """The last key the block's last row sees (negative: none)."""
    return min((start_m + 1) * block_m, n_q) - 1 + n_k - n_q


def _right_range(start_m, block_m, block_n, n_q, n_k):
    last_key = _last_key(start_m, block_m, block_n, n_q, n_k)
    return (0, last_key // block_n + 1) if last_key >= 0 else (0, 0)


def _normalised(lo: int, hi: int) -> tuple[int, int]:
    """Every empty range is the same range: (0, 0)."""
    return (lo, hi) if hi > lo else (0, 0)


def _as_range(got, config) -> tuple[int, int]:
    """The learner's (lo, hi) as two Python ints, or a clear WrongReturn."""
    where = "causal_block_range{}".format(tuple(config))
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        what = f"a {type(got).__name__}" + (f" of length {len(got)}" if isinstance(got, (tuple, list)) else "")
        raise WrongReturn(f"{where} returned {what}; expected a pair (lo, hi) of ints")
    pair = []
    for name, value in zip(("lo", "hi"), got):
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            hint = " (use // for integer division, or -(-a // b) to round up)" if isinstance(value, float) else ""
            raise WrongReturn(f"{where} returned {name} = {value!r} ({type(value).__name__}); expected an int{hint}")
        pair.append(int(value))
    return _normalised(*pair)


def _ranges(fn, configs) -> torch.Tensor:
    """(len(configs), 2) float64: fn's (lo, hi) per configuration, empty ranges as (0, 0)."""
    return torch.tensor([_normalised(*fn(*config)) for config in configs], dtype=torch.float64)


def _range_mistake(name: str, message: str, *variants) -> Mistake:
    return Mistake(name, message, lambda configs: [_ranges(v, configs) for v in variants])


def _last_row_ignoring_tail(start_m, block_m, block_n, n_q, n_k) -> int:
    return (start_m + 1) * block_m - 1


RANGE_MISTAKES = (
    _range_mistake(
        "diagonal block left out",
        "the diagonal block is left out: the block holding the last row's last visible key, "
        "last_key = last_row + n_k - n_q, is partly visible and must be visited: "
        "hi = last_key // block_n + 1 (hi is exclusive)",
        lambda s, bm, bn, nq, nk: (0, _last_key(s, bm, bn, nq, nk) // bn),
        lambda s, bm, bn, nq, nk: (0, (s * bm + nk - nq) // bn),
        lambda s, bm, bn, nq, nk: (0, s)),
    _range_mistake(
        "< for <=",
        "off by one at the diagonal: the block holding the last visible key is lost whenever that key "
        "starts a block. Either the diagonal is excluded (query i sees key j when j <= i + n_k - n_q, "
        "the diagonal itself included, not j < i + n_k - n_q), or hi = cdiv(last_key, block_n) rounds up "
        "the last key's index instead of the number of keys up to it: hi = cdiv(last_key + 1, block_n) "
        "= last_key // block_n + 1",
        lambda s, bm, bn, nq, nk: (0, ceil_div(_last_key(s, bm, bn, nq, nk), bn))),
    _range_mistake(
        "last row one past",
        "off by one in the block's last row: rows are numbered from 0, so the last row of query block "
        "start_m is min((start_m + 1) * block_m, n_q) - 1 ((start_m + 1) * block_m is the first row of "
        "the next block); one row too far visits a key block no row sees whenever the last key ends a block",
        lambda s, bm, bn, nq, nk: (0, (_last_key(s, bm, bn, nq, nk) + 1) // bn + 1)
        if _last_key(s, bm, bn, nq, nk) + 1 >= 0 else (0, 0)),
    _range_mistake(
        "top-left alignment",
        "the n_k - n_q offset is missing (top-left alignment): with n_q != n_k the causal diagonal is "
        "aligned to the bottom right, query i sees keys j <= i + n_k - n_q, so that the last query "
        "(the newest token) sees every key",
        lambda s, bm, bn, nq, nk: (0, min(min((s + 1) * bm, nq) - 1, nk - 1) // bn + 1),
        lambda s, bm, bn, nq, nk: (0, (min((s + 1) * bm, nq) - 1) // bn + 1),
        lambda s, bm, bn, nq, nk: (0, ceil_div(min((s + 1) * bm, nq), bn))),
    _range_mistake(
        "not rounded up",
        "the last, partly visible key block is dropped: hi must round up to a whole block, "
        "hi = cdiv(last_key + 1, block_n) = last_key // block_n + 1, not (last_key + 1) // block_n",
        lambda s, bm, bn, nq, nk: (0, (_last_key(s, bm, bn, nq, nk) + 1) // bn)),
    _range_mistake(
        "no skipping",
        "your range is safe (it holds every key these rows see, so the output would be right), but "
        "it is every key block: nothing above the diagonal is skipped, and skipping it (about half "
        "the work) is the point. Stop after the block holding the last row's last key, "
        "last_key = last_row + n_k - n_q",
        lambda s, bm, bn, nq, nk: (0, ceil_div(nk, bn))),
    _range_mistake(
        "past n_k",
        "hi goes past the last key block: the query tail cuts the last query block, so its last row "
        "is min((start_m + 1) * block_m, n_q) - 1, not (start_m + 1) * block_m - 1; then the last key "
        "is at most n_k - 1 and hi at most cdiv(n_k, block_n) (a block starting at n_k or later "
        "holds no key)",
        lambda s, bm, bn, nq, nk: (0, (_last_row_ignoring_tail(s, bm, bn, nq, nk) + nk - nq) // bn + 1),
        lambda s, bm, bn, nq, nk: (0, ceil_div(_last_row_ignoring_tail(s, bm, bn, nq, nk) + nk - nq, bn))),
    _range_mistake(
        "a block that sees no key",
        "with more queries than keys (n_q > n_k) the first n_q - n_k queries see no key at all: "
        "a query block whose last key, last_row + n_k - n_q, is negative must visit nothing (an empty "
        "range such as (0, 0)). Clamping last_key at 0, or int(last_key / block_n) (which rounds -0.5 "
        "up to 0), visits key block 0 for nothing",
        lambda s, bm, bn, nq, nk: (0, max(_last_key(s, bm, bn, nq, nk), 0) // bn + 1),
        lambda s, bm, bn, nq, nk: (0, int(_last_key(s, bm, bn, nq, nk) / bn) + 1)),
    _range_mistake(
        "query blocks as key blocks",
        "hi = start_m + 1 counts query blocks, which are key blocks only when block_m == block_n and "
        "n_q == n_k: go through positions: last_row = min((start_m + 1) * block_m, n_q) - 1, "
        "last_key = last_row + n_k - n_q, hi = last_key // block_n + 1",
        lambda s, bm, bn, nq, nk: (0, s + 1),
        lambda s, bm, bn, nq, nk: (0, s + 1 + (nk - nq) // bn)),
    _range_mistake(
        "key positions",
        "these are key positions, not key block indices: block j holds keys j * block_n to "
        "(j + 1) * block_n - 1; return hi in blocks, last_key // block_n + 1",
        lambda s, bm, bn, nq, nk: (0, _last_key(s, bm, bn, nq, nk) + 1),
        lambda s, bm, bn, nq, nk: (0, (_last_key(s, bm, bn, nq, nk) // bn + 1) * bn),
        lambda s, bm, bn, nq, nk: (0, min((_last_key(s, bm, bn, nq, nk) // bn + 1) * bn, nk))),
)


def _every_block(n_q, n_k, block_m, block_n):
    return [(s, block_m, block_n, n_q, n_k) for s in range(ceil_div(n_q, block_m))]


def _range_case(description: str, configs) -> Case:
    configs = tuple(configs)
    return Case(description, (configs,), _ranges(_right_range, configs), 0.0,
                shape_words="one row (lo, hi) per query block")


def _fixed_range_cases() -> list[Case]:
    """The same four cases in every run: each wrong answer of RANGE_MISTAKES fails one of them."""
    tails = [(100, 64, 32), (77, 32, 16), (50, 16, 32), (130, 32, 64), (129, 32, 64), (97, 32, 32)]
    return [
        _range_case("n_q = n_k = 128, block_m = block_n = 32, every query block", _every_block(128, 128, 32, 32)),
        _range_case("n_q = n_k, tails that are not a multiple of the block, block_m != block_n: every query "
                    "block of (n, block_m, block_n) = " + ", ".join(str(p) for p in tails)
                    + " (in (129, 32, 64) and (97, 32, 32) the last key starts a key block)",
                    [config for n, bm, bn in tails for config in _every_block(n, n, bm, bn)]),
        _range_case("n_q < n_k, the last n_q positions of a sequence (a chunk after a KV cache): every query "
                    "block of n_q = 40, n_k = 161, block_m = block_n = 32 (the last key, 160, starts a key "
                    "block) and of n_q = 100, n_k = 300, block_m = 64, block_n = 32; and one query over 161 "
                    "keys (decoding), block_m = 16, block_n = 32",
                    _every_block(40, 161, 32, 32) + _every_block(100, 300, 64, 32) + [(0, 16, 32, 1, 161)]),
        _range_case("n_q > n_k: the first n_q - n_k queries see no key, so whole query blocks visit nothing: "
                    "every query block of n_q = 150, n_k = 40, block_m = block_n = 32 (blocks 0-2 see no key) "
                    "and of n_q = 70, n_k = 20, block_m = 16, block_n = 32 (blocks 0-2 see no key)",
                    _every_block(150, 40, 32, 32) + _every_block(70, 20, 16, 32)),
    ]


def _range_cases(gen):
    def integer(low, high):  # inclusive
        return int(torch.randint(low, high + 1, (1,), generator=gen))

    def choice(options):
        return options[integer(0, len(options) - 1)]

    cases = _fixed_range_cases()
    configs = []
    for number in range(200):
        bm, bn = choice([16, 32, 64, 128]), choice([16, 32, 64, 128])
        n_q, n_k = integer(1, 500), integer(1, 500)
        start_m = integer(0, ceil_div(n_q, bm) - 1)
        if number % 4 < 2:
            # n_k chosen so that the block's last visible key starts a key block (number % 4 == 0) or ends one
            # (== 1), where the off-by-one mistakes show: drawn free, a few configs in a hundred do, and the
            # grader's hidden draw, which has no designed case here, could hold none
            last_row = min((start_m + 1) * bm, n_q) - 1  # at most n_q - 1, so n_k >= 1 from block 0 on
            shift = 0 if number % 4 == 0 else bn - 1  # the last key's place in its block
            n_k = integer(0, 500 // bn) * bn + shift + n_q - last_row
        configs.append((start_m, bm, bn, n_q, n_k))
    cases.append(_range_case("200 random (start_m, block_m, block_n, n_q, n_k), n_q from 1 to 500, n_k from 1 to "
                             "about 1100; in one in four the block's last visible key starts a key block, in one "
                             "in four it ends one", configs))
    return cases


def _call_range(learner, case: Case):
    rows = []
    for config in case.args[0]:
        got = learner(*config)
        if got is None:
            return None
        rows.append(_as_range(got, config))
    return torch.tensor(rows, dtype=torch.float64)


def _blocks(blocks: list[int], block_n: int, n_k: int) -> str:
    """'key blocks 3, 4 (keys 96..159)': the keys shown when the blocks are contiguous."""
    names = ", ".join(str(j) for j in blocks[:6]) + (", ..." if len(blocks) > 6 else "")
    text = f"key block{'s' if len(blocks) > 1 else ''} {names}"
    if blocks != list(range(blocks[0], blocks[-1] + 1)):
        return text
    first, last = blocks[0] * block_n, min((blocks[-1] + 1) * block_n, n_k) - 1
    return text + (f" (keys {first}..{last})" if first < n_k else f" (starting at key {first} >= n_k = {n_k})")


def _explain_range(case: Case, out: torch.Tensor) -> list[str]:
    """The first query block whose range is wrong, in words: what it misses, what it wastes."""
    configs = case.args[0]
    row = int((out != case.expected).any(dim=1).nonzero()[0])
    s, bm, bn, n_q, n_k = configs[row]
    want, got = tuple(int(x) for x in case.expected[row]), tuple(int(x) for x in out[row])
    first_row, last_row = s * bm, min((s + 1) * bm, n_q) - 1
    last_key = last_row + n_k - n_q
    sees = (f"sees keys 0..{last_key}, key blocks 0..{want[1] - 1}" if last_key >= 0
            else "sees no key (query i sees keys j <= i + n_k - n_q < 0)")
    lines = [f"row {row} of the comparison: causal_block_range{configs[row]}: query rows {first_row}..{last_row}, "
             f"the last one {sees}: expected (lo, hi) = {want}, got {got}"]
    missing = [j for j in range(*want) if not got[0] <= j < got[1]]
    extra = [j for j in range(*got) if not want[0] <= j < want[1]]
    if missing:
        lines.append(f"your range leaves out {_blocks(missing, bn, n_k)}, which these rows see: their scores "
                     "would be missing from the softmax (a wrong output)")
    past = [j for j in extra if j * bn >= n_k]
    inside = [j for j in extra if 0 <= j * bn < n_k]
    if any(j < 0 for j in extra):
        lines.append("lo is negative: key blocks are numbered from 0")
    if inside:
        lines.append(f"your range also visits {_blocks(inside, bn, n_k)}, which no row of this block sees: "
                     "wasted loads (the element mask would hide them)")
    if past:
        lines.append(f"your range visits {_blocks(past, bn, n_k)}: there is no key there, hi is at most "
                     f"cdiv(n_k, block_n) = {ceil_div(n_k, bn)}")
    return lines


CAUSAL_BLOCK_RANGE_CHECK = Check(CAUSAL_BLOCK_RANGE, _range_cases, RANGE_MISTAKES, call=_call_range,
                                 explain=_explain_range)


def check_causal_block_range(fn, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check ``fn(start_m, block_m, block_n, n_q, n_k) -> (lo, hi)``, the causal key-block range."""
    return run_check(CAUSAL_BLOCK_RANGE_CHECK, fn, seed=seed, time_limit_s=time_limit_s)


# ------------------------------------------------------------------------ padding mask

def _rows(n: int, lens: torch.Tensor) -> torch.Tensor:
    """(B, n) boolean: position i < lens[b]."""
    return torch.arange(n).view(1, -1) < lens.to(torch.long).view(-1, 1)


def _right_padding(seq_lens, n_q, n_k):
    """reference.attention_mask's keys, and padding queries attend to nothing."""
    keys = reference.attention_mask(n_q, n_k, seq_lens=seq_lens, batch=seq_lens.shape[0])
    return keys & _rows(n_q, seq_lens)[:, None, :, None]


def _mask_from(seq_lens, n_q, n_k, *, queries=True, keys=True, inclusive=False, lens=None):
    """A padding mask built the way a typical bug builds it."""
    lens = seq_lens if lens is None else lens
    lens = lens.to(torch.long) + (1 if inclusive else 0)
    mask = torch.ones(lens.shape[0], 1, n_q, n_k, dtype=torch.bool)
    if queries:
        mask = mask & _rows(n_q, lens)[:, None, :, None]
    if keys:
        mask = mask & _rows(n_k, lens)[:, None, None, :]
    return mask


def _one_length(seq_lens, n_q, n_k):
    variants = []
    for length in (seq_lens[0], seq_lens.max(), seq_lens.min(), seq_lens[-1]):
        same = length.expand(seq_lens.shape)
        variants += [_mask_from(seq_lens, n_q, n_k, lens=same), _mask_from(seq_lens, n_q, n_k, lens=same)[:1]]
        variants += [_mask_from(seq_lens, n_q, n_k, lens=same, queries=False)]
    return variants


PADDING_MISTAKES = (
    Mistake("keys only",
            "only the keys are masked: queries past the length are padding too and must attend to nothing "
            "(a fully masked row, whose output is then 0). Mask query rows i >= seq_lens[b] as well: "
            "(i < len) & (j < len), a (B, 1, N_q, N_k) mask",
            lambda seq_lens, n_q, n_k: [_mask_from(seq_lens, n_q, n_k, queries=False),
                                        _mask_from(seq_lens, n_q, n_k, queries=False)[:, :, :1, :]]),
    Mistake("queries only",
            "only the queries are masked: key j of sample b is padding when j >= seq_lens[b], and no query "
            "may attend to it (that part keeps the padding out of every real query's softmax). Mask the "
            "keys too: (i < len) & (j < len), a (B, 1, N_q, N_k) mask",
            lambda seq_lens, n_q, n_k: [_mask_from(seq_lens, n_q, n_k, keys=False),
                                        _mask_from(seq_lens, n_q, n_k, keys=False)[:, :, :, :1]]),
    Mistake("<= for <",
            "off by one: positions 0 .. seq_lens[b] - 1 are real, so position i is real when i < seq_lens[b], "
            "not i <= seq_lens[b]",
            lambda seq_lens, n_q, n_k: [_mask_from(seq_lens, n_q, n_k, inclusive=True),
                                        _mask_from(seq_lens, n_q, n_k, inclusive=True, queries=False)]),
    Mistake("one length for all",
            "every sample got the same length: each sample b has its own seq_lens[b]. Compare positions "
            "with seq_lens.view(-1, 1, 1, 1) (or seq_lens[:, None, None, None]) so that the batch axis "
            "broadcasts, one length per sample",
            _one_length),
    Mistake("inverted",
            "the mask is inverted: True must mean 'may attend' (as in SDPA's boolean attn_mask and "
            "reference.attention_mask), not 'is padding' (the key_padding_mask convention of "
            "nn.MultiheadAttention)",
            lambda seq_lens, n_q, n_k: [~_right_padding(seq_lens, n_q, n_k),
                                        ~_mask_from(seq_lens, n_q, n_k, queries=False)]),
    Mistake("additive mask",
            "this is an additive mask (0 where allowed, -inf where not): return the boolean mask itself, "
            "True where query i may attend to key j",
            lambda seq_lens, n_q, n_k: [
                torch.zeros(seq_lens.shape[0], 1, n_q, n_k, dtype=torch.float64).masked_fill(~m, float("-inf"))
                for m in (_right_padding(seq_lens, n_q, n_k), _mask_from(seq_lens, n_q, n_k, queries=False))]),
    Mistake("head axis missing",
            "the mask must have shape (B, 1, N_q, N_k): the axis of size 1 broadcasts over the heads of "
            "scores (B, H, N_q, N_k); add it with mask[:, None]",
            lambda seq_lens, n_q, n_k: [_right_padding(seq_lens, n_q, n_k)[:, 0],
                                        _mask_from(seq_lens, n_q, n_k, queries=False)[:, 0]]),
    Mistake("axes swapped",
            "rows are queries and columns are keys: the mask is (B, 1, N_q, N_k), mask[b, 0, i, j] for "
            "query i and key j (here it came out (B, 1, N_k, N_q))",
            lambda seq_lens, n_q, n_k: _right_padding(seq_lens, n_q, n_k).transpose(-1, -2)),
)


def _padding_case(description: str, lens: list[int], n_q: int, n_k: int) -> Case:
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return Case(f"seq_lens = {lens} (int32), n_q = {n_q}, n_k = {n_k}: {description}",
                (seq_lens, n_q, n_k), _right_padding(seq_lens, n_q, n_k), 0.0,
                shape_words="(B, 1, N_q, N_k)")


def _padding_cases(gen):
    def integer(low, high):  # inclusive
        return int(torch.randint(low, high + 1, (1,), generator=gen))

    def distinct(count, low, high):
        picks = torch.randperm(high - low + 1, generator=gen)[:count] + low
        return [int(x) for x in picks]

    # Fixed: n_q != n_k (swapped axes show), an empty sample, one longer than n_q (its queries are all
    # real, its keys are not), two padded in both; distinct lengths (one length for all shows).
    cases = [_padding_case("an empty sample, one longer than n_q (its queries are all real, its keys are not), "
                           "two padded", [9, 0, 4, 6], 7, 10)]
    n = integer(8, 16)
    cases.append(_padding_case("one full sample, two padded", [n] + distinct(2, 1, n - 1), n, n))
    n = integer(20, 40)
    cases.append(_padding_case("one empty sample (length 0)", distinct(3, 1, n - 1) + [0], n, n))
    n_q, n_k = integer(4, 10), integer(20, 30)
    cases.append(_padding_case("n_q < n_k", [integer(n_q + 1, n_k - 1), integer(1, n_q - 1)], n_q, n_k))
    n_q, n_k = integer(20, 30), integer(4, 10)
    cases.append(_padding_case("n_q > n_k", [integer(n_k + 1, n_q - 1), integer(1, n_k - 1), n_q], n_q, n_k))
    n_q, n_k = integer(30, 64), integer(30, 64)
    cases.append(_padding_case("a larger batch", distinct(5, 0, max(n_q, n_k)), n_q, n_k))
    return cases


def _explain_padding(case: Case, out: torch.Tensor) -> list[str]:
    """The first wrong entry, in words."""
    seq_lens = case.args[0]
    wrong = (out.detach().cpu().double() != case.expected.double()).nonzero()
    if not len(wrong):
        return []
    b, _, i, j = (int(x) for x in wrong[0])
    length = int(seq_lens[b])
    kind = lambda position: "real" if position < length else "padding"  # noqa: E731
    allowed = bool(case.expected[b, 0, i, j])
    return [f"mask[{b}, 0, {i}, {j}]: sample {b} has length {length}, so query {i} is {kind(i)} and key {j} is "
            f"{kind(j)}: expected {allowed}, got {not allowed if out.dtype == torch.bool else out[b, 0, i, j].item()}"]


def _inspect_padding(case: Case, out: torch.Tensor) -> str | None:
    if out.dtype != torch.bool:
        return (f"right values, but the mask must be a boolean tensor (torch.bool, True = may attend), "
                f"got {out.dtype}: comparisons such as i < len give one")
    return None


PADDING_MASK_CHECK = Check(PADDING_MASK, _padding_cases, PADDING_MISTAKES, explain=_explain_padding,
                           inspect=_inspect_padding)


def check_padding_mask(fn, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check ``fn(seq_lens, n_q, n_k) -> mask`` (B, 1, n_q, n_k) bool: queries and keys before each length."""
    return run_check(PADDING_MASK_CHECK, fn, seed=seed, time_limit_s=time_limit_s)
