"""The notebook 05 checks pass right answers and name the mistake in wrong ones.

Every wrong answer is written the way a learner plausibly writes it, independently
of the checks' own lists of mistakes: dS as torch functions, the dK/dV loop as real
@triton.jit kernels (one jit body, the bug picked by a constexpr).
"""
import math

import pytest
import torch

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from flashlib.course import checks  # noqa: E402
from flashlib.kernels.attention_bwd_simple import flash_dkdv_kernel  # noqa: E402


# ---------------------------------------------------------------------------- dS

def ds_right(p, dp, d):
    return p * (dp - d[..., None])


def ds_recomputed_d(p, dp, d):  # D recomputed from P and dP instead of the argument: also right
    return p * (dp - (p * dp).sum(dim=-1, keepdim=True))


def ds_blank(p, dp, d):
    raise NotImplementedError("Exercise: write your code here")


def ds_no_d(p, dp, d):
    return p * dp


def ds_not_broadcast(p, dp, d):
    return p * (dp - d)


def ds_rowsum_dp(p, dp, d):
    return p * (dp - dp.sum(dim=-1, keepdim=True))


def ds_p_twice(p, dp, d):
    return p * p * (dp - d.unsqueeze(-1))


def ds_no_p(p, dp, d):
    return dp - d.unsqueeze(-1)


def ds_sign_flipped(p, dp, d):
    return p * (d.unsqueeze(-1) - dp)


def ds_p_on_dp_only(p, dp, d):
    return p * dp - d.unsqueeze(-1)


def ds_wrong_axis(p, dp, d):
    return p * (dp - (p * dp).sum(dim=-2, keepdim=True))


def ds_transposed(p, dp, d):
    return (p * (dp - d[..., None])).transpose(-2, -1)


@pytest.mark.parametrize("fn", [ds_right, ds_recomputed_d])
def test_ds_passes_right_answers(fn, capsys):
    result = checks.check_ds(fn)
    assert result.passed and result.points == result.max_points == 2
    assert result.exercise == "05_flash_backward.ds"
    assert capsys.readouterr().out == "✓ ds: correct on 5 cases (2/2 points)\n"


def test_ds_blank_is_not_attempted():
    result = checks.check_ds(ds_blank)
    assert not result.passed and "not attempted yet" in result.feedback


@pytest.mark.parametrize("fn, words", [
    (ds_no_d, "D was not subtracted"),
    (ds_not_broadcast, "D was broadcast along the keys"),
    (ds_rowsum_dp, "rowsum(dP) is not D"),
    (ds_p_twice, "P is applied twice"),
    (ds_no_p, "the factor P is missing"),
    (ds_sign_flipped, "the sign is flipped"),
    (ds_p_on_dp_only, "P multiplies dP only"),
    (ds_wrong_axis, "D was summed over the query axis"),
])
def test_ds_wrong_answers_are_named(fn, words):
    result = checks.check_ds(fn)
    assert not result.passed and result.points == 0
    assert "case 1 of 5" in result.feedback
    assert f"likely mistake: {words}" in result.feedback, result.feedback


def test_ds_on_a_non_square_problem_the_broadcast_error_is_reported():
    """Past case 1 (square), `dp - d` cannot even broadcast: the exception and its line are said."""
    def square_only(p, dp, d):
        return ds_right(p, dp, d) if p.shape[-1] == p.shape[-2] and p.dim() == 2 else ds_not_broadcast(p, dp, d)

    result = checks.check_ds(square_only)
    assert not result.passed and "case 2 of 5" in result.feedback
    assert "your code raised RuntimeError" in result.feedback and "ds_not_broadcast" in result.feedback


def test_ds_transposed_is_named_on_square_and_non_square_cases():
    result = checks.check_ds(ds_transposed)
    assert not result.passed and "case 1 of 5" in result.feedback
    assert "likely mistake: dS is transposed" in result.feedback

    def transposed_past_case_1(p, dp, d):
        return ds_right(p, dp, d) if p.shape == (6, 6) else ds_transposed(p, dp, d)

    result = checks.check_ds(transposed_past_case_1)
    assert "case 2 of 5" in result.feedback and "wrong shape" in result.feedback
    assert "expected shape (5, 9) = (..., N_q, N_k), like p, got (9, 5)" in result.feedback
    assert "likely mistake: dS is transposed" in result.feedback


def test_ds_in_float64_for_float32_inputs_is_a_wrong_dtype():
    """The exercise asks for dS in p's dtype; with float64 cases only, an upcast answer passed."""
    result = checks.check_ds(lambda p, dp, d: p.double() * (dp.double() - d.double()[..., None]))
    assert not result.passed and "wrong dtype" in result.feedback and "case 5 of 5" in result.feedback
    assert "expected torch.float32, got torch.float64" in result.feedback


def test_ds_a_row_vector_is_a_wrong_shape():
    result = checks.check_ds(lambda p, dp, d: (p * (dp - d[..., None])).sum(dim=-1))
    assert not result.passed and "wrong shape" in result.feedback and "likely mistake" not in result.feedback


# ---------------------------------------------------------------------- dK / dV

(RIGHT, LOOP_STUB, P_NOT_PT, NO_DK_SCALE, DP_IN_DK, NO_DELTA, SIGN_FLIPPED, P_EXP, P_TILE_SOFTMAX,
 P_EXP2, UNSCALED_S, NO_TAIL_MASK, NO_OTHER, NO_OTHER_ON_D, ROW_STEP_HEAD_DIM, NO_CASTS, Q_UNMASKED_P_MASKED) = (
    tl.constexpr(i) for i in range(17))


@triton.jit
def _dkdv_body(Q, K, V, DO, L, DELTA, DK, DV, sm_scale,
               stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn,
               stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
               N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BUG: tl.constexpr):
    start_n = tl.program_id(0)
    off_h = tl.program_id(1)
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    # K and V as (BLOCK_N, HEAD_DIM) tiles here, transposed where needed (unlike the teaching kernel)
    k = tl.load(K + off_h * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :],
                mask=offs_n[:, None] < N_K, other=0.0)
    v = tl.load(V + off_h * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :],
                mask=offs_n[:, None] < N_K, other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    for start_m in range(0, N_Q, BLOCK_M):
        if BUG != LOOP_STUB:
            rows = start_m + offs_m
            q_ptrs = Q + off_h * stride_qh + rows[:, None] * stride_qn + offs_d[None, :]
            do_ptrs = DO + off_h * stride_doh + rows[:, None] * stride_don + offs_d[None, :]
            if BUG == ROW_STEP_HEAD_DIM:  # rows assumed HEAD_DIM apart: right only for contiguous rows
                q_ptrs = Q + off_h * stride_qh + offs_m[:, None] * stride_qn + offs_d[None, :] + start_m * HEAD_DIM
                do_ptrs = DO + off_h * stride_doh + offs_m[:, None] * stride_don + offs_d[None, :] + start_m * HEAD_DIM
            if BUG == NO_TAIL_MASK:
                q = tl.load(q_ptrs)
                do = tl.load(do_ptrs)
                lse = tl.load(L + off_h * N_Q + rows)
                delta = tl.load(DELTA + off_h * N_Q + rows)
            elif BUG == Q_UNMASKED_P_MASKED:  # q and dO read past N_Q; P of those rows zeroed below
                q = tl.load(q_ptrs)
                do = tl.load(do_ptrs)
                lse = tl.load(L + off_h * N_Q + rows, mask=rows < N_Q, other=0.0)
                delta = tl.load(DELTA + off_h * N_Q + rows, mask=rows < N_Q, other=0.0)
            elif BUG == NO_OTHER:
                q = tl.load(q_ptrs, mask=rows[:, None] < N_Q)
                do = tl.load(do_ptrs, mask=rows[:, None] < N_Q)
                lse = tl.load(L + off_h * N_Q + rows, mask=rows < N_Q)
                delta = tl.load(DELTA + off_h * N_Q + rows, mask=rows < N_Q)
            elif BUG == NO_OTHER_ON_D:
                q = tl.load(q_ptrs, mask=rows[:, None] < N_Q, other=0.0)
                do = tl.load(do_ptrs, mask=rows[:, None] < N_Q, other=0.0)
                lse = tl.load(L + off_h * N_Q + rows, mask=rows < N_Q, other=0.0)
                delta = tl.load(DELTA + off_h * N_Q + rows, mask=rows < N_Q)
            else:
                q = tl.load(q_ptrs, mask=rows[:, None] < N_Q, other=0.0)
                do = tl.load(do_ptrs, mask=rows[:, None] < N_Q, other=0.0)
                lse = tl.load(L + off_h * N_Q + rows, mask=rows < N_Q, other=0.0)
                delta = tl.load(DELTA + off_h * N_Q + rows, mask=rows < N_Q, other=0.0)
            if BUG == UNSCALED_S:
                s = tl.dot(q, tl.trans(k))
            else:
                s = tl.dot(q, tl.trans(k)) * sm_scale
            if BUG == P_EXP:
                p = tl.exp(s)
            elif BUG == P_TILE_SOFTMAX:
                p = tl.exp(s - tl.max(s, 1)[:, None])
                p = p / tl.sum(p, 1)[:, None]
            elif BUG == P_EXP2:
                p = tl.math.exp2(s - lse[:, None])
            else:
                p = tl.exp(s - lse[:, None])
            if BUG == Q_UNMASKED_P_MASKED:
                p = tl.where(rows[:, None] < N_Q, p, 0.0)
            if BUG == P_NOT_PT:
                dv += tl.dot(p.to(do.dtype), do)
            elif BUG == NO_CASTS:  # float32 P against float16 dO: tl.dot refuses the pair
                dv += tl.dot(tl.trans(p), do)
            else:
                dv += tl.dot(tl.trans(p).to(do.dtype), do)
            dp = tl.dot(do, tl.trans(v))
            if BUG == NO_DELTA:
                ds = p * dp
            elif BUG == SIGN_FLIPPED:
                ds = p * (delta[:, None] - dp)
            else:
                ds = p * (dp - delta[:, None])
            if BUG == NO_DK_SCALE:
                dk += tl.dot(tl.trans(ds).to(q.dtype), q)
            elif BUG == DP_IN_DK:
                dk += tl.dot(tl.trans(dp).to(q.dtype), q) * sm_scale
            elif BUG == NO_CASTS:
                dk += tl.dot(tl.trans(ds), q) * sm_scale
            else:
                dk += tl.dot(tl.trans(ds).to(q.dtype), q) * sm_scale
    tl.store(DK + off_h * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :], dk,
             mask=offs_n[:, None] < N_K)
    tl.store(DV + off_h * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :], dv,
             mask=offs_n[:, None] < N_K)


# One kernel per bug, each with the exercise's signature (the interpreter runs no closures).
@triton.jit
def right_kernel(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                 stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
                 N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _dkdv_body(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
               stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
               N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, RIGHT)


@triton.jit
def loop_stub_kernel(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                     stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh,
                     stride_dvn, N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    _dkdv_body(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
               stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
               N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, LOOP_STUB)


@triton.jit
def q_unmasked_p_masked_kernel(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh,
                               stride_kn, stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn,
                               stride_dvh, stride_dvn, N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                               BLOCK_N: tl.constexpr):
    _dkdv_body(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
               stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
               N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, Q_UNMASKED_P_MASKED)


@triton.jit
def no_casts_kernel(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                    stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh,
                    stride_dvn, N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    _dkdv_body(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
               stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
               N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, NO_CASTS)


@triton.jit
def p_not_pt_kernel(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                    stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh,
                    stride_dvn, N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    _dkdv_body(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
               stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
               N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, P_NOT_PT)


@triton.jit
def no_dk_scale_kernel(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                       stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh,
                       stride_dvn, N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    _dkdv_body(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
               stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
               N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, NO_DK_SCALE)


@triton.jit
def dp_in_dk_kernel(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                    stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh,
                    stride_dvn, N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    _dkdv_body(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
               stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
               N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, DP_IN_DK)


@triton.jit
def no_delta_kernel(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                    stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh,
                    stride_dvn, N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    _dkdv_body(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
               stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
               N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, NO_DELTA)


@triton.jit
def sign_flipped_kernel(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                        stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh,
                        stride_dvn, N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr):
    _dkdv_body(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
               stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
               N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, SIGN_FLIPPED)


@triton.jit
def p_exp_kernel(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                 stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
                 N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _dkdv_body(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
               stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
               N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, P_EXP)


@triton.jit
def p_tile_softmax_kernel(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh,
                          stride_kn, stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn,
                          stride_dvh, stride_dvn, N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr):
    _dkdv_body(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
               stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
               N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, P_TILE_SOFTMAX)


@triton.jit
def p_exp2_kernel(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                  stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
                  N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _dkdv_body(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
               stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
               N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, P_EXP2)


@triton.jit
def unscaled_s_kernel(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                      stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh,
                      stride_dvn, N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr):
    _dkdv_body(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
               stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
               N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, UNSCALED_S)


@triton.jit
def no_tail_mask_kernel(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                        stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh,
                        stride_dvn, N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr):
    _dkdv_body(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
               stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
               N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, NO_TAIL_MASK)


@triton.jit
def no_other_kernel(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                    stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh,
                    stride_dvn, N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    _dkdv_body(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
               stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
               N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, NO_OTHER)


@triton.jit
def no_other_on_d_kernel(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                         stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh,
                         stride_dvn, N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr):
    _dkdv_body(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
               stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
               N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, NO_OTHER_ON_D)


@triton.jit
def row_step_head_dim_kernel(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                             stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh,
                             stride_dvn, N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr):
    _dkdv_body(Q, K, V, DO, L, DELTA, DK, DV, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
               stride_vh, stride_vn, stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
               N_Q, N_K, HEAD_DIM, BLOCK_M, BLOCK_N, ROW_STEP_HEAD_DIM)


def test_the_teaching_kernel_passes(capsys):
    result = checks.check_dkdv_kernel(flash_dkdv_kernel)
    assert result.passed and result.points == result.max_points == 4
    assert result.exercise == "05_flash_backward.dkdv_loop"
    assert capsys.readouterr().out == "✓ dkdv_loop: correct on 6 cases (4/4 points)\n"


def test_a_kernel_written_independently_passes_and_the_verdict_is_deterministic():
    first = checks.check_dkdv_kernel(right_kernel)
    assert first.passed
    assert checks.check_dkdv_kernel(right_kernel).feedback == first.feedback


def test_loads_of_q_and_do_past_the_last_query_fail_even_where_dk_and_dv_come_out_right():
    """Zeros after the last query row and P zeroed there: the values are right on case 2, the loads are not."""
    result = checks.check_dkdv_kernel(q_unmasked_p_masked_kernel)
    assert not result.passed and "case 2 of 6" in result.feedback
    assert "✗ dkdv_loop: read q or dO past the last query (" in result.feedback
    assert checks.check_dkdv_kernel(right_kernel).passed  # the masked loads read nothing past it


def test_a_kernel_without_the_casts_to_16_bits_fails_on_the_float16_case():
    """float32 P and dS against float16 dO and Q: right in float32, refused by tl.dot in float16 (the kernel passed
    4/4 on float32 cases only, then crashed in the notebook's next cell on a GPU)."""
    result = checks.check_dkdv_kernel(no_casts_kernel)
    assert not result.passed and "case 6 of 6" in result.feedback and "float16" in result.feedback
    assert "Both operands must be same dtype" in result.feedback


def test_the_blank_exercise_is_not_attempted():
    result = checks.check_dkdv_kernel(loop_stub_kernel)
    assert not result.passed and result.points == 0
    assert "not attempted yet?" in result.feedback and "still the stub" in result.feedback


@pytest.mark.parametrize("bug, case, words", [
    (p_not_pt_kernel, 1, "dV used P where it needs P^T"),
    (no_dk_scale_kernel, 1, "dK is missing the softmax scale"),
    (dp_in_dk_kernel, 1, "dK used dP where it needs dS"),
    (no_delta_kernel, 1, "D was not subtracted"),
    (sign_flipped_kernel, 1, "the sign of dS is flipped"),
    (p_exp_kernel, 1, "P is not recomputed with the logsumexp"),
    (p_tile_softmax_kernel, 1, "P is not recomputed with the logsumexp"),
    (p_exp2_kernel, 1, "P uses exp2 with natural-log quantities"),
    (unscaled_s_kernel, 1, "the scores are not scaled before recomputing P"),
    (no_tail_mask_kernel, 2, "NaN from reading past the last query"),
    (no_other_kernel, 2, "a masked tl.load without other= reads undefined values in the masked lanes"),
    (no_other_on_d_kernel, 2, "a masked tl.load without other= reads undefined values in the masked lanes"),
    (row_step_head_dim_kernel, 1, "the query blocks were stepped through by start_m * HEAD_DIM"),
])
def test_wrong_kernels_are_named(bug, case, words):
    result = checks.check_dkdv_kernel(bug)
    assert not result.passed and result.points == 0
    assert f"case {case} of 6" in result.feedback
    assert f"likely mistake: {words}" in result.feedback, result.feedback
    assert "\n  or: " not in result.feedback, result.feedback


def test_a_masked_load_without_other_is_told_to_add_other_not_to_mask():
    result = checks.check_dkdv_kernel(no_other_kernel)
    assert "the memory after the last query row of q and dO holds 0" in result.feedback
    assert "Add other=0.0 to the loads of q, dO, L and D" in result.feedback
    assert "NaN from reading past the last query" not in result.feedback
    only_d = checks.check_dkdv_kernel(no_other_on_d_kernel)
    assert "compared: dK wrong, dV right" in only_d.feedback


def test_the_large_gap_case_names_every_wrong_p():
    """The large-gap case (4) on its own names every way of getting P wrong."""
    from flashlib.course.checks import backward, framework

    gap = framework.make_cases(backward.DKDV_CHECK)[3:4]
    assert "large gaps" in gap[0].description
    for bug, words in [(p_exp_kernel, "P is not recomputed with the logsumexp"),
                       (p_tile_softmax_kernel, "P is not recomputed with the logsumexp"),
                       (p_exp2_kernel, "P uses exp2 with natural-log quantities"),
                       (unscaled_s_kernel, "the scores are not scaled before recomputing P")]:
        passed, _, details = framework.judge(backward.DKDV_CHECK, gap, framework.run_learner(
            backward.DKDV_CHECK, bug, gap))
        assert not passed and f"likely mistake: {words}" in details[-1], details


def test_which_gradient_is_wrong_is_said():
    result = checks.check_dkdv_kernel(no_dk_scale_kernel)
    assert "dK: wrong values" in result.feedback and "compared: dK wrong, dV right" in result.feedback


def test_plain_torch_is_refused():
    def torch_dkdv(q, k, v, o, do, lse):
        p = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) - lse[..., None])
        return None, p.transpose(-2, -1) @ do

    result = checks.check_dkdv_kernel(torch_dkdv)
    assert not result.passed and "not a @triton.jit kernel" in result.feedback


def test_the_exercises_are_registered_for_the_grader():
    assert [name for name, _, _ in checks.EXERCISES["05_flash_backward"]] == ["ds", "dkdv_loop"]
    assert [points for _, points, _ in checks.EXERCISES["05_flash_backward"]] == [2, 4]
