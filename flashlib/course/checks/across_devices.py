"""Checks for notebook 10 (across devices): merging an incoming partial at one step of ring attention.

Exercise signature (stated in the notebook):

* ``ring_step_merge(o, lse, o_blk, lse_blk) -> (o, lse)``: at one step of the ring, a rank has
  attended its queries to the K/V block that just arrived and got that block's partial: o_blk
  (B, H, N, D), each row's output over the block's keys alone (0 where the row sees none of
  them), and lse_blk (B, H, N), their logsumexp (natural log, -inf where the row sees none).
  Fold it into the running accumulator o (B, H, N, D), lse (B, H, N), the same over every key
  seen at the earlier steps, and return the new (o, lse), float32 like the inputs, without
  changing the inputs. Before the first step the accumulator is empty (o = 0, lse = -inf); a
  causal step whose block no query sees brings o_blk = 0, lse_blk = -inf in every row.

The cases are float32 partials made from real attention problems (float64 scores, each side's
softmax output and logsumexp over its keys, rounded to float32, as flashlib's kernels return
them); the expected result is attention over both key sets at once, in float64, computed without
any merge. The first three cases are fixed (the same whatever the seed): one step whose rows are
written out (the accumulator empty, the block skipped, both empty, logsumexps near +100 where
exp overflows in float32 and near -120 where it underflows, two sides far apart), a step whose
whole block is skipped (the accumulator must come back unchanged), and a first step (the block
must be taken as it is). Seeded cases follow, each a whole ring: the check starts from the empty
accumulator and calls the learner's function once per step, with the blocks a rank of a real ring
gets in order (causal contiguous, with skipped steps; causal zigzag, where half of the rows see a
block; not causal, with logits x 30). The wrong answers it names: the two outputs averaged, added
without (or with only one) rescale, weights exp(L) without the max, weights not divided by their
sum, NaN where both sides are empty, NaN where the block is skipped, NaN where the accumulator is
empty, L returned as the max, L not updated, the two sides' weights swapped, the sign in the exp
flipped.

Every case's args are plain data (tensors, or one dict of tensors for a whole ring), so that a
case can be saved with torch.save and loaded with ``weights_only=True``.
"""
from __future__ import annotations

import torch

from ...online_softmax import safe_shift
from ...reference import stable_softmax
from .framework import Case, Check, Mistake, error_from, fixed_generator, register, run_check

NOTEBOOK = "10_across_devices"
RING_STEP_MERGE = register(NOTEBOOK, "ring_step_merge", 2,
                           "Fold an incoming block's partial (O_blk, L_blk) into the running (O, L) at one "
                           "ring step, -inf safe")

NEG_INF = float("-inf")
#: float32 inputs and plain torch arithmetic (no tl.dot, no TF32, on any device): float32 rounding.
TOLERANCE = 1e-5

#: The seed of the fixed cases: the same values in every run, whatever the exercise's seed
#: (the grader's hidden draw mixes it with its own: :func:`~.framework.fixed_generator`).
FIXED_SEED = 20241010

SHAPE_WORDS = ("(B, H, N, D)", "(B, H, N)")


# ------------------------------------------------------------------------- partials

def _partial(scores: torch.Tensor, v: torch.Tensor):
    """(o (..., M, D), lse (..., M)) of softmax attention of scores (..., M, n) over values (..., n, D), in
    float64, from the definition. A row with no visible key (all -inf) gets o = 0 and lse = -inf."""
    m = scores.amax(dim=-1)
    safe_m = safe_shift(m)
    lse = safe_m + torch.log(torch.exp(scores - safe_m.unsqueeze(-1)).sum(dim=-1))
    return stable_softmax(scores, dim=-1) @ v, lse


def _as_input(o: torch.Tensor, lse: torch.Tensor):
    """A partial as the kernels return it: float32."""
    return o.float(), lse.float()


def _step_case(description: str, scores: torch.Tensor, v: torch.Tensor, seen: int) -> Case:
    """One step: the accumulator holds the partial over keys [0, seen), the block the one over the rest;
    expected: attention over all the keys at once."""
    o, lse = _as_input(*_partial(scores[..., :seen], v[..., :seen, :]))
    o_blk, lse_blk = _as_input(*_partial(scores[..., seen:], v[..., seen:, :]))
    return Case(description, (o, lse, o_blk, lse_blk), _partial(scores, v), TOLERANCE,
                shape_words=SHAPE_WORDS, out_dtype=(torch.float32, torch.float32), output_names=("O", "L"))


def _ring(blocks_o: torch.Tensor, blocks_lse: torch.Tensor, labels: list[str]) -> dict:
    """A whole ring as one argument (a plain dict: loads with weights_only=True): the W blocks' partials
    in the order the rank receives them, (W, B, H, N, D) and (W, B, H, N), and what each step is."""
    return {"o_blocks": blocks_o, "lse_blocks": blocks_lse, "steps": "; ".join(labels)}


# --------------------------------------------------------------------- running a ring

def _fold(step, ring: dict):
    """Start from the empty accumulator and call ``step`` once per block, in order; return the last (o, lse).

    An output that is not a pair of tensors of the accumulator's shapes is returned as it is, at once,
    for the judge to explain (a missing return, a wrong shape), instead of failing at the next call.
    """
    o_blocks, lse_blocks = ring["o_blocks"], ring["lse_blocks"]
    o = torch.zeros_like(o_blocks[0])
    lse = torch.full_like(lse_blocks[0], NEG_INF)
    for o_blk, lse_blk in zip(o_blocks, lse_blocks):
        out = step(o, lse, o_blk.clone(), lse_blk.clone())
        if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)
                and out[0].shape == o.shape and out[1].shape == lse.shape):
            return out
        o, lse = out
    return o, lse


def _outcome(step, *args):
    """What ``step`` gives on a case: one call (four tensors), or a whole ring folded (one dict)."""
    if len(args) == 1:
        return _fold(step, args[0])
    return step(*args)


def _call(learner, case: Case):
    return _outcome(learner, *case.args)


# --------------------------------------------------------------------- wrong merges

def _right(o, lse, o_blk, lse_blk):
    lse_new = torch.logaddexp(lse, lse_blk)
    shift = safe_shift(lse_new)
    return (torch.exp(lse - shift).unsqueeze(-1) * o + torch.exp(lse_blk - shift).unsqueeze(-1) * o_blk, lse_new)


def _with_lse(o_of, *lse_of):
    """Steps whose O is ``o_of(o, lse, o_blk, lse_blk)``, each with one way of getting L."""
    def make(lse_rule):
        return lambda o, lse, o_blk, lse_blk: (o_of(o, lse, o_blk, lse_blk), lse_rule(o, lse, o_blk, lse_blk))
    return [make(rule) for rule in lse_of]


def _right_lse(o, lse, o_blk, lse_blk):
    return torch.logaddexp(lse, lse_blk)


def _max_lse(o, lse, o_blk, lse_blk):
    return torch.maximum(lse, lse_blk)


def _right_o(o, lse, o_blk, lse_blk):
    return _right(o, lse, o_blk, lse_blk)[0]


def _weights(lse, lse_blk, *, shift, sign=1.0):
    """Each side's weight, exp(sign * (its L - shift)), as (..., 1) columns."""
    return (torch.exp(sign * (lse - shift)).unsqueeze(-1), torch.exp(sign * (lse_blk - shift)).unsqueeze(-1))


def _max_form(o, lse, o_blk, lse_blk, *, guard=True, guard_total=True, normalise=True):
    """The merge through the max: w = exp(L - m), O = sum w O / sum w, L = m + log(sum w)."""
    m = torch.maximum(lse, lse_blk)
    shift = safe_shift(m) if guard else m
    w, w_blk = _weights(lse, lse_blk, shift=shift)
    total = w + w_blk
    o_new = w * o + w_blk * o_blk
    if normalise:
        o_new = o_new / (torch.where(total > 0, total, torch.ones_like(total)) if guard_total else total)
    return o_new, shift + torch.log(total.squeeze(-1))


def _exp_without_max(o, lse, o_blk, lse_blk):
    w, w_blk = torch.exp(lse).unsqueeze(-1), torch.exp(lse_blk).unsqueeze(-1)
    total = w + w_blk
    return (w * o + w_blk * o_blk) / total, torch.log(total.squeeze(-1))


def _lse_without_max(o, lse, o_blk, lse_blk):
    lse_new = torch.log(torch.exp(lse) + torch.exp(lse_blk))
    w, w_blk = _weights(lse, lse_blk, shift=lse_new)
    return w * o + w_blk * o_blk, lse_new


def _unguarded(o, lse, o_blk, lse_blk):
    lse_new = torch.logaddexp(lse, lse_blk)
    w, w_blk = _weights(lse, lse_blk, shift=lse_new)
    return w * o + w_blk * o_blk, lse_new


def _relative_to_block(o, lse, o_blk, lse_blk):
    w = torch.exp(lse - lse_blk)
    return (w.unsqueeze(-1) * o + o_blk) / (w.unsqueeze(-1) + 1), lse_blk + torch.log1p(w)


def _relative_to_accumulator(o, lse, o_blk, lse_blk):
    w = torch.exp(lse_blk - lse)
    return (o + w.unsqueeze(-1) * o_blk) / (1 + w.unsqueeze(-1)), lse + torch.log1p(w)


def _sigmoid_form(o, lse, o_blk, lse_blk):
    o_new = o - torch.sigmoid(lse_blk - lse).unsqueeze(-1) * (o - o_blk)
    return o_new, lse - torch.nn.functional.logsigmoid(lse - lse_blk)


def _swapped(o, lse, o_blk, lse_blk):
    lse_new = torch.logaddexp(lse, lse_blk)
    w, w_blk = _weights(lse, lse_blk, shift=safe_shift(lse_new))
    return w_blk * o + w * o_blk, lse_new


def _sign_flipped(o, lse, o_blk, lse_blk):
    lse_new = torch.logaddexp(lse, lse_blk)
    w, w_blk = _weights(lse, lse_blk, shift=safe_shift(lse_new), sign=-1.0)
    return w * o + w_blk * o_blk, lse_new


def _one_side_rescaled(o, lse, o_blk, lse_blk):
    w, w_blk = _weights(lse, lse_blk, shift=safe_shift(torch.logaddexp(lse, lse_blk)))
    return [o + w_blk * o_blk, w * o + o_blk]


def _steps(*steps):
    """A Mistake's compute: each step function (or list of them) folded or called on the case's args."""
    flat = [s for step in steps for s in (step if isinstance(step, list) else [step])]

    def compute(*args):
        return [_outcome(step, *args) for step in flat]
    return compute


def _only_one_side(*args):
    """O from one side rescaled and the other not (two variants), L right."""
    if len(args) == 1:
        variants = [lambda o, lse, ob, lb, i=i: (_one_side_rescaled(o, lse, ob, lb)[i], _right_lse(o, lse, ob, lb))
                    for i in range(2)]
        return [_fold(step, args[0]) for step in variants]
    return [(o_new, _right_lse(*args)) for o_new in _one_side_rescaled(*args)]


RING_MISTAKES = (
    Mistake("averaged",
            "the two outputs were averaged, (O + O_blk) / 2: each side counts in proportion to its share of the "
            "row's exp-mass, exp(L - L_new) and exp(L_blk - L_new) with L_new = logaddexp(L, L_blk), not one "
            "half each (a side that saw one key and a side that saw a thousand are not worth the same)",
            _steps(_with_lse(lambda o, lse, ob, lb: (o + ob) / 2, _right_lse, _max_lse,
                             lambda o, lse, ob, lb: (lse + lb) / 2, lambda o, lse, ob, lb: lb))),
    Mistake("not rescaled",
            "the outputs were added without rescaling them (or only one of them was rescaled): both O and O_blk "
            "are normalised over their own keys, so each must be weighed by its share of the merged sum: "
            "O_new = exp(L - L_new) O + exp(L_blk - L_new) O_blk, with L_new = logaddexp(L, L_blk)",
            lambda *args: _steps(_with_lse(lambda o, lse, ob, lb: o + ob, _right_lse, _max_lse))(*args)
            + _only_one_side(*args)),
    Mistake("exp(L) without the max",
            "exp(L) was taken on its own: in float32 it overflows to inf for L above about 88 and underflows to 0 "
            "below about -104, and the merge gives inf / inf or 0 / 0 = NaN (or L = inf). Weigh each side relative "
            "to the merged logsumexp: L_new = torch.logaddexp(L, L_blk) (stable), then exp(L - L_new) and "
            "exp(L_blk - L_new), both at most 1",
            _steps(_exp_without_max, _lse_without_max)),
    Mistake("not normalised",
            "the weights exp(L - m) and exp(L_blk - m), with m the larger of the two L, were used without dividing "
            "by their sum: O_new = (w O + w_blk O_blk) / (w + w_blk). (Or weigh by exp(L - L_new), whose two "
            "weights already sum to 1)",
            _steps(lambda *a: _max_form(*a, normalise=False))),
    Mistake("NaN where both are empty",
            "NaN in a row where neither side has seen a key (L = L_blk = -inf, a row that the blocks so far all "
            "skip): there L_new = -inf, and L - L_new = -inf - (-inf) = NaN (or the weights sum to 0 and O = 0 / 0). "
            "Subtract 0 where L_new is -inf (shift = torch.where(torch.isneginf(L_new), 0.0, L_new)): the row keeps "
            "O = 0 and L = -inf",
            _steps(_unguarded, lambda *a: _max_form(*a, guard=False), lambda *a: _max_form(*a, guard_total=False))),
    Mistake("NaN where the block is skipped",
            "NaN in a row where the incoming block is skipped (L_blk = -inf: no query of the row sees its keys, as "
            "a causal step that the ring skips): the weights were taken relative to the block, exp(L - L_blk) = "
            "exp(+inf) = inf. Take both weights relative to the merged L_new = logaddexp(L, L_blk), which is "
            "finite when either side is: the skipped block then weighs exp(-inf) = 0 and the accumulator comes "
            "back unchanged",
            _steps(_relative_to_block)),
    Mistake("NaN where the accumulator is empty",
            "NaN in a row where the accumulator is still empty (L = -inf: the first step, or every block so far "
            "skipped): the weights were taken relative to the accumulator, exp(L_blk - L) = exp(+inf), or in the "
            "sigmoid form O - sigmoid(L_blk - L) (O - O_blk), L - logsigmoid(L - L_blk), which gives "
            "-inf - (-inf) = NaN there. (PyTorch's context parallel uses the sigmoid form and starts from the "
            "first block instead of an empty accumulator.) Weigh both sides relative to L_new = "
            "logaddexp(L, L_blk): an empty accumulator weighs 0 and the block is taken as it is",
            _steps(_relative_to_accumulator, _sigmoid_form)),
    Mistake("L is the max",
            "O is right but L is the larger of L and L_blk: the merged L must be the logsumexp over both sides, "
            "logaddexp(L, L_blk) = m + log(exp(L - m) + exp(L_blk - m)); the max alone leaves the other side out, "
            "and the next step's merge (and the backward pass) need the true logsumexp",
            _steps(_with_lse(_right_o, _max_lse))),
    Mistake("L not updated",
            "O is right but L was not updated: it came back as the accumulator's L (or the block's). Return the "
            "merged L_new = logaddexp(L, L_blk), which the next step weighs the accumulator with: with the old "
            "L, every later block counts wrongly",
            _steps(_with_lse(_right_o, lambda o, lse, ob, lb: lse, lambda o, lse, ob, lb: lb))),
    Mistake("sides swapped",
            "the two weights are swapped: the accumulator's O goes with exp(L - L_new) (its own L) and the block's "
            "O_blk with exp(L_blk - L_new)",
            _steps(_swapped)),
    Mistake("sign flipped",
            "the sign in the exp is flipped: each side's weight is exp(its L - L_new) (at most 1, since L_new is "
            "at least both), not exp(L_new - its L)",
            _steps(_sign_flipped)),
)


# ------------------------------------------------------------------------- the cases

def _rows(gen, targets, size: int) -> torch.Tensor:
    """Score rows (M, size), standard normal shifted so that row r's max is targets[r] (-inf: all masked)."""
    rows = []
    for target in targets:
        row = torch.randn(size, generator=gen, dtype=torch.float64)
        rows.append(row - row.max() + target if target != NEG_INF
                    else torch.full((size,), NEG_INF, dtype=torch.float64))
    return torch.stack(rows)


#: Case 1's rows: (the accumulator's max score, the block's max score, what the row tests), head by head.
FIXED_ROWS = (
    ((0.5, 1.5, "two ordinary partials"), (NEG_INF, 2.0, "the accumulator empty (the first step): take the block"),
     (1.0, NEG_INF, "the block skipped: keep the accumulator"), (NEG_INF, NEG_INF, "both empty: O = 0, L = -inf")),
    ((100.0, 99.0, "scores near +100: exp(L) overflows in float32"),
     (-120.0, -118.0, "scores near -120: exp(L) underflows to 0 in float32"),
     (5.0, -30.0, "two sides far apart: the block weighs almost nothing"),
     (-3.0, 60.0, "two sides far apart: the accumulator weighs almost nothing")),
)


def _fixed_cases() -> list[Case]:
    gen = fixed_generator(FIXED_SEED)
    seen, fresh, d = 6, 5, 4
    heads = []
    for head in FIXED_ROWS:
        acc = _rows(gen, [row[0] for row in head], seen)
        blk = _rows(gen, [row[1] for row in head], fresh)
        heads.append(torch.cat([acc, blk], dim=-1))
    scores = torch.stack(heads)[None]  # (1, 2, 4, 11)
    v = torch.randn(1, 2, seen + fresh, d, generator=gen, dtype=torch.float64)
    written = "; ".join(f"[0, {h}, {r}] {what}" for h, head in enumerate(FIXED_ROWS)
                        for r, (_, _, what) in enumerate(head))
    cases = [_step_case(f"one step, B = 1, H = 2, N = 4 rows per head, D = {d}; rows {written}", scores, v, seen)]

    # a whole block skipped: a causal step whose keys all come after the rank's queries
    b, h, n, d = 2, 3, 8, 8
    scores = torch.randn(b, h, n, 2 * n, generator=gen, dtype=torch.float64) * 2.0
    scores[..., n:] = NEG_INF
    v = torch.randn(b, h, 2 * n, d, generator=gen, dtype=torch.float64)
    cases.append(_step_case(f"a skipped step, B = {b}, H = {h}, N = {n}, D = {d}: causal, contiguous, the incoming "
                            "block holds keys that come after every query of this rank (O_blk = 0, L_blk = -inf in "
                            "every row): the accumulator must come back unchanged", scores, v, n))
    # the first step: the accumulator is empty in every row
    scores = torch.randn(b, h, n, 2 * n, generator=gen, dtype=torch.float64) * 2.0
    scores[..., :n] = NEG_INF
    cases.append(_step_case(f"the first step, B = {b}, H = {h}, N = {n}, D = {d}: the accumulator is empty (O = 0, "
                            "L = -inf in every row): the block's partial must be taken as it is", scores, v, n))
    return cases


def _positions(rank: int, world_size: int, shard: int, scheme: str) -> torch.Tensor:
    """The sequence positions of a rank's shard: contiguous, or the zigzag's chunks r and 2W-1-r."""
    if scheme == "contiguous":
        return torch.arange(rank * shard, (rank + 1) * shard)
    half = shard // 2
    return torch.cat([torch.arange(rank * half, (rank + 1) * half),
                      torch.arange((2 * world_size - 1 - rank) * half, (2 * world_size - rank) * half)])


def _ring_case(gen, *, world_size: int, rank: int, scheme: str, causal: bool, shard: int, batch: int, heads: int,
               head_dim: int, logit_scale: float = 1.0) -> Case:
    """Rank ``rank``'s ring: the blocks of the K/V shards of ranks r, r-1, ..., in the order it gets them."""
    n = world_size * shard
    q = torch.randn(batch, heads, n, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(batch, heads, n, head_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, heads, n, head_dim, generator=gen, dtype=torch.float64)
    mine = _positions(rank, world_size, shard, scheme)
    scores = (q[:, :, mine] @ k.transpose(-1, -2)) * (logit_scale / head_dim ** 0.5)  # (B, H, shard, N)
    if causal:
        scores = scores.masked_fill(torch.arange(n)[None, :] > mine[:, None], NEG_INF)
    blocks_o, blocks_lse, labels = [], [], []
    for step in range(world_size):
        source = (rank - step) % world_size
        keys = _positions(source, world_size, shard, scheme)
        o_blk, lse_blk = _as_input(*_partial(scores[..., keys], v[:, :, keys]))
        blocks_o.append(o_blk)
        blocks_lse.append(lse_blk)
        seeing = torch.isfinite(lse_blk).all(dim=(0, 1))
        what = "all rows" if bool(seeing.all()) else "no row: skipped" if not bool(seeing.any()) else \
            f"rows {int(seeing.nonzero()[0])} to {int(seeing.nonzero()[-1])} only"
        labels.append(f"step {step}: the K/V of rank {source}, seen by {what}")
    keys = torch.arange(n)
    ring = _ring(torch.stack(blocks_o), torch.stack(blocks_lse), labels)
    description = (f"a whole ring: rank {rank} of W = {world_size}, {scheme}, {'causal' if causal else 'not causal'}, "
                   f"B = {batch}, H = {heads}, shards of N = {shard}, D = {head_dim}"
                   f"{f', logits x {logit_scale:g}' if logit_scale != 1 else ''}; starting from the empty "
                   f"accumulator, your function is called once per step ({ring['steps']}); the result must be "
                   "attention over the whole sequence")
    return Case(description, (ring,), _partial(scores[..., keys], v), TOLERANCE, shape_words=SHAPE_WORDS,
                out_dtype=(torch.float32, torch.float32), output_names=("O", "L"))


def _cases(gen: torch.Generator) -> list[Case]:
    cases = _fixed_cases()
    cases.append(_ring_case(gen, world_size=4, rank=1, scheme="contiguous", causal=True, shard=8, batch=1, heads=2,
                            head_dim=8))
    cases.append(_ring_case(gen, world_size=4, rank=1, scheme="zigzag", causal=True, shard=8, batch=2, heads=2,
                            head_dim=8))
    cases.append(_ring_case(gen, world_size=3, rank=int(torch.randint(0, 3, (1,), generator=gen)),
                            scheme="contiguous", causal=False, shard=6, batch=1, heads=3, head_dim=4,
                            logit_scale=30.0))
    return cases


# ------------------------------------------------------------------------ explaining

def _explain(case: Case, out) -> list[str]:
    """Which of O and L are right, and the logsumexps behind the first wrong row."""
    (want_o, want_lse), (got_o, got_lse) = case.expected, out
    got_o, got_lse = got_o.detach().double().cpu(), got_lse.detach().double().cpu()
    lines = [", ".join(f"{name} {'right' if error_from(got, want) <= case.tolerance else 'wrong'}"
                       for name, got, want in (("O", got_o, want_o), ("L", got_lse, want_lse)))]
    finite = torch.isfinite(want_lse)
    l_scale = want_lse[finite].abs().max().clamp_min(1.0) if finite.any() else torch.tensor(1.0)
    same_l = (got_lse == want_lse) | ((got_lse - want_lse).abs() <= case.tolerance * l_scale)
    o_scale = want_o.abs().max().clamp_min(1e-300)
    same_o = ((got_o - want_o).abs() <= case.tolerance * o_scale).all(dim=-1)
    wrong = (~(same_l & same_o)).nonzero()
    if not len(wrong):
        return lines
    row = tuple(int(i) for i in wrong[0])
    where = "[" + ", ".join(str(i) for i in row) + "]"
    tail = f"expected L = {want_lse[row].item():.6g}, got {got_lse[row].item():.6g}"
    if len(case.args) == 1:
        blocks = ", ".join(f"{x:.6g}" for x in case.args[0]["lse_blocks"][(slice(None),) + row].tolist())
        lines.append(f"row {where}: the blocks' L_blk, step by step = [{blocks}]: {tail}")
    else:
        _, lse, _, lse_blk = case.args
        lines.append(f"row {where}: the accumulator's L = {lse[row].item():.6g}, the block's L_blk = "
                     f"{lse_blk[row].item():.6g}: {tail}")
    return lines


RING_STEP_MERGE_CHECK = Check(
    RING_STEP_MERGE, _cases, RING_MISTAKES, call=_call, explain=_explain,
    nonfinite_hint=("NaN or inf: NaN usually comes from -inf - (-inf) in a row where a side is empty (weigh both "
                    "sides relative to L_new = logaddexp(L, L_blk), and subtract 0 where L_new is -inf); inf from "
                    "exp of a large L without subtracting the max"))


def check_ring_step_merge(fn, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check ``fn(o, lse, o_blk, lse_blk) -> (o, lse)``: one ring step's merge of an incoming partial."""
    return run_check(RING_STEP_MERGE_CHECK, fn, seed=seed, time_limit_s=time_limit_s)
