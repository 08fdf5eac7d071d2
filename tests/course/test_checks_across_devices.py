"""The notebook 10 check passes right answers and names the mistake in wrong ones.

Every wrong answer is written the way a learner plausibly writes it, independently of the
check's own list of mistakes, and each is tried on two seeds.
"""
import pytest
import torch
import torch.nn.functional as F

from flashlib.course import checks, registry
from flashlib.course.checks import across_devices, framework
from flashlib.distributed import merge_partial, step_work

NEG_INF = float("-inf")
SEEDS = (0, 1)


def _safe(x):
    return torch.where(torch.isneginf(x), torch.zeros_like(x), x)


# ------------------------------------------------------------------------ right answers

def merge_right(o, lse, o_blk, lse_blk):
    lse_new = torch.logaddexp(lse, lse_blk)
    shift = _safe(lse_new)
    return torch.exp(lse - shift)[..., None] * o + torch.exp(lse_blk - shift)[..., None] * o_blk, lse_new


def merge_through_the_max(o, lse, o_blk, lse_blk):  # also right: notebook 03's form, weights over their sum
    m = _safe(torch.maximum(lse, lse_blk))
    w, w_blk = torch.exp(lse - m), torch.exp(lse_blk - m)
    total = w + w_blk
    divisor = torch.where(total > 0, total, torch.ones_like(total))
    return (w[..., None] * o + w_blk[..., None] * o_blk) / divisor[..., None], m + torch.log(total)


def merge_in_float64(o, lse, o_blk, lse_blk):  # also right: computed in float64, returned in float32
    o_new, lse_new = merge_right(o.double(), lse.double(), o_blk.double(), lse_blk.double())
    return o_new.float(), lse_new.float()


def merge_blank(o, lse, o_blk, lse_blk):
    raise NotImplementedError("Exercise: write your code here")


# ------------------------------------------------------------------------ wrong answers

def merge_average(o, lse, o_blk, lse_blk):
    return (o + o_blk) / 2, torch.logaddexp(lse, lse_blk)


def merge_average_max(o, lse, o_blk, lse_blk):
    return (o + o_blk) / 2, torch.maximum(lse, lse_blk)


def merge_added(o, lse, o_blk, lse_blk):
    return o + o_blk, torch.logaddexp(lse, lse_blk)


def merge_only_block_rescaled(o, lse, o_blk, lse_blk):
    lse_new = torch.logaddexp(lse, lse_blk)
    return o + torch.exp(lse_blk - _safe(lse_new))[..., None] * o_blk, lse_new


def merge_exp_without_max(o, lse, o_blk, lse_blk):
    a, b = torch.exp(lse), torch.exp(lse_blk)   # inf near +100, 0 near -120 in float32
    return (a[..., None] * o + b[..., None] * o_blk) / (a + b)[..., None], torch.log(a + b)


def merge_log_of_sum_of_exps(o, lse, o_blk, lse_blk):
    lse_new = torch.log(torch.exp(lse) + torch.exp(lse_blk))
    return torch.exp(lse - lse_new)[..., None] * o + torch.exp(lse_blk - lse_new)[..., None] * o_blk, lse_new


def merge_not_normalised(o, lse, o_blk, lse_blk):
    m = _safe(torch.maximum(lse, lse_blk))
    w, w_blk = torch.exp(lse - m), torch.exp(lse_blk - m)
    return w[..., None] * o + w_blk[..., None] * o_blk, m + torch.log(w + w_blk)


def merge_unguarded(o, lse, o_blk, lse_blk):
    lse_new = torch.logaddexp(lse, lse_blk)   # -inf where both are: -inf - (-inf) = NaN below
    return torch.exp(lse - lse_new)[..., None] * o + torch.exp(lse_blk - lse_new)[..., None] * o_blk, lse_new


def merge_max_unguarded(o, lse, o_blk, lse_blk):
    m = torch.maximum(lse, lse_blk)
    w, w_blk = torch.exp(lse - m), torch.exp(lse_blk - m)
    return (w[..., None] * o + w_blk[..., None] * o_blk) / (w + w_blk)[..., None], m + torch.log(w + w_blk)


def merge_divides_by_zero(o, lse, o_blk, lse_blk):
    m = _safe(torch.maximum(lse, lse_blk))
    w, w_blk = torch.exp(lse - m), torch.exp(lse_blk - m)
    return (w[..., None] * o + w_blk[..., None] * o_blk) / (w + w_blk)[..., None], m + torch.log(w + w_blk)


def merge_relative_to_block(o, lse, o_blk, lse_blk):
    r = torch.exp(lse - lse_blk)   # inf where the block is skipped
    return (r[..., None] * o + o_blk) / (1 + r)[..., None], lse_blk + torch.log(1 + r)


def merge_relative_to_accumulator(o, lse, o_blk, lse_blk):
    r = torch.exp(lse_blk - lse)   # inf where the accumulator is empty
    return (o + r[..., None] * o_blk) / (1 + r)[..., None], lse + torch.log(1 + r)


def merge_sigmoid(o, lse, o_blk, lse_blk):  # PyTorch context parallel's form, without its first-block start
    o_new = o - torch.sigmoid(lse_blk - lse)[..., None] * (o - o_blk)
    return o_new, lse - F.logsigmoid(lse - lse_blk)


def merge_lse_is_max(o, lse, o_blk, lse_blk):
    return merge_right(o, lse, o_blk, lse_blk)[0], torch.maximum(lse, lse_blk)


def merge_lse_not_updated(o, lse, o_blk, lse_blk):
    return merge_right(o, lse, o_blk, lse_blk)[0], lse


def merge_lse_of_block(o, lse, o_blk, lse_blk):
    return merge_right(o, lse, o_blk, lse_blk)[0], lse_blk


def merge_swapped(o, lse, o_blk, lse_blk):
    lse_new = torch.logaddexp(lse, lse_blk)
    shift = _safe(lse_new)
    return torch.exp(lse_blk - shift)[..., None] * o + torch.exp(lse - shift)[..., None] * o_blk, lse_new


def merge_sign_flipped(o, lse, o_blk, lse_blk):
    lse_new = torch.logaddexp(lse, lse_blk)
    shift = _safe(lse_new)
    return torch.exp(shift - lse)[..., None] * o + torch.exp(shift - lse_blk)[..., None] * o_blk, lse_new


# ------------------------------------------------------------------------------ tests

def test_ring_step_merge_passes_right_answers(capsys):
    result = checks.check_ring_step_merge(merge_right)
    assert result.passed and result.points == result.max_points == 2
    assert result.exercise == "10_across_devices.ring_step_merge"
    assert capsys.readouterr().out == "✓ ring_step_merge: correct on 6 cases (2/2 points)\n"
    for other in (merge_through_the_max, merge_in_float64, merge_partial):
        assert checks.check_ring_step_merge(other).feedback == result.feedback
    for seed in SEEDS:
        assert checks.check_ring_step_merge(merge_right, seed=seed).passed


def test_ring_step_merge_blank_is_not_attempted():
    result = checks.check_ring_step_merge(merge_blank)
    assert not result.passed and result.points == 0
    assert "not attempted yet: replace `raise NotImplementedError`" in result.feedback


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("wrong, case, words", [
    (merge_average, 1, "the two outputs were averaged, (O + O_blk) / 2"),
    (merge_average_max, 1, "the two outputs were averaged, (O + O_blk) / 2"),
    (merge_added, 1, "the outputs were added without rescaling them (or only one of them was rescaled)"),
    (merge_only_block_rescaled, 1, "the outputs were added without rescaling them (or only one of them was rescaled)"),
    (merge_exp_without_max, 1, "exp(L) was taken on its own: in float32 it overflows"),
    (merge_log_of_sum_of_exps, 1, "exp(L) was taken on its own: in float32 it overflows"),
    (merge_not_normalised, 1, "the weights exp(L - m) and exp(L_blk - m), with m the larger of the two L, were used "
                              "without dividing by their sum"),
    (merge_unguarded, 1, "NaN in a row where neither side has seen a key"),
    (merge_max_unguarded, 1, "NaN in a row where neither side has seen a key"),
    (merge_divides_by_zero, 1, "NaN in a row where neither side has seen a key"),
    (merge_relative_to_block, 1, "NaN in a row where the incoming block is skipped"),
    (merge_relative_to_accumulator, 1, "NaN in a row where the accumulator is still empty"),
    (merge_sigmoid, 1, "NaN in a row where the accumulator is still empty"),
    (merge_lse_is_max, 1, "O is right but L is the larger of L and L_blk"),
    (merge_lse_not_updated, 1, "O is right but L was not updated"),
    (merge_lse_of_block, 1, "O is right but L was not updated"),
    (merge_swapped, 1, "the two weights are swapped"),
    (merge_sign_flipped, 1, "the sign in the exp is flipped"),
], ids=lambda x: getattr(x, "__name__", None))
def test_ring_step_merge_names_the_mistake(wrong, case, words, seed):
    result = checks.check_ring_step_merge(wrong, seed=seed)
    assert not result.passed and result.points == 0
    assert f"case {case} of 6" in result.feedback, result.feedback
    assert f"likely mistake: {words}" in result.feedback, result.feedback


def _judge_on(cases, learner):
    check = across_devices.RING_STEP_MERGE_CHECK
    return framework.judge(check, cases, framework.run_learner(check, learner, cases))


@pytest.mark.parametrize("wrong, number, words", [
    (merge_relative_to_block, 2, "NaN in a row where the incoming block is skipped"),
    (merge_relative_to_accumulator, 3, "NaN in a row where the accumulator is still empty"),
    (merge_sigmoid, 3, "NaN in a row where the accumulator is still empty"),
    (merge_added, 4, "the outputs were added without rescaling them"),
    (merge_lse_not_updated, 4, "O is right but L was not updated"),
    (merge_swapped, 5, "the two weights are swapped"),
    (merge_average, 6, "the two outputs were averaged"),
    (merge_exp_without_max, 6, None),
])
def test_the_later_cases_catch_the_mistakes_alone(wrong, number, words):
    """Each -inf situation has a fixed case of its own, and a whole ring (a sequence of calls, skipped and
    half-seen blocks included) catches the mistakes without the written-out rows of case 1."""
    case = framework.make_cases(across_devices.RING_STEP_MERGE_CHECK, seed=0)[number - 1]
    passed, _, details = _judge_on([case], wrong)
    if words is None:  # logits x 30: exp(L) without the max is wrong there only when it overflows
        lse_blocks = case.args[0]["lse_blocks"]
        assert passed == bool(lse_blocks[torch.isfinite(lse_blocks)].abs().max() < 80)
        return
    assert not passed
    assert any(line.startswith(f"likely mistake: {words}") for line in details), details


def test_ring_step_merge_says_which_output_is_wrong_and_shows_the_row():
    feedback = checks.check_ring_step_merge(merge_lse_is_max).feedback
    assert "O right, L wrong" in feedback
    assert "row [0, 0, 0]: the accumulator's L = " in feedback and "the block's L_blk = " in feedback
    feedback = checks.check_ring_step_merge(merge_unguarded).feedback
    assert "row [0, 0, 3]: the accumulator's L = -inf, the block's L_blk = -inf: expected L = -inf, got -inf" \
        in feedback and "O wrong, L right" in feedback
    cases = framework.make_cases(across_devices.RING_STEP_MERGE_CHECK, seed=0)
    _, _, details = _judge_on([cases[3]], merge_lse_not_updated)
    assert any("the blocks' L_blk, step by step = [" in line and "-inf, -inf]" in line for line in details), details


def test_fixed_cases_hold_the_extremes_whatever_the_seed():
    first = framework.make_cases(across_devices.RING_STEP_MERGE_CHECK, seed=0)[:3]
    again = framework.make_cases(across_devices.RING_STEP_MERGE_CHECK, seed=123)[:3]
    for a, b in zip(first, again):
        assert a.description == b.description and all(torch.equal(x, y) for x, y in zip(a.args, b.args))
    o, lse, o_blk, lse_blk = first[0].args
    assert all(t.dtype == torch.float32 for t in first[0].args)
    assert torch.isneginf(lse[0, 0, 1]) and torch.isfinite(lse_blk[0, 0, 1])            # accumulator empty
    assert torch.isfinite(lse[0, 0, 2]) and torch.isneginf(lse_blk[0, 0, 2])            # block skipped
    assert torch.isneginf(lse[0, 0, 3]) and torch.isneginf(lse_blk[0, 0, 3])            # both
    assert torch.isinf(torch.exp(lse[0, 1, 0])) and torch.exp(lse[0, 1, 1]) == 0        # float32 overflow, underflow
    assert torch.equal(o_blk[0, 0, 2], torch.zeros(4)) and torch.equal(o[0, 0, 1], torch.zeros(4))
    _, _, o_blk, lse_blk = first[1].args
    assert torch.isneginf(lse_blk).all() and not o_blk.any()
    _, lse, _, _ = first[2].args
    assert torch.isneginf(lse).all()


def test_expected_is_attention_over_the_whole_sequence():
    """The right merge, in float64, reproduces every case's expected output (case 1-3: one call; 4-6: a ring)."""
    def in_float64(o, lse, o_blk, lse_blk):
        return merge_right(o.double(), lse.double(), o_blk.double(), lse_blk.double())

    for case in framework.make_cases(across_devices.RING_STEP_MERGE_CHECK):
        if len(case.args) == 4:
            o, lse = in_float64(*case.args)
        else:
            ring = case.args[0]
            o = torch.zeros_like(ring["o_blocks"][0]).double()
            lse = torch.full_like(ring["lse_blocks"][0], NEG_INF).double()
            for o_blk, lse_blk in zip(ring["o_blocks"], ring["lse_blocks"]):
                o, lse = in_float64(o, lse, o_blk, lse_blk)
        assert framework.error_from(o, case.expected[0]) <= 1e-6
        assert framework.error_from(lse, case.expected[1]) <= 1e-6


def test_the_rings_blocks_are_what_step_work_says_a_rank_computes():
    """Which rows of each step see their block agrees with flashlib.distributed.step_work (None: skipped)."""
    cases = framework.make_cases(across_devices.RING_STEP_MERGE_CHECK, seed=0)
    for case, (world, rank, scheme, causal) in zip(cases[3:], [(4, 1, "contiguous", True), (4, 1, "zigzag", True),
                                                               (3, None, "contiguous", False)]):
        assert f"{scheme}, {'causal' if causal else 'not causal'}" in case.description
        rank = int(case.description.split("rank ")[1].split(" ")[0]) if rank is None else rank
        lse_blocks = case.args[0]["lse_blocks"]
        shard = lse_blocks.shape[-1]
        for step in range(world):
            work = step_work(rank, (rank - step) % world, shard, causal, scheme)
            seeing = torch.isfinite(lse_blocks[step]).all(dim=(0, 1))
            want = torch.zeros(shard, dtype=torch.bool)
            if work is not None:
                want[work.q_rows] = True
            assert torch.equal(seeing, want), (case.description, step)


@pytest.mark.parametrize("answer, words", [
    (lambda o, l, ob, lb: merge_right(o, l, ob, lb)[0], "returned a Tensor, expected 2 tensors: O, L"),
    (lambda o, l, ob, lb: merge_right(o.double(), l.double(), ob.double(), lb.double()),
     "O: expected torch.float32, got torch.float64"),
    (lambda o, l, ob, lb: (merge_right(o, l, ob, lb)[0], merge_right(o, l, ob, lb)[1][..., None]),
     "L: expected shape (1, 2, 4) = (B, H, N)"),
    (lambda o, l, ob, lb: None, "returned None"),
])
def test_ring_step_merge_wrong_forms_are_explained(answer, words):
    result = checks.check_ring_step_merge(answer)
    assert not result.passed and words in result.feedback, result.feedback


def test_a_ring_stops_at_a_wrong_form_and_says_so():
    cases = framework.make_cases(across_devices.RING_STEP_MERGE_CHECK, seed=0)
    passed, headline, _ = _judge_on([cases[3]], lambda o, l, ob, lb: None)
    assert not passed and headline == "returned None, expected 2 tensors: O, L"


def test_ring_step_merge_that_changes_its_input_in_place_fails():
    def in_place(o, lse, o_blk, lse_blk):
        o_new, lse_new = merge_right(o, lse, o_blk, lse_blk)
        o.copy_(o_new)
        return o, lse_new

    result = checks.check_ring_step_merge(in_place)
    assert not result.passed and "changed its input in place (argument 1)" in result.feedback


def test_the_exercise_is_registered_for_notebook_10():
    assert [e.name for e in registry.exercises_of("10_across_devices")] == ["ring_step_merge"]
    assert registry.max_points("10_across_devices") == 2
    assert set(checks.CHECKS) == {e.key for e in registry.EXERCISES}
