"""flashlib.experiment: the block-size grid is measured, checked, drawn and saved."""
import math

import pytest
import torch

from flashlib import experiment, runtime  # first: sets TRITON_INTERPRET before Triton loads
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from flashlib.timing import matmul_tflops
from flashlib.experiment import BlockSizeResults, plot_heatmap, run_block_size_experiment

SIZE = (48, 40, 24)  # tails in every dimension for 32-wide blocks


@pytest.fixture(scope="module")
def results():
    return run_block_size_experiment(*SIZE, block_sizes=[8, 16, 32], dtype=torch.float32)


def test_grid_has_every_cell_and_marks_blocks_too_small_for_tl_dot(results):
    assert results.block_sizes == [8, 16, 32]
    assert len(results.runs) == 9
    for bm in (8, 16, 32):
        for bn in (8, 16, 32):
            run = results.run(bm, bn)
            if 8 in (bm, bn):
                assert not run.ok and "tl.dot needs blocks of at least 16" in run.status
                assert math.isnan(run.ms) and math.isnan(run.tflops)
            else:
                assert run.ok, run.status
                assert run.ms > 0
                assert run.tflops == pytest.approx(matmul_tflops(*SIZE, run.ms))
    grid = results.grid("ms")
    assert len(grid) == 3 and all(len(row) == 3 for row in grid)
    assert math.isnan(grid[0][1]) and grid[2][1] == results.run(32, 16).ms
    assert results.best() in [r for r in results.runs if r.ok]
    assert results.best().ms == min(r.ms for r in results.runs if r.ok)


@triton.jit
def _kernel_that_skips_the_k_loop(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                  stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                                  BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # Only the first k-step: wrong whenever K > BLOCK_K.
    pid = tl.program_id(0)
    pid_m = pid // tl.cdiv(N, BLOCK_N)
    pid_n = pid % tl.cdiv(N, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a = tl.load(a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak,
                mask=(offs_m[:, None] < M) & (offs_k[None, :] < K), other=0.0)
    b = tl.load(b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                mask=(offs_k[:, None] < K) & (offs_n[None, :] < N), other=0.0)
    c = tl.dot(a, b)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, c,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def test_a_wrong_kernel_is_never_timed():
    res = run_block_size_experiment(32, 32, 64, [16, 32], torch.float32, block_k=16,
                                    kernel=_kernel_that_skips_the_k_loop)
    assert all(not r.ok and r.status.startswith("wrong result") for r in res.runs)
    assert res.best() is None


def test_a_kernel_that_raises_is_recorded_not_fatal():
    res = run_block_size_experiment(32, 32, 32, [16], torch.float32, kernel=object())
    (run,) = res.runs
    assert not run.ok and run.status.startswith("TypeError")


def test_bfloat16_runs_in_float32_in_the_interpreter_and_is_correct():
    res = run_block_size_experiment(32, 48, 40, [16, 32], torch.bfloat16)
    assert res.dtype == "bfloat16"
    assert all(r.ok for r in res.runs), [r.status for r in res.runs]


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(m=0), ValueError, "m must be a positive int"),
    (dict(block_sizes=[]), ValueError, "block_sizes must be a non-empty list"),
    (dict(block_sizes=[16, 16]), ValueError, "must not repeat"),
    (dict(dtype=torch.int32), TypeError, "dtype must be one of"),
    (dict(block_k=-32), ValueError, "block_k must be a positive int"),
])
def test_bad_arguments_name_the_argument(kwargs, error, match):
    args = dict(m=32, n=32, k=32, block_sizes=[16], dtype=torch.float32) | kwargs
    with pytest.raises(error, match=match):
        run_block_size_experiment(**args)


def test_heatmap_labels_every_cell_and_says_interpreter(results):
    fig = plot_heatmap(results)
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    assert texts.count("×") == 5  # the five cells with an 8
    assert len(texts) == 9
    assert ax.get_xlabel() == "BLOCK_N" and ax.get_ylabel() == "BLOCK_M"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["8", "16", "32"]
    if runtime.INTERPRET:
        assert "interpreter timings" in ax.get_title()
        assert fig.axes[1].get_ylabel() == "MFLOP/s"
    best = results.best()
    assert f"{best.tflops * (1e6 if runtime.INTERPRET else 1):.3g}" in texts


def test_csv_round_trip(results, tmp_path):
    path = results.to_csv(tmp_path / "grid.csv")
    back = BlockSizeResults.from_csv(path)
    assert (back.m, back.n, back.k, back.dtype) == (*SIZE, "float32")
    assert back.block_sizes == results.block_sizes
    assert back.interpreter == results.interpreter and back.device == results.device
    for a, b in zip(back.runs, results.runs):
        assert (a.block_m, a.block_n, a.block_k, a.status) == (b.block_m, b.block_n, b.block_k, b.status)
        assert (math.isnan(a.ms) and math.isnan(b.ms)) or a.ms == pytest.approx(b.ms)


def test_table_lists_reasons_and_best(results):
    text = results.table()
    assert "BLOCK_M < 16: tl.dot needs blocks of at least 16" in text
    assert f"best: BLOCK_M={results.best().block_m}, BLOCK_N={results.best().block_n}" in text


def test_main_writes_png_and_csv(tmp_path, capsys):
    out = tmp_path / "heat.png"
    res = experiment.main(["--size", "32", "48", "40", "--dtype", "fp32", "--block-sizes", "16", "32",
                           "--out", str(out)])
    assert out.exists() and out.read_bytes()[:4] == b"\x89PNG"
    assert BlockSizeResults.from_csv(out.with_suffix(".csv")).runs == res.runs
    printed = capsys.readouterr().out
    assert "best: BLOCK_M=" in printed and f"saved {out}" in printed


def test_main_rejects_bad_sizes(capsys):
    with pytest.raises(SystemExit):
        experiment.main(["--size", "0", "16", "16", "--block-sizes", "16"])
    assert "m must be a positive int" in capsys.readouterr().err


def test_default_output_is_a_temp_file_in_the_interpreter_and_benchmarks_results_on_a_gpu(results):
    path = experiment.default_output(results)
    assert path.suffix == ".png"
    if runtime.INTERPRET:
        assert "benchmarks" not in path.parts
    else:
        assert path.parent.as_posix() == "benchmarks/results"
