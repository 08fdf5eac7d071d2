"""The decoding benchmark (python -m flashlib.bench --mode decode) in the interpreter, and its stored results."""
from __future__ import annotations

import json

import matplotlib
import pytest

from flashlib import bench, bench_decode

matplotlib.use("Agg")

TINY = ["--mode", "decode", "--nk", "64", "--batch", "1", "--heads-kv", "1", "--nq", "1,4", "--d", "32",
        "--impl", "flashlib,flashlib_paged,flashlib_fa2,sdpa_flash"]


def test_the_cli_times_every_impl_and_checks_it_against_the_first(tmp_path, capsys):
    rows = bench.main(TINY + ["--out", str(tmp_path / "decode")])  # bench's CLI hands decode over
    assert {(r["impl"], r["n_q"]) for r in rows} == {(i, n) for i in ("flashlib", "flashlib_paged", "flashlib_fa2",
                                                                       "sdpa_flash") for n in (1, 4)}
    assert all(r["status"] == "ok" and r["us"] > 0 and r["us_graph"] is None for r in rows)  # no graphs on CPU
    assert all(r["rel_err"] < 1e-5 for r in rows)  # every impl agrees with flashlib on the same tensors
    meta, stored = bench_decode.load_decode_results(tmp_path / "decode.json")
    assert stored == [{**{f: None for f in bench_decode.ROW_FIELDS}, **r} for r in json.loads(
        (tmp_path / "decode.json").read_text())["rows"]]
    assert meta["interpreter"] and meta["command"].startswith("python -m flashlib.bench --mode decode")
    assert "flashlib / fastest SDPA (us)" in capsys.readouterr().out


def test_points_too_large_are_skipped_with_the_reason(monkeypatch):
    monkeypatch.setattr(bench_decode, "MAX_KV_BYTES", 1000)
    rows = bench_decode.bench_point("fp16", 32, 1, 4, 1, 64, 1, ["flashlib", "sdpa_flash"], 1, 1)
    assert [r["status"] for r in rows] == ["skipped: K and V take 0 GB"] * 2


def test_bad_flags_are_refused(capsys):
    with pytest.raises(SystemExit):
        bench_decode.main(["--impl", "flashlib,fa9"])
    assert "--impl: unknown ['fa9']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_decode.main(["--nk", "1k"])
    assert "--nk must be a comma list of ints; got '1k'" in capsys.readouterr().err


def test_the_stored_h100_runs_summarise_and_plot():
    files = [p for p in bench_decode.stored_decode_results()
             if p.name.startswith(("decode_fp16_nvidia", "decode_bf16_nvidia"))]
    assert files, "the H100 decoding grids are stored in benchmarks/results"
    for path in files:
        meta, rows = bench_decode.load_decode_results(path)
        assert meta["gpu"]["name"].startswith("NVIDIA") and not meta["interpreter"]
        lines = bench_decode.summary(rows, meta["copy_gb_per_s"])
        assert lines[-2].startswith("flashlib / fastest SDPA (us_graph): min ")
        figure = bench_decode.plot_decode(rows, dtype=rows[0]["dtype"])
        assert len(figure.axes) == 4  # (D, N_q) panels


def test_other_scripts_files_beside_the_grids_are_refused_not_misread(tmp_path):
    """The A/B and sweep scripts also write ``decode_*.json`` files with 'meta' and 'rows'; notebook 09 picks the
    newest loadable file, so those must raise ValueError rather than pass as a grid."""
    ab = {"meta": {"gpu": "NVIDIA H100 80GB HBM3", "date": "2099-01-01"}, "rows": [{"batch": 1, "early_us": 4.7}]}
    (tmp_path / "decode_merge_pdl.json").write_text(json.dumps(ab))
    with pytest.raises(ValueError, match="not a run of `python -m flashlib.bench --mode decode`"):
        bench_decode.load_decode_results(tmp_path / "decode_merge_pdl.json")
    loaded = []
    for path in bench_decode.stored_decode_results():
        try:
            loaded.append(bench_decode.load_decode_results(path))
        except ValueError:
            continue
    assert loaded and all(meta["gpu"]["name"] and all(r["impl"] for r in rows) for meta, rows in loaded)


@pytest.mark.gpu
def test_graph_timing_waits_for_work_still_queued_on_the_callers_stream():
    """Triton's do_bench_cudagraph warms up on a stream of its own that does not wait for the caller's; a call
    timed there must still see inputs that the caller's stream was writing (here: after a sleep of about 0.5 s).
    Every kernel and torch's stream pool are made ready first: CUDA loads a kernel's module on its first launch,
    and that load waits for the device, which would end the sleep before the race could show."""
    import torch

    x, seen, calls = (torch.zeros(1, device="cuda") for _ in range(3))
    torch.cuda.Stream()
    torch.cuda._sleep(1000)
    x.fill_(1.0), seen.add_(x), calls.add_(1)
    torch.cuda.synchronize()
    x.fill_(0.0), seen.fill_(0.0), calls.fill_(0.0)
    torch.cuda._sleep(1_000_000_000)
    x.fill_(1.0)
    bench_decode.graph_time_us(lambda: (seen.add_(x), calls.add_(1)), repeat=1)
    torch.cuda.synchronize()
    assert calls.item() > 1 and seen.item() == calls.item()
