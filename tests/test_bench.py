"""flashlib.bench's attention benchmark: FLOP counts by hand, the command line on a tiny grid in the
interpreter (files with every field, small errors), failures turned into statuses, results files."""
import csv
import json

import pytest
import torch

from flashlib import bench, runtime
from flashlib.validation import tolerance

META_FIELDS = {"date", "gpu", "torch", "triton", "flashlib", "python", "interpreter", "method", "command",
               "ceilings"}


def test_flops_by_hand():
    # B=2, H=3, N=128, D=64: 4 * 2 * 3 * 128^2 * 64 forward
    fwd = 4 * 2 * 3 * 128 * 128 * 64
    assert bench.attention_flops(2, 3, 128, 64) == fwd
    assert bench.attention_flops(2, 3, 128, 64, causal=True) == fwd / 2
    assert bench.attention_flops(2, 3, 128, 64, mode="bwd") == 2.5 * fwd
    assert bench.attention_flops(2, 3, 128, 64, causal=True, mode="train") == 3.5 * fwd / 2
    with pytest.raises(ValueError, match="mode must be one of"):
        bench.attention_flops(2, 3, 128, 64, mode="backward")


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
        assert set(row) == set(bench.ROW_FIELDS)
        assert (row["N"], row["D"], row["dtype"], row["batch"], row["heads"]) == (32, 16, "fp16", 1, 2)
        if row["impl"] == "sdpa_flash":
            assert row["status"] == "unsupported: needs CUDA" and row["ms"] is None and row["tflops"] is None
            continue
        assert row["status"] == "ok", row
        assert row["ms"] > 0 and row["peak_mem_bytes"] > 0
        flops = bench.attention_flops(1, 2, 32, 16, causal=row["causal"], mode=row["mode"])
        assert row["tflops"] == pytest.approx(flops / (row["ms"] * 1e-3) / 1e12)
        assert 0 <= row["rel_err"] < tolerance(torch.float16)
    with (tmp_path / "attention_test.csv").open() as handle:
        lines = list(csv.DictReader(handle))
    assert len(lines) == len(data["rows"])
    assert set(bench.ROW_FIELDS) <= set(lines[0]) and lines[0]["gpu"] == meta["gpu"]["name"]

    loaded_meta, loaded_rows = bench.load_results(tmp_path / "attention_test.json")
    assert loaded_meta == meta and loaded_rows == data["rows"]


def test_cli_rejects_unknown_values(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--impl", "flashlib,xformers"])
    assert "--impl must be a comma-separated list drawn from" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--causal", "maybe"])
    assert "--causal must be 'both', 'true' or 'false'" in capsys.readouterr().err


class _FailsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q):
        return q.clone()

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
                     ("nan_output", nan_output), ("bad_backward", lambda q, k, v, c: _FailsInBackward.apply(q))]:
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
    status = bench.failure_status(RuntimeError("No available kernel. Aborting execution."), warned)
    assert status.startswith("unsupported: Flash attention requires q,k,v to have the same last dimension")
    assert bench.failure_status(RuntimeError("No available kernel.")) == "unsupported: No available kernel."
    later_torch = RuntimeError("No viable backend for scaled_dot_product_attention was found.")
    assert bench.failure_status(later_torch).startswith("unsupported: No viable backend")


def test_load_results_rejects_other_json(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"date": "x", "rows": []}))
    with pytest.raises(ValueError, match="expected flashlib.bench results.*'meta'"):
        bench.load_results(path)


def test_stored_results_newest_first(tmp_path):
    for name, date in [("attention_a.json", "2026-01-02T00:00:00+00:00"),
                       ("attention_b.json", "2026-03-01T00:00:00+00:00"),
                       ("attention_c.json", "2025-12-31T00:00:00+00:00")]:
        (tmp_path / name).write_text(json.dumps({"meta": {"date": date}, "rows": []}))
    (tmp_path / "block_sizes.json").write_text("{}")
    assert [p.name for p in bench.stored_results(directory=tmp_path)] == [
        "attention_b.json", "attention_a.json", "attention_c.json"]


def test_matmul_table_still_reachable(capsys):
    bench.main(["--kernel", "matmul", "--repeat", "1"])
    out = capsys.readouterr().out
    assert "flashlib ms" in out and "torch ms" in out


@pytest.mark.gpu
def test_cli_small_gpu_grid(tmp_path):
    prefix = tmp_path / "attention_gpu"
    # One dtype: every flashlib row autotunes its own kernels, and bf16 is covered by the kernel tests.
    bench.main(["--mode", "fwd,bwd,train", "--dtype", "fp16", "--d", "64", "--N", "512,1024",
                "--impl", ",".join(bench.IMPLS), "--warmup", "5", "--repeat", "20", "--out", str(prefix)])
    meta, rows = bench.load_results(f"{prefix}.json")
    assert meta["interpreter"] is False and meta["gpu"]["is_gpu"]
    assert meta["ceilings"]["hbm_gb_per_s"] > 100 and meta["ceilings"]["matmul_tflops"] > 10
    assert len(rows) == len(bench.IMPLS) * 3 * 1 * 2 * 2  # impls x modes x dtypes x causal x N
    for r in rows:
        if r["impl"] in ("flashlib", "sdpa_flash", "naive"):
            assert r["status"] == "ok", r
            assert r["tflops"] > 0 and r["peak_mem_bytes"] > 0
            assert r["rel_err"] < tolerance(torch.float16 if r["dtype"] == "fp16" else torch.bfloat16)
    by_key = {(r["impl"], r["mode"], r["dtype"], r["causal"], r["N"]): r for r in rows}
    for mode in ("fwd", "train"):  # flash attention never holds the N x N matrix
        assert (by_key[("flashlib", mode, "fp16", False, 1024)]["peak_mem_bytes"]
                < by_key[("naive", mode, "fp16", False, 1024)]["peak_mem_bytes"])
    assert runtime.DEVICE.type == "cuda"
