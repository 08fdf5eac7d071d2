"""Checks for notebook 09 (decoding): the merge of split-KV partials and the gather index of a paged cache.

Exercise signatures (stated in the notebook):

* ``merge_splits(o_parts, lse_parts) -> (o, lse)``: the partials of S key chunks,
  o_parts (S, M, D) (each chunk's normalised output, 0 for a chunk where the row sees
  no key) and lse_parts (S, M) (each chunk's logsumexp, natural log, -inf for such a
  chunk), merged into the output (M, D) and logsumexp (M,) over all the keys, as
  split-KV decoding's merge kernel does. A row with no key in any chunk gets O = 0,
  L = -inf, never NaN.
* ``paged_gather_index(block_table, page_size, positions) -> (pages, rows)``: where
  token ``positions[b, t]`` of sequence b sits in a paged KV cache, a pool
  (num_pages, page_size, H_kv, D): page ``block_table[b, positions[b, t] // page_size]``,
  row ``positions[b, t] % page_size``; two integer tensors of the shape of positions.

The merge runs on float64 partials made from real attention problems (each chunk's
softmax output and logsumexp over its keys); the expected output is attention over
all the keys at once, computed without any merge. The first two cases are fixed (the
same whatever the seed): rows whose logsumexps are near +800 (exp alone overflows)
and -800 (it underflows) side by side, empty chunks (-inf) at the start, inside and
at the end, a row whose only keys have L = -1000, and a row with every chunk empty.
Seeded cases follow: random masked chunks, a decoding step whose short sequences
leave their last chunks empty, logits x 1000, a single chunk. The wrong answers it
names: a plain average (or sum) of the outputs, exp(L_s) without the max, a max over
the whole tensor instead of per row, no division by the sum of the weights, NaN where
every chunk is empty, -inf replaced by 0 before the max, L returned as the max or
without the max added back, log2 and ln mixed, the sign in the exp flipped.

The gather index runs on fixed cases first: three sequences with block tables
shuffled over a pool (unused entries -1) and positions on every page boundary; one
decoding step (the next token's slot, at a boundary and just before one); a prefill
chunk of 4 tokens for each of 4 sequences, crossing pages; then random ones. The
compared tensor is (B, T, 2): the page and the row of each token. The wrong answers
it names: the logical page used as the pool page (the table ignored), // and %
swapped, off by one at a page boundary (rounded up, positions from 1, one page too
far), another sample's row of the table, the pair returned as (rows, pages).

Every case's args are plain data (tensors, ints), so that a case can be saved with
torch.save and loaded with ``weights_only=True``.
"""
from __future__ import annotations

import torch

from ...online_softmax import safe_shift
from ...reference import stable_softmax
from ...validation import tolerance
from .framework import Case, Check, Mistake, WrongReturn, error_from, fixed_generator, register, run_check

NOTEBOOK = "09_decoding"
MERGE_SPLITS = register(NOTEBOOK, "merge_splits", 2,
                        "Merge the partials (O_s, L_s) of S key chunks into O and L: weights exp(L_s - max), "
                        "-inf safe")
PAGED_GATHER_INDEX = register(NOTEBOOK, "paged_gather_index", 2,
                              "Where a cached token sits in a paged KV cache: its page through the block table, "
                              "its row in the page")

NEG_INF = float("-inf")
TOLERANCE = tolerance(torch.float64)

#: The seed of the fixed cases: the same values in every run, whatever the exercise's seed
#: (the grader's hidden draw mixes it with its own: :func:`~.framework.fixed_generator`).
FIXED_SEED = 20240909


# =========================================================================== merge_splits

def _partial(scores: torch.Tensor, v: torch.Tensor):
    """(o (M, D), lse (M,)) of softmax attention of score rows (M, n) over values (n, D), from the definition.

    A row with no visible key (all -inf) gets o = 0 and lse = -inf.
    """
    m = scores.amax(dim=-1)
    safe_m = safe_shift(m)
    lse = safe_m + torch.log(torch.exp(scores - safe_m.unsqueeze(-1)).sum(dim=-1))
    return stable_softmax(scores, dim=-1) @ v, lse


def _merge_case(description: str, scores: torch.Tensor, v: torch.Tensor, cuts) -> Case:
    """The partials of the key chunks between ``cuts``; expected: attention over all keys at once."""
    parts = [_partial(scores[:, a:b], v[a:b]) for a, b in zip(cuts, cuts[1:])]
    o_parts = torch.stack([o for o, _ in parts])
    lse_parts = torch.stack([lse for _, lse in parts])
    expected = _partial(scores, v)
    return Case(description, (o_parts, lse_parts), expected, TOLERANCE,
                shape_words=("(M, D)", "(M,)"), out_dtype=(torch.float64, torch.float64),
                output_names=("O", "L"))


# ------------------------------------------------------------------- wrong merges

def _right_lse(lse_parts):
    m = safe_shift(lse_parts.amax(dim=0))
    return m + torch.log(torch.exp(lse_parts - m).sum(dim=0))


def _merge_variant(o_parts, lse_parts, *, shift="row", exp=torch.exp, log=torch.log, sign=1.0,
                   normalise=True, guard=True, guard_total=True, zero_first="", lse="right"):
    """The merge with one part done the way a typical bug does it.

    ``shift``: "row" (the max over the chunks, per row), "none" (exp(L_s) alone) or
    "global" (one max over the whole tensor); ``exp``/``log``: the bases used;
    ``guard``: subtract 0 where the row's max is -inf; ``guard_total``: divide only where
    the weights' sum is > 0; ``zero_first``: "" (no), "max" (-inf -> 0 only in the max)
    or "all" (-inf -> 0 everywhere); ``lse``: "right" (m + log(sum)), "max" (m),
    "no max" (log(sum)), "right ln" (m + ln(sum) whatever ``log``).
    """
    finite = torch.isfinite(lse_parts)
    if zero_first == "all":
        lse_parts = torch.where(finite, lse_parts, torch.zeros_like(lse_parts))
    m = lse_parts.amax(dim=0)
    if zero_first == "max":
        m = torch.where(finite, lse_parts, torch.zeros_like(lse_parts)).amax(dim=0)
    if shift == "none":
        m_ref = torch.zeros_like(m)
    elif shift == "global":
        m_ref = lse_parts[finite].max().expand(m.shape) if finite.any() else torch.zeros_like(m)
    else:
        m_ref = safe_shift(m) if guard else m
    w = exp(sign * (lse_parts - m_ref))  # (S, M)
    total = w.sum(dim=0)
    o = (w.unsqueeze(-1) * o_parts).sum(dim=0)
    if normalise:
        divisor = torch.where(total > 0, total, torch.ones_like(total)) if guard_total else total
        o = o / divisor.unsqueeze(-1)
    out_lse = {"right": m_ref + log(total), "max": m, "no max": log(total),
               "right ln": m_ref + torch.log(total)}[lse]
    return o, out_lse


def _merges(*variants):
    """A Mistake's compute: each variant (a dict of _merge_variant keywords) on the case's args."""
    def compute(o_parts, lse_parts):
        return [_merge_variant(o_parts, lse_parts, **kw) for kw in variants]
    return compute


def _averaged(o_parts, lse_parts):
    """Outputs averaged or added without weights, with the logsumexps a learner would pair with them."""
    finite = torch.isfinite(lse_parts)
    lses = [_right_lse(lse_parts), lse_parts.amax(dim=0), lse_parts.mean(dim=0),
            torch.where(finite, lse_parts, torch.zeros_like(lse_parts)).mean(dim=0)]
    return [(o, lse) for o in (o_parts.mean(dim=0), o_parts.sum(dim=0)) for lse in lses]


def _with_right_o(lse_of):
    """A mistake in L only: the right O, with L = lse_of(lse_parts)."""
    def compute(o_parts, lse_parts):
        o, _ = _merge_variant(o_parts, lse_parts)
        return (o, lse_of(lse_parts))
    return compute


MERGE_MISTAKES = (
    Mistake("plain average",
            "the chunks' outputs are averaged (or added) without weights: chunk s counts in proportion to "
            "its share of the row's exp-mass, exp(L_s - L). With m = max_s L_s and w_s = exp(L_s - m): "
            "O = sum_s w_s O_s / sum_s w_s", _averaged),
    Mistake("exp(L) without the max",
            "exp(L_s) was taken on its own: it overflows to inf for L_s above about 709 (float64; 88 in "
            "float32) and underflows to 0 for very negative L_s, so the division gives inf/inf or 0/0 = NaN. "
            "Subtract the row's max over the chunks first: w_s = exp(L_s - m) with m = lse_parts.amax(dim=0)",
            _merges(dict(shift="none"), dict(shift="none", guard_total=False))),
    Mistake("global max",
            "the max was taken over the whole tensor (every row at once), not per row over the chunks: in a "
            "row whose logsumexps lie far below the largest one anywhere, every weight exp(L_s - max) "
            "underflows to 0. Take one max per row: m = lse_parts.amax(dim=0), shape (M,)",
            _merges(dict(shift="global"), dict(shift="global", guard_total=False))),
    Mistake("not normalised",
            "the weighted sum of the outputs is not divided by the sum of the weights: with w_s = exp(L_s - m), "
            "O = sum_s w_s O_s / sum_s w_s (the shares w_s / sum w sum to 1; the w_s alone do not)",
            _merges(dict(normalise=False), dict(normalise=False, lse="max"), dict(normalise=False, lse="no max"))),
    Mistake("NaN where every chunk is empty",
            "NaN in a row where every chunk is empty (all L_s = -inf): there m = -inf, and L_s - m = "
            "-inf - (-inf) = NaN (or the weights sum to 0 and O = 0 / 0). Subtract 0 where m is -inf "
            "(m_safe = torch.where(torch.isneginf(m), 0.0, m)), divide only where the sum is > 0, and the row "
            "gets O = 0 and L = -inf",
            _merges(dict(guard=False), dict(guard_total=False), dict(guard=False, guard_total=False))),
    Mistake("-inf zeroed",
            "an empty chunk's L_s = -inf was replaced by 0 (nan_to_num, clamp or where) before the max or the "
            "weights: its weight exp(0 - m) is then not 0, so the empty chunk (O_s = 0) pulls the output towards "
            "0, and a row whose keys all have very negative scores gets m = 0 and weights that underflow. Keep "
            "L_s = -inf in the weights (exp(-inf) = 0 is what makes an empty chunk count for nothing) and in "
            "the max; replace -inf by 0 only in the m you subtract, and only where m itself is -inf",
            _merges(dict(zero_first="all"), dict(zero_first="max"))),
    Mistake("L is the max",
            "O is right but L is the largest L_s: L must be the logsumexp over all the chunks, "
            "L = m + log(sum_s exp(L_s - m)); the max alone leaves out every other chunk's share (the next "
            "merge, and a backward pass, need the true logsumexp)",
            _with_right_o(lambda lse_parts: lse_parts.amax(dim=0))),
    Mistake("L without the max",
            "O is right but L = log(sum_s w_s) is relative to the max you subtracted: add it back, "
            "L = m + log(sum_s exp(L_s - m))",
            _merges(dict(lse="no max"))),
    Mistake("log2 and ln mixed",
            "log2 and the natural log are mixed: the logsumexps are natural logarithms (as flash_attention's "
            "return_lse and torch.logsumexp), so weigh with torch.exp (not torch.exp2 or 2 ** x) and take "
            "L = m + torch.log(...), not torch.log2. (The Triton kernel works in base 2 inside, with scores "
            "multiplied by log2(e), and converts back before returning L.)",
            _merges(dict(exp=torch.exp2, log=torch.log2), dict(exp=torch.exp2), dict(log=torch.log2),
                    dict(exp=torch.exp2, lse="right ln"))),
    Mistake("sign flipped",
            "the sign in the exp is flipped: each chunk's weight is exp(L_s - m) (at most 1, since m is the "
            "largest L_s), not exp(m - L_s)",
            _merges(dict(sign=-1.0))),
)


# ------------------------------------------------------------------------- merge cases

def _chunked_scores(gen, row_max, sizes) -> torch.Tensor:
    """Scores (M, sum(sizes)): chunk c of row r standard normal, shifted so that its max is row_max[r][c]
    (-inf: the whole chunk masked, the row sees no key there)."""
    rows = []
    for maxima in row_max:
        pieces = []
        for target, size in zip(maxima, sizes):
            piece = torch.randn(size, generator=gen, dtype=torch.float64)
            pieces.append(piece - piece.max() + target if target != NEG_INF
                          else torch.full((size,), NEG_INF, dtype=torch.float64))
        rows.append(torch.cat(pieces))
    return torch.stack(rows)


def _cuts(sizes) -> list[int]:
    cuts = [0]
    for size in sizes:
        cuts.append(cuts[-1] + size)
    return cuts


def _fixed_merge_cases() -> list[Case]:
    """Two cases made row by row, the same in every run: what random partials catch only sometimes."""
    gen = fixed_generator(FIXED_SEED)
    sizes = (8, 8, 8, 5)
    row_max = [(0.5, 2.0, -1.0, 1.0), (3.0, -2.0, 0.0, 8.0), (800.0, 795.0, 801.0, 790.0),
               (-800.0, -805.0, -799.0, -810.0), (1.0, NEG_INF, 2.0, 0.5), (NEG_INF, NEG_INF, NEG_INF, -3.0)]
    first = _merge_case(
        "S = 4 chunks (8, 8, 8 and 5 keys), M = 6 rows, D = 5, float64: the chunk with the largest L_s "
        "differs from row to row; row 2's scores are near +800 (exp(L_s) alone overflows), row 3's near -800 "
        "(exp(L_s) alone underflows to 0); row 4 sees no key in chunk 1 (L_1 = -inf, O_1 = 0); row 5 sees "
        "keys only in the last chunk",
        _chunked_scores(gen, row_max, sizes), torch.randn(sum(sizes), 5, generator=gen, dtype=torch.float64),
        _cuts(sizes))
    sizes = (6, 6, 6)
    row_max = [(NEG_INF, NEG_INF, NEG_INF), (NEG_INF, 1.5, NEG_INF), (-1000.0, NEG_INF, NEG_INF),
               (2.0, 0.0, NEG_INF), (0.3, -0.2, 0.1)]
    second = _merge_case(
        "S = 3 chunks of 6 keys, M = 5 rows, D = 4, with empty chunks (L_s = -inf, O_s = 0): row 0 sees no key "
        "in any chunk (it must get O = 0 and L = -inf, not NaN); row 1 only in chunk 1; row 2 only in chunk 0, "
        "whose scores are near -1000; row 3's last chunk is empty (the tail past a short sequence); row 4 sees "
        "keys everywhere",
        _chunked_scores(gen, row_max, sizes), torch.randn(sum(sizes), 4, generator=gen, dtype=torch.float64),
        _cuts(sizes))
    return [first, second]


def _merge_cases(gen):
    def randn(*shape, scale=1.0):
        return torch.randn(shape, generator=gen, dtype=torch.float64) * scale

    cases = _fixed_merge_cases()
    # 3: eight chunks, whole chunks masked at random in each row, one row with nothing visible
    chunk, splits, rows, d = 16, 8, 12, 8
    scores = randn(rows, chunk * splits, scale=3.0)
    hidden = torch.rand(rows, splits, generator=gen) < 0.25
    hidden[7] = True
    scores = scores.masked_fill(hidden.repeat_interleave(chunk, dim=1), NEG_INF)
    cases.append(_merge_case(f"S = {splits} chunks of {chunk} keys, M = {rows} rows, D = {d}, logits x 3; about a "
                             "quarter of the chunks of each row fully masked (L_s = -inf), row 7 sees no key at all",
                             scores, randn(chunk * splits, d), _cuts([chunk] * splits)))
    # 4: a decoding step as split-KV cuts it: per-sequence cache lengths, chunks of 32 keys
    batch, heads, chunk, d = 3, 4, 32, 8
    lengths = [0, int(torch.randint(33, 95, (1,), generator=gen)), 160]
    splits = -(-max(lengths) // chunk)
    k = randn(batch, splits * chunk, d)
    q = randn(batch, heads, d)
    v = randn(batch * splits * chunk, d)
    scores = torch.full((batch * heads, batch * splits * chunk), NEG_INF, dtype=torch.float64)
    for b, length in enumerate(lengths):  # each sequence's rows see its own keys, up to its length
        cols = slice(b * splits * chunk, b * splits * chunk + length)
        scores[b * heads:(b + 1) * heads, cols] = q[b] @ k[b, :length].T / d ** 0.5
    # the chunks are taken sequence by sequence: chunk c holds keys c*32..c*32+31 of every sequence
    order = torch.arange(batch * splits * chunk).view(batch, splits, chunk).transpose(0, 1).reshape(-1)
    cases.append(_merge_case(
        f"a decoding step as split-KV cuts it: B = {batch} sequences of {lengths} cached tokens, H = {heads} "
        f"query heads (M = {batch * heads} rows, one query each), D = {d}, S = {splits} chunks of {chunk} "
        "positions; the rows of the short sequences see no key in their last chunks (and those of the empty "
        "one in none)",
        scores[:, order], v[order], _cuts([batch * chunk] * splits)))
    # 5: large logits
    cases.append(_merge_case("S = 5 chunks (3, 7, 4, 6 and 5 keys), M = 6, D = 4, large logits (standard "
                             "normal x 1000): exp(L_s) alone overflows or underflows",
                             randn(6, 25, scale=1000.0), randn(25, 4), _cuts([3, 7, 4, 6, 5])))
    # 6: one chunk
    cases.append(_merge_case("S = 1 chunk of 10 keys (a short sequence is not split), M = 3, D = 6: the merge "
                             "gives the one partial back", randn(3, 10), randn(10, 6), [0, 10]))
    return cases


def _explain_merge(case: Case, out) -> list[str]:
    """Which of O and L are right, and the chunks' logsumexps of the first wrong row."""
    o_parts, lse_parts = case.args
    (want_o, want_lse), (got_o, got_lse) = case.expected, out
    got_o, got_lse = got_o.detach().double().cpu(), got_lse.detach().double().cpu()
    verdicts = [f"{name} {'right' if error_from(got, want) <= case.tolerance else 'wrong'}"
                for name, got, want in (("O", got_o, want_o), ("L", got_lse, want_lse))]
    finite = torch.isfinite(want_lse)
    l_scale = want_lse[finite].abs().max().clamp_min(1.0) if finite.any() else torch.tensor(1.0)
    same_l = (got_lse == want_lse) | ((got_lse - want_lse).abs() <= case.tolerance * l_scale)
    scale = want_o.abs().max().clamp_min(1e-300)
    same_o = ((got_o - want_o).abs() <= case.tolerance * scale).all(dim=-1)
    wrong = (~(same_l & same_o)).nonzero()
    lines = [", ".join(verdicts)]
    if len(wrong):
        row = int(wrong[0])
        parts = ", ".join(f"{x:.6g}" for x in lse_parts[:, row].tolist())
        lines.append(f"row {row}: the chunks' L_s = [{parts}]: expected L = {want_lse[row].item():.6g}, "
                     f"got {got_lse[row].item():.6g}")
    return lines


MERGE_SPLITS_CHECK = Check(
    MERGE_SPLITS, _merge_cases, MERGE_MISTAKES, explain=_explain_merge,
    nonfinite_hint=("NaN or inf: NaN usually comes from -inf - (-inf) in a row where every chunk is empty "
                    "(subtract 0 where the max is -inf) or from 0 / 0 (divide only where the sum of the weights "
                    "is > 0); inf from exp(L_s) of a large L_s without subtracting the max"))


def check_merge_splits(fn, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check ``fn(o_parts, lse_parts) -> (o, lse)``: the merge of S split-KV partials."""
    return run_check(MERGE_SPLITS_CHECK, fn, seed=seed, time_limit_s=time_limit_s)


# ===================================================================== paged_gather_index

def _pack(pages: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """(B, T, 2) int64: the page and the row of every token."""
    return torch.stack([pages.long(), rows.long()], dim=-1)


def _lookup(block_table: torch.Tensor, logical: torch.Tensor) -> torch.Tensor:
    """block_table[b, logical[b, t]] for every (b, t) (negative indices wrap, as advanced indexing does)."""
    samples = torch.arange(block_table.shape[0])[:, None].expand_as(logical)
    return block_table.long()[samples, logical.long()]


def _right_index(block_table, page_size, positions):
    return _lookup(block_table, positions // page_size), positions % page_size


def _variants(*makers):
    """A Mistake's compute: each maker(block_table, page_size, positions) -> (pages, rows), packed;
    one that cannot be computed on a case (an index out of range) is left out."""
    def compute(block_table, page_size, positions):
        out = []
        for make in makers:
            try:
                out.append(_pack(*make(block_table, page_size, positions)))
            except (IndexError, RuntimeError):
                out.append(None)
        return out
    return compute


def _other_sample(block_table, page_size, positions):
    """table[t, logical[b, t]]: block_table[torch.arange(B), logical] where T == B broadcasts along tokens."""
    batch, tokens = positions.shape
    if tokens != batch:
        raise IndexError("applies when T == B")
    samples = torch.arange(tokens)[None, :].expand(batch, tokens)
    return block_table.long()[samples, positions // page_size], positions % page_size


GATHER_MISTAKES = (
    Mistake("table ignored",
            "the page was taken as position // page_size: that is the token's *logical* page, its page number "
            "within its own sequence. The pool page that holds it is written in the block table: "
            "block_table[b, position // page_size], with b the token's sample",
            _variants(lambda t, ps, p: (p // ps, p % ps))),
    Mistake("// and % swapped",
            "// and % are swapped: the logical page is position // page_size (how many whole pages come before "
            "the token), the row inside the page is position % page_size",
            _variants(lambda t, ps, p: (_lookup(t, p % ps), p // ps), lambda t, ps, p: (p % ps, p // ps))),
    Mistake("off by one at a page boundary",
            "off by one at a page boundary: positions count from 0, so logical page j holds positions "
            "j * page_size to (j + 1) * page_size - 1, and position p is in page p // page_size (rounded down: "
            "(p + page_size - 1) // page_size is how many pages p tokens fill, not the page of token p) at row "
            "p % page_size",
            _variants(lambda t, ps, p: (_lookup(t, (p + ps - 1) // ps), p % ps),
                      lambda t, ps, p: (_lookup(t, (p - 1) // ps), (p - 1) % ps),
                      lambda t, ps, p: (_lookup(t, p // ps + 1), p % ps),
                      lambda t, ps, p: (_lookup(t, (p + 1) // ps), (p + 1) % ps))),
    Mistake("another sample's row of the table",
            "the page came from another sample's row of the table: each sequence has its own pages, and token "
            "t of sample b is in page block_table[b, positions[b, t] // page_size]. Pair every position with "
            "its own sample: torch.gather(block_table, 1, positions // page_size), or "
            "block_table[torch.arange(B)[:, None], positions // page_size]",
            _variants(lambda t, ps, p: (t.long()[0][p // ps], p % ps),
                      lambda t, ps, p: (t.long().flatten()[p // ps], p % ps),
                      lambda t, ps, p: (torch.gather(t.long(), 0, p // ps), p % ps),
                      _other_sample)),
    Mistake("pair swapped",
            "the pair is (pages, rows), in that order: the page first (the pool's first index), then the row "
            "inside it",
            _variants(lambda t, ps, p: tuple(reversed(_right_index(t, ps, p))))),
)


# --------------------------------------------------------------------- gather cases

def _gather_case(description: str, block_table, page_size: int, positions) -> Case:
    block_table = torch.as_tensor(block_table, dtype=torch.int32)
    positions = torch.as_tensor(positions, dtype=torch.int64)
    batch, tokens = positions.shape
    pages = block_table.shape[1]
    return Case(f"B = {batch}, page_size = {page_size}, block_table ({batch}, {pages}) int32, positions "
                f"({batch}, {tokens}) int64: {description}",
                (block_table, page_size, positions), _pack(*_right_index(block_table, page_size, positions)), 0.0,
                shape_words="one (page, row) per token")


def _table_text(block_table) -> str:
    return "; ".join(f"sample {b}: {row}" for b, row in enumerate(block_table))


def _fixed_gather_cases() -> list[Case]:
    """Three cases written out, the same in every run: page boundaries, a decoding step, a prefill chunk."""
    table = [[7, 2, 11, 0, -1, -1, -1], [5, 9, 1, 14, 3, 8, -1], [12, 6, -1, -1, -1, -1, -1]]
    positions = [[0, 3, 4, 7, 8, 11, 12, 5], [0, 4, 8, 12, 16, 20, 21, 19], [0, 1, 2, 3, 4, 5, 5, 3]]
    decode_table = [[3, 10, -1, -1], [8, 0, -1, -1], [5, 1, 11, -1], [2, 9, 4, 6]]
    prefill_table = [[17, -1, -1, -1, -1], [4, 20, -1, -1, -1], [9, 0, 13, -1, -1], [22, 6, 15, 2, 11]]
    return [
        _gather_case("sequences of 13, 22 and 6 tokens in pages of 4 from a pool of 16, the tables shuffled "
                     f"(unused entries -1): {_table_text(table)}; positions on both sides of every page boundary "
                     "(3 | 4, 7 | 8, ...)", table, 4, positions),
        _gather_case("one decoding step: where each sequence's next token goes, at cache_seqlens = 0, 15, 16 and 47 "
                     f"(positions 15 and 47 end a page, 16 starts one); pages of 16: {_table_text(decode_table)}",
                     decode_table, 16, [[0], [15], [16], [47]]),
        _gather_case("a prefill chunk of 4 new tokens for each of 4 sequences, at cache_seqlens = 0, 6, 13 and 29 "
                     f"(the chunks cross pages of 8): {_table_text(prefill_table)}",
                     prefill_table, 8, [[0, 1, 2, 3], [6, 7, 8, 9], [13, 14, 15, 16], [29, 30, 31, 32]]),
    ]


def _random_gather_case(gen, description: str) -> Case:
    def integer(low, high):  # inclusive
        return int(torch.randint(low, high + 1, (1,), generator=gen))

    batch, page_size, max_pages, tokens = integer(2, 6), [4, 8, 16][integer(0, 2)], integer(3, 8), integer(1, 12)
    pool = batch * max_pages + integer(0, 5)
    table = torch.randperm(pool, generator=gen)[:batch * max_pages].view(batch, max_pages)
    lengths = torch.randint(1, max_pages * page_size + 1, (batch,), generator=gen)
    used = -(-lengths // page_size)
    table = table.masked_fill(torch.arange(max_pages)[None, :] >= used[:, None], -1)
    positions = (torch.rand(batch, tokens, generator=gen, dtype=torch.float64) * lengths[:, None]).long()
    return _gather_case(f"{description}: sequences of {lengths.tolist()} tokens in a pool of {pool} pages, "
                        f"{tokens} random positions each", table, page_size, positions)


def _gather_cases(gen):
    cases = _fixed_gather_cases()
    cases += [_random_gather_case(gen, f"random tables {i + 1}") for i in range(3)]
    return cases


def _as_pair(out, positions: torch.Tensor):
    """The learner's (pages, rows) as two (B, T) integer tensors, or a clear error."""
    want = tuple(positions.shape)
    if isinstance(out, torch.Tensor):
        raise WrongReturn("paged_gather_index must return a pair (pages, rows), got one Tensor: return the page and "
                        "the row of each token separately (a flat index page * page_size + row is one tensor)")
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        what = type(out).__name__ + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else "")
        raise WrongReturn(f"paged_gather_index must return a pair (pages, rows), got a {what}")
    pair = []
    for name, value in zip(("pages", "rows"), out):
        if not isinstance(value, torch.Tensor):
            raise WrongReturn(f"paged_gather_index returned {name} as a {type(value).__name__}, "
                              "expected a torch.Tensor")
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise WrongReturn(f"paged_gather_index returned {name} of dtype {value.dtype}: pages and rows are integer "
                            "indices (use // for the page number, not /, and keep the integer dtypes)")
        if tuple(value.shape) != want:
            raise WrongReturn(f"paged_gather_index returned {name} of shape {tuple(value.shape)}, expected {want}, "
                             "the shape of positions (B, T): one page and one row per token")
        pair.append(value)
    return _pack(*pair)


def _call_gather(learner, case: Case):
    block_table, page_size, positions = case.args
    out = learner(block_table, page_size, positions)
    if out is None:
        return None
    return _as_pair(out, positions)


def _explain_gather(case: Case, out: torch.Tensor) -> list[str]:
    """The first wrong token, in words: its position, logical page, table entry, expected and got."""
    block_table, page_size, positions = case.args
    wrong = (out != case.expected).any(dim=-1).nonzero()
    if not len(wrong):
        return []
    b, t = (int(i) for i in wrong[0])
    p = int(positions[b, t])
    j = p // page_size
    page, row = (int(x) for x in case.expected[b, t])
    got = tuple(int(x) for x in out[b, t])
    return [f"sample {b}, token {t}: position {p} is in logical page {p} // {page_size} = {j}, and "
            f"block_table[{b}, {j}] = {page}: expected (page, row) = ({page}, {row}) (row {p} % {page_size} = "
            f"{row}), got {got}"]


PAGED_GATHER_INDEX_CHECK = Check(PAGED_GATHER_INDEX, _gather_cases, GATHER_MISTAKES, call=_call_gather,
                                 explain=_explain_gather)


def check_paged_gather_index(fn, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check ``fn(block_table, page_size, positions) -> (pages, rows)``: where tokens sit in a paged cache."""
    return run_check(PAGED_GATHER_INDEX_CHECK, fn, seed=seed, time_limit_s=time_limit_s)
