"""flashlib.bench's attention benchmark: FLOP counts by hand, the command line on a tiny grid in the
interpreter (files with every field, small errors), failures turned into statuses, results files."""
import csv
import json
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from flashlib import bench, bench_results, runtime
from flashlib.io_model import attention_flops
from flashlib.reference import naive_attention
from flashlib.validation import tolerance

META_FIELDS = {"date", "gpu", "torch", "triton", "flashlib", "python", "interpreter", "method", "command",
               "ceilings"}


def test_flops_by_hand():
    # B=2, H=3, N=128, D=64: 4 * 2 * 3 * 128^2 * 64 forward
    fwd = 4 * 2 * 3 * 128 * 128 * 64
    assert attention_flops(2, 3, 128, 64) == fwd
    assert attention_flops(2, 3, 128, 64, causal=True) == fwd / 2
    assert attention_flops(2, 3, 128, 64, mode="bwd") == 2.5 * fwd
    assert attention_flops(2, 3, 128, 64, causal=True, mode="train") == 3.5 * fwd / 2
    with pytest.raises(ValueError, match="mode must be one of"):
        attention_flops(2, 3, 128, 64, mode="backward")


def test_fa2_shapes():
    assert bench.fa2_shape(512, 64) == (32, 32)
    assert bench.fa2_shape(16384, 128) == (1, 16)
    assert bench.fa2_shape(32768, 64) == (1, 32)  # never a batch of 0


def test_cli_tiny_grid_writes_every_field(tmp_path, capsys):
    prefix = tmp_path / "attention_test"
    rows = bench.main(["--N", "32", "--d", "16", "--impl", "naive,flashlib,sdpa_flash", "--out", str(prefix)])
    printed = capsys.readouterr().out
    assert "interpreter timings" in printed and "flashlib" in printed

    data = json.loads((tmp_path / "attention_test.json").read_text())
    meta = data["meta"]
    assert META_FIELDS <= set(meta)
    assert meta["interpreter"] is True and "INTERPRETER" in meta["method"]
    assert meta["ceilings"] == {"hbm_gb_per_s": None, "matmul_tflops": None}
    assert meta["command"].startswith("python -m flashlib.bench --N 32")
    assert len(data["rows"]) == 3 * 3 * 2 == len(rows)  # impls x modes x causal
    for row in data["rows"]:
        assert set(row) == set(bench_results.ROW_FIELDS)
        assert (row["N"], row["D"], row["dtype"], row["batch"], row["heads"]) == (32, 16, "fp16", 1, 2)
        if row["impl"] == "sdpa_flash":
            assert row["status"] == "unsupported: needs CUDA" and row["ms"] is None and row["tflops"] is None
            continue
        assert row["status"] == "ok", row
        assert row["ms"] > 0 and row["peak_mem_bytes"] > 0
        flops = attention_flops(1, 2, 32, 16, causal=row["causal"], mode=row["mode"])
        assert row["tflops"] == pytest.approx(flops / (row["ms"] * 1e-3) / 1e12)
        assert 0 <= row["rel_err"] < tolerance(torch.float16)
    with (tmp_path / "attention_test.csv").open() as handle:
        lines = list(csv.DictReader(handle))
    assert len(lines) == len(data["rows"])
    assert set(bench_results.ROW_FIELDS) <= set(lines[0]) and lines[0]["gpu"] == meta["gpu"]["name"]

    loaded_meta, loaded_rows = bench_results.load_results(tmp_path / "attention_test.json")
    assert loaded_meta == meta and loaded_rows == data["rows"]


def test_cli_rejects_unknown_values(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--impl", "flashlib,xformers"])
    assert "--impl must be a comma-separated list drawn from" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--causal", "maybe"])
    assert "--causal must be 'both', 'true' or 'false'" in capsys.readouterr().err


class _FailsInBackward(torch.autograd.Function):
    """A right forward (naive attention) whose backward raises."""
    @staticmethod
    def forward(ctx, q, k, v, causal):
        return naive_attention(q, k, v, causal=causal)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("backward exploded")


def test_failures_become_statuses(monkeypatch):
    def broken(q, k, v, causal):
        raise RuntimeError("kernel crashed")

    def refuses(q, k, v, causal):
        raise ValueError("Unsupported head_dim: 16")

    def no_memory(q, k, v, causal):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB")

    def nan_output(q, k, v, causal):
        return torch.full_like(q, float("nan"))

    for name, fn in [("broken", broken), ("refuses", refuses), ("no_memory", no_memory),
                     ("nan_output", nan_output), ("bad_backward", _FailsInBackward.apply)]:
        monkeypatch.setitem(bench.ATTENTION_IMPLS, name, fn)
    rows = bench.run_attention_benchmark(
        modes=("fwd", "bwd"), dtypes=("fp16",), causals=(False,), head_dims=(16,), seq_lens=(16,),
        impls=("broken", "refuses", "no_memory", "nan_output", "bad_backward", "naive"), warmup=1, repeat=1,
        log=lambda _: None)
    status = {(r["impl"], r["mode"]): r["status"] for r in rows}
    assert status[("broken", "fwd")] == status[("broken", "bwd")] == "error: RuntimeError: kernel crashed"
    assert status[("refuses", "bwd")] == "unsupported: Unsupported head_dim: 16"
    assert status[("no_memory", "fwd")] == "out of memory"
    assert status[("nan_output", "fwd")] == "error: non-finite output (NaN or inf)"
    assert status[("bad_backward", "fwd")] == "ok"
    assert status[("bad_backward", "bwd")] == "error: RuntimeError: backward exploded"
    assert status[("naive", "fwd")] == status[("naive", "bwd")] == "ok"  # the run went on
    for r in rows:
        assert (r["ms"] is None) == (r["status"] != "ok")


def test_sdpa_refusal_takes_the_reason_from_its_warnings():
    warned = ["Flash attention kernel not used because:", "Flash attention has been runtime disabled.",
              "Flash attention requires q,k,v to have the same last dimension and to be less than or equal to 256."]
    status = bench_results.failure_status(RuntimeError("No available kernel. Aborting execution."), warned)
    assert status.startswith("unsupported: Flash attention requires q,k,v to have the same last dimension")
    assert bench_results.failure_status(RuntimeError("No available kernel.")) == "unsupported: No available kernel."
    later_torch = RuntimeError("No viable backend for scaled_dot_product_attention was found.")
    assert bench_results.failure_status(later_torch).startswith("unsupported: No viable backend")


def test_load_results_rejects_other_json(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"date": "x", "rows": []}))
    with pytest.raises(ValueError, match="expected flashlib.bench results.*'meta'"):
        bench_results.load_results(path)


def test_stored_rows_that_fail_the_check_load_as_wrong(tmp_path):
    """Files written before the benchmark refused wrong outputs: an ok row off float64 loses its time."""
    base = dict(mode="fwd", causal=False, N=1024, D=64, batch=16, heads=32, peak_mem_bytes=1)
    rows = [dict(base, impl="tutorial", dtype="fp16", ms=1.0, tflops=400.0, rel_err=0.86, status="ok"),
            dict(base, impl="flashlib", dtype="fp16", ms=1.1, tflops=390.0, rel_err=4e-4, status="ok"),
            dict(base, impl="flashlib", dtype="bf16", ms=1.1, tflops=390.0, rel_err=4e-3, status="ok")]
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"meta": {"interpreter": False}, "rows": rows}))
    _, loaded = bench_results.load_results(path)
    assert loaded[0]["status"] == "wrong: relative error 0.86 > 5e-03"
    assert loaded[0]["ms"] is None and loaded[0]["tflops"] is None and loaded[0]["rel_err"] == 0.86
    assert [r["status"] for r in loaded[1:]] == ["ok", "ok"] and loaded[1]["ms"] == 1.1


def test_stored_results_newest_first(tmp_path):
    for name, date in [("attention_a.json", "2026-01-02T00:00:00+00:00"),
                       ("attention_b.json", "2026-03-01T00:00:00+00:00"),
                       ("attention_c.json", "2025-12-31T00:00:00+00:00")]:
        (tmp_path / name).write_text(json.dumps({"meta": {"date": date}, "rows": []}))
    (tmp_path / "block_sizes.json").write_text("{}")
    assert [p.name for p in bench_results.stored_results(directory=tmp_path)] == [
        "attention_b.json", "attention_a.json", "attention_c.json"]


def test_matmul_table_still_reachable(capsys):
    bench.main(["--kernel", "matmul", "--repeat", "1"])
    out = capsys.readouterr().out
    assert "flashlib ms" in out and "torch ms" in out


def test_the_check_covers_the_first_and_the_last_sample():
    assert bench.checked_corners(1, 2, 2) == [(slice(0, 1), slice(0, 2))]
    assert bench.checked_corners(16, 32, 2) == [(slice(0, 1), slice(0, 2)), (slice(15, 16), slice(30, 32))]


def test_a_wrong_output_is_a_status_and_gets_no_time(monkeypatch):
    """A fast wrong answer must not land in a table: a batch offset that is wrong only past the first
    sample (the tutorial's bug), a wrong scale, and a last head left unwritten all fail the check."""
    def first_sample_everywhere(q, k, v, causal):
        out = naive_attention(q[:1], k[:1], v[:1], causal=causal)
        return out.expand_as(q).clone()

    def wrong_scale(q, k, v, causal):
        return naive_attention(q * 1.1, k, v, causal=causal)

    def last_head_zero(q, k, v, causal):
        out = naive_attention(q, k, v, causal=causal)
        out[:, -1] = 0
        return out

    impls = {"offset": first_sample_everywhere, "scale": wrong_scale, "head": last_head_zero}
    for name, fn in impls.items():
        monkeypatch.setitem(bench.ATTENTION_IMPLS, name, fn)
    rows = bench.run_attention_benchmark(modes=("fwd", "bwd"), dtypes=("fp16",), causals=(False,), head_dims=(16,),
                                         seq_lens=(32,), impls=(*impls, "naive"), batch=3, heads=4, warmup=1,
                                         repeat=1, log=lambda _: None)
    for r in rows:
        if r["impl"] == "naive":
            assert r["status"] == "ok" and r["ms"] > 0
            continue
        assert r["status"].startswith("wrong: relative error ") and r["status"].endswith("> 5e-03"), r
        assert r["ms"] is None and r["tflops"] is None and r["rel_err"] > tolerance(torch.float16)


def test_the_tutorial_runs_on_one_sample_of_all_heads(monkeypatch, tmp_path):
    """Folding (B, H) into one sample of B * H heads is exact, and hides the tutorial's batch offset."""
    fake = tmp_path / "one_sample_tutorial.py"
    fake.write_text(FAKE_TUTORIAL.replace("def attention(q, k, v, causal, sm_scale):\n",
                                          "def attention(q, k, v, causal, sm_scale):\n    assert q.shape[0] == 1\n"))
    monkeypatch.setenv(bench.TUTORIAL_ENV, str(fake))
    q, k, v = (torch.randn(3, 4, 16, 8, dtype=torch.float64) for _ in range(3))
    for causal in (False, True):
        expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(bench._tutorial(q, k, v, causal), expected)


FAKE_TUTORIAL = """import torch.nn.functional as F


def attention(q, k, v, causal, sm_scale):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale)
"""


def _fake_flash_attn_cute(monkeypatch):
    """A stand-in for flash_attn.cute: (B, N, H, D) in, (out, lse) back, as FlashAttention-4."""
    def flash_attn_func(q, k, v, softmax_scale=None, causal=False):
        assert q.shape[1] > q.shape[2], "expects (B, N, H, D)"  # the benchmark's shapes have N > H
        out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=causal)
        return out.transpose(1, 2), None

    package, cute = types.ModuleType("flash_attn"), types.ModuleType("flash_attn.cute")
    cute.flash_attn_func = flash_attn_func
    package.cute = cute
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)


def test_outside_impls_on_cpu_are_skipped_with_the_reason(tmp_path, capsys):
    rows = bench.main(["--N", "32", "--d", "16", "--mode", "fwd,bwd", "--causal", "false",
                       "--impl", "tutorial,fa4,naive", "--out", str(tmp_path / "outside")])
    status = {(r["impl"], r["mode"]): r["status"] for r in rows}
    assert status == {("tutorial", "fwd"): "unsupported: needs CUDA", ("tutorial", "bwd"): "forward only",
                      ("fa4", "fwd"): "unsupported: needs CUDA", ("fa4", "bwd"): "unsupported: needs CUDA",
                      ("naive", "fwd"): "ok", ("naive", "bwd"): "ok"}
    assert all(r["ms"] is None and r["rel_err"] is None for r in rows if r["impl"] != "naive")
    _, stored = bench_results.load_results(tmp_path / "outside.json")
    assert [r["status"] for r in stored] == [r["status"] for r in rows]
    printed = capsys.readouterr().out
    assert "fwd only" in printed and "(forward only)" in printed and "(unsupported: needs CUDA)" in printed


def test_absent_outside_impls_say_how_to_provide_them(monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "CUDA_ONLY", ())  # as on a GPU
    monkeypatch.setenv(bench.TUTORIAL_ENV, str(tmp_path / "missing.py"))
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # import flash_attn fails, installed or not
    rows = bench.run_attention_benchmark(modes=("fwd", "bwd"), causals=(False,), head_dims=(16,), seq_lens=(32,),
                                         impls=("tutorial", "fa4"), warmup=1, repeat=1, log=lambda _: None)
    status = {(r["impl"], r["mode"]): r["status"] for r in rows}
    assert status == {("tutorial", "fwd"): bench.TUTORIAL_MISSING, ("tutorial", "bwd"): "forward only",
                      ("fa4", "fwd"): bench.FA4_MISSING, ("fa4", "bwd"): bench.FA4_MISSING}
    assert bench.TUTORIAL_MISSING.startswith("not found: set FLASHLIB_TUTORIAL06 to Triton's python/tutorials/")
    assert bench.FA4_MISSING == "not installed: pip install flash-attn-4 nvidia-cutlass-dsl"


def test_tutorial_loader_reads_the_file_the_variable_names(monkeypatch, tmp_path):
    fake = tmp_path / "fake_tutorial.py"
    fake.write_text(FAKE_TUTORIAL)
    monkeypatch.setenv(bench.TUTORIAL_ENV, str(fake))
    assert bench.tutorial_path() == fake
    module = bench.load_tutorial()
    assert module.__file__ == str(fake.resolve()) and bench.load_tutorial(fake) is module  # executed once
    q, k, v = (torch.randn(1, 2, 16, 8, dtype=torch.float64) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(module.attention(q, k, v, True, 8 ** -0.5), expected)

    monkeypatch.delenv(bench.TUTORIAL_ENV)
    assert bench.tutorial_path() == bench.TUTORIAL_DEFAULT
    with pytest.raises(bench_results.Unavailable, match="^not found: set FLASHLIB_TUTORIAL06"):
        bench.load_tutorial(tmp_path / "missing.py")
    empty = tmp_path / "no_attention.py"
    empty.write_text("X = 1\n")
    with pytest.raises(bench_results.Unavailable, match="defines no attention"):
        bench.load_tutorial(empty)


def test_outside_impls_are_checked_against_float64_when_they_run(monkeypatch, tmp_path):
    fake = tmp_path / "fake_tutorial.py"
    fake.write_text(FAKE_TUTORIAL)
    monkeypatch.setenv(bench.TUTORIAL_ENV, str(fake))
    _fake_flash_attn_cute(monkeypatch)
    monkeypatch.setattr(bench, "CUDA_ONLY", ())
    rows = bench.run_attention_benchmark(modes=("fwd", "bwd"), causals=(False, True), head_dims=(16,),
                                         seq_lens=(32,), impls=("tutorial", "fa4"), dtypes=("fp16",),
                                         warmup=1, repeat=1, log=lambda _: None)
    for r in rows:
        if (r["impl"], r["mode"]) == ("tutorial", "bwd"):
            assert r["status"] == "forward only" and r["ms"] is None
            continue
        assert r["status"] == "ok", r
        assert r["ms"] > 0 and 0 <= r["rel_err"] < tolerance(torch.float16)


@pytest.mark.gpu
def test_cli_small_gpu_grid(tmp_path):
    prefix = tmp_path / "attention_gpu"
    # One dtype: every flashlib row autotunes its own kernels, and bf16 is covered by the kernel tests.
    bench.main(["--mode", "fwd,bwd,train", "--dtype", "fp16", "--d", "64", "--N", "512,1024",
                "--impl", ",".join(bench.IMPLS), "--warmup", "5", "--repeat", "20", "--out", str(prefix)])
    meta, rows = bench_results.load_results(f"{prefix}.json")
    assert meta["interpreter"] is False and meta["gpu"]["is_gpu"]
    assert meta["ceilings"]["hbm_gb_per_s"] > 100 and meta["ceilings"]["matmul_tflops"] > 10
    assert len(rows) == len(bench.IMPLS) * 3 * 1 * 2 * 2  # impls x modes x dtypes x causal x N
    for r in rows:
        if r["impl"] == "tutorial" and r["mode"] != "fwd":
            assert r["status"] == "forward only", r
        if r["impl"] in ("tutorial", "fa4") and r["status"] != "ok":
            assert r["status"] in ("forward only", bench.TUTORIAL_MISSING, bench.FA4_MISSING), r
        if r["impl"] in ("flashlib", "sdpa_flash", "naive"):
            assert r["status"] == "ok", r
            assert r["tflops"] > 0 and r["peak_mem_bytes"] > 0
            assert r["rel_err"] < tolerance(torch.float16 if r["dtype"] == "fp16" else torch.bfloat16)
    by_key = {(r["impl"], r["mode"], r["dtype"], r["causal"], r["N"]): r for r in rows}
    for mode in ("fwd", "train"):  # flash attention never holds the N x N matrix
        assert (by_key[("flashlib", mode, "fp16", False, 1024)]["peak_mem_bytes"]
                < by_key[("naive", mode, "fp16", False, 1024)]["peak_mem_bytes"])
    assert runtime.DEVICE.type == "cuda"
