"""triton_matmul: correct on every size and dtype, every element written, clear errors."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from flashlib import runtime, triton_matmul, validate_matmul
from flashlib.validation import relative_error, tolerance

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("m, n, k", [(64, 64, 64), (1, 1, 1), (33, 47, 65), (100, 17, 200), (5, 128, 31)])
def test_matches_float64_reference(m, n, k, dtype):
    valid, max_diff = validate_matmul(triton_matmul, m, n, k, dtype=dtype, seed=m * n + k)
    assert valid, f"max |diff| = {max_diff}"


@pytest.mark.parametrize("blocks", [(16, 16, 16), (32, 64, 16), (64, 16, 32)])
def test_explicit_block_sizes(blocks):
    valid, max_diff = validate_matmul(lambda a, b: triton_matmul(a, b, *blocks), 70, 45, 90,
                                      dtype=torch.float32, seed=1)
    assert valid, max_diff


@settings(max_examples=25, deadline=None, derandomize=True)
@given(m=st.integers(1, 96), n=st.integers(1, 96), k=st.integers(1, 96),
       dtype=st.sampled_from([torch.float32, torch.float16]))
def test_any_shape(m, n, k, dtype):
    valid, max_diff = validate_matmul(triton_matmul, m, n, k, dtype=dtype, seed=7)
    assert valid, max_diff


def test_every_output_element_is_written():
    a = torch.randn(45, 70, device=runtime.DEVICE)
    b = torch.randn(70, 37, device=runtime.DEVICE)
    out = torch.full((45, 37), float("nan"), device=runtime.DEVICE)
    result = triton_matmul(a, b, out=out)
    assert result is out
    assert torch.isfinite(out).all()
    assert relative_error(out, a.double() @ b.double()) < tolerance(torch.float32)


def test_non_contiguous_inputs_use_their_strides():
    a = torch.randn(80, 48, device=runtime.DEVICE).t()  # (48, 80), column-major
    b = torch.randn(40, 80, device=runtime.DEVICE).t()  # (80, 40)
    assert not a.is_contiguous() and not b.is_contiguous()
    assert relative_error(triton_matmul(a, b), a.double() @ b.double()) < tolerance(torch.float32)


def test_bfloat16_output_keeps_its_dtype():
    a = torch.randn(20, 30, device=runtime.DEVICE, dtype=torch.bfloat16)
    b = torch.randn(30, 10, device=runtime.DEVICE, dtype=torch.bfloat16)
    c = triton_matmul(a, b)
    assert c.dtype == torch.bfloat16
    assert relative_error(c, a.double() @ b.double()) < tolerance(torch.bfloat16)


@pytest.mark.parametrize("a_shape, b_shape, message", [
    ((4, 5), (6, 7), r"Incompatible dimensions: a is \(4, 5\) \(M, K\) and b is \(6, 7\)"),
    ((4, 5, 1), (5, 7), r"Expected 2D tensors: got a.shape=\(4, 5, 1\) and b.shape=\(5, 7\)"),
    ((5,), (5, 2), r"Expected 2D tensors: got a.shape=\(5,\)"),
])
def test_shape_errors_name_the_shapes(a_shape, b_shape, message):
    with pytest.raises(ValueError, match=message):
        triton_matmul(torch.randn(a_shape, device=runtime.DEVICE), torch.randn(b_shape, device=runtime.DEVICE))


@pytest.mark.parametrize("blocks, message", [
    ((0, 32, 32), "Block sizes must be positive: got block_m=0"),
    ((32, -16, 32), "Block sizes must be positive: got block_n=-16"),
    ((32, 32, 24), "Block sizes must be powers of two .*block_k=24"),
    ((32, 32, 8), "block_k must be at least 16"),
    ((32, None, 32), "Give all three block sizes or none"),
])
def test_block_size_errors(blocks, message):
    a = torch.randn(8, 8, device=runtime.DEVICE)
    with pytest.raises(ValueError, match=message):
        triton_matmul(a, a, *blocks)


def test_dtype_and_type_errors():
    a = torch.randn(4, 4, device=runtime.DEVICE)
    with pytest.raises(TypeError, match="same dtype: got a.dtype=torch.float32, b.dtype=torch.float16"):
        triton_matmul(a, a.half())
    with pytest.raises(TypeError, match="Unsupported dtype torch.int32"):
        triton_matmul(a.int(), a.int())
    with pytest.raises(TypeError, match="b is a list"):
        triton_matmul(a, [[1.0]])
    with pytest.raises(TypeError, match="Block sizes must be positive integers: block_m=32.0"):
        triton_matmul(a, a, 32.0, 32, 32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("size", [(512, 512, 512), (1000, 1000, 1000), (4096, 4096, 128), (257, 1025, 513)])
def test_gpu_autotuned(size, dtype):
    valid, max_diff = validate_matmul(triton_matmul, *size, dtype=dtype, seed=0)
    assert valid, max_diff
