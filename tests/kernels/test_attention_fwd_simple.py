"""The teaching forward kernel: equal to the float64 reference and to flash_attention; the
launcher runs any kernel with its signature, through strides, and refuses bad arguments."""
import re

import pytest
import torch
from hypothesis import given, settings, strategies as st

from flashlib import flash_attention, runtime  # before triton: flashlib picks the interpreter on a CPU
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from flashlib.kernels.attention_fwd_simple import (flash_forward_kernel, launch_simple_forward,  # noqa: E402
                                                    simple_flash_attention)
from flashlib.reference import naive_attention  # noqa: E402
from flashlib.validation import relative_error, tolerance  # noqa: E402
from support import attention as attention_inputs  # noqa: E402

DEVICE = runtime.DEVICE


def make_inputs(batch, heads, n_q, n_k, head_dim, dtype, seed=0, spread=1.0):
    """q, k, v (B, H, N, D) with as many key/value heads as query heads (the teaching kernel has no GQA)."""
    return attention_inputs.make_inputs(batch, heads, heads, n_q, n_k, head_dim, dtype, seed=seed, spread=spread)


def assert_matches_reference(q, k, v, out, lse, **kwargs):
    ref_out, ref_lse = naive_attention(q.double().cpu(), k.double().cpu(), v.double().cpu(), return_lse=True,
                                       **kwargs)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32
    assert relative_error(out, ref_out) <= tolerance(q.dtype)
    # L comes from float32 sums whatever the inputs' dtype
    assert relative_error(lse, ref_lse) <= tolerance(torch.float32 if q.dtype != torch.float32 else q.dtype) * 10


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n_q, n_k, block_m, block_n", [
    (64, 64, 32, 32),    # no tails
    (40, 72, 16, 32),    # tails in both
    (1, 50, 16, 16),     # a single query
    (100, 17, 64, 16),   # more queries than keys, one partial key block
])
def test_matches_the_float64_reference(dtype, n_q, n_k, block_m, block_n):
    q, k, v = make_inputs(2, 3, n_q, n_k, 32, dtype, spread=1.5)
    out, lse = launch_simple_forward(flash_forward_kernel, q, k, v, block_m, block_n)
    assert_matches_reference(q, k, v, out, lse)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(n_q=st.integers(1, 90), n_k=st.integers(1, 90), head_dim=st.sampled_from([16, 32, 64]),
       block_m=st.sampled_from([16, 32, 64]), block_n=st.sampled_from([16, 32]), seed=st.integers(0, 99),
       scale=st.one_of(st.none(), st.floats(0.01, 2.0)))
def test_any_problem_matches_reference(n_q, n_k, head_dim, block_m, block_n, seed, scale):
    q, k, v = make_inputs(1, 2, n_q, n_k, head_dim, torch.float32, seed=seed)
    out, lse = launch_simple_forward(flash_forward_kernel, q, k, v, block_m, block_n, softmax_scale=scale)
    assert_matches_reference(q, k, v, out, lse, softmax_scale=scale)


def test_equals_the_library_kernel():
    q, k, v = make_inputs(2, 2, 96, 80, 64, torch.float32, seed=3)
    out, lse = simple_flash_attention(q, k, v, block_m=32, block_n=16)
    lib_out, lib_lse = flash_attention(q, k, v, return_lse=True)
    assert relative_error(out, lib_out) <= tolerance(torch.float32)
    assert relative_error(lse, lib_lse) <= tolerance(torch.float32)


def test_large_logits_do_not_overflow():
    q, k, v = make_inputs(1, 1, 48, 48, 16, torch.float32, spread=30.0)  # scores in the hundreds
    out, lse = simple_flash_attention(q, k, v, block_m=16, block_n=16)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    assert_matches_reference(q, k, v, out, lse)


def test_strided_views_and_the_out_argument():
    """Inputs through strides (bnhd memory seen as bhnd); outputs written in place, every element."""
    q, k, v = make_inputs(2, 3, 40, 56, 16, torch.float32, seed=5)
    q_s, k_s, v_s = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    assert not q_s.is_contiguous()
    o = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device=DEVICE)
    got_o, got_lse = launch_simple_forward(flash_forward_kernel, q_s, k_s, v_s, 16, 16, out=(o, lse))
    assert got_o is o and got_lse is lse
    assert_matches_reference(q, k, v, o, lse)


def test_non_contiguous_head_dim_is_copied():
    q, k, v = make_inputs(1, 2, 32, 32, 16, torch.float32, seed=6)
    q_t = q.transpose(-2, -1).contiguous().transpose(-2, -1)  # stride(-1) != 1
    assert q_t.stride(-1) != 1
    out, lse = simple_flash_attention(q_t, k, v, block_m=16, block_n=16)
    assert_matches_reference(q, k, v, out, lse)


@triton.jit
def zeros_kernel(Q, K, V, O, L, sm_scale, stride_qh, stride_qn, stride_kh, stride_kn,
                 stride_vh, stride_vn, stride_oh, stride_on, N_Q, N_K,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Another kernel with the signature: O = 0, L = program id (0) + 1 per row."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    off_h = tl.program_id(1)
    tl.store(O + off_h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :],
             tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32), mask=offs_m[:, None] < N_Q)
    tl.store(L + off_h * N_Q + offs_m, tl.zeros([BLOCK_M], dtype=tl.float32) + tl.program_id(0) + 1,
             mask=offs_m < N_Q)


def test_launches_any_kernel_with_the_signature_on_the_fa2_grid():
    q, k, v = make_inputs(2, 2, 40, 24, 16, torch.float32)
    out, lse = launch_simple_forward(zeros_kernel, q, k, v, 16, 16)
    assert (out == 0).all()
    # grid (cdiv(N_q, BLOCK_M), B * H): rows 0-15 by program 0, 16-31 by 1, 32-39 by 2, for every head
    expected = torch.tensor([1.0] * 16 + [2.0] * 16 + [3.0] * 8).expand(2, 2, 40)
    assert torch.equal(lse.cpu(), expected)


@pytest.mark.parametrize("args, kwargs, error, message", [
    ((torch.zeros(2, 8, 16), torch.zeros(2, 8, 16), torch.zeros(2, 8, 16), 16, 16), {}, ValueError,
     "Expected 4D tensors"),
    ((torch.zeros(1, 2, 8, 16), torch.zeros(1, 1, 8, 16), torch.zeros(1, 1, 8, 16), 16, 16), {}, ValueError,
     "Q, K, V shapes must match"),
    ((torch.zeros(1, 1, 8, 24), torch.zeros(1, 1, 8, 24), torch.zeros(1, 1, 8, 24), 16, 16), {}, ValueError,
     "Unsupported head_dim 24"),
    ((torch.zeros(1, 1, 8, 16), torch.zeros(1, 1, 8, 16), torch.zeros(1, 1, 8, 16), 24, 16), {}, ValueError,
     "block_m=24"),
    ((torch.zeros(1, 1, 8, 16), torch.zeros(1, 1, 8, 16), torch.zeros(1, 1, 8, 16), 16, 8), {}, ValueError,
     "block_n=8"),
    ((torch.zeros(1, 1, 8, 16), torch.zeros(1, 1, 0, 16), torch.zeros(1, 1, 0, 16), 16, 16), {}, ValueError,
     "at least one query and one key"),
    ((torch.zeros(1, 1, 8, 16, dtype=torch.float64),) * 3 + (16, 16), {}, TypeError, "torch.float64"),
    ((torch.zeros(1, 1, 8, 16),) * 3 + (16, 16), {"out": (torch.zeros(1, 1, 8, 16), torch.zeros(1, 8))},
     ValueError, "out[1] must be a contiguous float32 tensor of shape (1, 1, 8)"),
])
def test_errors_name_the_argument(args, kwargs, error, message):
    args = tuple(a.to(DEVICE) if isinstance(a, torch.Tensor) else a for a in args)
    kwargs = {key: tuple(t.to(DEVICE) for t in value) for key, value in kwargs.items()}
    with pytest.raises(error, match=re.escape(message)):
        launch_simple_forward(flash_forward_kernel, *args, **kwargs)
