"""The exercise checks pass right answers and name the mistake in wrong ones.

Every wrong answer here is a bug a learner plausibly writes. Wrong kernels are
real @triton.jit kernels at module level (Triton needs their source).
"""
import math
import signal
import threading

import pytest
import torch

from flashlib import runtime  # before triton: flashlib picks the interpreter on a CPU
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from flashlib.course import checks, results
from flashlib.course.checks import framework
from flashlib.kernels.matmul import matmul_kernel

interpreter_only = pytest.mark.skipif(not runtime.INTERPRET, reason="needs Triton's interpreter")


def _scaled_scores(q, k):
    return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])


# ------------------------------------------------------------- naive attention

def attention_right(q, k, v):
    return torch.softmax(_scaled_scores(q, k), dim=-1) @ v


def attention_blank(q, k, v):
    raise NotImplementedError("write naive attention here")


def attention_no_scale(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v


def attention_scale_1_over_d(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1], dim=-1) @ v


def attention_softmax_over_queries(q, k, v):
    return torch.softmax(_scaled_scores(q, k), dim=-2) @ v


def attention_k_not_transposed(q, k, v):
    return torch.softmax(q @ k / math.sqrt(q.shape[-1]), dim=-1) @ v


def attention_returns_p(q, k, v):
    return torch.softmax(_scaled_scores(q, k), dim=-1)


def attention_scale_from_n(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-2]), dim=-1) @ v


def attention_scales_q_in_place(q, k, v):
    q /= math.sqrt(q.shape[-1])  # right values, but the caller's q is changed
    return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v


def attention_hangs(q, k, v):
    while True:
        pass


def attention_raises(q, k, v):
    both = torch.cat([q, k], dim=5)
    return both


def test_naive_attention_passes_the_right_answer(capsys):
    result = checks.check_naive_attention(attention_right)
    assert result.passed and result.points == result.max_points == 2
    assert result.exercise == "01_naive_attention.naive_attention"
    assert capsys.readouterr().out == "✓ naive_attention: correct on 5 cases (2/2 points)\n"


def test_naive_attention_passing_verdict_is_deterministic():
    first = checks.check_naive_attention(attention_right)
    second = checks.check_naive_attention(attention_right)
    assert first.feedback == second.feedback


def test_naive_attention_blank_is_not_attempted(capsys):
    result = checks.check_naive_attention(attention_blank)
    assert not result.passed and result.points == 0
    assert "not attempted yet: replace `raise NotImplementedError`" in result.feedback
    assert capsys.readouterr().out.strip() == result.feedback


@pytest.mark.parametrize("wrong, words", [
    (attention_no_scale, "1/sqrt(d) scale is missing"),
    (attention_scale_1_over_d, "1/d instead of 1/sqrt(d)"),
    (attention_softmax_over_queries, "softmax is over the wrong dimension"),
    (attention_k_not_transposed, "K is not transposed"),
    (attention_returns_p, "returned the attention probabilities P"),
])
def test_naive_attention_names_the_mistake(wrong, words):
    result = checks.check_naive_attention(wrong)
    assert not result.passed
    assert "likely mistake: looks like" in result.feedback and words in result.feedback
    assert "case 1 of 5" in result.feedback and "expected" in result.feedback


@pytest.mark.parametrize("seed", [None, 1, 2])
def test_naive_attention_scale_from_the_sequence_length_is_named(seed):
    result = checks.check_naive_attention(attention_scale_from_n, seed=seed)
    assert not result.passed and "case 2 of 5" in result.feedback  # case 1 has N = D: no difference there
    assert "likely mistake: looks like the scale uses the sequence length instead of the head dim" in result.feedback


def test_naive_attention_that_changes_its_input_in_place_fails():
    result = checks.check_naive_attention(attention_scales_q_in_place)
    assert not result.passed and result.points == 0
    assert "right values, but your code changed its input in place (argument 1)" in result.feedback
    assert "case 1 of 5" in result.feedback and "x = x - m, not x -= m" in result.feedback


def test_naive_attention_first_case_is_the_same_whatever_the_seed():
    first = [framework.make_cases(checks.attention_basics.NAIVE_ATTENTION_CHECK, seed=seed)[0] for seed in (0, 1)]
    assert all(torch.equal(a, b) for a, b in zip(first[0].args, first[1].args))


def test_naive_attention_wrong_shape_is_explained():
    result = checks.check_naive_attention(lambda q, k, v: attention_right(q, k, v).transpose(1, 2))
    assert not result.passed
    assert "wrong shape" in result.feedback
    assert "expected shape (1, 2, 16, 16) = (B, H, N_q, D), got (1, 16, 2, 16)" in result.feedback


def test_naive_attention_shape_of_p_is_named_when_n_k_differs_from_d():
    # Past the square first case (where P is caught by its values), P has the wrong shape.
    def p_except_on_square(q, k, v):
        square = k.shape[-2] == q.shape[-1]
        return attention_right(q, k, v) if square else attention_returns_p(q, k, v)

    result = checks.check_naive_attention(p_except_on_square)
    assert "case 2 of 5" in result.feedback and "wrong shape" in result.feedback
    assert "returned the attention probabilities P" in result.feedback


def test_naive_attention_wrong_dtype_and_none_are_explained():
    as_float32 = checks.check_naive_attention(lambda q, k, v: attention_right(q, k, v).float())
    assert "wrong dtype" in as_float32.feedback and "expected torch.float64, got torch.float32" in as_float32.feedback
    returns_none = checks.check_naive_attention(lambda q, k, v: None)
    assert "returned None" in returns_none.feedback and "`return` missing" in returns_none.feedback


def test_naive_attention_hang_is_stopped_by_the_time_limit():
    result = checks.check_naive_attention(attention_hangs, time_limit_s=0.3)
    assert not result.passed
    assert "took longer than 0.3 s (an infinite loop? a too-large grid?)" in result.feedback


def attention_hangs_then_swallows_the_alarm(q, k, v):
    """A hang inside code that turns every exception into another one, as C code (numpy, torch, Triton's
    interpreter) sometimes does with the alarm's CheckTimeout: seen once as a flaky TypeError in CI."""
    try:
        while True:
            pass
    except BaseException:
        raise TypeError("expected a sequence of integers") from None


def test_a_timeout_turned_into_another_error_is_still_reported_as_the_timeout():
    result = checks.check_naive_attention(attention_hangs_then_swallows_the_alarm, time_limit_s=0.3)
    assert not result.passed
    assert "took longer than 0.3 s (an infinite loop? a too-large grid?)" in result.feedback
    assert "TypeError" not in result.feedback


def test_naive_attention_exception_shows_type_message_and_line():
    result = checks.check_naive_attention(attention_raises)
    assert not result.passed
    assert "your code raised IndexError" in result.feedback
    assert "Dimension out of range" in result.feedback
    assert "in attention_raises, line" in result.feedback
    assert "both = torch.cat([q, k], dim=5)" in result.feedback


# -------------------------------------------------------------- stable softmax

def softmax_right(x):
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def softmax_blank(x):
    raise NotImplementedError


def softmax_without_max(x):
    e = torch.exp(x)
    return e / e.sum(dim=-1, keepdim=True)


def softmax_over_dim_0(x):
    e = torch.exp(x - x.amax(dim=0, keepdim=True))
    return e / e.sum(dim=0, keepdim=True)


def softmax_divided_by_max(x):
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return e / e.amax(dim=-1, keepdim=True)


def softmax_minus_min(x):
    e = torch.exp(x - x.amin(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def softmax_global_max(x):
    e = torch.exp(x - x.max())  # the max of the whole tensor
    return e / e.sum(dim=-1, keepdim=True)


def softmax_global_max_guarded(x):
    e = torch.exp(x - x.max())
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def softmax_column_max(x):
    e = torch.exp(x - x.amax(dim=0, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def softmax_in_place(x):
    x -= x.amax(dim=-1, keepdim=True)  # right values, but the caller's x is changed
    e = torch.exp(x)
    return e / e.sum(dim=-1, keepdim=True)


def softmax_hangs(x):
    total = 0
    while total >= 0:
        total += 1
    return x


def test_stable_softmax_passes_the_right_answer_and_torch_softmax(capsys):
    assert checks.check_stable_softmax(softmax_right).passed
    assert checks.check_stable_softmax(lambda x: torch.softmax(x, dim=-1)).passed
    out = capsys.readouterr().out
    assert out == "✓ stable_softmax: correct on 6 cases (2/2 points)\n" * 2


def test_stable_softmax_blank_is_not_attempted():
    result = checks.check_stable_softmax(softmax_blank)
    assert not result.passed and "not attempted yet" in result.feedback


def test_stable_softmax_without_max_fails_on_large_values_and_says_so():
    result = checks.check_stable_softmax(softmax_without_max)
    assert not result.passed
    assert "case 1 of 6: x (4, 6), float64, rows at very different offsets: around +800" in result.feedback
    assert "NaN" in result.feedback and "row max is not subtracted" in result.feedback


@pytest.mark.parametrize("seed", [None, 1, 2, 3])
@pytest.mark.parametrize("wrong, headline, row", [
    (softmax_global_max, "NaN or inf in the output", "row [2] sums to nan"),
    (softmax_global_max_guarded, "wrong values", "row [2] sums to 0"),
], ids=lambda x: getattr(x, "__name__", None))
def test_stable_softmax_global_max_fails_in_every_run_and_is_named(wrong, headline, row, seed):
    # random rows rarely sit far enough apart; the fixed first case has rows near +800, +300, -300, -800
    result = checks.check_stable_softmax(wrong, seed=seed)
    assert not result.passed and result.points == 0
    assert f"✗ stable_softmax: {headline}" in result.feedback and "case 1 of 6" in result.feedback
    assert f"every row must sum to 1; {row}" in result.feedback
    assert ("likely mistake: looks like the max of the whole tensor (x.max()) is subtracted, not each row's "
            "own max") in result.feedback
    assert "\n  or: " not in result.feedback


def test_stable_softmax_max_over_the_wrong_dim_is_named():
    result = checks.check_stable_softmax(softmax_column_max)
    assert not result.passed and "case 1 of 6" in result.feedback
    assert "the max is taken over the wrong dimension (each column's max, not each row's)" in result.feedback


def test_stable_softmax_that_changes_its_input_in_place_fails():
    result = checks.check_stable_softmax(softmax_in_place)
    assert not result.passed and result.points == 0
    assert "right values, but your code changed its input in place (argument 1)" in result.feedback
    assert "a function must not modify the tensors it is given" in result.feedback


@pytest.mark.parametrize("wrong, words", [
    (softmax_over_dim_0, "softmax is over the wrong dimension"),
    (softmax_divided_by_max, "divided by its max instead of its sum"),
    (softmax_minus_min, "row min is subtracted instead of the max"),
])
def test_stable_softmax_names_the_mistake(wrong, words):
    result = checks.check_stable_softmax(wrong)
    assert not result.passed and words in result.feedback


def test_stable_softmax_says_which_row_does_not_sum_to_one():
    result = checks.check_stable_softmax(softmax_divided_by_max)
    assert "every row must sum to 1; row [0] sums to" in result.feedback


def test_stable_softmax_hang_and_exception():
    hang = checks.check_stable_softmax(softmax_hangs, time_limit_s=0.3)
    assert "took longer than 0.3 s" in hang.feedback
    raised = checks.check_stable_softmax(lambda x: x.softmax(dim=7))
    assert "your code raised IndexError" in raised.feedback and "x.softmax(dim=7)" in raised.feedback


# ------------------------------------------------------------- matmul kernel

@triton.jit
def matmul_stub_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                       stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # the exercise as generated: the k-loop body is the stub `pass`
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        pass
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def matmul_empty_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                        stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pass


@triton.jit
def matmul_no_k_mask_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                            stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=offs_m[:, None] < M, other=0.0)  # K tail not masked
        b = tl.load(b_ptrs, mask=offs_n[None, :] < N, other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def matmul_no_advance_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                             stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] + k0 < K), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] + k0 < K) & (offs_n[None, :] < N), other=0.0)
        acc += tl.dot(a, b)  # the pointers never move on
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def matmul_overwrite_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                            stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] + k0 < K), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] + k0 < K) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b)  # overwrites instead of accumulating
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def matmul_no_store_mask_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] + k0 < K), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] + k0 < K) & (offs_n[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty))  # no mask


@triton.jit
def matmul_k_only_masks_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                               stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Loads masked along K only: C's values come out right (the rows of A past M only reach rows of C that the
    masked store drops), but the loads read past A and B."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=offs_k[None, :] + k0 < K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] + k0 < K, other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def matmul_wrapped_rows_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                               stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Triton's tutorial way: rows and columns wrapped modulo M and N, so every load stays inside A and B, and
    only K is masked. Correct, and must pass."""
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_m % M)[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + (offs_n % N)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=offs_k[None, :] + k0 < K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] + k0 < K, other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def matmul_bad_arange_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                             stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    offs_k = tl.arange(0, 3)
    tl.store(c_ptr + offs_k, tl.load(a_ptr + offs_k))


@triton.jit
def matmul_slow_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                       stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K * 1000000, BLOCK_K):  # a far too long loop
        acc += 1.0
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


# More wrong k-loops, from one jit body (the bug picked by a constexpr).
(MM_NO_OTHER, MM_NO_OTHER_ON_B, MM_A_ADVANCED_BY_BLOCK_K, MM_B_REBUILT_WITHOUT_STRIDE_BN, MM_LOOP_TO_K_MINUS_BLOCK,
 MM_LOOP_TO_WHOLE_BLOCKS, MM_A_STEPS_WITH_STRIDE_AM, MM_A_ASSUMED_CONTIGUOUS, MM_LOOP_TO_K_MINUS_ONE) = (
    tl.constexpr(i) for i in range(9))


@triton.jit
def _matmul_bug_body(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                     stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, BUG: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_pid_n
    pid_n = pid % num_pid_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_end = K
    if BUG == MM_LOOP_TO_K_MINUS_BLOCK:
        k_end = K - BLOCK_K
    elif BUG == MM_LOOP_TO_WHOLE_BLOCKS:
        k_end = K // BLOCK_K * BLOCK_K
    elif BUG == MM_LOOP_TO_K_MINUS_ONE:  # right unless the last step is 1 wide
        k_end = K - 1
    for k0 in range(0, k_end, BLOCK_K):
        a_mask = (offs_m[:, None] < M) & (offs_k[None, :] + k0 < K)
        b_mask = (offs_k[:, None] + k0 < K) & (offs_n[None, :] < N)
        if BUG == MM_NO_OTHER:
            a = tl.load(a_ptrs, mask=a_mask)
            b = tl.load(b_ptrs, mask=b_mask)
        elif BUG == MM_NO_OTHER_ON_B:
            a = tl.load(a_ptrs, mask=a_mask, other=0.0)
            b = tl.load(b_ptrs, mask=b_mask)
        elif BUG == MM_A_ASSUMED_CONTIGUOUS:
            a = tl.load(a_ptr + offs_m[:, None] * K + (k0 + offs_k)[None, :], mask=a_mask, other=0.0)
            b = tl.load(b_ptrs, mask=b_mask, other=0.0)
        elif BUG == MM_B_REBUILT_WITHOUT_STRIDE_BN:
            a = tl.load(a_ptrs, mask=a_mask, other=0.0)
            b = tl.load(b_ptr + (k0 + offs_k)[:, None] * stride_bk + offs_n[None, :], mask=b_mask, other=0.0)
        else:
            a = tl.load(a_ptrs, mask=a_mask, other=0.0)
            b = tl.load(b_ptrs, mask=b_mask, other=0.0)
        acc += tl.dot(a, b)
        if BUG == MM_A_ADVANCED_BY_BLOCK_K:
            a_ptrs += BLOCK_K  # assumes stride_ak == 1
        elif BUG == MM_A_STEPS_WITH_STRIDE_AM:
            a_ptrs += BLOCK_K * stride_am
        else:
            a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def matmul_no_other_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                           stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    _matmul_bug_body(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                     stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, MM_NO_OTHER)


@triton.jit
def matmul_no_other_on_b_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    _matmul_bug_body(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                     stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, MM_NO_OTHER_ON_B)


@triton.jit
def matmul_a_advanced_by_block_k_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                                        stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr,
                                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    _matmul_bug_body(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                     stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, MM_A_ADVANCED_BY_BLOCK_K)


@triton.jit
def matmul_b_rebuilt_without_stride_bn_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                                              stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr,
                                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                              GROUP_M: tl.constexpr):
    _matmul_bug_body(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                     stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, MM_B_REBUILT_WITHOUT_STRIDE_BN)


@triton.jit
def matmul_loop_to_k_minus_block_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                                        stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr,
                                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    _matmul_bug_body(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                     stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, MM_LOOP_TO_K_MINUS_BLOCK)


@triton.jit
def matmul_loop_to_whole_blocks_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                                       stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr,
                                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    _matmul_bug_body(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                     stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, MM_LOOP_TO_WHOLE_BLOCKS)


@triton.jit
def matmul_loop_to_k_minus_one_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                                      stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr,
                                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    _matmul_bug_body(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                     stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, MM_LOOP_TO_K_MINUS_ONE)


@triton.jit
def matmul_a_steps_with_stride_am_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                                         stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr,
                                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    _matmul_bug_body(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                     stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, MM_A_STEPS_WITH_STRIDE_AM)


@triton.jit
def matmul_a_assumed_contiguous_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                                       stride_bn, stride_cm, stride_cn, BLOCK_M: tl.constexpr,
                                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    _matmul_bug_body(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                     stride_cm, stride_cn, BLOCK_M, BLOCK_N, BLOCK_K, MM_A_ASSUMED_CONTIGUOUS)


@triton.jit
def masked_copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, WITH_OTHER: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    if WITH_OTHER:
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    else:
        x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, x)


def test_matmul_kernel_passes_the_library_kernel(capsys):
    result = checks.check_matmul_kernel(matmul_kernel)
    assert result.passed and result.points == 3
    assert result.exercise == "02_triton_tiled_matmul.matmul_kernel"
    assert capsys.readouterr().out == "✓ matmul_kernel: correct on 7 cases (3/3 points)\n"


@triton.jit
def matmul_steps_by_one_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                               stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    offs_m = (pid // num_pid_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid % num_pid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K):  # one step per element of K, while the pointers move a whole block
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] + k0 < K), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] + k0 < K) & (offs_n[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def test_a_kernel_that_reads_far_past_its_tensors_gets_feedback_not_a_crash():
    """The interpreter reads raw memory: this loop once ended the process (Jupyter: "kernel died"), with no word
    for the learner. Loads and stores outside every tensor of the launch are refused before they happen."""
    result = checks.check_matmul_kernel(matmul_steps_by_one_kernel)
    assert not result.passed
    assert "WildAccess: the kernel loads" in result.feedback and "a loop that runs too long" in result.feedback


def test_matmul_replies_without_their_count_of_stray_loads_fail():
    """The count of loads outside A and B is made where the kernel runs (the learner's process, when grading):
    a reply that lacks it, or holds something else, fails instead of counting as no stray load."""
    check = checks.matmul.MATMUL_KERNEL_CHECK
    cases = framework.make_cases(check)
    replies = framework.run_learner(check, matmul_kernel, cases)
    assert framework.judge(check, cases, replies)[0]
    for forged in (None, "0", -1, True):
        for reply in replies:
            reply.context.pop("stray_reads", None)
            if forged is not None:
                reply.context["stray_reads"] = forged
        passed, headline, _ = framework.judge(check, cases, replies)
        assert not passed and "did not come back as a count" in headline, forged


def test_matmul_kernel_passes_loads_kept_inside_by_wrapping_rows():
    """Out-of-bounds reads are judged by address, not by how the kernel avoids them: wrapping rows modulo M (as
    Triton's tutorial does) keeps every load inside A and B and earns full points."""
    result = checks.check_matmul_kernel(matmul_wrapped_rows_kernel)
    assert result.passed and result.points == 3, result.feedback


@pytest.mark.parametrize("blank, words", [
    (matmul_stub_kernel, "C is all zeros"),
    (matmul_empty_kernel, "the kernel stored nothing"),
])
def test_matmul_kernel_blank_is_not_attempted(blank, words):
    result = checks.check_matmul_kernel(blank)
    assert not result.passed
    assert "not attempted yet?" in result.feedback and words in result.feedback


@pytest.mark.parametrize("wrong, words", [
    (matmul_no_k_mask_kernel, "K-tail mask is missing"),
    (matmul_no_advance_kernel, "pointers are not advanced"),
    (matmul_overwrite_kernel, "acc is overwritten instead of accumulated"),
    (matmul_no_store_mask_kernel, "wrote outside C: missing store mask"),
    (matmul_k_only_masks_kernel, "read outside A or B along M or N"),
])
def test_matmul_kernel_names_the_mistake(wrong, words):
    result = checks.check_matmul_kernel(wrong)
    assert not result.passed and words in result.feedback


def test_matmul_kernel_k_tail_failure_shows_the_case_and_the_nan():
    result = checks.check_matmul_kernel(matmul_no_k_mask_kernel)
    assert "case 3 of 7: A (45, 50) @ B (50, 70)" in result.feedback
    assert "NaN or inf in the output" in result.feedback and "got nan" in result.feedback


def test_matmul_kernel_rejects_a_plain_torch_function():
    result = checks.check_matmul_kernel(lambda a, b: a @ b)
    assert not result.passed
    assert "this is not a @triton.jit kernel (plain torch/python?)" in result.feedback


@interpreter_only
def test_matmul_kernel_exception_shows_type_message_and_kernel_line():
    result = checks.check_matmul_kernel(matmul_bad_arange_kernel)
    assert not result.passed and "your code raised" in result.feedback
    assert "power of 2" in result.feedback
    assert "in matmul_bad_arange_kernel, line" in result.feedback
    assert "offs_k = tl.arange(0, 3)" in result.feedback


@interpreter_only
def test_matmul_kernel_slow_kernel_is_stopped_by_the_time_limit():
    result = checks.check_matmul_kernel(matmul_slow_kernel, time_limit_s=0.5)
    assert not result.passed
    assert "took longer than 0.5 s (an infinite loop? a too-large grid?)" in result.feedback
    # the interpreter was left usable
    assert checks.check_matmul_kernel(matmul_kernel).passed


UNDEFINED_LANES_HINT = "likely mistake: a masked tl.load without other= reads undefined values in the masked lanes"


@pytest.mark.parametrize("wrong, case, words", [
    (matmul_no_other_kernel, 2, UNDEFINED_LANES_HINT),
    (matmul_no_other_on_b_kernel, 2, UNDEFINED_LANES_HINT),
    (matmul_loop_to_k_minus_block_kernel, 1, "likely mistake: the k-loop stops before the end of K"),
    (matmul_loop_to_whole_blocks_kernel, 2, "likely mistake: the k-loop stops before the end of K"),
    # range(0, K - 1, BLOCK_K) passed: no case had a last step 1 wide
    (matmul_loop_to_k_minus_one_kernel, 7, "likely mistake: the k-loop stops before the end of K"),
    (matmul_a_advanced_by_block_k_kernel, 4, "likely mistake: A is not read through its strides"),
    (matmul_a_steps_with_stride_am_kernel, 1, "likely mistake: A is not read through its strides"),
    (matmul_a_assumed_contiguous_kernel, 1, "likely mistake: A is not read through its strides"),
    (matmul_b_rebuilt_without_stride_bn_kernel, 5, "likely mistake: B is not read through its strides"),
])
def test_matmul_kernel_names_the_mistake_on_the_case_made_for_it(wrong, case, words):
    result = checks.check_matmul_kernel(wrong)
    assert not result.passed and result.points == 0
    assert f"case {case} of 7" in result.feedback
    assert words in result.feedback and "\n  or: " not in result.feedback, result.feedback


def test_matmul_kernel_masked_load_without_other_is_told_to_add_other():
    result = checks.check_matmul_kernel(matmul_no_other_kernel)
    assert "the memory past K holds 0" in result.feedback  # a load that ignores its K mask would read 0
    assert "Add other=0.0 to both loads" in result.feedback
    assert "K-tail mask is missing" not in result.feedback


def test_matmul_kernel_a_loop_that_stops_early_is_not_told_pointers_are_not_advanced():
    for wrong in (matmul_loop_to_k_minus_block_kernel, matmul_loop_to_whole_blocks_kernel):
        result = checks.check_matmul_kernel(wrong)
        assert "pointers are not advanced" not in result.feedback
        assert "range(0, K, BLOCK_K)" in result.feedback


def test_matmul_kernel_transposed_operands_are_described_with_their_strides():
    result = checks.check_matmul_kernel(matmul_a_advanced_by_block_k_kernel)
    assert "A is a transposed view, strides (1, " in result.feedback
    assert "wrong values" in result.feedback  # the memory around A holds numbers there, not NaN
    result = checks.check_matmul_kernel(matmul_b_rebuilt_without_stride_bn_kernel)
    assert "B is a transposed view, strides (1, " in result.feedback


def _masked_copy(with_other: bool) -> torch.Tensor:
    x = torch.arange(1.0, 9.0, device=runtime.DEVICE)
    y = torch.full((16,), -1.0, device=runtime.DEVICE)
    masked_copy_kernel[(1,)](x, y, 8, BLOCK=16, WITH_OTHER=with_other)
    return y.cpu()


@interpreter_only
def test_masked_lanes_are_nan_only_inside_the_context_and_only_without_other():
    from flashlib.course.checks.undefined_memory import nan_in_masked_lanes

    assert torch.equal(_masked_copy(False)[8:], torch.zeros(8))  # the interpreter's own fill
    with nan_in_masked_lanes():
        assert torch.isnan(_masked_copy(False)[8:]).all()
        assert torch.equal(_masked_copy(False)[:8], torch.arange(1.0, 9.0))
        assert torch.equal(_masked_copy(True)[8:], torch.zeros(8))  # other=0.0 is obeyed
    assert torch.equal(_masked_copy(False)[8:], torch.zeros(8))
    with pytest.raises(RuntimeError, match="inside"):
        with nan_in_masked_lanes():
            raise RuntimeError("inside")
    assert torch.equal(_masked_copy(False)[8:], torch.zeros(8))  # restored after an exception too


@interpreter_only
def test_a_check_leaves_the_interpreter_and_the_library_kernels_as_they_were():
    from triton.runtime import interpreter

    from flashlib.matmul import triton_matmul

    assert not checks.check_matmul_kernel(matmul_no_other_kernel).passed
    assert not checks.check_matmul_kernel(matmul_slow_kernel, time_limit_s=0.2).passed  # stopped mid-launch
    assert "create_masked_load" not in vars(interpreter.interpreter_builder)
    assert torch.equal(_masked_copy(False)[8:], torch.zeros(8))
    a, b = torch.randn(45, 50, device=runtime.DEVICE), torch.randn(50, 70, device=runtime.DEVICE)
    assert torch.allclose(triton_matmul(a, b), a @ b, atol=1e-4)


# ------------------------------------------------------------------ framework

def test_a_check_cell_keeps_its_verdict_in_the_session_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = len(results.RECORDED)
    passed = checks.check_stable_softmax(softmax_right)
    failed = checks.check_naive_attention(attention_blank)
    assert results.RECORDED[before:] == [passed, failed]
    assert failed.points == 0 and passed.points == passed.max_points
    assert list(tmp_path.iterdir()) == []  # nothing written for a grader to read


def test_the_same_code_gets_the_same_cases_every_run():
    first = framework.make_cases(checks.attention_basics.STABLE_SOFTMAX_CHECK)
    again = framework.make_cases(checks.attention_basics.STABLE_SOFTMAX_CHECK)
    assert len(first) == len(again)
    for a, b in zip(first, again):
        assert a.description == b.description
        assert all(torch.equal(x, y) for x, y in zip(a.args, b.args))


def test_exercises_registry_lists_the_notebooks_in_order():
    assert [name for name, _, _ in checks.EXERCISES["01_naive_attention"]] == ["naive_attention",
                                                                            "stable_softmax"]
    assert [name for name, _, _ in checks.EXERCISES["02_triton_tiled_matmul"]] == ["matmul_kernel"]
    for entries in checks.EXERCISES.values():
        for name, points, title in entries:
            assert points > 0 and title


def test_checks_never_raise_for_a_non_callable():
    result = checks.check_naive_attention(42)
    assert not result.passed and "expected a function, got int" in result.feedback


def test_time_limit_restores_an_outer_alarm():
    fired = []

    def outer_handler(signum, frame):
        fired.append(signum)

    previous = signal.signal(signal.SIGALRM, outer_handler)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with framework.time_limit(0.1):
            pass
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < remaining <= 0.5
        assert signal.getsignal(signal.SIGALRM) is outer_handler and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_check_runs_off_the_main_thread_without_a_time_limit():
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(checks.check_stable_softmax(softmax_right)))
    worker.start()
    worker.join(timeout=30)
    assert outcome and outcome[0].passed


def test_distance_requires_nan_at_the_same_places():
    nan = math.nan
    assert framework.distance(torch.tensor([nan, 1.0]), torch.tensor([nan, 1.0])) == 0
    assert framework.distance(torch.tensor([nan, 1.0]), torch.tensor([1.0, nan])) == math.inf
    assert framework.distance(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 4.0])) == 0.5
    assert framework.distance(torch.ones(2), torch.ones(3)) == math.inf


def test_known_error_messages_get_a_hint():
    def raises(x):
        raise RuntimeError("Cannot call @triton.jit'd outside of the scope of a kernel")

    result = checks.check_stable_softmax(raises)
    assert "`import flashlib` before `import triton`" in result.feedback


def _sum_and_max_cases(gen):
    x = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    return [framework.Case("x (3, 5), float64", (x,), (x.sum(-1), x.amax(-1)), 1e-10,
                           shape_words=("(rows,)", "(rows,)"), output_names=("sum", "max"))]


SUM_AND_MAX = framework.Check(
    "99_framework_test.sum_and_max", _sum_and_max_cases,
    [framework.Mistake("swapped", "sum and max are swapped", lambda x: (x.amax(-1), x.sum(-1)))])


@pytest.fixture
def sum_and_max_exercise(monkeypatch):
    monkeypatch.setitem(framework.EXERCISES, "99_framework_test", [("sum_and_max", 1, "a test")])


@pytest.mark.usefixtures("sum_and_max_exercise")
@pytest.mark.parametrize("answer, words", [
    (lambda x: (x.sum(-1), x.amax(-1)), "✓ sum_and_max: correct on 1 case "),
    (lambda x: (x.amax(-1), x.sum(-1)), "likely mistake: sum and max are swapped"),
    (lambda x: x.sum(-1), "returned a Tensor, expected 2 tensors: sum, max"),
    (lambda x: (x.sum(-1), x.amax(-1, keepdim=True)),
     "max: expected shape (3,) = (rows,), got (3, 1)"),
    (lambda x: (x.sum(-1), x.amin(-1)), "max: wrong values"),
])
def test_framework_checks_several_outputs(answer, words):
    result = framework.run_check(SUM_AND_MAX, answer)
    assert words in result.feedback
    assert result.passed == words.startswith("✓")


def test_a_reference_with_infinities_asks_for_the_same_infinities():
    ref = torch.tensor([1.0, -math.inf, 2.0], dtype=torch.float64)
    assert framework.error_from(ref.clone(), ref) == 0
    assert framework.error_from(torch.tensor([1.0, 0.0, 2.0]), ref) == math.inf
    index, expected, got = framework.first_difference(torch.tensor([1.0, -math.inf, 2.5]), ref, 1e-6)
    assert (index, expected, got) == ((2,), 2.0, 2.5)
