"""The validators accept the right answer and reject wrong ones; metrics behave."""
import pytest
import torch

from flashlib import naive_attention, runtime, validate_attention, validate_matmul
from flashlib.timing import BenchmarkRunner, matmul_tflops, peak_memory_bytes, print_comparison_table, time_ms
from flashlib.validation import max_abs_diff, relative_error, relative_error_text


def test_relative_error_basics():
    ref = torch.tensor([1.0, -2.0, 4.0], dtype=torch.float64)
    assert relative_error(ref, ref) == 0.0
    assert abs(relative_error(ref + 0.04, ref) - 0.01) < 1e-12
    assert relative_error(torch.tensor([float("nan"), 0, 0]), ref) == float("inf")
    assert relative_error(ref[:2], ref) == float("inf")
    assert max_abs_diff(ref * 2, ref) == 4.0


def test_validate_matmul_accepts_torch_and_rejects_a_wrong_product():
    assert validate_matmul(torch.matmul, 17, 9, 13, dtype=torch.float32)[0]
    valid, max_diff = validate_matmul(lambda a, b: a @ b * 1.01, 17, 9, 13, dtype=torch.float32)
    assert not valid and max_diff > 0
    assert not validate_matmul(lambda a, b: (a @ b).t().contiguous(), 17, 9, 13, dtype=torch.float32)[0]


def test_validate_attention_accepts_the_reference_and_rejects_no_scale():
    assert validate_attention(naive_attention, 1, 2, 24, 16, dtype=torch.float32)[0]
    assert validate_attention(naive_attention, 1, 2, 24, 16, dtype=torch.float32, causal=True)[0]
    no_scale = lambda q, k, v: naive_attention(q, k, v, softmax_scale=1.0)  # noqa: E731
    assert not validate_attention(no_scale, 1, 2, 24, 16, dtype=torch.float32)[0]
    # the non-causal answer is not accepted for the causal problem
    assert not validate_attention(lambda q, k, v, causal: naive_attention(q, k, v), 1, 2, 24, 16,
                                  dtype=torch.float32, causal=True)[0]


def test_time_and_memory_measurements():
    assert time_ms(lambda: torch.ones(10)) >= 0.0
    n = 256
    peak = peak_memory_bytes(lambda: torch.empty(n, n, device=runtime.DEVICE, dtype=torch.float32).fill_(1))
    assert peak >= n * n * 4
    assert abs(matmul_tflops(1000, 1000, 1000, 1.0) - 2.0) < 1e-12


def test_benchmark_runner_and_table(capsys):
    results = BenchmarkRunner(rep=1).benchmark_matmul(torch.matmul, [(16, 16, 16)])
    assert results[0]["M"] == 16 and results[0]["ms"] > 0 and results[0]["tflops"] > 0
    print_comparison_table(results)
    out = capsys.readouterr().out
    assert "TFLOP/s" in out
    if runtime.INTERPRET:
        assert "interpreter" in out


def test_time_ms_off_the_gpu_warms_up_until_stable():
    """A slow first call (thread pools, allocations) must not count: only the steady state is timed."""
    import time as _time

    from flashlib import runtime

    if not runtime.INTERPRET:
        pytest.skip("the GPU path times with triton.testing.do_bench")
    calls = []

    def fn():
        calls.append(None)
        _time.sleep(0.2 if len(calls) <= 2 else 0.001)

    assert time_ms(fn) < 20  # about 1 ms, not 200


def test_relative_error_text_prints_digits_only_above_rounding():
    ref = torch.tensor([1.0, -2.0], dtype=torch.float64)
    assert relative_error_text(ref + torch.tensor([0.0, 0.5], dtype=torch.float64), ref) == "2.5e-01"
    assert relative_error_text(ref + 3e-7, ref) == "< 1e-06"  # rounding: no digits that vary by machine
    assert relative_error_text(ref + 2.2e-6, ref) == "1.1e-06"
    assert relative_error_text(torch.full_like(ref, float("nan")), ref) == "inf"
