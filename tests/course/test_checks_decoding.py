"""The notebook 09 checks pass right answers and name the mistake in wrong ones.

Every wrong answer is written the way a learner plausibly writes it, independently
of the check's own list of mistakes, and each is tried on two seeds.
"""
import pytest
import torch

from flashlib import reference
from flashlib.course import checks, registry
from flashlib.course.checks import decoding, framework

NEG_INF = float("-inf")
SEEDS = (0, 1)


# ------------------------------------------------------------------------ merge_splits

def _safe(m):
    return torch.where(torch.isneginf(m), torch.zeros_like(m), m)


def merge_right(o_parts, lse_parts):
    m = lse_parts.amax(dim=0)
    m_safe = _safe(m)
    w = torch.exp(lse_parts - m_safe)
    total = w.sum(dim=0)
    o = (w[..., None] * o_parts).sum(dim=0) / torch.where(total > 0, total, torch.ones_like(total))[:, None]
    return o, m_safe + torch.log(total)


def merge_by_folding(o_parts, lse_parts):  # also right: notebook 03's pairwise merge, one chunk at a time
    o, lse = o_parts[0], lse_parts[0]
    for o_s, lse_s in zip(o_parts[1:], lse_parts[1:]):
        m = _safe(torch.maximum(lse, lse_s))
        w_a, w_b = torch.exp(lse - m), torch.exp(lse_s - m)
        total = w_a + w_b
        o = (w_a[:, None] * o + w_b[:, None] * o_s) / torch.where(total > 0, total, torch.ones_like(total))[:, None]
        lse = m + torch.log(total)
    return o, lse


def merge_blank(o_parts, lse_parts):
    raise NotImplementedError("Exercise: write your code here")


def merge_average(o_parts, lse_parts):
    return o_parts.mean(dim=0), merge_right(o_parts, lse_parts)[1]


def merge_sum(o_parts, lse_parts):
    return o_parts.sum(dim=0), lse_parts.amax(dim=0)


def merge_exp_without_max(o_parts, lse_parts):
    w = torch.exp(lse_parts)  # overflows near +800, underflows near -800
    total = w.sum(dim=0)
    return (w[..., None] * o_parts).sum(dim=0) / total[:, None], torch.log(total)


def merge_global_max(o_parts, lse_parts):
    m = lse_parts[torch.isfinite(lse_parts)].max()
    w = torch.exp(lse_parts - m)
    total = w.sum(dim=0)
    return (w[..., None] * o_parts).sum(dim=0) / torch.where(total > 0, total, torch.ones_like(total))[:, None], \
        m + torch.log(total)


def merge_not_normalised(o_parts, lse_parts):
    m = _safe(lse_parts.amax(dim=0))
    w = torch.exp(lse_parts - m)
    return (w[..., None] * o_parts).sum(dim=0), m + torch.log(w.sum(dim=0))


def merge_no_guard(o_parts, lse_parts):
    m = lse_parts.amax(dim=0)
    w = torch.exp(lse_parts - m)  # -inf - (-inf) = NaN where every chunk is empty
    total = w.sum(dim=0)
    return (w[..., None] * o_parts).sum(dim=0) / total[:, None], m + torch.log(total)


def merge_divides_by_zero(o_parts, lse_parts):
    m = _safe(lse_parts.amax(dim=0))
    w = torch.exp(lse_parts - m)
    total = w.sum(dim=0)
    return (w[..., None] * o_parts).sum(dim=0) / total[:, None], m + torch.log(total)  # 0 / 0 where all empty


def merge_nan_to_num(o_parts, lse_parts):
    return merge_right(o_parts, torch.nan_to_num(lse_parts, neginf=0.0))


def merge_lse_is_max(o_parts, lse_parts):
    return merge_right(o_parts, lse_parts)[0], lse_parts.amax(dim=0)


def merge_lse_without_max(o_parts, lse_parts):
    m = _safe(lse_parts.amax(dim=0))
    return merge_right(o_parts, lse_parts)[0], torch.log(torch.exp(lse_parts - m).sum(dim=0))


def merge_base_2(o_parts, lse_parts):
    m = _safe(lse_parts.amax(dim=0))
    w = 2 ** (lse_parts - m)
    total = w.sum(dim=0)
    return (w[..., None] * o_parts).sum(dim=0) / torch.where(total > 0, total, torch.ones_like(total))[:, None], \
        m + torch.log2(total)


def merge_log2_for_lse(o_parts, lse_parts):
    m = _safe(lse_parts.amax(dim=0))
    return merge_right(o_parts, lse_parts)[0], m + torch.log2(torch.exp(lse_parts - m).sum(dim=0))


def merge_sign_flipped(o_parts, lse_parts):
    m = _safe(lse_parts.amax(dim=0))
    w = torch.exp(m - lse_parts)
    total = w.sum(dim=0)
    return (w[..., None] * o_parts).sum(dim=0) / torch.where(total > 0, total, torch.ones_like(total))[:, None], \
        m + torch.log(total)


def test_merge_splits_passes_right_answers(capsys):
    result = checks.check_merge_splits(merge_right)
    assert result.passed and result.points == result.max_points == 2
    assert result.exercise == "09_decoding.merge_splits"
    assert capsys.readouterr().out == "✓ merge_splits: correct on 6 cases (2/2 points)\n"
    assert checks.check_merge_splits(merge_by_folding).feedback == result.feedback
    for seed in SEEDS:
        assert checks.check_merge_splits(merge_right, seed=seed).passed


def test_merge_splits_blank_is_not_attempted():
    result = checks.check_merge_splits(merge_blank)
    assert not result.passed and result.points == 0
    assert "not attempted yet: replace `raise NotImplementedError`" in result.feedback


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("wrong, case, words", [
    (merge_average, 1, "the chunks' outputs are averaged (or added) without weights"),
    (merge_sum, 1, "the chunks' outputs are averaged (or added) without weights"),
    (merge_exp_without_max, 1, "exp(L_s) was taken on its own: it overflows to inf"),
    (merge_global_max, 1, "the max was taken over the whole tensor (every row at once)"),
    (merge_not_normalised, 1, "the weighted sum of the outputs is not divided by the sum of the weights"),
    (merge_no_guard, 2, "NaN in a row where every chunk is empty"),
    (merge_divides_by_zero, 2, "NaN in a row where every chunk is empty"),
    (merge_nan_to_num, 1, "an empty chunk's L_s = -inf was replaced by 0"),
    (merge_lse_is_max, 1, "O is right but L is the largest L_s"),
    (merge_lse_without_max, 1, "O is right but L = log(sum_s w_s) is relative to the max you subtracted"),
    (merge_base_2, 1, "log2 and the natural log are mixed"),
    (merge_log2_for_lse, 1, "log2 and the natural log are mixed"),
    (merge_sign_flipped, 1, "the sign in the exp is flipped"),
], ids=lambda x: getattr(x, "__name__", None))
def test_merge_splits_names_the_mistake(wrong, case, words, seed):
    result = checks.check_merge_splits(wrong, seed=seed)
    assert not result.passed and result.points == 0
    assert f"case {case} of 6" in result.feedback, result.feedback
    assert f"likely mistake: {words}" in result.feedback, result.feedback


def test_merge_splits_says_which_output_is_wrong_and_shows_the_row():
    feedback = checks.check_merge_splits(merge_lse_is_max).feedback
    assert "O right, L wrong" in feedback
    assert "row 0: the chunks' L_s = [" in feedback and "expected L = " in feedback
    feedback = checks.check_merge_splits(merge_no_guard).feedback
    assert "row 0: the chunks' L_s = [-inf, -inf, -inf]: expected L = -inf, got nan" in feedback


def test_merge_splits_first_cases_are_fixed_and_hold_the_extremes():
    first, second = framework.make_cases(decoding.MERGE_SPLITS_CHECK, seed=0)[:2]
    again = framework.make_cases(decoding.MERGE_SPLITS_CHECK, seed=123)[:2]
    for a, b in zip((first, second), again):
        assert a.description == b.description and all(torch.equal(x, y) for x, y in zip(a.args, b.args))
    o_parts, lse_parts = first.args
    assert o_parts.shape == (4, 6, 5) and lse_parts.shape == (4, 6)
    assert lse_parts[:, 2].min() > 709 and lse_parts[:, 3].max() < -709   # exp overflows / underflows
    assert torch.isneginf(lse_parts[1, 4]) and torch.equal(o_parts[1, 4], torch.zeros(5, dtype=torch.float64))
    o_parts, lse_parts = second.args
    assert torch.isneginf(lse_parts[:, 0]).all() and torch.isneginf(second.expected[1][0])
    assert torch.equal(second.expected[0][0], torch.zeros(4, dtype=torch.float64))


def test_merge_splits_expected_is_attention_over_all_keys():
    for case in framework.make_cases(decoding.MERGE_SPLITS_CHECK):
        o, lse = merge_right(*case.args)
        assert framework.error_from(o, case.expected[0]) <= 1e-12
        assert framework.error_from(lse, case.expected[1]) <= 1e-12


@pytest.mark.parametrize("answer, words", [
    (lambda o, l: merge_right(o, l)[0], "returned a Tensor, expected 2 tensors: O, L"),
    (lambda o, l: tuple(x.float() for x in merge_right(o, l)), "O: expected torch.float64, got torch.float32"),
    (lambda o, l: (merge_right(o, l)[0][None], merge_right(o, l)[1]), "O: expected shape (6, 5) = (M, D)"),
    (lambda o, l: None, "returned None"),
])
def test_merge_splits_wrong_forms_are_explained(answer, words):
    result = checks.check_merge_splits(answer)
    assert not result.passed and words in result.feedback, result.feedback


def test_merge_splits_that_changes_its_input_in_place_fails():
    def in_place(o_parts, lse_parts):
        out = merge_right(o_parts, lse_parts)
        lse_parts.zero_()
        return out

    result = checks.check_merge_splits(in_place)
    assert not result.passed and "changed its input in place (argument 2)" in result.feedback


# ------------------------------------------------------------------ paged_gather_index

def gather_right(block_table, page_size, positions):
    return torch.gather(block_table, 1, positions // page_size), positions % page_size


def gather_by_indexing(block_table, page_size, positions):  # also right, int32 pages
    samples = torch.arange(block_table.shape[0])[:, None]
    return block_table[samples, positions // page_size], (positions % page_size).int()


def gather_blank(block_table, page_size, positions):
    raise NotImplementedError("Exercise: write your code here")


def gather_ignores_table(block_table, page_size, positions):
    return positions // page_size, positions % page_size


def gather_swapped_ops(block_table, page_size, positions):
    return torch.gather(block_table, 1, positions % page_size), positions // page_size


def gather_rounds_up(block_table, page_size, positions):
    return torch.gather(block_table, 1, (positions + page_size - 1) // page_size), positions % page_size


def gather_from_one(block_table, page_size, positions):
    samples = torch.arange(block_table.shape[0])[:, None]
    return block_table[samples, (positions - 1) // page_size], (positions - 1) % page_size


def gather_next_page(block_table, page_size, positions):
    return torch.gather(block_table, 1, positions // page_size + 1), positions % page_size


def gather_first_sample(block_table, page_size, positions):
    return block_table[0][positions // page_size], positions % page_size


def gather_flattened_table(block_table, page_size, positions):
    return block_table.flatten()[positions // page_size], positions % page_size


def gather_pair_swapped(block_table, page_size, positions):
    pages, rows = gather_right(block_table, page_size, positions)
    return rows, pages


def test_paged_gather_index_passes_right_answers(capsys):
    result = checks.check_paged_gather_index(gather_right)
    assert result.passed and result.points == result.max_points == 2
    assert result.exercise == "09_decoding.paged_gather_index"
    assert capsys.readouterr().out == "✓ paged_gather_index: correct on 6 cases (2/2 points)\n"
    assert checks.check_paged_gather_index(gather_by_indexing).feedback == result.feedback
    for seed in SEEDS:
        assert checks.check_paged_gather_index(gather_right, seed=seed).passed


def test_paged_gather_index_blank_is_not_attempted():
    result = checks.check_paged_gather_index(gather_blank)
    assert not result.passed and "not attempted yet" in result.feedback


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("wrong, case, words", [
    (gather_ignores_table, 1, "the page was taken as position // page_size"),
    (gather_swapped_ops, 1, "// and % are swapped"),
    (gather_rounds_up, 1, "off by one at a page boundary"),
    (gather_from_one, 1, "off by one at a page boundary"),
    (gather_next_page, 1, "off by one at a page boundary"),
    (gather_first_sample, 1, "the page came from another sample's row of the table"),
    (gather_flattened_table, 1, "the page came from another sample's row of the table"),
    (gather_pair_swapped, 1, "the pair is (pages, rows), in that order"),
], ids=lambda x: getattr(x, "__name__", None))
def test_paged_gather_index_names_the_mistake(wrong, case, words, seed):
    result = checks.check_paged_gather_index(wrong, seed=seed)
    assert not result.passed and result.points == 0
    assert f"case {case} of 6" in result.feedback, result.feedback
    assert f"likely mistake: {words}" in result.feedback, result.feedback


def test_paged_gather_index_the_wrong_sample_by_broadcasting_is_named_on_the_square_case():
    def arange_without_column(block_table, page_size, positions):  # pairs sample t with token t when T == B
        return block_table[torch.arange(block_table.shape[0]), positions // page_size], positions % page_size

    cases = framework.make_cases(decoding.PAGED_GATHER_INDEX_CHECK)
    square = [c for c in cases if c.args[2].shape[0] == c.args[2].shape[1]]
    passed, headline, details = framework.judge(
        decoding.PAGED_GATHER_INDEX_CHECK, square, framework.run_learner(
            decoding.PAGED_GATHER_INDEX_CHECK, arange_without_column, square))
    assert not passed and headline == "wrong values"
    assert any("likely mistake: the page came from another sample's row" in line for line in details), details


def test_paged_gather_index_explains_the_first_wrong_token():
    feedback = checks.check_paged_gather_index(gather_ignores_table).feedback
    assert ("sample 0, token 0: position 0 is in logical page 0 // 4 = 0, and block_table[0, 0] = 7: "
            "expected (page, row) = (7, 0) (row 0 % 4 = 0), got (0, 0)") in feedback


@pytest.mark.parametrize("answer, words", [
    (lambda t, ps, p: torch.gather(t, 1, p // ps) * ps + p % ps, "must return a pair (pages, rows), got one Tensor"),
    (lambda t, ps, p: (torch.gather(t, 1, (p / ps).long()), p / ps),
     "rows of dtype torch.float32: pages and rows are integer indices (use // for the page number, not /"),
    (lambda t, ps, p: (t[:, :1], p % ps), "returned pages of shape (3, 1), expected (3, 8)"),
    (lambda t, ps, p: [gather_right(t, ps, p)], "must return a pair (pages, rows), got a list of length 1"),
    (lambda t, ps, p: None, "returned None"),
])
def test_paged_gather_index_wrong_forms_are_explained(answer, words):
    result = checks.check_paged_gather_index(answer)
    assert not result.passed and words in result.feedback, result.feedback
    # The learner's code raised nothing: the feedback says what it returned, not "your code raised TypeError".
    assert "your code raised" not in result.feedback, result.feedback


def test_paged_gather_index_wrong_index_is_told_without_a_relative_error():
    """An index is right or wrong: a 'relative error 0.86, allowed 0' says nothing a learner can use."""
    feedback = checks.check_paged_gather_index(gather_ignores_table).feedback
    assert "first difference at" in feedback and "relative error" not in feedback, feedback


def test_a_learners_own_error_is_still_reported_as_raised():
    def crash(block_table, page_size, positions):
        return block_table[positions]   # IndexError: positions run past the table's columns

    feedback = checks.check_paged_gather_index(crash).feedback
    assert "your code raised IndexError" in feedback and "block_table[positions]" in feedback, feedback


def test_paged_gather_index_fixed_cases_cross_page_boundaries_whatever_the_seed():
    cases = framework.make_cases(decoding.PAGED_GATHER_INDEX_CHECK, seed=0)
    again = framework.make_cases(decoding.PAGED_GATHER_INDEX_CHECK, seed=99)
    for a, b in zip(cases[:3], again[:3]):
        assert a.description == b.description and all(
            torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a.args, b.args))
    for case in cases[:3]:
        _, page_size, positions = case.args
        rows = positions % page_size
        assert (rows == 0).any() and (rows == page_size - 1).any()  # both sides of a boundary


def test_the_gather_reference_agrees_with_the_librarys_paged_cache():
    """The check's (page, row) of every token reads what reference.cached_keys reads from a paged cache."""
    for case in framework.make_cases(decoding.PAGED_GATHER_INDEX_CHECK):
        block_table, page_size, positions = case.args
        pool = torch.randn(int(block_table.max()) + 1, page_size, 2, 3, dtype=torch.float64)
        pages, rows = case.expected[..., 0].long(), case.expected[..., 1].long()
        for b in range(positions.shape[0]):
            length = int(positions[b].max()) + 1
            keys = reference.cached_keys(pool, b, length, block_table)
            assert torch.equal(pool[pages[b], rows[b]], keys[positions[b]])


def test_the_exercises_are_registered_for_notebook_09():
    assert [e.name for e in registry.exercises_of("09_decoding")] == ["merge_splits", "paged_gather_index"]
    assert registry.max_points("09_decoding") == 4
    assert set(checks.CHECKS) == {e.key for e in registry.EXERCISES}
