"""The notebook 07 checks pass right answers and name the mistake in wrong ones.

Every wrong answer is written the way a learner plausibly writes it, independently
of the check's own list of mistakes, and each is tried on several seeds: the
mistake must be named whatever the random cases.
"""

import io

import numpy as np
import pytest
import torch

from flashlib.course import checks
from flashlib.course.checks import framework, performance

SEEDS = range(4)
FACTOR = {"fwd": 1.0, "bwd": 2.5, "train": 3.5}


# --------------------------------------------------------------------- attention FLOPs

def flops_right(batch, heads, n, d, causal=False, mode="fwd"):
    flops = 4 * batch * heads * n * n * d
    if causal:
        flops /= 2
    return flops * FACTOR[mode]


def flops_blank(batch, heads, n, d, causal=False, mode="fwd"):
    raise NotImplementedError("Exercise: write your code here")


def flops_crashes(batch, heads, n, d, causal=False, mode="fwd"):
    return 4 * batch * heads * n * n * d * {"forward": 1.0}[mode]


def flops_no_causal(batch, heads, n, d, causal=False, mode="fwd"):
    return 4 * batch * heads * n * n * d * FACTOR[mode]


def flops_causal_fwd_only(batch, heads, n, d, causal=False, mode="fwd"):
    if mode == "fwd":
        return 4 * batch * heads * n * n * d * (0.5 if causal else 1.0)
    return 4 * batch * heads * n * n * d * FACTOR[mode]


def flops_causal_pairs(batch, heads, n, d, causal=False, mode="fwd"):
    pairs = n * (n + 1) / 2 if causal else n * n
    return 4 * batch * heads * pairs * d * FACTOR[mode]


def flops_one_product(batch, heads, n, d, causal=False, mode="fwd"):
    return 2 * batch * heads * n * n * d * (0.5 if causal else 1.0) * FACTOR[mode]


def flops_bwd_twice(batch, heads, n, d, causal=False, mode="fwd"):
    factor = {"fwd": 1, "bwd": 2, "train": 3}[mode]
    return 4 * batch * heads * n * n * d * (0.5 if causal else 1.0) * factor


def flops_train_is_bwd(batch, heads, n, d, causal=False, mode="fwd"):
    factor = 1.0 if mode == "fwd" else 2.5
    return 4 * batch * heads * n * n * d * (0.5 if causal else 1.0) * factor


def flops_mode_ignored(batch, heads, n, d, causal=False, mode="fwd"):
    return 4 * batch * heads * n * n * d * (0.5 if causal else 1.0)


def flops_no_batch(batch, heads, n, d, causal=False, mode="fwd"):
    return 4 * heads * n * n * d * (0.5 if causal else 1.0) * FACTOR[mode]


def test_attention_flops_passes_the_right_answer(capsys):
    result = checks.check_attention_flops(flops_right)
    assert result.passed and result.points == result.max_points == 2
    assert result.exercise == "07_performance.attention_flops"
    assert capsys.readouterr().out == "✓ attention_flops: correct on 5 cases (2/2 points)\n"


def test_attention_flops_accepts_ints_numpy_and_tensors():
    def as_int(batch, heads, n, d, causal=False, mode="fwd"):
        return int(flops_right(batch, heads, n, d, causal, mode))

    def as_numpy(*args, **kwargs):
        return np.float64(flops_right(*args, **kwargs))

    def as_tensor(*args, **kwargs):
        return torch.tensor(flops_right(*args, **kwargs), dtype=torch.float64)

    for fn in (as_int, as_numpy, as_tensor):
        assert checks.check_attention_flops(fn).passed, fn.__name__


def test_attention_flops_agrees_with_the_benchmark_convention():
    # FA2's benchmark shapes: 16384 // N sequences, 2048 // D heads; forward 4·B·H·N²·D.
    assert flops_right(16, 32, 1024, 64) == 4 * 16 * 32 * 1024 ** 2 * 64
    from flashlib.course.checks import performance

    assert performance.attention_flops(16, 32, 1024, 64, True, "train") == 3.5 * 0.5 * 4 * 16 * 32 * 1024 ** 2 * 64


def test_attention_flops_passing_verdict_is_deterministic():
    first = checks.check_attention_flops(flops_right)
    assert all(checks.check_attention_flops(flops_right).feedback == first.feedback for _ in range(3))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("bug, case, words", [
    (flops_no_causal, 2, "causal attention is not halved"),
    (flops_causal_fwd_only, 4, "causal attention is not halved"),
    (flops_causal_pairs, 2, "not N(N+1)/2"),
    (flops_one_product, 1, "two matrix products"),
    (flops_bwd_twice, 3, "five N x N x D products"),
    (flops_train_is_bwd, 3, "1 + 2.5 = 3.5x"),
    (flops_mode_ignored, 3, "mode is ignored"),
    (flops_no_batch, 1, "multiply by batch * heads"),
])
def test_attention_flops_names_the_mistake(bug, case, words, seed):
    result = checks.check_attention_flops(bug, seed=seed)
    assert not result.passed and result.points == 0
    assert f"case {case} of 5" in result.feedback  # a fixed case: the same whatever the seed
    assert "likely mistake: " in result.feedback and words in result.feedback, result.feedback
    assert "x the right value" in result.feedback  # the first wrong call, in words


def test_attention_flops_blank_and_crash_give_readable_messages():
    blank = checks.check_attention_flops(flops_blank)
    assert not blank.passed and "not attempted yet" in blank.feedback
    crash = checks.check_attention_flops(flops_crashes)
    assert not crash.passed and "your code raised KeyError" in crash.feedback
    assert "in flops_crashes, line" in crash.feedback and "case 1 of 5" in crash.feedback


def test_attention_flops_refuses_a_non_number():
    result = checks.check_attention_flops(lambda *args, **kwargs: "many")
    assert not result.passed and "expected a number" in result.feedback
    missing = checks.check_attention_flops(lambda *args, **kwargs: None)
    assert not missing.passed and "returned None" in missing.feedback


# --------------------------------------------------------------------- achieved TFLOP/s

def tflops_right(flops, ms):
    return flops / (ms * 1e-3) / 1e12


def tflops_ms_as_seconds(flops, ms):
    return flops / ms / 1e12


def tflops_peta(flops, ms):
    return flops / (ms * 1e-3) / 1e15


def tflops_giga(flops, ms):
    return flops / (ms / 1e3) / 1e9


def tflops_ms_times_1000(flops, ms):
    return flops / (ms * 1e3) / 1e12


def tflops_microseconds(flops, ms):
    return flops / (ms * 1e-6) / 1e12


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("bug, words", [
    (tflops_ms_as_seconds, "the result is 1000x too small: the time was used as if it were in seconds"),
    (tflops_ms_times_1000, "the result is 10^6 times too small: milliseconds were multiplied by 1000"),
    (lambda flops, ms: flops / (ms / 1e-3) / 1e12, "the result is 10^6 times too small"),
    (tflops_giga, "the result is 1000x too large: dividing the FLOP/s by 1e9 gives GFLOP/s"),
    (tflops_peta, "the result is 1000x too small: dividing the FLOP/s by 1e15 gives PFLOP/s"),
    (tflops_microseconds, "the time was converted with 1e-6 (microseconds to seconds)"),
    (lambda flops, ms: flops / (ms / 1e3) / 2 ** 40, "not 2^40"),
    (lambda flops, ms: flops * (ms / 1e3) / 1e12, "a rate is work per time"),
])
def test_achieved_tflops_names_the_mistake(bug, words, seed):
    result = checks.check_achieved_tflops(bug, seed=seed)
    assert not result.passed and "case 1 of 2" in result.feedback
    assert "likely mistake: " in result.feedback and words in result.feedback, result.feedback


@pytest.mark.parametrize("bug", [tflops_ms_as_seconds, tflops_peta])
def test_achieved_tflops_1000x_too_small_names_both_slips(bug):
    # flops / ms / 1e12 and flops / (ms * 1e-3) / 1e15 give the same number: the verdict names the factor
    # and both causes, not one of them as if it were certain
    feedback = checks.check_achieved_tflops(bug).feedback
    assert "(0.001 x the right value)" in feedback
    assert ("likely mistake: the result is 1000x too small: the time was used as if it were in seconds"
            in feedback)
    assert "\n  or: the result is 1000x too small: dividing the FLOP/s by 1e15 gives PFLOP/s" in feedback


def test_achieved_tflops_1000x_too_large_names_both_slips():
    feedback = checks.check_achieved_tflops(tflops_giga).feedback
    assert "(1000 x the right value)" in feedback
    assert "GFLOP/s" in feedback and "microseconds to seconds" in feedback


def test_achieved_tflops_right_blank_and_crash(capsys):
    result = checks.check_achieved_tflops(tflops_right)
    assert result.passed and result.points == result.max_points == 1
    assert capsys.readouterr().out == "✓ achieved_tflops: correct on 2 cases (1/1 points)\n"

    def blank(flops, ms):
        raise NotImplementedError("Exercise: write your code here")

    assert "not attempted yet" in checks.check_achieved_tflops(blank).feedback
    crash = checks.check_achieved_tflops(lambda flops, ms: flops / ms.total_seconds())
    assert not crash.passed and "your code raised AttributeError" in crash.feedback


# ------------------------------------------------------------------------- roofline

def roofline_right(flops, bytes_moved, peak_tflops, hbm_gb_per_s):
    compute_s = flops / (peak_tflops * 1e12)
    memory_s = bytes_moved / (hbm_gb_per_s * 1e9)
    return max(compute_s, memory_s) * 1e3


def roofline_sum(flops, bytes_moved, peak_tflops, hbm_gb_per_s):
    return (flops / (peak_tflops * 1e12) + bytes_moved / (hbm_gb_per_s * 1e9)) * 1e3


def roofline_min(flops, bytes_moved, peak_tflops, hbm_gb_per_s):
    return min(flops / (peak_tflops * 1e12), bytes_moved / (hbm_gb_per_s * 1e9)) * 1e3


def roofline_compute_only(flops, bytes_moved, peak_tflops, hbm_gb_per_s):
    return flops / (peak_tflops * 1e12) * 1e3


def roofline_memory_only(flops, bytes_moved, peak_tflops, hbm_gb_per_s):
    return bytes_moved / (hbm_gb_per_s * 1e9) * 1e3


def roofline_gib(flops, bytes_moved, peak_tflops, hbm_gb_per_s):
    return max(flops / (peak_tflops * 1e12), bytes_moved / (hbm_gb_per_s * 2 ** 30)) * 1e3


def roofline_seconds(flops, bytes_moved, peak_tflops, hbm_gb_per_s):
    return max(flops / (peak_tflops * 1e12), bytes_moved / (hbm_gb_per_s * 1e9))


def roofline_gflops(flops, bytes_moved, peak_tflops, hbm_gb_per_s):
    return max(flops / (peak_tflops * 1e9), bytes_moved / (hbm_gb_per_s * 1e9)) * 1e3


def roofline_microseconds(flops, bytes_moved, peak_tflops, hbm_gb_per_s):
    return max(flops / (peak_tflops * 1e12), bytes_moved / (hbm_gb_per_s * 1e9)) * 1e6


def roofline_divided_by_1000(flops, bytes_moved, peak_tflops, hbm_gb_per_s):
    return max(flops / (peak_tflops * 1e12), bytes_moved / (hbm_gb_per_s * 1e9)) / 1e3


def roofline_terabytes(flops, bytes_moved, peak_tflops, hbm_gb_per_s):
    return max(flops / (peak_tflops * 1e12), bytes_moved / (hbm_gb_per_s * 1e12)) * 1e3


def roofline_units_dropped(flops, bytes_moved, peak_tflops, hbm_gb_per_s):
    return max(flops / peak_tflops, bytes_moved / hbm_gb_per_s) * 1e3


def roofline_intensity(flops, bytes_moved, peak_tflops, hbm_gb_per_s):
    # the ridge test written out, but returning the wrong branch
    intensity, ridge = flops / bytes_moved, peak_tflops * 1e12 / (hbm_gb_per_s * 1e9)
    if intensity > ridge:
        return bytes_moved / (hbm_gb_per_s * 1e9) * 1e3
    return flops / (peak_tflops * 1e12) * 1e3


def test_roofline_passes_the_right_answer_and_an_intensity_form(capsys):
    result = checks.check_roofline_time_ms(roofline_right)
    assert result.passed and result.points == result.max_points == 2
    assert capsys.readouterr().out == "✓ roofline_time_ms: correct on 2 cases (2/2 points)\n"

    def by_intensity(flops, bytes_moved, peak_tflops, hbm_gb_per_s):
        intensity, ridge = flops / bytes_moved, peak_tflops * 1e12 / (hbm_gb_per_s * 1e9)
        if intensity >= ridge:
            return flops / (peak_tflops * 1e12) * 1e3
        return bytes_moved / (hbm_gb_per_s * 1e9) * 1e3

    assert checks.check_roofline_time_ms(by_intensity).passed


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("bug, words", [
    (roofline_sum, "not their sum"),
    (roofline_min, "not min"),
    (roofline_intensity, "not min"),
    (roofline_compute_only, "only the arithmetic time"),
    (roofline_memory_only, "only the memory time"),
    (roofline_gib, "not 2^30"),
    (roofline_seconds, "the result is 1000x too small: it is in seconds"),
    (roofline_microseconds, "the result is 1000x too large: multiplying the seconds by 1e6 gives microseconds"),
    (roofline_divided_by_1000, "the result is 10^6 times too small: the seconds were divided by 1e3"),
    (roofline_gflops, "the compute time is 1000x too long: peak_tflops was multiplied by 1e9"),
    (roofline_terabytes, "the memory time is 1000x too short: hbm_gb_per_s was multiplied by 1e12"),
    (roofline_units_dropped, "convert both to per-second rates"),
], ids=lambda x: getattr(x, "__name__", None))
def test_roofline_names_the_mistake(bug, words, seed):
    result = checks.check_roofline_time_ms(bug, seed=seed)
    assert not result.passed and "case 1 of 2" in result.feedback
    assert "likely mistake: " in result.feedback and words in result.feedback, result.feedback
    # the fixed first case (an elementwise op 2000x below the ridge among others) tells them apart
    assert "\n  or: " not in result.feedback


def test_roofline_blank_and_crash():
    def blank(flops, bytes_moved, peak_tflops, hbm_gb_per_s):
        raise NotImplementedError("Exercise: write your code here")

    assert "not attempted yet" in checks.check_roofline_time_ms(blank).feedback
    crash = checks.check_roofline_time_ms(lambda f, b, p, h: max(f / p))  # max of one float
    assert not crash.passed and "your code raised TypeError" in crash.feedback
    assert "not iterable" in crash.feedback and "max(f / p)" in crash.feedback


@pytest.mark.parametrize("check", [performance.ATTENTION_FLOPS_CHECK, performance.ACHIEVED_TFLOPS_CHECK,
                                   performance.ROOFLINE_TIME_CHECK], ids=lambda check: check.exercise)
def test_first_cases_are_fixed_and_plain_data(check):
    fixed = len(framework.make_cases(check)) - 1  # the last case is the random one
    assert [c.args for c in framework.make_cases(check, seed=1)[:fixed]] == \
        [c.args for c in framework.make_cases(check, seed=2)[:fixed]]
    buffer = io.BytesIO()
    torch.save([(case.args, case.context) for case in framework.make_cases(check)], buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True)


def test_the_exercises_are_registered_in_notebook_order():
    assert [name for name, _, _ in checks.EXERCISES["07_performance"]] == [
        "attention_flops", "achieved_tflops", "roofline_time_ms"]
    assert [points for _, points, _ in checks.EXERCISES["07_performance"]] == [2, 1, 2]


def test_the_library_functions_pass_the_checks():
    from flashlib import io_model

    assert checks.check_attention_flops(io_model.attention_flops).passed
    assert checks.check_roofline_time_ms(io_model.roofline_ms).passed
