"""The exponentials shared between the special-function unit and a polynomial (flashlib.kernels.exp2)."""
import pytest
import torch
import triton
import triton.language as tl

from flashlib import flash_attention, runtime
from flashlib.kernels import attention_fwd
from flashlib.kernels.exp2 import exp2_polynomial, exp2_shared
from flashlib.reference import naive_attention
from flashlib.validation import relative_error, tolerance
from support.attention import DEVICE, make_inputs

#: The cubic's largest relative error on [0, 1), measured when its coefficients were fitted (8.34e-5).
POLYNOMIAL_ERROR = 8.4e-5


@triton.jit
def _apply_kernel(X, Y, M: tl.constexpr, N: tl.constexpr, SHARED: tl.constexpr):
    offs = tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :]
    x = tl.load(X + offs)
    if SHARED:
        y = exp2_shared(x)
    else:
        y = exp2_polynomial(x)
    tl.store(Y + offs, y)


def apply(x: torch.Tensor, shared: bool) -> torch.Tensor:
    y = torch.full_like(x, float("nan"))
    _apply_kernel[(1,)](x, y, x.shape[0], x.shape[1], shared)
    return y


def test_the_polynomial_is_within_its_bound_from_0_down_to_its_smallest_exponent():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([-torch.rand(64 * 63, generator=g, dtype=torch.float64) * 125,
                   torch.tensor([0.0, -1.0, -0.5, -124.999, -125.0, -1e-7] + [-k / 64 for k in range(58)],
                                dtype=torch.float64)]).reshape(64, 64)
    got = apply(x.float().to(DEVICE), shared=False).double().cpu()
    want = torch.exp2(x.float().double())
    error = ((got - want).abs() / want).max().item()
    assert error <= POLYNOMIAL_ERROR, error


def test_below_its_smallest_exponent_it_gives_two_to_the_minus_125_and_nan_stays_nan():
    x = torch.full((16, 16), -1000.0)
    x[0, 0], x[0, 1], x[1, 1] = float("nan"), -125.5, float("-inf")
    got = apply(x.to(DEVICE), shared=False).double().cpu()
    assert got[0, 0].isnan()
    rest = torch.ones_like(got, dtype=torch.bool)
    rest[0, 0] = False
    assert ((got[rest] / 2.0 ** -125 - 1).abs() <= POLYNOMIAL_ERROR).all()


def test_the_shared_tile_puts_even_columns_on_exp2_and_odd_ones_on_the_polynomial():
    g = torch.Generator().manual_seed(1)
    x = (-torch.rand(32, 64, generator=g) * 40).to(DEVICE)
    got = apply(x, shared=True)
    want = torch.exp2(x.double())
    relative = ((got.double() - want).abs() / want).cpu()
    assert relative.max() <= POLYNOMIAL_ERROR
    hardware = apply(x, shared=False)
    assert torch.equal(got[:, 1::2], hardware[:, 1::2]), "odd columns: the polynomial, bit for bit"
    assert relative[:, 0::2].max() <= 1e-6, "even columns: the hardware exp2"


@pytest.mark.parametrize("causal", [False, True])
def test_the_forward_with_shared_exponentials_matches_float64(monkeypatch, causal):
    """16-bit inputs take the polynomial in unmasked blocks when SOFTWARE_EXP2 is on: O stays within
    float16's tolerance of the float64 reference, and float32 inputs never take it."""
    monkeypatch.setattr(attention_fwd, "SOFTWARE_EXP2", True)
    seen = []
    real = attention_fwd.launch

    def spy(fn, grid, *args, **kwargs):
        seen.append(kwargs.get("SOFTWARE_EXP2"))
        return real(fn, grid, *args, **kwargs)

    monkeypatch.setattr(attention_fwd, "launch", spy)
    q, k, v = make_inputs(1, 2, 2, 96, 96, 32, torch.float16, seed=5)
    out = flash_attention(q, k, v, causal=causal)
    want = naive_attention(*(t.double().cpu() for t in (q, k, v)), causal=causal)
    assert relative_error(out.double().cpu(), want) <= tolerance(torch.float16)
    q32, k32, v32 = make_inputs(1, 2, 2, 96, 96, 32, torch.float32, seed=5)
    flash_attention(q32, k32, v32, causal=causal)
    assert seen == [True, False] or (not runtime.INTERPRET and seen == [])
    monkeypatch.setattr(attention_fwd, "SOFTWARE_EXP2", False)
    hardware = flash_attention(q, k, v, causal=causal)
    assert not torch.equal(out, hardware), "the switch reached the kernel: some weights took the polynomial"
    assert relative_error(hardware.double().cpu(), want) <= tolerance(torch.float16)
