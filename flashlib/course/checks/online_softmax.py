"""Checks for notebook 03 (online softmax): the (m, l, acc) update and the merge of partials.

Exercise signatures (stated in the notebook; 2-D tensors, one entry per query row):

* ``online_update(m, l, acc, scores, v) -> (m_new, l_new, acc_new)`` with m, l (M,),
  acc (M, D) unnormalised, scores (M, Bn) already scaled and masked (-inf), v (Bn, D).
* ``merge_partials(a, b) -> (m, l, o)`` with a = (m_a, l_a, o_a), b = (m_b, l_b, o_b),
  m, l (M,) and o (M, D) normalised, over two disjoint sets of keys.

The learner's answer runs on float64 inputs. The first cases of each check are
fixed (the same values whatever the seed), built row by row to catch the wrong
answers that random inputs catch only sometimes: rows that have seen no key yet
(m = -inf, l = 0) meeting visible but very negative scores (-3, -200, -1000) or a
fully masked block, running maxima far apart, empty sides of a merge. Seeded random
cases follow: single steps from a real running state, first blocks with fully masked
rows (-inf), large logits (x 1000), and whole problems run block by block (or chunk
by chunk) against softmax(scores) @ V. A state is compared as one tensor (M, 2 + D)
per case: the columns are m, l and then acc (or o); where the right m is -inf (no
visible key yet) the learner's m must be -inf too (the comparison asks for the same
infinities at the same places). The wrong answers it names: l or acc not rescaled,
the factor's sign flipped, NaN from -inf - (-inf), -inf replaced by 0 before the max
(m = 0 instead of a negative max, exp underflowing to 0), m = 0 instead of -inf for
a row that has seen no key, the old max dropped, acc normalised too early; a merge
without normalisation, without weights, with weights l only, with the sign flipped,
exp(m) without the max, and the same two -inf slips.

Every case's args are plain data (tensors, ints, tuples, lists, dicts), so that a
case can be saved with torch.save and loaded with ``weights_only=True``.
"""
from __future__ import annotations

import torch

from ...online_softmax import safe_shift, finalize, initial_state, online_softmax_step
from ...reference import stable_softmax
from ...validation import tolerance
from .framework import (Case, Check, Mistake, WrongReturn, copy_tensors, error_from, fixed_generator, raise_if_changed,
                        register, run_check)

NOTEBOOK = "03_online_softmax"
ONLINE_UPDATE = register(NOTEBOOK, "online_update", 2,
                         "The (m, l, acc) update for one key block: running max, rescale, -inf safe")
MERGE_PARTIALS = register(NOTEBOOK, "merge_partials", 2,
                          "Merge two partial softmaxes (m, l, o) over disjoint keys, exactly")

NEG_INF = float("-inf")
TOLERANCE = tolerance(torch.float64)

#: The seed of the fixed cases: the same values in every run, whatever the exercise's seed
#: (the grader's hidden draw mixes it with its own: :func:`~.framework.fixed_generator`).
FIXED_SEED = 20240303


# ----------------------------------------------------------------------- packing

def _pack(m, l, x):  # noqa: E741
    """One tensor (M, 2 + D): columns m, l, x. An m of -inf stays -inf (the judge asks for the same
    infinities at the same places), so that m = 0 for a row that has seen no key is wrong."""
    return torch.cat([m.unsqueeze(-1), l.unsqueeze(-1), x], dim=-1)


def _as_state(out, who: str, rows: int, head_dim: int, names=("m_new", "l_new", "acc_new")):
    """The learner's (m, l, x) as float64 tensors of shapes (M,), (M,), (M, D), or a clear error."""
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        got = type(out).__name__ + (f" of length {len(out)}" if isinstance(out, (tuple, list)) else "")
        raise WrongReturn(f"{who} must return a tuple ({', '.join(names)}), got a {got}")
    shapes = ((rows,), (rows,), (rows, head_dim))
    state = []
    for name, value, shape in zip(names, out, shapes):
        if not isinstance(value, torch.Tensor):
            raise WrongReturn(f"{who} returned {name} as a {type(value).__name__}, expected a torch.Tensor")
        if tuple(value.shape) != shape:
            raise WrongReturn(f"{who} returned {name} of shape {tuple(value.shape)}, expected {shape} "
                             f"(M = {rows} query rows, D = {head_dim})")
        state.append(value.detach().double().cpu())
    return tuple(state)


# ------------------------------------------------------------------ online update

def _problem(scores, v, block_n: int) -> dict:
    """A whole attention problem run block by block: scores (M, N) masked, v (N, D).

    A plain dict (not a dataclass), so that a case's args load with torch.load(weights_only=True).
    """
    return {"scores": scores, "v": v, "block_n": int(block_n)}


def _run_problem(step, problem: dict):
    """Fold every key block with ``step``, then normalise: the final (m, l, o), packed."""
    scores, v, block_n = problem["scores"], problem["v"], problem["block_n"]
    rows, head_dim = scores.shape[0], v.shape[1]
    m, l, acc = initial_state((rows,), head_dim)  # noqa: E741
    for start in range(0, scores.shape[1], block_n):
        stop = start + block_n
        m, l, acc = step(m, l, acc, scores[:, start:stop].clone(), v[start:stop].clone())  # noqa: E741
    return _pack(*finalize(m, l, acc))


def _update_outcome(step, *args):
    """What ``step`` gives on a case: one packed step, or a whole problem's packed result."""
    if len(args) == 1:
        return _run_problem(step, args[0])
    return _pack(*step(*args))


def _step_variant(m, l, acc, scores, v, *, rescale_l=True, rescale_acc=True, sign=1.0,  # noqa: E741
                  guard=True, keep_old_max=True, shift=True, normalise=False, return_old_m=False,
                  zero_m_first=False, zero_empty_m=False):
    """The update with one part done the way a typical bug does it.

    ``zero_m_first``: m = -inf replaced by 0 *before* the max (so m_new >= 0 in a row that has
    seen no key); ``zero_empty_m``: the guard applied to m_new itself (m_new = 0, not -inf, in a
    row that has seen no key, and that 0 returned).
    """
    if zero_m_first:
        m = safe_shift(m)
    block_max = scores.amax(dim=-1)
    m_new = torch.maximum(m, block_max) if keep_old_max else block_max
    if zero_empty_m:
        m_new = safe_shift(m_new)
    m_ref = safe_shift(m_new) if guard else m_new
    if not shift:  # no max at all: everything relative to 0
        m_ref = torch.zeros_like(m_new)
    alpha = torch.exp(sign * (m - m_ref)) if shift else torch.ones_like(m)
    p = torch.exp(scores - m_ref.unsqueeze(-1))
    l_new = (alpha * l if rescale_l else l) + p.sum(dim=-1)
    acc_new = (alpha.unsqueeze(-1) * acc if rescale_acc else acc) + p @ v
    if normalise:
        acc_new = acc_new / l_new.unsqueeze(-1)
    return (m if return_old_m else m_new), l_new, acc_new


def _update_mistake(name, message, **variant):
    return Mistake(name, message, lambda *args: _update_outcome(
        lambda *state: _step_variant(*state, **variant), *args))


UPDATE_MISTAKES = (
    _update_mistake(
        "l not rescaled",
        "l was not rescaled: when the max grows, the old sum is relative to the old max. "
        "Use l_new = exp(m - m_new) * l + p.sum(-1)", rescale_l=False),
    _update_mistake(
        "acc not rescaled",
        "acc was not rescaled: when the max grows, the old accumulator is relative to the old max. "
        "Use acc_new = exp(m - m_new)[:, None] * acc + p @ v", rescale_acc=False),
    _update_mistake(
        "nothing rescaled",
        "neither l nor acc was rescaled: multiply both by alpha = exp(m - m_new) before adding "
        "this block's terms", rescale_l=False, rescale_acc=False),
    _update_mistake(
        "sign flipped",
        "the rescale factor's sign is flipped: it is exp(m_old - m_new) (at most 1, since the max "
        "only grows), not exp(m_new - m_old)", sign=-1.0),
    _update_mistake(
        "no -inf guard",
        "NaN from -inf - (-inf): a row with m = -inf (no visible key yet) met a fully masked block, "
        "so m_new = -inf and exp(scores - m_new) is exp(NaN). Subtract 0 where m_new is -inf: "
        "m_safe = torch.where(m_new == float('-inf'), 0.0, m_new)", guard=False),
    _update_mistake(
        "-inf zeroed before the max",
        "m = -inf was replaced by 0 before the max: a row that has seen no key yet then gets "
        "m_new = max(0, scores) = 0 when every new score is negative, instead of the row's max, and "
        "exp(scores - 0) underflows to 0 for very negative scores (l = 0: the row looks empty). Take "
        "m_new = torch.maximum(m, scores.amax(-1)) with m as it is (-inf), and replace -inf by 0 only "
        "in the value you subtract: m_safe = torch.where(m_new == float('-inf'), 0.0, m_new)",
        zero_m_first=True),
    _update_mistake(
        "m = 0 for an empty row",
        "m_new is 0 in a row that has seen no visible key yet: it must stay -inf there (the max of no "
        "scores, with l = 0 and acc = 0). Apply the -inf guard only to the value you subtract, "
        "m_safe = torch.where(m_new == float('-inf'), 0.0, m_new), and return m_new itself: an m of 0 "
        "claims a max the row has not seen, and later very negative scores, exp(scores - 0), "
        "underflow to 0",
        zero_empty_m=True),
    _update_mistake(
        "old max dropped",
        "m_new must be the max of the old m and this block's row max, "
        "torch.maximum(m, scores.amax(-1)): the max so far, not the block's max", keep_old_max=False),
    _update_mistake(
        "scores not shifted",
        "the scores are not shifted by the running max: p = exp(scores) is relative to 0 while l and "
        "acc are relative to m, and exp(scores) overflows for large logits (underflows for very "
        "negative ones). Use p = exp(scores - m_new[:, None]) and rescale the old state by "
        "exp(m - m_new)",
        shift=False),
    _update_mistake(
        "acc normalised",
        "acc was divided by l: acc must stay unnormalised (sum of exp(s - m) * v); the division "
        "by l happens once, after the last block", normalise=True),
    _update_mistake(
        "old m returned",
        "l and acc look right but m was not updated: return m_new = torch.maximum(m, "
        "scores.amax(-1)), the max the new l and acc are relative to", return_old_m=True),
)


def _reference_state(gen, rows, keys, head_dim, spread=1.0):
    """A running state after one real block of ``keys`` keys: (m, l, acc)."""
    scores = torch.randn(rows, keys, generator=gen, dtype=torch.float64) * spread
    v = torch.randn(keys, head_dim, generator=gen, dtype=torch.float64)
    return online_softmax_step(*initial_state((rows,), head_dim), scores, v)


def _step_case(description, m, l, acc, scores, v) -> Case:  # noqa: E741
    m_right = torch.maximum(m, scores.amax(dim=-1))
    expected = _pack(*online_softmax_step(m, l, acc, scores, v))
    return Case(description, (m, l, acc, scores, v), expected, TOLERANCE,
                shape_words="one row per query: [m, l, acc]",
                context={"empty_rows": torch.isneginf(m_right), "x_name": "acc"})


def _problem_case(description, scores, v, block_n) -> Case:
    m_right = scores.amax(dim=-1)
    empty = torch.isneginf(m_right)
    safe_m = torch.where(empty, torch.zeros_like(m_right), m_right)
    l_right = torch.exp(scores - safe_m.unsqueeze(-1)).sum(dim=-1)
    expected = _pack(m_right, l_right, stable_softmax(scores, dim=-1) @ v)
    return Case(description, (_problem(scores, v, block_n),), expected, TOLERANCE,
                shape_words="one row per query: [m, l, o]",
                context={"empty_rows": empty, "x_name": "o = acc / l"})


def _with_row_max(scores, target):
    """``scores`` shifted row by row so that each row's max is ``target`` (M,)."""
    return scores + (target - scores.amax(dim=-1)).unsqueeze(-1)


def _designed_scores(gen, row_max, keys: int, masked=()) -> torch.Tensor:
    """Scores (len(row_max), keys): standard normal, shifted so that row r's max is row_max[r]
    (-inf: the whole row masked); in the rows of ``masked``, a third of the entries other than
    the max are -inf too."""
    row_max = torch.tensor(row_max, dtype=torch.float64)
    scores = torch.randn(len(row_max), keys, generator=gen, dtype=torch.float64)
    finite = torch.isfinite(row_max)
    scores = _with_row_max(scores, torch.where(finite, row_max, torch.zeros_like(row_max)))
    for r in masked:
        hide = torch.rand(keys, generator=gen) < 0.34
        hide[scores[r].argmax()] = False
        scores[r] = scores[r].masked_fill(hide, NEG_INF)
    scores[~finite] = NEG_INF
    return scores


def _fixed_update_cases() -> list[Case]:
    """Two steps made row by row, the same in every run: what random states catch only sometimes."""
    gen = fixed_generator(FIXED_SEED)
    rows, keys, block, d = 6, 5, 8, 4

    def step_from(previous_max, new_max, masked=()):
        """A real state after a block whose row maxima are ``previous_max`` (-inf: no key seen),
        and a new block of scores whose row maxima are ``new_max``."""
        previous = _designed_scores(gen, previous_max, keys)
        v_previous = torch.randn(keys, d, generator=gen, dtype=torch.float64)
        state = online_softmax_step(*initial_state((rows,), d), previous, v_previous)
        return (*state, _designed_scores(gen, new_max, block, masked),
                torch.randn(block, d, generator=gen, dtype=torch.float64))

    seen = step_from([1.0, 2.0, -300.0, 0.7, -2.0, 5.0], [3.0, 0.5, -250.0, NEG_INF, 40.0, 4.75], masked=(5,))
    unseen = step_from([NEG_INF] * 5 + [-1.0], [1.3, -2.5, -180.0, -900.0, NEG_INF, -3.0], masked=(0,))
    return [
        _step_case(f"{rows} query rows that have seen keys, a block of {block} keys, D = {d}, float64: "
                   "the running max grows in rows 0 (1 -> 3), 2 (-300 -> -250) and 4 (-2 -> 40) and stays "
                   "in rows 1 and 5 (row 5 partly masked); row 3's block is fully masked (-inf), so its "
                   "state must not change", *seen),
        _step_case("rows 0-4 have seen no key yet (m = -inf, l = 0, acc = 0); this block's row max is "
                   "1.3 (row 0, some scores -inf), -2.5 (row 1), -180 (row 2), -900 (row 3: exp(score) "
                   "alone underflows to 0), and row 4 is fully masked (it stays empty: m = -inf); row 5 "
                   "has seen keys (m = -1, new scores up to -3)", *unseen),
    ]


def _update_cases(gen):
    def randn(*shape, scale=1.0):
        return torch.randn(shape, generator=gen, dtype=torch.float64) * scale

    def rand(*shape):
        return torch.rand(shape, generator=gen, dtype=torch.float64)

    rows, block, d = 6, 8, 4
    grows = torch.tensor([1.0, -1.0] * (rows // 2), dtype=torch.float64)  # +1: the max grows
    cases = _fixed_update_cases()
    # 3: the max grows in even rows and stays in odd rows
    m, l, acc = _reference_state(gen, rows, 5, d)  # noqa: E741
    scores = _with_row_max(randn(rows, block), m + grows * (0.5 + 2 * rand(rows)))
    cases.append(_step_case(f"{rows} query rows, a block of {block} keys, D = {d}, float64; the running "
                        "max grows in rows 0, 2, 4 and stays in rows 1, 3, 5",
                        m, l, acc, scores, randn(block, d)))
    # 4: the first block, some entries masked, rows 1 and 4 fully masked
    scores = randn(rows, block).masked_fill(rand(rows, block) < 0.3, NEG_INF)
    scores[[1, 4]] = NEG_INF
    cases.append(_step_case("the first block (m = -inf, l = 0, acc = 0); some scores -inf, rows 1 and 4 "
                            "fully masked (every score -inf)", *initial_state((rows,), d), scores,
                            randn(block, d)))
    # 5: a fully masked block after visible keys (rows 0-3), and an empty row meeting one (row 5)
    m, l, acc = _reference_state(gen, rows, 5, d)  # noqa: E741
    m[5], l[5], acc[5] = NEG_INF, 0.0, 0.0
    scores = randn(rows, block)
    scores[[0, 1, 2, 3, 5]] = NEG_INF
    cases.append(_step_case("a later block that is fully masked (-inf) for rows 0, 1, 2, 3 and 5; "
                            "row 5 has seen no visible key yet (m = -inf, l = 0)", m, l, acc, scores,
                            randn(block, d)))
    # 6: large logits: the max grows (even rows) or falls short (odd rows) by hundreds
    m, l, acc = _reference_state(gen, rows, 5, d, spread=1000.0)  # noqa: E741
    scores = _with_row_max(randn(rows, block, scale=1000.0), m + grows * (100 + 500 * rand(rows)))
    cases.append(_step_case("large logits (standard normal x 1000; the max grows by hundreds in rows "
                            "0, 2, 4): exp(scores) overflows unless shifted by the max",
                            m, l, acc, scores, randn(block, d)))
    # 7: a whole problem, block by block; every block raises the max of the keys before it
    n_q, n_k, block_n = 10, 22, 4
    scores = randn(n_q, n_k, scale=30.0)
    for start in range(block_n, n_k, block_n):
        scores[:, start] = scores[:, :start].amax(dim=-1) + 1 + 10 * rand(n_q)
    visible = torch.arange(n_k).unsqueeze(0) <= 3 * (torch.arange(n_q).unsqueeze(1) - 2)
    scores = scores.masked_fill(~visible, NEG_INF)  # rows 0 and 1 see no key
    cases.append(_problem_case(f"a whole problem: {n_q} queries, {n_k} keys in blocks of {block_n} "
                               "(the last one 2 wide), query i sees keys j <= 3 (i - 2) (rows 0 and 1 "
                               "see none), logits x 30, the max grows in every block; your update runs "
                               "on every block from m = -inf, l = 0, acc = 0, then o = acc / l "
                               "(0 where l = 0)", scores, randn(n_k, 5), block_n))
    return cases


class _NoneReturned(Exception):
    """The learner's function returned None (a missing return)."""


def _call_update(learner, case: Case):
    def step(m, l, acc, scores, v):  # noqa: E741
        given = copy_tensors((m, l, acc, scores, v))
        out = learner(*given)
        if out is None:
            raise _NoneReturned
        raise_if_changed(given, (m, l, acc, scores, v), ("m", "l", "acc", "scores", "v"))
        return _as_state(out, "online_update", m.shape[0], acc.shape[1])

    try:
        return _update_outcome(step, *copy_tensors(case.args))
    except _NoneReturned:
        return None


def _same_m(got: torch.Tensor, want: torch.Tensor, tol: float) -> torch.Tensor:
    """Per row: whether the learner's m is the right one (-inf exactly where the right m is -inf)."""
    finite = torch.isfinite(want)
    close = (got - want).abs() <= tol * want[finite].abs().max().clamp_min(1.0) if finite.any() else finite
    return torch.where(finite, torch.isfinite(got) & close, got == want)


def _explain_parts(case: Case, out: torch.Tensor) -> list[str]:
    """Which of m, l and acc (or o) are wrong, and what the first row with a wrong m should hold."""
    x_name = case.context["x_name"]
    expected = case.expected
    parts = [("m", out[:, 0], expected[:, 0]), ("l", out[:, 1], expected[:, 1]),
             (x_name, out[:, 2:], expected[:, 2:])]
    verdicts = [f"{name} {'right' if error_from(o, e) <= case.tolerance else 'wrong'}"
                for name, o, e in parts]
    lines = [f"compared per query row as [m, l, {x_name}] (column 0 is m, 1 is l): "
             + ", ".join(verdicts)]
    got_m, want_m = out[:, 0].double().cpu(), expected[:, 0]
    empty = case.context["empty_rows"]
    wrong_m = ~_same_m(got_m, want_m, case.tolerance)
    # the first row with keys whose m is wrong, and the first empty row whose m is not -inf, in row order
    rows = sorted(int(wrong.nonzero()[0]) for wrong in (wrong_m & ~empty, wrong_m & empty) if wrong.any())
    return lines + [_explain_m(case, row, got_m, want_m) for row in rows]


def _explain_m(case: Case, row: int, got_m: torch.Tensor, want_m: torch.Tensor) -> str:
    """Why row ``row`` has the m it should have, and what the learner's m is."""
    got, want = f"{got_m[row].item():.6g}", f"{want_m[row].item():.6g}"
    if case.context["empty_rows"][row]:
        where = "is empty on both sides (no key in a or in b)" if len(case.args) == 2 else "has seen no visible key"
        return f"row {row} {where}: m must stay -inf (with l = 0), got m = {got}"
    if len(case.args) == 5:  # one step: m_new = max(m, this block's max)
        m, scores = case.args[0], case.args[3]
        return (f"row {row}: m = {m[row].item():.6g} before this block, whose max is "
                f"{scores[row].amax().item():.6g}: m_new = the larger of the two = {want}, got {got}")
    if len(case.args) == 2:  # one merge: m = max(m_a, m_b)
        m_a, m_b = case.args[0][0], case.args[1][0]
        return (f"row {row}: m_a = {m_a[row].item():.6g}, m_b = {m_b[row].item():.6g}: "
                f"m = max(m_a, m_b) = {want}, got {got}")
    return f"row {row}: the max over every key it sees is {want}, got m = {got}"


ONLINE_UPDATE_CHECK = Check(
    ONLINE_UPDATE, _update_cases, UPDATE_MISTAKES, call=_call_update, explain=_explain_parts,
    nonfinite_hint=("NaN or inf: NaN usually comes from exp(-inf - (-inf)) in a row with no visible "
                    "key (subtract 0 where m_new is -inf); inf from exp of unshifted large scores"))


def check_online_update(fn, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check ``fn(m, l, acc, scores, v) -> (m_new, l_new, acc_new)``, the update for one key block."""
    return run_check(ONLINE_UPDATE_CHECK, fn, seed=seed, time_limit_s=time_limit_s)


# ------------------------------------------------------------------------- merge

def _merge_variant(a, b, *, weights="exp", sign=1.0, guard=True, normalise=True,
                   l_from="weights", first_m=False, zero_m_first=False, zero_empty_m=False):
    """The merge with one part done the way a typical bug does it.

    ``weights``: "exp" (l * exp(sign * (m_side - m))), "l" (l alone), "no max"
    (l * exp(m_side)) or "none" (1 each); ``l_from``: "weights" (w_a + w_b),
    "right" (the correct l) or "plain" (l_a + l_b). ``zero_m_first``: each side's
    m = -inf replaced by 0 before the max; ``zero_empty_m``: the merged m = 0, not -inf,
    where both sides are empty.
    """
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    if zero_m_first:
        m_a, m_b = safe_shift(m_a), safe_shift(m_b)
    m = torch.maximum(m_a, m_b)
    m_ref = safe_shift(m) if guard else m
    if weights == "exp":
        w_a, w_b = l_a * torch.exp(sign * (m_a - m_ref)), l_b * torch.exp(sign * (m_b - m_ref))
    elif weights == "l":
        w_a, w_b = l_a, l_b
    elif weights == "no max":
        w_a, w_b = l_a * torch.exp(m_a), l_b * torch.exp(m_b)
    else:
        w_a, w_b = torch.ones_like(l_a), torch.ones_like(l_b)
    right_l = l_a * torch.exp(m_a - safe_shift(m)) + l_b * torch.exp(m_b - safe_shift(m))
    l = {"weights": w_a + w_b, "right": right_l, "plain": l_a + l_b}[l_from]  # noqa: E741
    o = w_a.unsqueeze(-1) * o_a + w_b.unsqueeze(-1) * o_b
    if normalise:
        total = w_a + w_b
        o = o / torch.where(total > 0, total, torch.ones_like(total)).unsqueeze(-1)
    if zero_empty_m:
        m = safe_shift(m)
    return (m_a if first_m else m), l, o


def _merge_all(merge, parts):
    """((p0 + p1) + (p2 + p3)): a tree of merges over four chunks."""
    return merge(merge(parts[0], parts[1]), merge(parts[2], parts[3]))


def _merge_outcome(merge, *args):
    """What ``merge`` gives on a case, packed: two partials, or a tree over four chunks."""
    out = _merge_all(merge, args[0]) if len(args) == 1 else merge(*args)
    return _pack(*out)


def _merge_mistake(name, message, *variants):
    """A mistake with one or more variants (keyword sets for :func:`_merge_variant`)."""
    return Mistake(name, message, lambda *args: [
        _merge_outcome(lambda a, b, kw=kw: _merge_variant(a, b, **kw), *args) for kw in variants])


MERGE_MISTAKES = (
    _merge_mistake(
        "not normalised",
        "the merged output is not normalised: divide w_a * o_a + w_b * o_b by l = w_a + w_b, "
        "so that the two weights sum to 1",
        dict(normalise=False), dict(normalise=False, l_from="plain")),
    _merge_mistake(
        "outputs added",
        "the outputs are added (or averaged) without weights: each side counts in proportion to "
        "its share of the row's exp-mass, w = l * exp(m_side - m), and o = (w_a o_a + w_b o_b) / "
        "(w_a + w_b)",
        *[dict(weights="none", normalise=normalise, l_from=l_from)
          for normalise in (False, True) for l_from in ("right", "plain", "weights")]),
    _merge_mistake(
        "weights without exp",
        "the weights are l_a and l_b alone: each l is relative to its own max, so move it to the "
        "common max first, w = l * exp(m_side - m) with m = max(m_a, m_b)",
        dict(weights="l"), dict(weights="l", l_from="right")),
    _merge_mistake(
        "sign flipped",
        "the sign in the exp is flipped: each side's weight is l * exp(m_side - m) (at most l, "
        "since m is the larger max), not l * exp(m - m_side)",
        dict(sign=-1.0), dict(sign=-1.0, l_from="right")),
    _merge_mistake(
        "l not rescaled",
        "o looks right but l is not: the merged l is relative to the merged max, "
        "l = l_a * exp(m_a - m) + l_b * exp(m_b - m)",
        dict(l_from="plain")),
    _merge_mistake(
        "no -inf guard",
        "NaN where both sides are empty (m = -inf, l = 0): exp(-inf - (-inf)) is NaN. Subtract 0 "
        "where the merged m is -inf, and give l = 0, o = 0 there",
        dict(guard=False)),
    _merge_mistake(
        "exp(m) without the max",
        "exp(m_a) and exp(m_b) overflow (or underflow to 0) for large logits: subtract the merged "
        "max first, w = l * exp(m_side - max(m_a, m_b))",
        dict(weights="no max")),
    _merge_mistake(
        "-inf zeroed before the max",
        "an empty side's m = -inf was replaced by 0 before the max: where one side is empty and the "
        "other side's max is negative, the merged m comes out 0 instead of that max, and its weight "
        "l * exp(m_side - 0) underflows to 0 for very negative maxima. Take m = torch.maximum(m_a, m_b) "
        "as they are (-inf included), and replace -inf by 0 only in the value you subtract",
        dict(zero_m_first=True)),
    _merge_mistake(
        "m = 0 where both are empty",
        "where both sides are empty (m = -inf, l = 0) the merged m must stay -inf, not 0: it is the max "
        "of no keys. Apply the -inf guard only to the value you subtract, m_safe = "
        "torch.where(m == float('-inf'), 0.0, m), and return m itself",
        dict(zero_empty_m=True)),
    _merge_mistake(
        "m not the max",
        "the merged m must be max(m_a, m_b), the max over both key sets",
        dict(first_m=True)),
)


def _partial(scores, v):
    """(m, l, o) of softmax attention over these keys (reference, from its definition)."""
    m = scores.amax(dim=-1)
    safe_m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    return (m, torch.exp(scores - safe_m.unsqueeze(-1)).sum(dim=-1), stable_softmax(scores, dim=-1) @ v)


def _merge_case(description, scores, v, cuts) -> Case:
    """Partials over the key ranges between ``cuts``; expected: the partial over all keys."""
    parts = [_partial(scores[:, a:b], v[a:b]) for a, b in zip(cuts, cuts[1:])]
    whole = _partial(scores, v)
    expected = _pack(*whole)
    args = (parts,) if len(parts) > 2 else tuple(parts)
    return Case(description, args, expected, TOLERANCE, shape_words="one row per query: [m, l, o]",
                context={"empty_rows": torch.isneginf(whole[0]), "x_name": "o"})


def _fixed_merge_cases() -> list[Case]:
    """Two merges made row by row, the same in every run: maxima far apart, empty sides."""
    gen = fixed_generator(FIXED_SEED + 1)
    d, keys_a, keys_b = 4, 7, 5

    def scores_with(max_a, max_b):
        a_part = _designed_scores(gen, max_a, keys_a, masked=range(len(max_a)))
        return torch.cat([a_part, _designed_scores(gen, max_b, keys_b)], dim=-1)

    def values():
        return torch.randn(keys_a + keys_b, d, generator=gen, dtype=torch.float64)

    cuts = [0, keys_a, keys_a + keys_b]
    return [
        _merge_case("4 query rows, D = 4, float64, a = keys 0..6 (some -inf), b = keys 7..11, both sides "
                    "hold keys: the larger max is in a in row 0 (2 vs 0.5) and in b in row 1 (-1 vs 1.5); "
                    "in row 2 the maxima are 1600 apart (+800 in a, -800 in b: exp(m) alone overflows); in "
                    "row 3 both are very negative (-1000 in a, -900 in b)",
                    scores_with([2.0, -1.0, 800.0, -1000.0], [0.5, 1.5, -800.0, -900.0]), values(), cuts),
        _merge_case("6 query rows, a = keys 0..6, b = keys 7..11, with empty sides (m = -inf, l = 0, "
                    "o = 0): a is empty in rows 0 (b's max 1.2) and 1 (b's max -300); b is empty in rows 2 "
                    "(a's max 0.8) and 3 (a's max -1000); both are empty in row 4 (the merged m stays -inf); "
                    "row 5 has keys on both sides",
                    scores_with([NEG_INF, NEG_INF, 0.8, -1000.0, NEG_INF, 0.3],
                                [1.2, -300.0, NEG_INF, NEG_INF, NEG_INF, -0.2]), values(), cuts),
    ]


def _merge_cases(gen):
    def randn(*shape, scale=1.0):
        return torch.randn(shape, generator=gen, dtype=torch.float64) * scale

    rows, d = 6, 4
    cases = _fixed_merge_cases()
    # 3: keys 0..7 and 8..12; side a has the larger max in even rows, side b in odd rows
    a_part, b_part = randn(rows, 8, scale=2.0), randn(rows, 5, scale=2.0)
    lead = 0.5 + 2 * torch.rand(rows, generator=gen, dtype=torch.float64)
    a_part[0::2] = _with_row_max(a_part[0::2], b_part[0::2].amax(dim=-1) + lead[0::2])
    b_part[1::2] = _with_row_max(b_part[1::2], a_part[1::2].amax(dim=-1) + lead[1::2])
    cases.append(_merge_case(f"{rows} query rows, D = {d}, float64: a = keys 0..7, b = keys 8..12; the larger "
                         "max is in a for rows 0, 2, 4 and in b for rows 1, 3, 5",
                         torch.cat([a_part, b_part], dim=-1), randn(13, d), [0, 8, 13]))
    # 4: empty sides: a empty in rows 0, 1; b empty in rows 2, 3; both in row 4
    scores = randn(rows, 10)
    scores[[0, 1, 4], :6] = NEG_INF
    scores[[2, 3, 4], 6:] = NEG_INF
    cases.append(_merge_case("a = keys 0..5, b = keys 6..9 with fully masked sides: a is empty "
                             "(m = -inf, l = 0, o = 0) in rows 0, 1, 4, b in rows 2, 3, 4",
                             scores, randn(10, d), [0, 6, 10]))
    # 5: large logits
    scores = randn(rows, 12, scale=1000.0)
    cases.append(_merge_case("large logits (standard normal x 1000): exp(m) alone overflows",
                             scores, randn(12, d), [0, 5, 12]))
    # 6: four chunks, merged as a tree, some rows with masked chunks
    scores = randn(8, 20, scale=5.0)
    scores[[0, 3], 4:11] = NEG_INF
    scores[5] = NEG_INF
    cases.append(_merge_case("four chunks of keys (0..3, 4..10, 11..15, 16..19), logits x 5, merged as "
                             "merge(merge(p0, p1), merge(p2, p3)); row 5 fully masked",
                             scores, randn(20, d), [0, 4, 11, 16, 20]))
    return cases


def _call_merge(learner, case: Case):
    def merge(a, b):
        given_a, given_b = copy_tensors(a), copy_tensors(b)
        out = learner(given_a, given_b)
        if out is None:
            raise _NoneReturned
        raise_if_changed((*given_a, *given_b), (*a, *b), ("m_a", "l_a", "o_a", "m_b", "l_b", "o_b"))
        return _as_state(out, "merge_partials", a[0].shape[0], a[2].shape[1], names=("m", "l", "o"))

    try:
        return _merge_outcome(merge, *copy_tensors(case.args))
    except _NoneReturned:
        return None


MERGE_PARTIALS_CHECK = Check(
    MERGE_PARTIALS, _merge_cases, MERGE_MISTAKES, call=_call_merge, explain=_explain_parts,
    nonfinite_hint=("NaN or inf: NaN usually comes from exp(-inf - (-inf)) where both sides are "
                    "empty (subtract 0 where the merged m is -inf) or 0/0 (divide by l only where "
                    "l > 0); inf from exp(m) of large logits without subtracting the max"))


def check_merge_partials(fn, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check ``fn(a, b) -> (m, l, o)``: the merge of two partial softmaxes a = (m_a, l_a, o_a), b."""
    return run_check(MERGE_PARTIALS_CHECK, fn, seed=seed, time_limit_s=time_limit_s)
