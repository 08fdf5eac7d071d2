"""flashlib.report: ratios by hand on synthetic results, plots and markdown files written, and the
README section replaced exactly and idempotently."""
import json
import subprocess
import sys

import matplotlib
import pytest

from flashlib import bench, report
from flashlib.io_model import attention_flops

matplotlib.use("Agg")

GPU = "Test GPU 80GB"
META = dict(date="2026-05-01T12:00:00+00:00", gpu={"name": GPU, "is_gpu": True}, torch="2.11.0", triton="3.6.0",
            flashlib="0.1.0", python="3.12.3", interpreter=False, method="synthetic", command="python -m flashlib.bench",
            ceilings={"hbm_gb_per_s": 3000.0, "matmul_tflops": 700.0})
#: baseline time / flashlib time per N: the ratios the summary must find
SPEEDUP = {"sdpa_flash": {512: 2.0, 1024: 1.5, 2048: 1.2}, "sdpa_cudnn": {512: 0.5, 1024: 0.8, 2048: 0.9}}


def _row(impl, mode, causal, n, ms, mem, status="ok", dtype="fp16", d=64):
    b, h = bench.fa2_shape(n, d)
    flops = attention_flops(b, h, n, d, causal=causal, mode=mode)
    return dict(impl=impl, mode=mode, dtype=dtype, causal=causal, N=n, D=d, batch=b, heads=h,
                ms=ms if status == "ok" else None, tflops=flops / (ms * 1e-3) / 1e12 if status == "ok" else None,
                peak_mem_bytes=mem if status == "ok" else None, rel_err=1e-3 if status == "ok" else None,
                status=status)


def synthetic_rows():
    rows = []
    for mode in ("fwd", "bwd", "train"):
        for causal in (False, True):
            for n in (512, 1024, 2048):
                flash_ms = 1.0 + n / 1024
                rows.append(_row("flashlib", mode, causal, n, flash_ms, 10 * n))
                for base, ratio in SPEEDUP.items():
                    rows.append(_row(base, mode, causal, n, flash_ms * ratio[n], 20 * n))
                rows.append(_row("naive", mode, causal, n, 10 * flash_ms, n * n,
                                 status="out of memory" if n == 2048 else "ok"))
    return rows


@pytest.fixture
def results_file(tmp_path):
    path = tmp_path / "attention_test_gpu.json"
    path.write_text(json.dumps({"meta": META, "rows": synthetic_rows()}))
    return path


@pytest.fixture
def small_results_file(tmp_path):
    """Two implementations only: fewer figures to draw (each PNG takes about a second)."""
    path = tmp_path / "attention_small.json"
    rows = [r for r in synthetic_rows() if r["impl"] in ("flashlib", "sdpa_flash")]
    path.write_text(json.dumps({"meta": META, "rows": rows}))
    return path


def test_summary_ratios_by_hand():
    ratios = report.summary_ratios(synthetic_rows(), "sdpa_flash")
    assert list(ratios) == [("fwd", "fp16"), ("bwd", "fp16"), ("train", "fp16")]
    for lo, mid, hi in ratios.values():  # 1.2, 1.5, 2.0, each twice (causal and not)
        assert (lo, mid, hi) == pytest.approx((1.2, 1.5, 2.0))
    assert report.summary_ratios(synthetic_rows(), "sdpa_cudnn")[("bwd", "fp16")] == pytest.approx((0.5, 0.8, 0.9))


def test_summary_ratios_skip_failed_and_unmatched_rows():
    rows = synthetic_rows()
    rows = [r for r in rows if not (r["impl"] == "sdpa_flash" and r["N"] == 512)]  # baseline missing there
    rows.append(_row("flashlib", "fwd", False, 4096, 1.0, 1, status="unsupported: test"))
    assert report.summary_ratios(rows, "sdpa_flash")[("fwd", "fp16")] == pytest.approx((1.2, 1.35, 1.5))
    # naive is 10x slower where it ran, and its out-of-memory rows are ignored
    assert report.summary_ratios(rows, "naive")[("train", "fp16")] == pytest.approx((10, 10, 10))
    assert report.summary_ratios(rows, "sdpa_efficient") == {}


def test_memory_comparison_at_largest_n():
    memory = report.memory_comparison(synthetic_rows())
    assert memory[("train", "fp16", 64, False, 2048)] == {
        "flashlib": 20480, "sdpa_flash": 40960, "sdpa_cudnn": 40960, "naive": None}  # naive: out of memory
    assert report.memory_comparison([dict(r, peak_mem_bytes=None) for r in synthetic_rows()]) == {}


def test_markdown_table():
    text = report.markdown_table(synthetic_rows(), [META])
    assert f"**{GPU}, torch 2.11.0, triton 3.6.0, flashlib 0.1.0, 2026-05-01**" in text
    assert ("| mode | D | causal | N | flashlib TFLOP/s | sdpa_flash TFLOP/s | flashlib / sdpa_flash "
            "| sdpa_cudnn TFLOP/s | flashlib / sdpa_cudnn |") in text
    flash_ms = 1.0 + 512 / 1024
    tflops = attention_flops(*bench.fa2_shape(512, 64), 512, 64, causal=False, mode="fwd") / (flash_ms * 1e-3) / 1e12
    assert (f"| fwd | 64 | no | 512 | {tflops:.1f} | {tflops / 2:.1f} | 2.00 | {tflops * 2:.1f} | 0.50 |") in text
    assert "- flashlib / sdpa_flash: fwd 1.20 / 1.50 / 2.00 (6); bwd 1.20 / 1.50 / 2.00 (6)" in text
    assert "- flashlib / sdpa_cudnn: fwd 0.50 / 0.80 / 0.90 (6)" in text
    assert "| train | fp16 | 64 | 2048 | 0.01953 | 0.03906 | 0.03906 | - | 0.50 |" in text  # MiB; flashlib / sdpa_flash
    assert "HBM traffic" in text and "| flashlib | fwd | fp16 | 64 | 2048 |" in text


def test_replace_section_exact_and_idempotent():
    text = "# T\n\nbefore\n<!-- results:start -->\nold table\n<!-- results:end -->\nafter\n"
    once = report.replace_section(text, "new\ntable\n")
    assert once == "# T\n\nbefore\n<!-- results:start -->\nnew\ntable\n<!-- results:end -->\nafter\n"
    assert report.replace_section(once, "new\ntable\n") == once
    with pytest.raises(ValueError, match="must contain"):
        report.replace_section("no markers here", "x")
    with pytest.raises(ValueError, match="must contain"):
        report.replace_section("<!-- results:end --> <!-- results:start -->", "x")


def test_command_writes_plots_markdown_and_readme(small_results_file, tmp_path):
    readme = tmp_path / "README.md"
    original = "# Project\n\n## GPU results\n<!-- results:start -->\ntyped\n<!-- results:end -->\n\n## More\n"
    readme.write_text(original)
    out_dir = tmp_path / "out"
    report.main([str(small_results_file), "--out-dir", str(out_dir), "--readme", str(readme)])
    pngs = sorted(p.name for p in out_dir.glob("*.png"))
    assert pngs == ["attention_test_gpu_80gb_memory_fp16.png", "attention_test_gpu_80gb_speedup_vs_sdpa_flash.png",
                    "attention_test_gpu_80gb_tflops_fp16.png"]
    for png in out_dir.glob("*.png"):
        assert png.read_bytes()[:4] == b"\x89PNG"
    md = (out_dir / "attention_test_gpu_80gb.md").read_text()
    assert "1.20 / 1.50 / 2.00" in md and "(attention_test_gpu_80gb_tflops_fp16.png)" in md

    first = readme.read_text()
    assert first.startswith("# Project\n\n## GPU results\n<!-- results:start -->\n")
    assert first.endswith("<!-- results:end -->\n\n## More\n") and "typed" not in first
    assert "1.20 / 1.50 / 2.00" in first and "(out/attention_test_gpu_80gb_tflops_fp16.png)" in first
    report.main([str(small_results_file), "--out-dir", str(out_dir), "--readme", str(readme)])
    assert readme.read_text() == first  # regenerating changes nothing


def test_newest_file_wins_for_a_problem_measured_twice(results_file, tmp_path):
    newer = tmp_path / "attention_newer.json"
    rows = [dict(r, ms=r["ms"] / 2) if r["impl"] == "flashlib" and r["ms"] else r for r in synthetic_rows()]
    newer.write_text(json.dumps({"meta": dict(META, date="2026-06-01T00:00:00+00:00"), "rows": rows[:3]}))
    (slug, (metas, merged)), = report.group_by_gpu([newer, results_file]).items()
    assert slug == "test_gpu_80gb" and [m["date"][:7] for m in metas] == ["2026-06", "2026-05"]
    assert len(merged) == len(synthetic_rows())
    first = next(r for r in merged if r["impl"] == "flashlib")
    assert first["ms"] == synthetic_rows()[0]["ms"] / 2


def test_plots_have_one_panel_per_case():
    rows = synthetic_rows()
    assert len(report.plot_tflops(rows, "fp16").axes) == 3 * 2  # modes x (D, causal)
    assert len(report.plot_speedup(rows, "sdpa_cudnn").axes) == 3
    assert len(report.plot_memory(rows, "fp16").axes) == 3
    empty = report.plot_memory([dict(r, peak_mem_bytes=None) for r in rows], "fp16")
    assert "no memory measurements" in empty.axes[0].texts[0].get_text()


def test_report_imports_results_never_the_command_line():
    code = ("import sys, flashlib.report; "
            "assert 'flashlib.bench' not in sys.modules, sorted(m for m in sys.modules if m.startswith('flashlib'))")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_rows_of_absent_impls_change_no_summary():
    absent = [_row(impl, mode, False, 512, 1.0, 1, status=status) for impl, status in
              (("tutorial", "not found: set FLASHLIB_TUTORIAL06 to ..."), ("fa4", "not installed: pip ..."))
              for mode in ("fwd", "bwd", "train")]
    rows = synthetic_rows() + absent
    assert report.summary_ratios(rows, "tutorial") == {}
    assert report.memory_comparison(rows) == report.memory_comparison(synthetic_rows())  # no column for them
    assert report.markdown_table(rows, [META]) == report.markdown_table(synthetic_rows(), [META])
    table = report.format_table(rows, interpreter=False)
    assert "  absent   absent" in table and "(not installed: pip ...)" in table
    assert len(report.plot_tflops(rows, "fp16").axes) == 3 * 2


def test_outside_baselines_join_the_summaries_where_they_ran():
    rows = synthetic_rows() + [dict(r, impl="tutorial", ms=r["ms"] * 0.5, tflops=r["tflops"] * 2)
                               for r in synthetic_rows() if r["impl"] == "flashlib"]
    assert report.summary_ratios(rows, "tutorial")[("fwd", "fp16")] == pytest.approx((0.5, 0.5, 0.5))
    text = report.markdown_table(rows, [META])
    assert "| flashlib / tutorial |" in text and "- flashlib / tutorial: fwd 0.50 / 0.50 / 0.50 (6)" in text
    assert "fa4" not in text
    assert "flashlib / tutorial" in report.format_table(rows, interpreter=False)


# ---------------------------------------------------------------- which files the README shows

def _write(path, rows, **meta):
    path.write_text(json.dumps({"meta": dict(META, **meta), "rows": rows}))
    return path


def test_files_merge_newest_first_by_their_date_and_each_column_names_its_file(tmp_path):
    """Given oldest first, the newer file still wins where both measured a problem; the older one
    supplies only the columns the newer lacks, and each dtype's table names file, date and command."""
    base = [r for r in synthetic_rows() if r["mode"] != "train" and r["impl"] in ("flashlib", "sdpa_cudnn")]
    older_rows = base + [dict(r, impl="tutorial") for r in base if r["impl"] == "flashlib"]
    older = _write(tmp_path / "grid_old.json", older_rows, date="2026-05-01T06:48:00+00:00", command="bench old")
    newer_rows = [dict(r, ms=r["ms"] / 2) if r["impl"] == "flashlib" else r for r in base]
    newer = _write(tmp_path / "grid_new.json", newer_rows, date="2026-05-01T09:13:00+00:00", command="bench new")
    (slug, used), = report.sources_by_gpu([older, newer]).items()
    assert [path.name for path, _, _ in used] == ["grid_new.json", "grid_old.json"]
    assert {r["impl"] for r in used[1][2]} == {"tutorial"}  # the old flashlib and cudnn rows lose
    metas, rows = report.group_by_gpu([older, newer])[slug]
    assert [m["command"] for m in metas] == ["bench new", "bench old"]
    assert report.summary_ratios(rows, "sdpa_cudnn")[("fwd", "fp16")] == pytest.approx((1.0, 1.6, 1.8))
    text = report.markdown_table(rows, metas, sources=[(p.name, m, r) for p, m, r in used])
    assert "**fp16**, measured on **Test GPU 80GB, torch 2.11.0, triton 3.6.0, flashlib 0.1.0, 2026-05-01**" in text
    assert "- flashlib, sdpa_cudnn: measured 2026-05-01 09:13 UTC by `bench new` (`grid_new.json`)" in text
    assert "- tutorial: measured 2026-05-01 06:48 UTC by `bench old` (`grid_old.json`)" in text
    assert "Measured on" not in text  # the per-file lines replace the single one


def test_the_io_table_takes_each_rows_ceilings_from_the_run_that_timed_it(tmp_path):
    """Files merged for one table: a row's HBM line uses the copy bandwidth measured in its own run, and a row
    from a run that measured none gets no line (never another run's ceilings)."""
    fwd = [r for r in synthetic_rows() if r["mode"] == "fwd" and r["impl"] == "flashlib"]
    bwd = [r for r in synthetic_rows() if r["mode"] == "bwd" and r["impl"] == "flashlib"]
    without = _write(tmp_path / "fwd_old.json", fwd, date="2026-05-01T06:00:00+00:00", ceilings=None)
    measured = _write(tmp_path / "bwd_new.json", bwd, date="2026-05-01T09:00:00+00:00",
                      ceilings={"hbm_gb_per_s": 1500.0, "matmul_tflops": 350.0})
    (slug, used), = report.sources_by_gpu([without, measured]).items()
    metas, rows = report.group_by_gpu([without, measured])[slug]
    text = report.markdown_table(rows, metas, sources=[(p.name, m, r) for p, m, r in used])
    assert "at the ceilings measured in the same run (1500 GB/s copy bandwidth and 350 TFLOP/s matmul)" in text
    assert "| flashlib | bwd | fp16 | 64 | 2048 |" in text and "| flashlib | fwd | fp16 | 64 | 2048 |" not in text
    only_fwd = report.markdown_table(fwd, [dict(META, ceilings=None)])
    assert "HBM traffic" not in only_fwd


def test_default_command_writes_the_readme_from_readme_grids_only(tmp_path, monkeypatch, capsys):
    """``make report``: the files named in README_GRIDS, whatever else lies beside them; no plots."""
    _write(tmp_path / "grid_a.json", [r for r in synthetic_rows() if r["impl"] in ("flashlib", "sdpa_cudnn")],
           command="bench a")
    _write(tmp_path / "attention_other.json", synthetic_rows(), date="2026-12-01T00:00:00+00:00", command="bench b")
    readme = tmp_path / "README.md"
    readme.write_text("# P\n<!-- results:start -->\nold\n<!-- results:end -->\n")
    monkeypatch.setattr(report, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(report, "README", readme)
    monkeypatch.setattr(report, "README_GRIDS", ("grid_a.json",))
    assert report.main([]) == [tmp_path / "grid_a.json"]
    text = readme.read_text()
    assert "`bench a` (`grid_a.json`)" in text and "bench b" not in text and "sdpa_flash" not in text
    assert "from grid_a.json; edit those" in text and not list(tmp_path.glob("*.png"))
    monkeypatch.setattr(report, "README_GRIDS", ("grid_a.json", "missing.json"))
    with pytest.raises(SystemExit):
        report.main([])
    error = capsys.readouterr().err
    assert "README_GRIDS names files that are not there" in error and "missing.json" in error


def test_readme_grids_are_stored_and_no_stored_grid_is_newer():
    paths = report.readme_grids()
    metas = [report.load_results(p)[0] for p in paths]
    dtypes = {r["dtype"] for p in paths for r in report.load_results(p)[1] if r["impl"] == "flashlib"}
    assert dtypes == {"fp16", "bf16"}
    newest = max(m["date"] for m in metas)
    for pattern in ("attention_*.json", "hopper_*.json"):
        for path in report.RESULTS_DIR.glob(pattern):
            if path.name not in report.README_GRIDS:
                assert report.load_results(path)[0]["date"] <= newest, f"{path.name} is newer than README_GRIDS"


def test_the_readme_section_is_what_the_report_makes_of_readme_grids():
    """The README's numbers are generated: regenerating its section from README_GRIDS changes nothing."""
    text = report.README.read_text(encoding="utf-8")
    section = report.readme_section(report.readme_grids(), report.README.parent)
    assert report.replace_section(text, section) == text, "README results section is stale: run `make report`"
