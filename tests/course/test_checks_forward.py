"""The notebook 04 check passes the teaching kernel and names the mistake in wrong kernels.

The wrong kernels are the teaching kernel with one part written the way a learner
plausibly writes it (one jit body, the bug picked by a constexpr), independently of
the check's own list of mistakes.
"""
import math

import pytest
import torch

from flashlib import runtime  # before triton: flashlib picks the interpreter on a CPU
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime.jit import KernelInterface  # noqa: E402
from flashlib.course import checks  # noqa: E402
from flashlib.kernels.attention_fwd_simple import flash_forward_kernel  # noqa: E402

# Which bug a kernel has (constexpr: globals a compiled kernel reads must be).
(RIGHT, NO_ACC_RESCALE, NO_L_RESCALE, NO_DIVISION, SCALE_TWICE, LOG2_SCALE_WITH_EXP, NO_TAIL_MASK,
 TAIL_OFF_BY_ONE, NO_LOAD_MASK, LOG2_LSE, NO_M_UPDATE, LOOP_STUB, ALL_STUBS, BLOCK_MAX_ONLY, NO_OTHER,
 NO_MAX, K_WITHOUT_OTHER, ALPHA_FLIPPED, P_OLD_MAX, ROW_STEP_HEAD_DIM, LOAD_MASK_OFF_BY_ONE,
 LOAD_MASK_WITHOUT_START) = (tl.constexpr(i) for i in range(22))


@triton.jit
def _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                  stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BUG: tl.constexpr):
    start_m = tl.program_id(0)
    off_h = tl.program_id(1)
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    q = tl.load(Q + off_h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :],
                mask=offs_m[:, None] < N_Q, other=0.0)
    k_ptrs = K + off_h * stride_kh + offs_n[None, :] * stride_kn + offs_d[:, None]
    v_ptrs = V + off_h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, N_K, BLOCK_N):
        if BUG != LOOP_STUB and BUG != ALL_STUBS:
            cols = start_n + offs_n
            if BUG == NO_LOAD_MASK:
                k = tl.load(k_ptrs)
                v = tl.load(v_ptrs)
                k_ptrs += BLOCK_N * stride_kn
                v_ptrs += BLOCK_N * stride_vn
            elif BUG == NO_OTHER:
                k = tl.load(k_ptrs + start_n * stride_kn, mask=cols[None, :] < N_K)
                v = tl.load(v_ptrs + start_n * stride_vn, mask=cols[:, None] < N_K)
            elif BUG == ROW_STEP_HEAD_DIM:  # rows assumed HEAD_DIM apart: right only for contiguous rows
                k = tl.load(k_ptrs + start_n * HEAD_DIM, mask=cols[None, :] < N_K, other=0.0)
                v = tl.load(v_ptrs + start_n * HEAD_DIM, mask=cols[:, None] < N_K, other=0.0)
            elif BUG == LOAD_MASK_OFF_BY_ONE:  # one key past N_K loaded: its score is masked below
                k = tl.load(k_ptrs + start_n * stride_kn, mask=cols[None, :] <= N_K, other=0.0)
                v = tl.load(v_ptrs + start_n * stride_vn, mask=cols[:, None] <= N_K, other=0.0)
            elif BUG == LOAD_MASK_WITHOUT_START:  # the mask of block 0 for every block: the tail block reads past
                k = tl.load(k_ptrs + start_n * stride_kn, mask=offs_n[None, :] < N_K, other=0.0)
                v = tl.load(v_ptrs + start_n * stride_vn, mask=cols[:, None] < N_K, other=0.0)
            elif BUG == K_WITHOUT_OTHER:  # harmless: the scores past N_K are replaced by -inf below
                k = tl.load(k_ptrs + start_n * stride_kn, mask=cols[None, :] < N_K)
                v = tl.load(v_ptrs + start_n * stride_vn, mask=cols[:, None] < N_K, other=0.0)
            else:
                k = tl.load(k_ptrs + start_n * stride_kn, mask=cols[None, :] < N_K, other=0.0)
                v = tl.load(v_ptrs + start_n * stride_vn, mask=cols[:, None] < N_K, other=0.0)
            if BUG == SCALE_TWICE:
                s = tl.dot(q * sm_scale, k) * sm_scale
            elif BUG == LOG2_SCALE_WITH_EXP:
                s = tl.dot(q, k) * (sm_scale * 1.4426950408889634)
            elif BUG == LOG2_LSE:
                s = tl.dot(q, k) * (sm_scale * 1.4426950408889634)  # log2 units, used with exp2 below
            else:
                s = tl.dot(q, k) * sm_scale
            if BUG == TAIL_OFF_BY_ONE:
                s = tl.where(cols[None, :] <= N_K, s, float("-inf"))
            elif BUG != NO_TAIL_MASK:
                s = tl.where(cols[None, :] < N_K, s, float("-inf"))
            if BUG == BLOCK_MAX_ONLY:
                m_new = tl.max(s, 1)
            else:
                m_new = tl.maximum(m_i, tl.max(s, 1))
            if BUG == NO_MAX:
                m_new = tl.zeros([BLOCK_M], dtype=tl.float32)  # exp(s - 0) = exp(s), nothing rescaled
                m_i = m_new
            if BUG == LOG2_LSE:
                alpha = tl.math.exp2(m_i - m_new)
                p = tl.math.exp2(s - m_new[:, None])
            elif BUG == ALPHA_FLIPPED:
                alpha = tl.exp(m_new - m_i)
                p = tl.exp(s - m_new[:, None])
            elif BUG == P_OLD_MAX:
                alpha = tl.exp(m_i - m_new)
                p = tl.exp(s - m_i[:, None])
            else:
                alpha = tl.exp(m_i - m_new)
                p = tl.exp(s - m_new[:, None])
            if BUG == NO_L_RESCALE:
                l_i = l_i + tl.sum(p, 1)
            else:
                l_i = l_i * alpha + tl.sum(p, 1)
            if BUG == NO_ACC_RESCALE:
                acc += tl.dot(p.to(v.dtype), v)
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            if BUG != NO_M_UPDATE:
                m_i = m_new
    if BUG == ALL_STUBS:
        out, lse = acc, m_i
    elif BUG == NO_MAX:
        out = acc / l_i[:, None]
        lse = tl.log(l_i)
    elif BUG == NO_DIVISION:
        out = acc
        lse = m_i + tl.log(l_i)
    else:
        out = acc / l_i[:, None]
        lse = m_i + tl.log(l_i)
    tl.store(O + off_h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=offs_m[:, None] < N_Q)
    tl.store(L + off_h * N_Q + offs_m, lse, mask=offs_m < N_Q)


# One kernel per bug, each with the exercise's signature (the interpreter runs no closures).
@triton.jit
def right_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                 stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, RIGHT)


@triton.jit
def no_acc_rescale_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                          stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                          HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, NO_ACC_RESCALE)


@triton.jit
def no_l_rescale_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                        stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, NO_L_RESCALE)


@triton.jit
def no_division_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                       stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, NO_DIVISION)


@triton.jit
def scale_twice_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                       stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, SCALE_TWICE)


@triton.jit
def log2_scale_with_exp_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                               stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, LOG2_SCALE_WITH_EXP)


@triton.jit
def no_tail_mask_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                        stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, NO_TAIL_MASK)


@triton.jit
def tail_off_by_one_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                           stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                           HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, TAIL_OFF_BY_ONE)


@triton.jit
def no_load_mask_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                        stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                        HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, NO_LOAD_MASK)


@triton.jit
def log2_lse_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                    stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, LOG2_LSE)


@triton.jit
def no_m_update_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                       stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, NO_M_UPDATE)


@triton.jit
def loop_stub_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                     stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                     HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, LOOP_STUB)


@triton.jit
def all_stubs_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                     stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                     HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, ALL_STUBS)


@triton.jit
def block_max_only_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                          stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                          HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_MAX_ONLY)


@triton.jit
def no_other_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                    stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, NO_OTHER)


@triton.jit
def k_without_other_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                           stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                           HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, K_WITHOUT_OTHER)


@triton.jit
def no_max_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                  stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                  HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, NO_MAX)


@triton.jit
def alpha_flipped_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                         stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                         HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, ALPHA_FLIPPED)


@triton.jit
def p_old_max_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                     stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                     HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, P_OLD_MAX)


@triton.jit
def row_step_head_dim_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                             stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, ROW_STEP_HEAD_DIM)


@triton.jit
def load_mask_off_by_one_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                                stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, LOAD_MASK_OFF_BY_ONE)


@triton.jit
def load_mask_without_start_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                                   stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                                   HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _forward_body(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn, stride_vh,
                  stride_vn, stride_oh, stride_on, N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, LOAD_MASK_WITHOUT_START)


class NaiveKernel(KernelInterface):
    """A 'kernel' that computes S = Q K^T with torch when launched: right values, N x N memory."""

    def run(self, Q, K, V, O, L, sm_scale, *args, grid, warmup, **kwargs):
        scores = torch.matmul(Q.float(), K.float().transpose(-2, -1)) * sm_scale  # (B*H, N_q, N_k)
        O.copy_(torch.softmax(scores, dim=-1) @ V.float())
        L.view(scores.shape[:2]).copy_(torch.logsumexp(scores, dim=-1))


def test_the_teaching_kernel_passes(capsys):
    result = checks.check_flash_forward_kernel(flash_forward_kernel)
    assert result.passed and result.points == result.max_points == 4
    assert result.exercise == "04_flash_forward.inner_loop"
    assert capsys.readouterr().out == "✓ inner_loop: correct on 8 cases (4/4 points)\n"


def test_a_kernel_written_independently_passes_and_the_verdict_is_deterministic():
    first = checks.check_flash_forward_kernel(right_kernel)
    assert first.passed
    assert checks.check_flash_forward_kernel(right_kernel).feedback == first.feedback


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the loop stub divides 0 by 0 in numpy
@pytest.mark.parametrize("bug", [all_stubs_kernel, loop_stub_kernel])
def test_the_blank_exercise_is_not_attempted(bug):
    result = checks.check_flash_forward_kernel(bug)
    assert not result.passed and result.points == 0
    assert "not attempted yet?" in result.feedback and "still the stubs" in result.feedback
    assert "case 1 of 8" in result.feedback
    assert "comes from the arithmetic" not in result.feedback  # L = -inf is the stub's m_i, not arithmetic


@pytest.mark.parametrize("bug, case, words", [
    (no_acc_rescale_kernel, 1, "acc was not rescaled by alpha"),
    (no_l_rescale_kernel, 1, "l_i was not rescaled by alpha"),
    (no_division_kernel, 1, "O was not divided by l"),
    (scale_twice_kernel, 1, "the softmax scale is applied twice"),
    (log2_scale_with_exp_kernel, 1, "scaled by sm_scale * log2(e) but exponentiated with tl.exp"),
    (log2_lse_kernel, 1, "L is in log2 units"),
    (no_m_update_kernel, 1, "m_i is never updated"),
    (no_tail_mask_kernel, 2, "keys past N_K were not masked out of the scores"),
    (tail_off_by_one_kernel, 2, "one key too many in"),
    (no_other_kernel, 2, "a masked tl.load without other= reads undefined values in the masked lanes"),
    (no_max_kernel, 4, "exponentiated without subtracting the running max"),
    (block_max_only_kernel, 5, "the running max must be the max of the old m and this block's max"),
    (alpha_flipped_kernel, 1, "alpha is flipped"),
    (p_old_max_kernel, 1, "p is taken against the old max"),
    (row_step_head_dim_kernel, 1, "the key blocks were stepped through by start_n * HEAD_DIM"),
])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # some wrong kernels overflow exp in numpy
def test_wrong_kernels_are_named(bug, case, words):
    result = checks.check_flash_forward_kernel(bug)
    assert not result.passed and result.points == 0
    assert f"case {case} of 8" in result.feedback
    assert "likely mistake: " in result.feedback and words in result.feedback, result.feedback
    assert "\n  or: " not in result.feedback, result.feedback


def test_a_masked_load_without_other_is_told_to_add_other_not_to_mask():
    result = checks.check_flash_forward_kernel(no_other_kernel)
    assert "the memory after the last key holds 0" in result.feedback
    assert "Add other=0.0 to the loads of K and V" in result.feedback
    assert "read past the last key" not in result.feedback


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # exp(+inf), 0 * inf in numpy
def test_nan_from_the_arithmetic_is_not_blamed_on_the_loads():
    result = checks.check_flash_forward_kernel(alpha_flipped_kernel)
    assert "case 1 of 8" in result.feedback and "NaN or inf in the output" in result.feedback
    assert "this case has no key tail" in result.feedback
    assert "read past the last key" not in result.feedback and "without other=" not in result.feedback


def test_k_loaded_without_other_passes_when_its_scores_are_masked():
    """The lanes past N_K of K are undefined, but their scores are replaced by -inf: right on a GPU too."""
    assert checks.check_flash_forward_kernel(k_without_other_kernel).passed


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # alpha = exp(m_i - m_new) overflows in numpy
def test_a_running_max_from_the_block_alone_fails_whichever_block_is_larger():
    """Key block 0 far above the later ones (case 5), or block 1 above blocks 0 and 2 (case 6)."""
    from flashlib.course.checks import forward, framework

    cases = framework.make_cases(forward.FORWARD_KERNEL_CHECK)
    replies = framework.run_learner(forward.FORWARD_KERNEL_CHECK, block_max_only_kernel, cases)
    for number in (5, 6):
        alone = framework.judge(forward.FORWARD_KERNEL_CHECK, [cases[number - 1]], [replies[number - 1]])
        assert not alone[0] and "running max must be the max of the old m" in alone[2][-1], alone
    for number in (1, 2, 3, 4, 7, 8):  # with no large drop of the max it is right
        assert framework.judge(forward.FORWARD_KERNEL_CHECK, [cases[number - 1]], [replies[number - 1]])[0]


def test_the_scale_applied_twice_is_told_so():
    result = checks.check_flash_forward_kernel(scale_twice_kernel)
    assert "likely mistake: the softmax scale is applied twice" in result.feedback
    assert "sm_scale already is 1/sqrt(D): apply it once" in result.feedback


def test_which_output_is_wrong_is_said():
    result = checks.check_flash_forward_kernel(log2_lse_kernel)
    assert "L: wrong values" in result.feedback and "compared: O right, L wrong" in result.feedback


@pytest.mark.parametrize("kernel, count", [(no_load_mask_kernel, 4608), (load_mask_off_by_one_kernel, 192),
                                           (load_mask_without_start_kernel, 2304)])
def test_reading_past_the_last_key_fails_even_where_o_comes_out_right(kernel, count):
    """Case 2 keeps 0 after the last key, and the scores past N_K are masked: O came out right and these kernels
    passed (4/4, the grader too), though on a GPU their loads read past K and V. The check counts them."""
    result = checks.check_flash_forward_kernel(kernel)
    assert not result.passed and "case 2 of 8" in result.feedback
    assert f"✗ inner_loop: read past the last key or query ({count} loaded elements)" in result.feedback
    assert "start_n + offs_n < N_K" in result.feedback


def test_reading_past_the_last_key_into_nan_is_told_where_the_nan_came_from():
    from flashlib.course.checks import forward, framework

    cases = framework.make_cases(forward.FORWARD_KERNEL_CHECK)
    replies = framework.run_learner(forward.FORWARD_KERNEL_CHECK, no_load_mask_kernel, cases[:3])
    passed, headline, details = framework.judge(forward.FORWARD_KERNEL_CHECK, cases[2:3], replies[2:3])
    assert not passed and headline == "O: NaN or inf in the output"
    assert any("loads read 2304 element(s) past the last query or key" in line for line in details), details
    assert any("a tl.load read past the last key" in line for line in details), details


def test_plain_torch_is_refused():
    def torch_attention(q, k, v):
        return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v

    result = checks.check_flash_forward_kernel(torch_attention)
    assert not result.passed and "not a @triton.jit kernel" in result.feedback


def test_a_kernel_that_materialises_the_scores_is_rejected():
    fake = NaiveKernel()
    assert runtime.is_triton_kernel(fake)  # it gets past the gate ...
    result = checks.check_flash_forward_kernel(fake)
    assert not result.passed  # ... and its values are right until the memory case
    assert "case 8 of 8" in result.feedback
    assert "right values, but the launch allocated" in result.feedback
    assert "FlashAttention never stores S = Q K^T" in result.feedback


def test_the_exercise_is_registered_for_the_grader():
    assert checks.EXERCISES["04_flash_forward"] == [
        ("inner_loop", 4, "The inner loop of the FlashAttention forward kernel, then O = acc / l and L = m + log l")]
