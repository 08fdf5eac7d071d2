"""The teaching dK/dV kernel: equal to autograd of the float64 reference (and to the library's
backward); the launcher runs any kernel with its signature, through strides, and refuses bad arguments."""
import math
import re

import pytest
import torch
from hypothesis import given, settings, strategies as st

from flashlib import flash_attention, runtime  # before triton: flashlib picks the interpreter on a CPU
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from flashlib.kernels.attention_bwd_simple import (delta_kernel, flash_dkdv_kernel,  # noqa: E402
                                                    launch_simple_dkdv, simple_dkdv)
from flashlib.reference import naive_attention  # noqa: E402
from flashlib.validation import relative_error, tolerance  # noqa: E402

DEVICE = runtime.DEVICE


def make_problem(batch, heads, n_q, n_k, head_dim, dtype, seed=0, spread=1.5, scale=None):
    """Inputs in ``dtype``; O and L of the float64 reference; dK, dV by autograd in float64."""
    gen = torch.Generator().manual_seed(seed)

    def randn(n, factor=1.0):
        return (torch.randn(batch, heads, n, head_dim, generator=gen, dtype=torch.float64) * factor).to(dtype)

    q, k, v, do = randn(n_q, spread), randn(n_k, spread), randn(n_k), randn(n_q)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    o, lse = naive_attention(q64, k64, v64, return_lse=True, softmax_scale=scale)
    dk, dv = torch.autograd.grad(o, (k64, v64), do.double())
    inputs = tuple(t.to(DEVICE) for t in (q, k, v, o.detach().to(dtype), do, lse.detach().float()))
    return inputs, (dk, dv)


def assert_gradients(got, expected, dtype):
    for name, g, e in zip(("dK", "dV"), got, expected):
        assert g.shape == e.shape and g.dtype == dtype, name
        assert relative_error(g, e) <= tolerance(dtype), (name, relative_error(g, e))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n_q, n_k, block_m, block_n", [
    (64, 64, 32, 32),    # no tails
    (40, 72, 16, 32),    # tails in both
    (1, 50, 16, 16),     # a single query
    (100, 17, 64, 16),   # more queries than keys, one partial key block
])
def test_matches_autograd_of_the_float64_reference(dtype, n_q, n_k, block_m, block_n):
    inputs, expected = make_problem(2, 2, n_q, n_k, 32, dtype)
    got = launch_simple_dkdv(flash_dkdv_kernel, *inputs, block_m, block_n)
    assert_gradients(got, expected, dtype)


@settings(max_examples=12, deadline=None, derandomize=True)
@given(n_q=st.integers(1, 80), n_k=st.integers(2, 80), head_dim=st.sampled_from([16, 32, 64]),
       block_m=st.sampled_from([16, 32]), block_n=st.sampled_from([16, 32, 64]), seed=st.integers(0, 99),
       scale=st.one_of(st.none(), st.floats(0.05, 1.0)))
def test_any_problem_matches_autograd(n_q, n_k, head_dim, block_m, block_n, seed, scale):
    inputs, expected = make_problem(1, 2, n_q, n_k, head_dim, torch.float32, seed=seed, scale=scale)
    got = launch_simple_dkdv(flash_dkdv_kernel, *inputs, block_m, block_n, softmax_scale=scale)
    assert_gradients(got, expected, torch.float32)


def test_works_from_the_library_forward_lse():
    """The L that flash_attention returns is what the kernel needs."""
    (q, k, v, _, do, _), expected = make_problem(1, 2, 96, 80, 64, torch.float32, seed=3)
    o, lse = flash_attention(q, k, v, return_lse=True)
    assert_gradients(simple_dkdv(q, k, v, o, do, lse, block_m=32, block_n=16), expected, torch.float32)


def test_equals_the_library_backward():
    (q, k, v, o, do, lse), _ = make_problem(2, 2, 72, 56, 32, torch.float32, seed=4)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    flash_attention(*leaves).backward(do)
    dk, dv = simple_dkdv(q, k, v, o, do, lse, block_m=16, block_n=32)
    assert relative_error(dk, leaves[1].grad) <= tolerance(torch.float32)
    assert relative_error(dv, leaves[2].grad) <= tolerance(torch.float32)


def test_large_logits_do_not_overflow():
    """P = exp(S - L) <= 1 whatever the scores: no max is needed in the backward.

    Scores beyond 88.7, where exp overflows in float32. (float16 inputs: with float32
    ones, L stored in float32 alone limits P to a relative accuracy of about |L| 2**-24.)
    """
    inputs, expected = make_problem(1, 1, 48, 48, 16, torch.float16, spread=6.0)
    q, k = inputs[0].double(), inputs[1].double()
    assert (q @ k.transpose(-2, -1) / 4).max() > 88.8
    got = simple_dkdv(*inputs, block_m=16, block_n=16)
    assert all(torch.isfinite(g).all() for g in got)
    assert_gradients(got, expected, torch.float16)


def test_strided_views_and_the_out_argument():
    """Inputs through strides (bnhd memory seen as bhnd); outputs written in place, every element."""
    inputs, expected = make_problem(2, 3, 40, 56, 16, torch.float32, seed=5)
    q, k, v, o, do, lse = inputs
    q_s, k_s, v_s, o_s, do_s = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, o, do))
    assert not q_s.is_contiguous()
    dk, dv = torch.full_like(k, math.nan), torch.full_like(v, math.nan)
    got = launch_simple_dkdv(flash_dkdv_kernel, q_s, k_s, v_s, o_s, do_s, lse, 16, 16, out=(dk, dv))
    assert got[0] is dk and got[1] is dv
    assert_gradients((dk, dv), expected, torch.float32)


def test_outputs_that_cannot_be_merged_are_filled_too():
    inputs, expected = make_problem(2, 2, 32, 48, 16, torch.float32, seed=6)
    dk = torch.full((2, 48, 2, 16), math.nan, device=DEVICE).transpose(1, 2)  # (B, H) not mergeable
    dv = torch.full_like(inputs[2], math.nan)
    launch_simple_dkdv(flash_dkdv_kernel, *inputs, 16, 16, out=(dk, dv))
    assert_gradients((dk, dv), expected, torch.float32)


def test_delta_kernel_is_rowsum_of_do_times_o():
    gen = torch.Generator().manual_seed(7)
    o, do = (torch.randn(3, 50, 32, generator=gen).to(DEVICE) for _ in range(2))
    delta = torch.full((3 * 50,), math.nan, device=DEVICE)
    delta_kernel[(triton.cdiv(50, 16), 3)](o, do, delta, o.stride(0), o.stride(1), do.stride(0), do.stride(1),
                                           50, HEAD_DIM=32, BLOCK_M=16)
    expected = (o.double() * do.double()).sum(-1).reshape(-1)
    assert relative_error(delta, expected) <= tolerance(torch.float32)


@triton.jit
def program_id_kernel(Q, K, V, DO, L, DELTA, DK, DV, sm_scale,
                      stride_qh, stride_qn, stride_kh, stride_kn, stride_vh, stride_vn,
                      stride_doh, stride_don, stride_dkh, stride_dkn, stride_dvh, stride_dvn,
                      N_Q, N_K, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Another kernel with the signature: dK = key-block program id + 1, dV = D of query 0 of its head."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    off_h = tl.program_id(1)
    mask = offs_n[:, None] < N_K
    ones = tl.full([BLOCK_N, HEAD_DIM], 1.0, dtype=tl.float32)
    tl.store(DK + off_h * stride_dkh + offs_n[:, None] * stride_dkn + offs_d[None, :],
             ones * (tl.program_id(0) + 1), mask=mask)
    tl.store(DV + off_h * stride_dvh + offs_n[:, None] * stride_dvn + offs_d[None, :],
             ones * tl.load(DELTA + off_h * N_Q), mask=mask)


def test_launches_any_kernel_with_the_signature_on_the_key_block_grid():
    (q, k, v, o, do, lse), _ = make_problem(2, 2, 24, 40, 16, torch.float32)
    dk, dv = launch_simple_dkdv(program_id_kernel, q, k, v, o, do, lse, 16, 16)
    # grid (cdiv(N_k, BLOCK_N), B * H): keys 0-15 by program 0, 16-31 by 1, 32-39 by 2, for every head
    expected = torch.tensor([1.0] * 16 + [2.0] * 16 + [3.0] * 8)[:, None].expand(2, 2, 40, 16)
    assert torch.equal(dk.cpu(), expected)
    # DELTA holds D = rowsum(dO * O) of each head's rows
    d0 = (do.double() * o.double()).sum(-1)[:, :, 0]
    assert relative_error(dv[:, :, 0, 0], d0) <= tolerance(torch.float32)


def zeros(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype)


GOOD = dict(q=zeros(1, 1, 8, 16), k=zeros(1, 1, 8, 16), v=zeros(1, 1, 8, 16), o=zeros(1, 1, 8, 16),
            do=zeros(1, 1, 8, 16), lse=zeros(1, 1, 8), block_m=16, block_n=16)


@pytest.mark.parametrize("changes, kwargs, error, message", [
    (dict(q=zeros(8, 16)), {}, ValueError, "Expected 4D tensors"),
    (dict(k=zeros(1, 2, 8, 16)), {}, ValueError, "Q, K, V shapes must match"),
    (dict(block_n=24), {}, ValueError, "block_n=24"),
    (dict(o=zeros(1, 1, 9, 16)), {}, ValueError, "o must have shape (1, 1, 8, 16) torch.float32; got (1, 1, 9, 16)"),
    (dict(do=zeros(1, 1, 8, 16, dtype=torch.float16)), {}, ValueError,
     "do must have shape (1, 1, 8, 16) torch.float32"),
    (dict(lse=zeros(1, 1, 8, dtype=torch.float16)), {}, ValueError, "lse must have shape (1, 1, 8) torch.float32"),
    (dict(lse=None), {}, TypeError, "lse must be a torch.Tensor of shape (1, 1, 8); got a NoneType"),
    ({}, {"out": (zeros(1, 1, 8, 16), zeros(1, 1, 8, 8))}, ValueError, "out[1] must have shape (1, 1, 8, 16)"),
])
def test_errors_name_the_argument(changes, kwargs, error, message):
    args = {**GOOD, **changes}
    args = {key: value.to(DEVICE) if isinstance(value, torch.Tensor) else value for key, value in args.items()}
    kwargs = {key: tuple(t.to(DEVICE) for t in value) for key, value in kwargs.items()}
    with pytest.raises(error, match=re.escape(message)):
        launch_simple_dkdv(flash_dkdv_kernel, *args.values(), **kwargs)
