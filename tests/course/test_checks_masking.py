"""The notebook 06 checks pass right answers and name the mistake in wrong ones.

Every wrong answer is written the way a learner plausibly writes it, independently
of the check's own list of mistakes, and each is tried on several seeds: the
mistake must be named whatever the random cases.
"""
import io

import pytest
import torch

from flashlib import masks
from flashlib.course import checks
from flashlib.course.checks import framework, masking

SEEDS = range(5)


# ------------------------------------------------------------------ causal block range
def range_right(start_m, block_m, block_n, n_q, n_k):
    last_key = min((start_m + 1) * block_m, n_q) - 1 + n_k - n_q
    if last_key < 0:
        return 0, 0
    return 0, last_key // block_n + 1


def range_blank(start_m, block_m, block_n, n_q, n_k):
    raise NotImplementedError("Exercise: write your code here")


def range_strict_less(start_m, block_m, block_n, n_q, n_k):
    # "key j visible when j < i + n_k - n_q": the last visible key is one lower
    last_row = min((start_m + 1) * block_m, n_q) - 1
    return 0, -(-(last_row + n_k - n_q) // block_n)


def range_top_left(start_m, block_m, block_n, n_q, n_k):
    last_row = min((start_m + 1) * block_m, n_q) - 1
    return 0, min(last_row // block_n + 1, -(-n_k // block_n))


def range_no_round_up(start_m, block_m, block_n, n_q, n_k):
    end = min((start_m + 1) * block_m, n_q) + n_k - n_q
    return 0, end // block_n


def range_every_block(start_m, block_m, block_n, n_q, n_k):
    return 0, -(-n_k // block_n)


def range_ignores_query_tail(start_m, block_m, block_n, n_q, n_k):
    return 0, ((start_m + 1) * block_m - 1 + n_k - n_q) // block_n + 1


def range_excludes_diagonal(start_m, block_m, block_n, n_q, n_k):
    return 0, (start_m * block_m + n_k - n_q) // block_n


def range_tutorial(start_m, block_m, block_n, n_q, n_k):
    return 0, start_m + 1


def range_key_positions(start_m, block_m, block_n, n_q, n_k):
    return 0, min((start_m + 1) * block_m, n_q) + n_k - n_q


def range_cdiv_of_last_key(start_m, block_m, block_n, n_q, n_k):
    # "round up" applied to the last key's index instead of the number of keys
    last_key = min((start_m + 1) * block_m, n_q) - 1 + n_k - n_q
    return 0, -(-last_key // block_n)


def range_last_row_one_past(start_m, block_m, block_n, n_q, n_k):
    last_row = min((start_m + 1) * block_m, n_q)  # the first row of the next block
    last_key = last_row + n_k - n_q
    if last_key < 0:
        return 0, 0
    return 0, last_key // block_n + 1


def range_clamped_at_zero(start_m, block_m, block_n, n_q, n_k):
    last_key = max(min((start_m + 1) * block_m, n_q) - 1 + n_k - n_q, 0)
    return 0, last_key // block_n + 1


def range_truncating_division(start_m, block_m, block_n, n_q, n_k):
    last_key = min((start_m + 1) * block_m, n_q) - 1 + n_k - n_q
    return 0, int(last_key / block_n) + 1


def test_causal_block_range_passes_the_right_answer_and_the_library(capsys):
    result = checks.check_causal_block_range(range_right)
    assert result.passed and result.points == result.max_points == 2
    assert result.exercise == "06_masking.causal_block_range"
    assert capsys.readouterr().out == "✓ causal_block_range: correct on 5 cases (2/2 points)\n"
    assert checks.check_causal_block_range(masks.causal_block_range).passed


def test_causal_block_range_accepts_any_empty_range_and_integer_types():
    def negative_hi_when_empty(start_m, block_m, block_n, n_q, n_k):
        last_key = min((start_m + 1) * block_m, n_q) - 1 + n_k - n_q
        return torch.tensor(0), last_key // block_n + 1 if last_key >= 0 else -3

    assert checks.check_causal_block_range(negative_hi_when_empty).passed


def test_causal_block_range_passing_verdict_is_deterministic():
    assert (checks.check_causal_block_range(range_right).feedback
            == checks.check_causal_block_range(range_right).feedback)


def test_causal_block_range_blank_is_not_attempted(capsys):
    result = checks.check_causal_block_range(range_blank)
    assert not result.passed and result.points == 0
    assert "not attempted yet: replace `raise NotImplementedError`" in result.feedback
    assert capsys.readouterr().out.strip() == result.feedback


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("wrong, words", [
    (range_strict_less, "off by one at the diagonal: the block holding the last visible key is lost"),
    (range_top_left, "the n_k - n_q offset is missing (top-left alignment)"),
    (range_no_round_up, "the last, partly visible key block is dropped: hi must round up"),
    (range_every_block, "your range is safe (it holds every key these rows see, so the output would be right), "
                        "but it is every key block: nothing above the diagonal is skipped"),
    (range_ignores_query_tail, "hi goes past the last key block"),
    (range_excludes_diagonal, "the diagonal block is left out"),
    (range_tutorial, "hi = start_m + 1 counts query blocks"),
    (range_key_positions, "these are key positions, not key block indices"),
    (range_cdiv_of_last_key, "off by one at the diagonal"),
    (range_last_row_one_past, "off by one in the block's last row"),
    (range_clamped_at_zero, "with more queries than keys (n_q > n_k) the first n_q - n_k queries see no key"),
    (range_truncating_division, "with more queries than keys (n_q > n_k) the first n_q - n_k queries see no key"),
], ids=lambda x: getattr(x, "__name__", None))
def test_causal_block_range_names_the_mistake(wrong, words, seed):
    result = checks.check_causal_block_range(wrong, seed=seed)
    assert not result.passed and result.points == 0
    assert f"likely mistake: {words}" in result.feedback, result.feedback
    assert "\n  or: " not in result.feedback  # the fixed cases tell these answers apart


@pytest.mark.parametrize("wrong, case", [
    (range_excludes_diagonal, 1), (range_key_positions, 1), (range_every_block, 1), (range_last_row_one_past, 1),
    (range_strict_less, 2), (range_cdiv_of_last_key, 2), (range_no_round_up, 2), (range_ignores_query_tail, 2),
    (range_tutorial, 2), (range_top_left, 3), (range_clamped_at_zero, 4), (range_truncating_division, 4),
], ids=lambda x: getattr(x, "__name__", None))
def test_causal_block_range_wrong_answers_fail_a_fixed_case_whatever_the_seed(wrong, case):
    for seed in (11, 12):
        assert f"case {case} of 5: " in checks.check_causal_block_range(wrong, seed=seed).feedback


def test_causal_block_range_fixed_cases_hold_tails_more_queries_and_fewer_queries():
    cases = framework.make_cases(masking.CAUSAL_BLOCK_RANGE_CHECK)
    other_seed = framework.make_cases(masking.CAUSAL_BLOCK_RANGE_CHECK, seed=5)
    assert [c.args for c in cases[:4]] == [c.args for c in other_seed[:4]]
    configs = [config for case in cases[:4] for config in case.args[0]]
    assert any(n_q % bm and bm != bn for _, bm, bn, n_q, n_k in configs)                   # tails, bm != bn
    assert any(n_q < n_k for *_, n_q, n_k in configs) and any(n_q > n_k for *_, n_q, n_k in configs)
    sees_nothing = [c for c in configs if masking._last_key(*c) < 0]
    assert sees_nothing and all(tuple(masking._right_range(*c)) == (0, 0) for c in sees_nothing)


def test_causal_block_range_says_which_block_and_what_goes_wrong():
    result = checks.check_causal_block_range(range_excludes_diagonal, seed=0)
    assert "case 1 of 5: n_q = n_k = " in result.feedback
    assert "causal_block_range(0, 32, 32, " in result.feedback
    assert "expected (lo, hi) = (0, 1), got (0, 0)" in result.feedback
    assert "your range leaves out key block 0 (keys 0..31), which these rows see" in result.feedback
    wasteful = checks.check_causal_block_range(range_every_block, seed=0).feedback
    assert "which no row of this block sees: wasted loads" in wasteful
    past = checks.check_causal_block_range(range_ignores_query_tail, seed=0).feedback
    assert "there is no key there, hi is at most cdiv(n_k, block_n)" in past


@pytest.mark.parametrize("answer, words", [
    (lambda *args: None, "returned None"),
    (lambda s, bm, bn, nq, nk: (0, (min((s + 1) * bm, nq) + nk - nq) / bn),
     "returned hi = 1.0 (float); expected an int (use // for integer division"),
    (lambda *args: (0, 1, 2), "returned a tuple of length 3; expected a pair (lo, hi) of ints"),
    (lambda *args: [[0, 1]], "returned a list of length 1"),
])
def test_causal_block_range_malformed_answers_are_explained(answer, words):
    result = checks.check_causal_block_range(answer, seed=0)
    assert not result.passed and words in result.feedback, result.feedback


# ------------------------------------------------------------------ padding mask
def padding_right(seq_lens, n_q, n_k):
    lens = seq_lens[:, None, None, None]
    return (torch.arange(n_q)[:, None] < lens) & (torch.arange(n_k)[None, :] < lens)


def padding_blank(seq_lens, n_q, n_k):
    raise NotImplementedError("Exercise: write your code here")


def padding_keys_only(seq_lens, n_q, n_k):
    lens = seq_lens[:, None, None, None]
    return (torch.arange(n_k) < lens).expand(-1, -1, n_q, -1)


def padding_queries_only(seq_lens, n_q, n_k):
    lens = seq_lens[:, None, None, None]
    return (torch.arange(n_q)[:, None] < lens).expand(-1, -1, -1, n_k)


def padding_inclusive(seq_lens, n_q, n_k):
    lens = seq_lens[:, None, None, None]
    return (torch.arange(n_q)[:, None] <= lens) & (torch.arange(n_k)[None, :] <= lens)


def padding_one_length(seq_lens, n_q, n_k):
    length = int(seq_lens.max())
    mask = (torch.arange(n_q)[:, None] < length) & (torch.arange(n_k)[None, :] < length)
    return mask.expand(len(seq_lens), 1, n_q, n_k)


def padding_first_length_no_batch(seq_lens, n_q, n_k):
    length = seq_lens[0]
    return ((torch.arange(n_q)[:, None] < length) & (torch.arange(n_k)[None, :] < length))[None, None]


def padding_inverted(seq_lens, n_q, n_k):
    lens = seq_lens[:, None, None, None]
    return (torch.arange(n_q)[:, None] >= lens) | (torch.arange(n_k)[None, :] >= lens)


def padding_additive(seq_lens, n_q, n_k):
    return torch.zeros(len(seq_lens), 1, n_q, n_k).masked_fill(~padding_right(seq_lens, n_q, n_k), float("-inf"))


def padding_no_head_axis(seq_lens, n_q, n_k):
    lens = seq_lens[:, None, None]
    return (torch.arange(n_q)[:, None] < lens) & (torch.arange(n_k)[None, :] < lens)


def padding_axes_swapped(seq_lens, n_q, n_k):
    lens = seq_lens[:, None, None, None]
    return (torch.arange(n_k)[:, None] < lens) & (torch.arange(n_q)[None, :] < lens)


def padding_keys_only_broadcastable(seq_lens, n_q, n_k):
    return torch.arange(n_k) < seq_lens[:, None, None, None]             # (B, 1, 1, N_k)


def padding_queries_only_broadcastable(seq_lens, n_q, n_k):
    return torch.arange(n_q)[:, None] < seq_lens[:, None, None, None]    # (B, 1, N_q, 1)


def test_padding_mask_passes_the_right_answer_and_the_library(capsys):
    result = checks.check_padding_mask(padding_right)
    assert result.passed and result.points == result.max_points == 2
    assert result.exercise == "06_masking.padding_mask"
    assert capsys.readouterr().out == "✓ padding_mask: correct on 6 cases (2/2 points)\n"
    assert checks.check_padding_mask(masks.padding_mask).passed


def test_padding_mask_blank_is_not_attempted():
    result = checks.check_padding_mask(padding_blank)
    assert not result.passed and "not attempted yet" in result.feedback


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("wrong, words", [
    (padding_keys_only, "only the keys are masked: queries past the length are padding too"),
    (padding_queries_only, "only the queries are masked: key j of sample b is padding"),
    (padding_inclusive, "off by one: positions 0 .. seq_lens[b] - 1 are real"),
    (padding_one_length, "every sample got the same length"),
    (padding_first_length_no_batch, "every sample got the same length"),
    (padding_inverted, "the mask is inverted: True must mean 'may attend'"),
    (padding_additive, "this is an additive mask (0 where allowed, -inf where not)"),
    (padding_no_head_axis, "the mask must have shape (B, 1, N_q, N_k)"),
    (padding_axes_swapped, "rows are queries and columns are keys"),
    (padding_keys_only_broadcastable, "only the keys are masked: queries past the length are padding too"),
    (padding_queries_only_broadcastable, "only the queries are masked: key j of sample b is padding"),
], ids=lambda x: getattr(x, "__name__", None))
def test_padding_mask_names_the_mistake(wrong, words, seed):
    result = checks.check_padding_mask(wrong, seed=seed)
    assert not result.passed and result.points == 0
    assert "case 1 of 6: seq_lens = [9, 0, 4, 6]" in result.feedback  # the fixed case, whatever the seed
    assert f"likely mistake: {words}" in result.feedback, result.feedback
    assert "\n  or: " not in result.feedback


def test_padding_mask_says_which_entry_is_wrong_and_why():
    feedback = checks.check_padding_mask(padding_keys_only, seed=0).feedback
    assert "case 1 of 6: seq_lens = [9, 0, 4, 6] (int32), n_q = 7, n_k = 10" in feedback
    assert "so query" in feedback and "is padding and key" in feedback and "expected False, got True" in feedback


def test_padding_mask_wants_a_boolean_mask():
    result = checks.check_padding_mask(lambda *args: padding_right(*args).float(), seed=0)
    assert not result.passed
    assert "right values, but the mask must be a boolean tensor (torch.bool, True = may attend), got torch.float32" \
        in result.feedback


@pytest.mark.parametrize("check", [masking.CAUSAL_BLOCK_RANGE_CHECK, masking.PADDING_MASK_CHECK],
                         ids=lambda check: check.exercise)
def test_cases_are_plain_data_that_load_with_weights_only(check):
    cases = framework.make_cases(check)
    buffer = io.BytesIO()
    torch.save([(case.args, case.context) for case in cases], buffer)
    buffer.seek(0)
    assert len(torch.load(buffer, weights_only=True)) == len(cases)


def test_padding_mask_that_edits_seq_lens_in_place_fails():
    def reshapes_in_place(seq_lens, n_q, n_k):
        lens = seq_lens.unsqueeze_(-1).unsqueeze_(-1).unsqueeze_(-1)  # the caller's seq_lens is now (B, 1, 1, 1)
        return (torch.arange(n_q)[:, None] < lens) & (torch.arange(n_k)[None, :] < lens)

    result = checks.check_padding_mask(reshapes_in_place)
    assert not result.passed and "changed its input in place (argument 1)" in result.feedback


def test_exercises_are_registered_in_notebook_order():
    assert [(name, points) for name, points, _ in checks.EXERCISES["06_masking"]] == [
        ("causal_block_range", 2), ("padding_mask", 2)]
