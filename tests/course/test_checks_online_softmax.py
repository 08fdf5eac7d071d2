"""The notebook 03 checks pass right answers and name the mistake in wrong ones.

Every wrong answer is written the way a learner plausibly writes it, independently
of the check's own list of mistakes.
"""

import pytest
import torch

from flashlib.course import checks
from flashlib.course.checks import framework, online_softmax

NEG_INF = float("-inf")
SEEDS = (0, 1, 2)


# ------------------------------------------------------------------ online update

def update_right(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.max(dim=-1).values)
    m_safe = torch.where(m_new == NEG_INF, torch.zeros_like(m_new), m_new)
    alpha = torch.exp(m - m_safe)
    p = torch.exp(scores - m_safe[:, None])
    return m_new, alpha * l + p.sum(dim=-1), alpha[:, None] * acc + p @ v


def update_blank(m, l, acc, scores, v):
    raise NotImplementedError("Exercise: write your code here")


def update_l_not_rescaled(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.max(dim=-1).values)
    m_safe = torch.where(m_new == NEG_INF, torch.zeros_like(m_new), m_new)
    alpha = torch.exp(m - m_safe)
    p = torch.exp(scores - m_safe[:, None])
    return m_new, l + p.sum(dim=-1), alpha[:, None] * acc + p @ v


def update_acc_not_rescaled(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.max(dim=-1).values)
    m_safe = torch.where(m_new == NEG_INF, torch.zeros_like(m_new), m_new)
    alpha = torch.exp(m - m_safe)
    p = torch.exp(scores - m_safe[:, None])
    return m_new, alpha * l + p.sum(dim=-1), acc + p @ v


def update_sign_flipped(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.max(dim=-1).values)
    m_safe = torch.where(m_new == NEG_INF, torch.zeros_like(m_new), m_new)
    alpha = torch.exp(m_safe - m)
    p = torch.exp(scores - m_safe[:, None])
    return m_new, alpha * l + p.sum(dim=-1), alpha[:, None] * acc + p @ v


def update_no_guard(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.max(dim=-1).values)
    alpha = torch.exp(m - m_new)
    p = torch.exp(scores - m_new[:, None])
    return m_new, alpha * l + p.sum(dim=-1), alpha[:, None] * acc + p @ v


def update_block_max_only(m, l, acc, scores, v):
    m_new = scores.max(dim=-1).values
    m_safe = torch.where(m_new == NEG_INF, torch.zeros_like(m_new), m_new)
    alpha = torch.exp(torch.where(m == NEG_INF, m, m - m_safe))
    p = torch.exp(scores - m_safe[:, None])
    return m_new, alpha * l + p.sum(dim=-1), alpha[:, None] * acc + p @ v


def update_normalised_acc(m, l, acc, scores, v):
    m_new, l_new, acc_new = update_right(m, l, acc, scores, v)
    return m_new, l_new, acc_new / l_new[:, None]


def update_zero_before_max(m, l, acc, scores, v):
    m = torch.where(m == NEG_INF, torch.zeros_like(m), m)  # "guard" the old m: -inf becomes 0 first
    m_new = torch.maximum(m, scores.max(dim=-1).values)
    alpha = torch.exp(m - m_new)
    p = torch.exp(scores - m_new[:, None])
    return m_new, alpha * l + p.sum(dim=-1), alpha[:, None] * acc + p @ v


def update_zero_for_empty_rows(m, l, acc, scores, v):
    m_new = torch.maximum(m, scores.max(dim=-1).values)
    m_new = torch.where(m_new == NEG_INF, torch.zeros_like(m_new), m_new)  # the guard overwrites m_new
    alpha = torch.exp(m - m_new)
    p = torch.exp(scores - m_new[:, None])
    return m_new, alpha * l + p.sum(dim=-1), alpha[:, None] * acc + p @ v


def update_no_shift(m, l, acc, scores, v):
    p = torch.exp(scores)
    return torch.maximum(m, scores.max(dim=-1).values), l + p.sum(dim=-1), acc + p @ v


def update_finite_minus_infinity(m, l, acc, scores, v):
    m = torch.where(m == NEG_INF, torch.full_like(m, -1e30), m)  # a finite "-inf"
    m_new = torch.maximum(m, scores.max(dim=-1).values)
    alpha = torch.exp(m - m_new)
    p = torch.exp(scores - m_new[:, None])
    return m_new, alpha * l + p.sum(dim=-1), alpha[:, None] * acc + p @ v


def test_online_update_passes_the_right_answer_and_the_library(capsys):
    from flashlib.online_softmax import online_softmax_step

    result = checks.check_online_update(update_right)
    assert result.passed and result.points == result.max_points == 2
    assert result.exercise == "03_online_softmax.online_update"
    assert capsys.readouterr().out == "✓ online_update: correct on 7 cases (2/2 points)\n"
    assert checks.check_online_update(online_softmax_step).passed


def test_online_update_passing_verdict_is_deterministic():
    assert checks.check_online_update(update_right).feedback == checks.check_online_update(update_right).feedback


def test_online_update_blank_is_not_attempted(capsys):
    result = checks.check_online_update(update_blank)
    assert not result.passed and result.points == 0
    assert "not attempted yet: replace `raise NotImplementedError`" in result.feedback
    assert capsys.readouterr().out.strip() == result.feedback


@pytest.mark.parametrize("wrong, case, words", [
    (update_l_not_rescaled, 1, "l was not rescaled"),
    (update_acc_not_rescaled, 1, "acc was not rescaled"),
    (update_sign_flipped, 1, "the rescale factor's sign is flipped"),
    (update_no_guard, 2, "NaN from -inf - (-inf)"),
    (update_block_max_only, 1, "m_new must be the max of the old m and this block's row max"),
    (update_normalised_acc, 1, "acc must stay unnormalised"),
    (update_no_shift, 1, "the scores are not shifted by the running max"),
    (update_zero_before_max, 2, "m = -inf was replaced by 0 before the max"),
    (update_zero_for_empty_rows, 2, "m_new is 0 in a row that has seen no visible key yet: it must stay -inf"),
], ids=lambda x: getattr(x, "__name__", None))
@pytest.mark.parametrize("seed", SEEDS)
def test_online_update_names_the_mistake(wrong, case, words, seed):
    # the first cases are fixed: the same verdict whatever the seed of the random ones
    result = checks.check_online_update(wrong, seed=seed)
    assert not result.passed
    assert f"case {case} of 7" in result.feedback
    assert "likely mistake: " in result.feedback and words in result.feedback, result.feedback


def test_online_update_says_which_part_is_wrong():
    result = checks.check_online_update(update_l_not_rescaled)
    assert "compared per query row as [m, l, acc] (column 0 is m, 1 is l): m right, l wrong, acc right" \
        in result.feedback
    assert "first difference at [0, 1]" in result.feedback  # row 0, column l


def test_online_update_nan_for_fully_masked_rows_is_reported_as_nan():
    result = checks.check_online_update(update_no_guard)
    assert "NaN or inf in the output" in result.feedback
    assert "row 4 is fully masked" in result.feedback


@pytest.mark.parametrize("answer, got", [(update_finite_minus_infinity, "-1e+30"),
                                         (update_zero_for_empty_rows, "0")])
def test_online_update_requires_m_to_stay_minus_infinity_for_empty_rows(answer, got):
    # m = 0 (or -1e30) where no key was seen used to compare equal to -inf: it must fail now
    result = checks.check_online_update(answer)
    assert not result.passed and "case 2 of 7" in result.feedback
    assert "first difference at [4, 0]: expected -inf, got " + got in result.feedback
    assert "m wrong, l right, acc right" in result.feedback
    assert f"row 4 has seen no visible key: m must stay -inf (with l = 0), got m = {got}" in result.feedback


def test_online_update_zero_before_the_max_is_shown_on_a_row_with_negative_scores():
    result = checks.check_online_update(update_zero_before_max)
    assert "first difference at [1, 0]: expected -2.5, got 0" in result.feedback
    assert "row 1: m = -inf before this block, whose max is -2.5: m_new = the larger of the two = -2.5, got 0" \
        in result.feedback
    assert "row 4 has seen no visible key: m must stay -inf" in result.feedback


def test_online_update_empty_row_with_very_negative_scores_is_fixed_in_every_run():
    first, again = (framework.make_cases(online_softmax.ONLINE_UPDATE_CHECK, seed=seed)[:2] for seed in (0, 7))
    for a, b in zip(first, again):
        assert a.description == b.description
        assert all(torch.equal(x, y) for x, y in zip(a.args, b.args))
    m, l, acc, scores, v = first[1].args
    assert torch.isneginf(m[:5]).all() and (l[:5] == 0).all() and (acc[:5] == 0).all()
    assert scores[3].amax() == -900 and torch.exp(scores[3]).sum() == 0  # exp(s - 0) underflows


def test_online_update_without_max_shift_fails_on_large_logits():
    def no_shift_for_large_logits(m, l, acc, scores, v):
        if scores[torch.isfinite(scores)].abs().max() < 1000:
            return update_right(m, l, acc, scores, v)
        return update_no_shift(m, l, acc, scores, v)  # overflows to inf for logits in the thousands

    result = checks.check_online_update(no_shift_for_large_logits)
    assert not result.passed and "case 6 of 7: large logits" in result.feedback
    assert "NaN or inf in the output" in result.feedback


def test_online_update_whole_problem_catches_an_error_in_later_blocks():
    # right on the single-step cases (6 rows), wrong only on the whole problem (10 rows)
    def wrong_on_the_whole_problem(m, l, acc, scores, v):
        m_new, l_new, acc_new = update_right(m, l, acc, scores, v)
        if m.shape[0] == 10:  # the whole-problem case: drop the rescale of acc
            m_safe = torch.where(m_new == NEG_INF, torch.zeros_like(m_new), m_new)
            acc_new = acc + torch.exp(scores - m_safe[:, None]) @ v
        return m_new, l_new, acc_new

    result = checks.check_online_update(wrong_on_the_whole_problem)
    assert not result.passed and "case 7 of 7: a whole problem" in result.feedback
    assert "[m, l, o = acc / l]" in result.feedback and "o = acc / l wrong" in result.feedback
    assert "acc was not rescaled" in result.feedback


def test_online_update_bad_returns_are_explained():
    none = checks.check_online_update(lambda m, l, acc, scores, v: None)
    assert "returned None" in none.feedback and "is a `return` missing?" in none.feedback
    pair = checks.check_online_update(lambda m, l, acc, scores, v: update_right(m, l, acc, scores, v)[1:])
    assert "must return a tuple (m_new, l_new, acc_new), got a tuple of length 2" in pair.feedback
    wrong_shape = checks.check_online_update(
        lambda m, l, acc, scores, v: (m, l, acc.T))
    assert "acc_new of shape (4, 6), expected (6, 4)" in wrong_shape.feedback


def test_online_update_exception_shows_the_line():
    def typo(m, l, acc, scores, v):
        m_new = torch.maximum(m, scores.max(dim=-1))  # max(dim=...) returns (values, indices)
        return m_new, l, acc

    result = checks.check_online_update(typo)
    assert "your code raised TypeError" in result.feedback
    assert "m_new = torch.maximum(m, scores.max(dim=-1))" in result.feedback


def test_online_update_fails_an_answer_that_changes_its_inputs_in_place():
    """The check hands each block's call copies, so an in-place edit never reached the case's arguments and passed
    (4/4 in the grader), while notebook 03's demo, whose blocks are views of one score matrix, came out wrong."""
    def in_place(m, l, acc, scores, v):
        out = update_right(m, l, acc, scores, v)
        scores.fill_(0.0)
        m.fill_(123.0)
        return out

    def exp_in_place(m, l, acc, scores, v):  # the audit's answer: right values, scores turned into p in place
        m_new = torch.maximum(m, scores.amax(-1))
        m_safe = torch.where(torch.isneginf(m_new), 0.0, m_new)
        alpha = torch.exp(m - m_safe)
        scores.sub_(m_safe[:, None]).exp_()
        return m_new, alpha * l + scores.sum(-1), alpha[:, None] * acc + scores @ v

    for answer, changed in ((in_place, "m, scores"), (exp_in_place, "scores")):
        for seed in SEEDS:
            result = checks.check_online_update(answer, seed=seed)
            assert not result.passed
            assert f"your code changed its input in place ({changed})" in result.feedback
            assert "a function must not modify the tensors it is given" in result.feedback


# ------------------------------------------------------------------------- merge

def merge_right(a, b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    m = torch.maximum(m_a, m_b)
    m_safe = torch.where(m == NEG_INF, torch.zeros_like(m), m)
    w_a, w_b = l_a * torch.exp(m_a - m_safe), l_b * torch.exp(m_b - m_safe)
    l = w_a + w_b
    o = (w_a[:, None] * o_a + w_b[:, None] * o_b) / torch.where(l > 0, l, torch.ones_like(l))[:, None]
    return m, l, o


def merge_blank(a, b):
    raise NotImplementedError("Exercise: write your code here")


def merge_not_normalised(a, b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    m = torch.maximum(m_a, m_b)
    w_a, w_b = l_a * torch.exp(m_a - m), l_b * torch.exp(m_b - m)
    return m, w_a + w_b, w_a[:, None] * o_a + w_b[:, None] * o_b


def merge_adds_outputs(a, b):
    m, l, _ = merge_right(a, b)
    return m, l, a[2] + b[2]


def merge_weights_without_exp(a, b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    l = l_a + l_b
    return torch.maximum(m_a, m_b), l, (l_a[:, None] * o_a + l_b[:, None] * o_b) / l[:, None]


def merge_sign_flipped(a, b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    m = torch.maximum(m_a, m_b)
    w_a, w_b = l_a * torch.exp(m - m_a), l_b * torch.exp(m - m_b)
    l = w_a + w_b
    return m, l, (w_a[:, None] * o_a + w_b[:, None] * o_b) / l[:, None]


def merge_no_guard(a, b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    m = torch.maximum(m_a, m_b)
    w_a, w_b = l_a * torch.exp(m_a - m), l_b * torch.exp(m_b - m)
    l = w_a + w_b
    o = (w_a[:, None] * o_a + w_b[:, None] * o_b) / torch.where(l > 0, l, torch.ones_like(l))[:, None]
    return m, l, o


def merge_zero_before_max(a, b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    m_a = torch.where(m_a == NEG_INF, torch.zeros_like(m_a), m_a)  # an empty side counts as max 0
    m_b = torch.where(m_b == NEG_INF, torch.zeros_like(m_b), m_b)
    m = torch.maximum(m_a, m_b)
    w_a, w_b = l_a * torch.exp(m_a - m), l_b * torch.exp(m_b - m)
    l = w_a + w_b
    o = (w_a[:, None] * o_a + w_b[:, None] * o_b) / torch.where(l > 0, l, torch.ones_like(l))[:, None]
    return m, l, o


def merge_zero_where_both_empty(a, b):
    m, l, o = merge_right(a, b)
    return torch.where(m == NEG_INF, torch.zeros_like(m), m), l, o


def merge_l_not_rescaled(a, b):
    m, _, o = merge_right(a, b)
    return m, a[1] + b[1], o


def merge_exp_of_m(a, b):
    (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
    w_a, w_b = l_a * torch.exp(m_a), l_b * torch.exp(m_b)  # overflows for large logits
    m = torch.maximum(m_a, m_b)
    l = w_a + w_b
    o = (w_a[:, None] * o_a + w_b[:, None] * o_b) / torch.where(l > 0, l, torch.ones_like(l))[:, None]
    return m, l * torch.exp(-m), o


def test_merge_partials_passes_the_right_answer_and_the_library(capsys):
    from flashlib.online_softmax import merge_partials

    result = checks.check_merge_partials(merge_right)
    assert result.passed and result.points == result.max_points == 2
    assert result.exercise == "03_online_softmax.merge_partials"
    assert capsys.readouterr().out == "✓ merge_partials: correct on 6 cases (2/2 points)\n"
    assert checks.check_merge_partials(merge_partials).passed


def test_merge_partials_blank_is_not_attempted():
    result = checks.check_merge_partials(merge_blank)
    assert not result.passed and "not attempted yet" in result.feedback


@pytest.mark.parametrize("wrong, case, words", [
    (merge_not_normalised, 1, "the merged output is not normalised"),
    (merge_adds_outputs, 1, "the outputs are added (or averaged) without weights"),
    (merge_weights_without_exp, 1, "the weights are l_a and l_b alone"),
    (merge_sign_flipped, 1, "the sign in the exp is flipped"),
    (merge_no_guard, 2, "NaN where both sides are empty"),
    (merge_l_not_rescaled, 1, "o looks right but l is not"),
    (merge_zero_before_max, 2, "an empty side's m = -inf was replaced by 0 before the max"),
    (merge_zero_where_both_empty, 2, "where both sides are empty (m = -inf, l = 0) the merged m must stay -inf"),
], ids=lambda x: getattr(x, "__name__", None))
@pytest.mark.parametrize("seed", SEEDS)
def test_merge_partials_names_the_mistake(wrong, case, words, seed):
    result = checks.check_merge_partials(wrong, seed=seed)
    assert not result.passed
    assert f"case {case} of 6" in result.feedback
    assert "likely mistake: " in result.feedback and words in result.feedback, result.feedback


def test_merge_partials_explains_the_merged_max():
    zero_first = checks.check_merge_partials(merge_zero_before_max).feedback
    assert "row 1: m_a = -inf, m_b = -300: m = max(m_a, m_b) = -300, got 0" in zero_first
    both_empty = checks.check_merge_partials(merge_zero_where_both_empty).feedback
    assert "first difference at [4, 0]: expected -inf, got 0" in both_empty
    assert "row 4 is empty on both sides (no key in a or in b): m must stay -inf (with l = 0), got m = 0" \
        in both_empty


@pytest.mark.parametrize("seed", SEEDS)
def test_merge_partials_exp_of_m_fails_with_nan_or_inf(seed):
    # exact in exact arithmetic, but exp(m) is 0 for very negative maxima and overflows for large ones:
    # the fixed first case has maxima +800 / -800 and -1000 / -900
    result = checks.check_merge_partials(merge_exp_of_m, seed=seed)
    assert not result.passed and "case 1 of 6" in result.feedback
    assert "NaN or inf in the output" in result.feedback
    assert "inf from exp(m) of large logits without subtracting the max" in result.feedback


def test_merge_partials_exp_of_m_is_named_when_l_is_left_relative_to_zero():
    def exp_of_m_l_unscaled(a, b):
        (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
        w_a, w_b = l_a * torch.exp(m_a), l_b * torch.exp(m_b)
        l = w_a + w_b
        o = (w_a[:, None] * o_a + w_b[:, None] * o_b) / torch.where(l > 0, l, torch.ones_like(l))[:, None]
        return torch.maximum(m_a, m_b), l, o

    result = checks.check_merge_partials(exp_of_m_l_unscaled)
    assert "case 1 of 6" in result.feedback and "exp(m_a) and exp(m_b) overflow" in result.feedback


def test_merge_partials_bad_returns_are_explained():
    result = checks.check_merge_partials(lambda a, b: merge_right(a, b)[2])
    assert "merge_partials must return a tuple (m, l, o), got a Tensor" in result.feedback



def test_merge_partials_fails_an_answer_that_changes_its_inputs_in_place():
    def scaled_in_place(a, b):  # the audit's answer: right values, o_a rescaled in place and returned
        (m_a, l_a, o_a), (m_b, l_b, o_b) = a, b
        m = torch.maximum(m_a, m_b)
        m_safe = torch.where(m == NEG_INF, torch.zeros_like(m), m)
        w_a, w_b = l_a * torch.exp(m_a - m_safe), l_b * torch.exp(m_b - m_safe)
        l = w_a + w_b
        l_safe = torch.where(l == 0, torch.ones_like(l), l)
        o_a.mul_(w_a[:, None]).add_(w_b[:, None] * o_b).div_(l_safe[:, None])
        return m, l, o_a

    for seed in SEEDS:
        assert checks.check_merge_partials(merge_right, seed=seed).passed
        result = checks.check_merge_partials(scaled_in_place, seed=seed)
        assert not result.passed and "your code changed its input in place (o_a)" in result.feedback


def test_checks_are_registered_in_notebook_order():
    assert [name for name, _, _ in checks.EXERCISES["03_online_softmax"]] == ["online_update", "merge_partials"]
    notebooks = list(checks.EXERCISES)
    assert notebooks.index("02_triton_tiled_matmul") < notebooks.index("03_online_softmax")
