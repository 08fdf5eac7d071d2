"""Plots and tables from attention benchmark results (``flashlib.bench``'s JSON files).

``python -m flashlib.report`` (``make report``) regenerates the README's results section, between
``<!-- results:start -->`` and ``<!-- results:end -->``, from the grids named in :data:`README_GRIDS`
(the newest measured ones, listed by name so that an older or partial file never slips in), so the
numbers in the README are generated, never typed. It writes no plots.

``python -m flashlib.report FILES [--out-dir DIR] [--readme README.md]`` reads the given results files
and writes per GPU into DIR (default ``benchmarks/results``): TFLOP/s versus N, flashlib's speedup
versus each baseline, peak memory versus N (one PNG per figure) and a markdown file; with
``--readme``, that README's results section too. (The plots of the full 2026-11-23 grid:
``python -m flashlib.report benchmarks/results/attention_*.json``.)

Either way the files of one GPU are merged newest first, by the date inside each: a problem
(impl, mode, dtype, D, causal, N) measured twice keeps its newest row. Each dtype's table states the
GPU, versions, and for each file that supplied rows its date, its command and the implementations
it supplied; it gives TFLOP/s per point, flashlib's speed ratio to each baseline, and the min /
median / max of those ratios.

matplotlib is imported only when a plot is drawn: the table functions (``format_table``,
which ``flashlib.bench`` prints, and the markdown) work without it, on a GPU machine that lacks it.
Results are read through :mod:`flashlib.bench_results`; this module never imports the
benchmark's command line.
"""
from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from . import runtime
from .bench_results import OK, OUT_OF_MEMORY, RESULTS_DIR, gpu_slug, load_results
from .io_model import MODES, io_analysis

START, END = "<!-- results:start -->", "<!-- results:end -->"
README = RESULTS_DIR.parents[1] / "README.md"
#: Fixed colours, so that an implementation looks the same in every figure.
COLORS = {"flashlib": "C3", "sdpa_flash": "C0", "sdpa_cudnn": "C2", "sdpa_efficient": "C1", "naive": "C7",
          "tutorial": "C4", "fa4": "C5"}
#: The baselines of every summary; those of OUTSIDE_BASELINES join them where they ran (they are often absent).
BASELINES = ("sdpa_flash", "sdpa_cudnn")
OUTSIDE_BASELINES = ("tutorial", "fa4")
#: The stored grids (files in benchmarks/results) that ``make report`` puts in the README: the newest
#: measured, H100, 2026-11-24. Their order does not matter (newest first by the date inside each); a
#: problem in two of them keeps the newest row. Name a new file here when a newer grid is stored.
README_GRIDS = (
    "hopper_fp16_nvidia_h100_80gb_hbm3.json",  # fp16: flashlib, sdpa_cudnn, tutorial in one process (session 18)
    "hopper_bf16_nvidia_h100_80gb_hbm3.json",  # bf16: the same (session 18)
    # the forward at D = 128 after it took the Gluon Hopper kernel from 2048 rows, beside cuDNN (session 39);
    "hopper_gluon_fwd_fp16_nvidia_h100_80gb_hbm3.json",
    "hopper_gluon_fwd_bf16_nvidia_h100_80gb_hbm3.json",
    # the same after it became persistent and took 1024 rows without a mask (session 40)
    "hopper_gluon_fwd_persistent_fp16_nvidia_h100_80gb_hbm3.json",
    "hopper_gluon_fwd_persistent_bf16_nvidia_h100_80gb_hbm3.json",
    # an H200 (its own table): forward and backward at D = 64 and 128 beside cuDNN, after the backward took the
    # Gluon dK/dV kernel at D = 128 (session 42); and that backward's first front-door run at D = 128
    "hopper_session42_grid_fp16_bf16_nvidia_h200.json",
    "hopper_gluon_bwd_m64_fp16_bf16_nvidia_h200.json",
    # the backward at D = 128 once its dQ also came from a Gluon kernel (session 43)
    "hopper_gluon_dq_bwd_fp16_bf16_nvidia_h200.json",
    # an H100: forward and backward at D = 64 and 128 beside cuDNN after Q in registers at D = 64 and FP8 through
    # Gluon (session 53; three N = 1024 points at D = 128 ran far below the same kernels' A/B run that day)
    "hopper_session53_grid_fp16_bf16_nvidia_h100_80gb_hbm3.json",
    # the same H100 kind, N = 1024 at D = 128 again in a fresh process (session 55): session 53's three far-off points
    # did not come back (forward 0.81-0.98x cuDNN, backward 0.88-1.00x)
    "hopper_session55_grid_n1024_fp16_bf16_nvidia_h100_80gb_hbm3.json",
    # the backward at D = 128 once the dK/dV kernel's loading warp staged L and D in shared memory (session 59)
    "hopper_session59_bwd_fp16_nvidia_h100_80gb_hbm3.json",
    "hopper_session59_bwd_bf16_nvidia_h100_80gb_hbm3.json",
    # the backward at D = 64 once the dK/dV kernel took 128 query rows a step there, K and V in shared memory
    # (session 63; it had taken D = 64 from 1024 rows in session 61, 64 rows a step with K and V in registers)
    "hopper_session63_bwd_d64_fp16_nvidia_h100_80gb_hbm3.json",
    "hopper_session63_bwd_d64_bf16_nvidia_h100_80gb_hbm3.json",
    # the whole grid again, N 1k-16k with 2k and 8k (session 66); its N = 1024 points at D = 128 ran far low (the
    # causal backward 0.65-0.70x cuDNN), likely bound by that machine's host as on another H100 where a probe timed
    # it: 0.55-0.63x eager, 1.08x from CUDA graphs (fifty-ninth finding, results/short_rows_probe_session66_h100.log)
    "hopper_session66_grid_fp16_bf16_nvidia_h100_80gb_hbm3.json",
    # the same grid once the Gluon kernels launched from the compiled-binary cache (session 67): N = 1024 at D = 128
    # came up (unmasked forward 0.93-0.98x), and one point ran far low (bf16 causal forward at 1024, 0.60x; 0.81x
    # when re-run in the same hour, results/n1024_recheck_session67_h100.log)
    "hopper_session67_grid_fp16_bf16_nvidia_h100_80gb_hbm3.json",
    # the same grid with session 68-70's forward routes (session 71): the relative mask test, three consumers at 64
    # from 8k unmasked rows, two consumers at 64 causal from 2k, the half-width diagonal block at 128 causal from 1k
    "hopper_session71_grid_fp16_bf16_nvidia_h100_80gb_hbm3.json",
    # the fp16 forward beside cuDNN and Triton's tutorial 06 (its TMA forward) in one process, same routes
    # (session 72): issue 14's first bar, flashlib / tutorial 1.03-1.25x at the 12 points
    "hopper_session72_tutorial_fwd_fp16_nvidia_h100_80gb_hbm3.json",
)
_MIB = 2 ** 20


# ---------------------------------------------------------------- rows

def _ok(rows, **where) -> list[dict]:
    """Rows measured successfully (status ok, a time) that match every ``field=value``."""
    return [r for r in rows if r["status"] == OK and r["ms"] and all(r[k] == v for k, v in where.items())]


def _problem(row: dict) -> tuple:
    return row["mode"], row["dtype"], row["D"], row["causal"], row["N"]


def _present(rows, field: str, order=None) -> list:
    values = list(dict.fromkeys(r[field] for r in rows))
    return sorted(values, key=(lambda v: order.index(v) if v in order else len(order)) if order else None)


def _baselines(rows) -> tuple[str, ...]:
    """Those of BASELINES, then of OUTSIDE_BASELINES, that have a measured row."""
    return tuple(b for b in BASELINES + OUTSIDE_BASELINES if _ok(rows, impl=b))


def contributions(results: list[tuple]) -> list[tuple]:
    """``results`` (tuples whose last two items are meta and rows; files of one GPU, given newest
    first) with each file's rows cut to those it contributes: the first row of each
    (impl, mode, dtype, D, causal, N) wins. Files that contribute nothing are left out."""
    seen, out = set(), []
    for *head, meta, file_rows in results:
        won = []
        for r in file_rows:
            key = (r["impl"], *_problem(r))
            if key not in seen:
                seen.add(key)
                won.append(r)
        if won:
            out.append((*head, meta, won))
    return out


def merge(results: list[tuple[dict, list[dict]]]) -> tuple[list[dict], list[dict]]:
    """(metas that contributed, rows) from several files of one GPU, given newest first:
    the first row of each (impl, mode, dtype, D, causal, N) wins."""
    used = contributions(results)
    return [meta for meta, _ in used], [r for _, rows in used for r in rows]


def summary_ratios(rows: list[dict], baseline: str = "sdpa_flash",
                   impl: str = "flashlib") -> dict[tuple[str, str], tuple[float, float, float]]:
    """{(mode, dtype): (min, median, max)} of baseline time / ``impl`` time (= ``impl``'s TFLOP/s /
    the baseline's) over the problems where both ran; above 1, ``impl`` is faster."""
    times = {(r["impl"], *_problem(r)): r["ms"] for r in _ok(rows)}
    ratios: dict[tuple[str, str], list[float]] = {}
    for (name, *problem), ms in times.items():
        other = times.get((baseline, *problem))
        if name == impl and other is not None:
            ratios.setdefault((problem[0], problem[1]), []).append(other / ms)
    ordered = sorted(ratios, key=lambda k: (MODES.index(k[0]) if k[0] in MODES else 99, k[1]))
    return {k: (min(ratios[k]), statistics.median(ratios[k]), max(ratios[k])) for k in ordered}


def _ratio_counts(rows, baseline, impl="flashlib") -> dict[tuple[str, str], int]:
    times = {(r["impl"], *_problem(r)) for r in _ok(rows)}
    counts: dict[tuple[str, str], int] = {}
    for name, *problem in times:
        if name == impl and (baseline, *problem) in times:
            counts[(problem[0], problem[1])] = counts.get((problem[0], problem[1]), 0) + 1
    return counts


def memory_comparison(rows: list[dict], causal: bool = False) -> dict[tuple, dict[str, int | None]]:
    """{(mode, dtype, D, causal, N): {impl: peak bytes or None}} at the largest N of each (mode, dtype, D);
    empty when no row has a memory measurement."""
    if not any(r["peak_mem_bytes"] is not None for r in rows):
        return {}
    impls = _present(_ok(rows), "impl", list(COLORS))  # an impl that never ran (not installed, ...) has no column
    out = {}
    for mode in _present(rows, "mode", list(MODES)):
        for dtype in _present(rows, "dtype"):
            for d in sorted({r["D"] for r in rows if (r["mode"], r["dtype"]) == (mode, dtype)}):
                same = [r for r in rows if (r["mode"], r["dtype"], r["D"], r["causal"]) == (mode, dtype, d, causal)]
                if not same:
                    continue
                n = max(r["N"] for r in same)
                mem = {r["impl"]: r["peak_mem_bytes"] if r["status"] == OK else None for r in same if r["N"] == n}
                out[(mode, dtype, d, causal, n)] = {i: mem.get(i) for i in impls}
    return out


def describe(metas: list[dict]) -> str:
    """One line: GPU, versions, dates (several when the rows come from several files)."""
    if not metas:
        return "no results"
    first = metas[0]
    if first.get("interpreter"):
        where = "Triton interpreter on the CPU: interpreter timings (numpy), not GPU timings"
    else:
        where = first["gpu"]["name"]

    def joined(key):
        return ", ".join(dict.fromkeys(str(m.get(key)) for m in metas))
    dates = ", ".join(dict.fromkeys(str(m.get("date", ""))[:10] for m in metas))
    return f"{where}, torch {joined('torch')}, triton {joined('triton')}, flashlib {joined('flashlib')}, {dates}"


# ---------------------------------------------------------------- the printed table

#: A status's cell, by the status up to its first colon (else that text's first 5 characters).
_ABBREVIATIONS = {OK: "", OUT_OF_MEMORY: "oom", "forward only": "fwd only", "not found": "absent",
                  "not installed": "absent"}
_LABELS = {"sdpa_flash": "flash", "sdpa_cudnn": "cudnn", "sdpa_efficient": "effic"}


def _cell(row: dict | None, interpreter: bool) -> str:
    if row is None:
        return "-"
    if row["status"] != OK:
        kind = row["status"].split(":")[0]
        return _ABBREVIATIONS.get(kind, kind[:5])
    return f"{row['ms']:.3g}" if interpreter else f"{row['tflops']:.1f}"


def format_table(rows: list[dict], interpreter: bool = runtime.INTERPRET) -> str:
    """The table ``python -m flashlib.bench`` prints: one line per (mode, dtype, D, causal, N), one
    column per impl; then flashlib's ratios, its peak memory at the largest N, and each failure
    reason once."""
    if not rows:
        return "(no results)"
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    index = {(r["impl"], r["mode"], r["dtype"], r["D"], r["causal"], r["N"]): r for r in rows}
    problems = sorted({(MODES.index(r["mode"]), r["mode"], r["dtype"], r["D"], r["causal"], r["N"]) for r in rows})
    unit = "ms (interpreter timings: numpy on the CPU, not a GPU)" if interpreter else "TFLOP/s"
    labels = [_LABELS.get(i, i)[:8] for i in impls]
    lines = [f"{unit}; flash/cudnn/effic = SDPA's backends, c = causal, oom = out of memory",
             f"{'mode':5} {'dtype':5} {'D':>4} {'c':1} {'N':>6} " + " ".join(f"{label:>8}" for label in labels)]
    for _, mode, dtype, d, causal, n in problems:
        cells = [_cell(index.get((i, mode, dtype, d, causal, n)), interpreter) for i in impls]
        lines.append(f"{mode:5} {dtype:5} {d:>4} {'y' if causal else 'n':1} {n:>6} "
                     + " ".join(f"{c:>8}" for c in cells))
    for baseline in _baselines(rows):
        ratios = summary_ratios(rows, baseline)
        if ratios:
            lines.append(f"flashlib / {baseline} (speed ratio, min / median / max over D, causal, N):")
            lines += [f"  {mode:5} {dtype}: {lo:.2f} / {mid:.2f} / {hi:.2f}"
                      for (mode, dtype), (lo, mid, hi) in ratios.items()]
    memory = memory_comparison(rows)
    if memory:
        lines.append("peak memory above the inputs at the largest N, MiB (mode dtype D causal N: impl=MiB):")
        for key, by_impl in memory.items():
            cells = " ".join(f"{i}={m / 2 ** 20:.3g}" if m is not None else f"{i}=-" for i, m in by_impl.items())
            lines.append(f"  {' '.join(str(x) for x in key)}: {cells}")
    reasons = sorted({r["status"] for r in rows if r["status"] not in (OK, OUT_OF_MEMORY)})
    lines += [f"  ({reason})" for reason in reasons[:10]]
    if interpreter:
        lines.append("Note: Triton *interpreter* timings on the CPU (numpy), not GPU timings.")
    return "\n".join(lines)


# ---------------------------------------------------------------- markdown

def _fmt_ratio(triple, count) -> str:
    return "-" if triple is None else f"{triple[0]:.2f} / {triple[1]:.2f} / {triple[2]:.2f} ({count})"


def _run_ceilings(rows, metas, sources) -> dict:
    """(impl, problem) -> the ceilings measured in the run that timed that row: the file that supplied it
    (``sources``, one file a problem) or, without sources, ``metas[0]``'s."""
    if sources:
        return {(r["impl"], *_problem(r)): meta.get("ceilings") for _, meta, file_rows in sources for r in file_rows}
    ceilings = metas[0].get("ceilings") if metas else None
    return {(r["impl"], *_problem(r)): ceilings for r in rows}


def _io_lines(rows, run_ceilings: dict) -> list[str]:
    """Predicted HBM bytes against what the measured time moves at the measured bandwidth, at the ceilings of the
    run that timed each row (:func:`_run_ceilings`; a row from a run without them gets no line)."""
    lines, ceilings = [], set()
    for impl in ("naive", "flashlib"):
        for mode in MODES:
            candidates = _ok(rows, impl=impl, mode=mode, causal=False)
            if not candidates:
                continue
            d = max(r["D"] for r in candidates)
            r = max((r for r in candidates if r["D"] == d), key=lambda r: (r["N"], r["dtype"] == "fp16"))
            measured = run_ceilings.get((r["impl"], *_problem(r))) or {}
            bw, peak = measured.get("hbm_gb_per_s"), measured.get("matmul_tflops")
            if not bw:
                continue
            ceilings.add((round(bw), round(peak) if peak else None))
            a = io_analysis(r, bw, peak)
            bound = "-" if a["bound_ms"] is None else f"{a['bound_ms']:.3g} ({a['bound']})"
            lines.append(f"| {impl} | {mode} | {r['dtype']} | {r['D']} | {r['N']} | {r['ms']:.3g} | "
                         f"{a['predicted_bytes'] / 1e9:.3g} | {a['implied_bytes'] / 1e9:.3g} | "
                         f"{a['predicted_fraction']:.0%} | {a['intensity']:.0f} | {bound} |")
    if not lines:
        return []
    at = "; ".join(f"{bw} GB/s copy bandwidth" + (f" and {peak} TFLOP/s matmul" if peak else "")
                   for bw, peak in sorted(ceilings, key=str))
    head = [f"HBM traffic (`flashlib.io_model`) against time, at the ceilings measured in the same run ({at}), not "
            "causal, largest N:", "",
            "| impl | mode | dtype | D | N | ms | predicted GB | GB movable in that time | predicted / movable "
            "| FLOP/byte | roofline bound, ms |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    note = ("The model charges every re-read of K and V (once per block of queries) to HBM. A ratio above "
            "100% means the kernel ran faster than those bytes could cross HBM: the re-reads came from the "
            "L2 cache, and the 'memory' bound is the model's, not the kernel's. A ratio far below 100% means "
            "time went to something other than HBM traffic.")
    return head + lines + ["", note, ""]


def _when(meta: dict) -> str:
    """'2026-11-24T09:13:28+00:00' -> '2026-11-24 09:13 UTC' (the dates results_meta writes are UTC)."""
    date = str(meta.get("date", ""))
    return f"{date[:10]} {date[11:16]} UTC" if len(date) >= 16 and date.endswith("+00:00") else date or "no date"


def _source_lines(sources, dtype: str) -> list[str]:
    """One bullet per file that supplied measured rows of ``dtype``: its implementations, date, command, path."""
    lines = []
    for path, meta, file_rows in sources:
        impls = _present(_ok(file_rows, dtype=dtype), "impl", list(COLORS))
        if impls:
            command = f" by `{meta['command']}`" if meta.get("command") else ""
            lines.append(f"- {', '.join(impls)}: measured {_when(meta)}{command} (`{path}`)")
    return lines


def tflops_lines(rows: list[dict], dtype: str, impl: str = "flashlib", baselines=None,
                 interpreter: bool = False) -> list[str]:
    """Markdown table of one dtype: per (mode, D, causal, N), ``impl``'s TFLOP/s (ms in the
    interpreter), and per baseline its TFLOP/s and ``impl``'s speed ratio to it (baseline time /
    ``impl`` time); then the min / median / max of each ratio per mode, with the point count."""
    baselines = _baselines(rows) if baselines is None else baselines
    same = [r for r in rows if r["dtype"] == dtype]
    index = {(r["impl"], *_problem(r)): r for r in same}
    problems = sorted({_problem(r) for r in same if r["impl"] in (impl, *baselines)},
                      key=lambda p: (MODES.index(p[0]) if p[0] in MODES else 99, p[2], p[3], p[4]))
    unit = "ms" if interpreter else "TFLOP/s"
    lines = [f"| mode | D | causal | N | {impl} {unit} | "
             + " | ".join(f"{b} {unit} | {impl} / {b}" for b in baselines) + " |",
             "| --- | --- | --- | --- | --- | " + " | ".join("--- | ---" for _ in baselines) + " |"]
    for problem in problems:
        mode, _, d, causal, n = problem
        mine = index.get((impl, *problem))
        cells = [_cell(mine, interpreter) or "-"]
        for b in baselines:
            theirs = index.get((b, *problem))
            both = all(r is not None and r["status"] == OK and r["ms"] for r in (mine, theirs))
            cells += [_cell(theirs, interpreter) or "-", f"{theirs['ms'] / mine['ms']:.2f}" if both else "-"]
        lines.append(f"| {mode} | {d} | {'yes' if causal else 'no'} | {n} | " + " | ".join(cells) + " |")
    lines += ["", (f"{impl} / baseline = baseline time / {impl} time (above 1: {impl} faster); "
                   "min / median / max over the points measured (their count):"), ""]
    for b in baselines:
        ratios = {mode: triple for (mode, t), triple in summary_ratios(same, b, impl).items() if t == dtype}
        counts = _ratio_counts(same, b, impl)
        parts = [f"{mode} {_fmt_ratio(triple, counts.get((mode, dtype)))}" for mode, triple in ratios.items()]
        lines.append(f"- {impl} / {b}: " + ("; ".join(parts) if parts else "no point where both ran"))
    return lines


def markdown_table(rows: list[dict], metas: list[dict] | None = None, impl: str = "flashlib",
                   baselines=None, images: dict[str, str] | None = None, sources=None) -> str:
    """Markdown: per dtype, where and when, then :func:`tflops_lines` (TFLOP/s, ratios to each
    baseline, their min / median / max; default baselines: those of BASELINES and the outside ones
    that ran); peak memory at the largest N; the IO model against the measured times (when the
    bandwidth was measured); links to ``images`` {title: path}.

    ``sources``: [(path, meta, rows it contributed)] (:func:`contributions`); when given, each
    dtype's table states, per file that supplied it, the implementations, date, command and path;
    otherwise one line states ``metas``' GPU, versions, dates and first command."""
    metas = metas or []
    baselines = _baselines(rows) if baselines is None else baselines
    interpreter = bool(metas and metas[0].get("interpreter"))
    lines = [] if sources else [f"Measured on **{describe(metas)}**" + (
        f" (`{metas[0]['command']}`)" if metas and metas[0].get("command") else "") + ".", ""]
    if not any(_ok(rows, impl=impl, dtype=t) for t in _present(rows, "dtype")):
        lines += [f"No {impl} row was measured.", ""]
    for dtype in _present(rows, "dtype", ["fp16", "bf16"]):
        if not _ok(rows, impl=impl, dtype=dtype):
            continue
        if sources:
            dtype_metas = [m for _, m, file_rows in sources if _ok(file_rows, dtype=dtype)]
            lines += [f"**{dtype}**, measured on **{describe(dtype_metas)}**:", "", *_source_lines(sources, dtype), ""]
        else:
            lines += [f"**{dtype}**:", ""]
        lines += tflops_lines(rows, dtype, impl, baselines, interpreter) + [""]
    memory = memory_comparison(rows)
    if memory:
        impls = list(next(iter(memory.values())))
        base = baselines[0] if baselines else impl
        lines += ["Peak memory allocated during one call above the inputs (MiB), not causal, at the largest N:", "",
                  "| mode | dtype | D | N | " + " | ".join(impls) + f" | {impl} / {base} |",
                  "| --- | --- | --- | --- | " + " | ".join("---" for _ in impls) + " | --- |"]
        for (mode, dtype, d, _, n), by_impl in memory.items():
            cells = ["-" if by_impl[i] is None else f"{by_impl[i] / _MIB:.4g}" for i in impls]
            mine, theirs = by_impl.get(impl), by_impl.get(base)
            ratio = f"{mine / theirs:.2f}" if mine is not None and theirs else "-"
            lines.append(f"| {mode} | {dtype} | {d} | {n} | " + " | ".join(cells) + f" | {ratio} |")
        lines.append("")
    else:
        lines += ["No memory measurements in these results.", ""]
    lines += _io_lines(rows, _run_ceilings(rows, metas, sources))
    if images:
        lines.append("Plots: " + ", ".join(f"[{title}]({path})" for title, path in images.items()) + ".")
    return "\n".join(lines).rstrip("\n") + "\n"


def replace_section(text: str, content: str, start: str = START, end: str = END) -> str:
    """``text`` with what lies between the ``start`` and ``end`` marker lines replaced by ``content``.

    Everything outside the markers is kept byte for byte; applying it twice gives the same text.
    """
    i, j = text.find(start), text.find(end)
    if i < 0 or j < 0 or j < i:
        raise ValueError(f"text must contain {start!r} followed by {end!r} (found start at {i}, end at {j})")
    return text[:i + len(start)] + "\n" + content.strip("\n") + "\n" + text[j:]


def update_readme(path, content: str) -> bool:
    """Replace the results section of the README at ``path``; True if the file changed."""
    path = Path(path)
    old = path.read_text(encoding="utf-8")
    new = replace_section(old, content)
    if new != old:
        path.write_text(new, encoding="utf-8")
    return new != old


# ---------------------------------------------------------------- plots

def _pyplot():
    import matplotlib.pyplot as plt

    return plt


def _figure(nrows: int, ncols: int, width: float = 4.0, height: float = 3.2):
    plt = _pyplot()
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False,
                             layout="constrained")
    plt.close(fig)  # shown once, when returned to a notebook
    return fig, axes


def _log2_x(ax, ns) -> None:
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(ns))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x / 1024:g}k" if x >= 1024 else f"{x:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("N (sequence length)")
    ax.grid(True, alpha=0.3)


def _title(fig, text: str, metas) -> None:
    fig.suptitle(f"{text}\n{describe(metas or [])}", fontsize=10)


def _empty(fig, ax, message: str):
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()
    return fig


def plot_tflops(rows: list[dict], dtype: str | None = None, metas: list[dict] | None = None):
    """TFLOP/s versus N: one panel per (mode, D, causal), one line per implementation."""
    dtype = dtype or (_present(rows, "dtype") or [None])[0]
    ok = _ok(rows, dtype=dtype)
    if not ok:
        fig, axes = _figure(1, 1)
        return _empty(fig, axes[0, 0], f"no successful rows for dtype {dtype}")
    modes = _present(ok, "mode", list(MODES))
    columns = sorted({(r["D"], r["causal"]) for r in ok})
    fig, axes = _figure(len(modes), len(columns))
    interpreter = bool(metas and metas[0].get("interpreter"))
    for i, mode in enumerate(modes):
        for j, (d, causal) in enumerate(columns):
            ax = axes[i, j]
            panel = [r for r in ok if (r["mode"], r["D"], r["causal"]) == (mode, d, causal)]
            for impl in _present(panel, "impl", list(COLORS)):
                pts = sorted((r["N"], r["ms"] if interpreter else r["tflops"]) for r in panel if r["impl"] == impl)
                ax.plot(*zip(*pts), marker="o", ms=3, color=COLORS.get(impl), label=impl,
                        lw=2.2 if impl == "flashlib" else 1.2)
            _log2_x(ax, {r["N"] for r in panel} or {1})
            ax.set_title(f"{mode}, D={d}, {'causal' if causal else 'not causal'}", fontsize=9)
            ax.set_ylabel("ms (interpreter)" if interpreter else "TFLOP/s")
            if interpreter:
                ax.set_yscale("log")
    axes[0, 0].legend(fontsize=8)
    _title(fig, f"attention {dtype}: throughput versus N (FLOPs 4BHN²D fwd, halved if causal; bwd 2.5x, "
                f"train 3.5x)", metas)
    return fig


def plot_speedup(rows: list[dict], baseline: str = "sdpa_flash", impl: str = "flashlib",
                 metas: list[dict] | None = None):
    """``impl``'s speedup over ``baseline`` (baseline time / impl time) versus N: one panel per mode,
    one line per (dtype, D, causal); the dashed line is parity."""
    times = {(r["impl"], *_problem(r)): r["ms"] for r in _ok(rows)}
    pairs = [(p, times[(baseline, *p)] / ms) for (name, *p), ms in times.items()
             if name == impl and (baseline, *p) in times]
    if not pairs:
        fig, axes = _figure(1, 1)
        return _empty(fig, axes[0, 0], f"no problem where {impl} and {baseline} both ran")
    modes = [m for m in MODES if any(p[0] == m for p, _ in pairs)]
    fig, axes = _figure(1, len(modes), width=4.6)
    combos = sorted({(p[1], p[2], p[3]) for p, _ in pairs})
    for j, mode in enumerate(modes):
        ax = axes[0, j]
        for k, (dtype, d, causal) in enumerate(combos):
            pts = sorted((p[4], s) for p, s in pairs if (p[0], p[1], p[2], p[3]) == (mode, dtype, d, causal))
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, color=f"C{k % 10}", ls="--" if causal else "-",
                        label=f"{dtype} D={d}{' causal' if causal else ''}")
        ax.axhline(1.0, color="black", lw=0.8, ls=":")
        _log2_x(ax, {p[4] for p, _ in pairs})
        ax.set_title(mode, fontsize=9)
        ax.set_ylabel(f"{baseline} time / {impl} time")
    axes[0, 0].legend(fontsize=7)
    _title(fig, f"{impl} speedup over {baseline} (above 1: {impl} faster)", metas)
    return fig


def plot_memory(rows: list[dict], dtype: str | None = None, causal: bool = False,
                metas: list[dict] | None = None):
    """Peak memory above the inputs versus N (log scale): one panel per mode, colour = implementation,
    line style = D. Missing points: out of memory, unsupported, or not measured."""
    dtype = dtype or (_present(rows, "dtype") or [None])[0]
    ok = [r for r in _ok(rows, dtype=dtype, causal=causal) if r["peak_mem_bytes"] is not None]
    if not ok:
        fig, axes = _figure(1, 1)
        return _empty(fig, axes[0, 0], f"no memory measurements for dtype {dtype}")
    modes = _present(ok, "mode", list(MODES))
    fig, axes = _figure(1, len(modes), width=4.6)
    styles = ["-", "--", ":", "-."]
    dims = sorted({r["D"] for r in ok})
    for j, mode in enumerate(modes):
        ax = axes[0, j]
        for impl in _present(ok, "impl", list(COLORS)):
            for d in dims:
                pts = sorted((r["N"], max(r["peak_mem_bytes"], 1) / _MIB) for r in ok
                             if (r["mode"], r["impl"], r["D"]) == (mode, impl, d))
                if pts:
                    ax.plot(*zip(*pts), marker="o", ms=3, color=COLORS.get(impl),
                            ls=styles[dims.index(d) % len(styles)], label=f"{impl} D={d}")
        ax.set_yscale("log")
        _log2_x(ax, {r["N"] for r in ok})
        ax.set_title(mode, fontsize=9)
        ax.set_ylabel("peak MiB above inputs")
    axes[0, 0].legend(fontsize=7)
    _title(fig, f"attention {dtype}{' causal' if causal else ''}: peak memory of one call", metas)
    return fig


# ---------------------------------------------------------------- the command

def sources_by_gpu(files) -> dict[str, list[tuple[Path, dict, list[dict]]]]:
    """{gpu slug: [(path, meta, rows it contributes)]}: the files of each GPU newest first by the
    date inside each (stable: files of one date keep the given order), cut by :func:`contributions`."""
    loaded: dict[str, list] = {}
    for path in files:
        meta, rows = load_results(path)
        name = meta.get("gpu", {}).get("name", "unknown")
        slug = "interpreter" if meta.get("interpreter") else gpu_slug(name)
        loaded.setdefault(slug, []).append((Path(path), meta, rows))
    return {slug: contributions(sorted(results, key=lambda x: str(x[1].get("date", "")), reverse=True))
            for slug, results in loaded.items()}


def group_by_gpu(files) -> dict[str, tuple[list[dict], list[dict]]]:
    """{gpu slug: (metas, merged rows)} from results files, newest first by the date inside each."""
    return {slug: ([meta for _, meta, _ in used], [r for *_, rows in used for r in rows])
            for slug, used in sources_by_gpu(files).items()}


def readme_grids(directory=None) -> list[Path]:
    """The files of :data:`README_GRIDS` in ``directory`` (default benchmarks/results); a missing one is
    an error, not a smaller table."""
    paths = [Path(RESULTS_DIR if directory is None else directory) / name for name in README_GRIDS]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"flashlib.report.README_GRIDS names files that are not there: {', '.join(missing)}")
    return paths


def _relative(path: Path, start: Path) -> str:
    return Path(os.path.relpath(path, start)).as_posix()


def readme_section(files, readme_dir, images: dict[str, dict[str, str]] | None = None) -> str:
    """What goes between the README's markers: a line naming the command and ``files``, then a
    :func:`markdown_table` per GPU, with paths relative to ``readme_dir``; ``images``:
    {gpu slug: {title: path}}."""
    base = Path(readme_dir).resolve()
    names = ", ".join(_relative(Path(f).resolve(), base) for f in files)
    parts = [(f"<!-- generated by python -m flashlib.report (`make report`: the files of "
              f"flashlib.report.README_GRIDS) from {names}; edit those, not this -->")]
    for slug, used in sources_by_gpu(files).items():
        metas, rows = [m for _, m, _ in used], [r for *_, file_rows in used for r in file_rows]
        parts.append(markdown_table(rows, metas, images=(images or {}).get(slug),
                                    sources=[(_relative(p.resolve(), base), m, r) for p, m, r in used]))
    return "\n".join(parts)


def write_report(files, out_dir=RESULTS_DIR, readme=None) -> list[Path]:
    """Plots and a markdown file per GPU in ``out_dir`` (none if it is None); the README's section if
    ``readme``. Returns the paths written."""
    written, images = [], {}
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        for slug, used in sources_by_gpu(files).items():
            metas, rows = [m for _, m, _ in used], [r for *_, file_rows in used for r in file_rows]
            figures = {}
            for dtype in _present(rows, "dtype"):
                figures[f"TFLOP/s {dtype}"] = (f"attention_{slug}_tflops_{dtype}.png",
                                               plot_tflops(rows, dtype, metas))
            for baseline in _present(rows, "impl", list(COLORS)):
                if baseline != "flashlib" and summary_ratios(rows, baseline):
                    figures[f"speedup vs {baseline}"] = (f"attention_{slug}_speedup_vs_{baseline}.png",
                                                         plot_speedup(rows, baseline, metas=metas))
            for dtype in _present(rows, "dtype"):
                if any(r["peak_mem_bytes"] is not None for r in rows if r["dtype"] == dtype):
                    figures[f"memory {dtype}"] = (f"attention_{slug}_memory_{dtype}.png",
                                                  plot_memory(rows, dtype, metas=metas))
            for name, fig in figures.values():
                fig.savefig(out_dir / name, dpi=110)
                written.append(out_dir / name)
            md = out_dir / f"attention_{slug}.md"
            md.write_text(markdown_table(rows, metas, images={t: n for t, (n, _) in figures.items()},
                                         sources=[(p.name, m, r) for p, m, r in used]), encoding="utf-8")
            written.append(md)
            images[slug] = {t: out_dir.resolve() / n for t, (n, _) in figures.items()}
    if readme is not None:
        base = Path(readme).resolve().parent
        links = {slug: {t: _relative(path, base) for t, path in by_title.items()} for slug, by_title in images.items()}
        update_readme(readme, readme_section(files, base, links))
        written.append(Path(readme))
    return written


def main(argv: list[str] | None = None) -> list[Path]:
    """``python -m flashlib.report``: plots, markdown and the README section from results files."""
    import matplotlib

    matplotlib.use("Agg")
    parser = argparse.ArgumentParser(prog="python -m flashlib.report", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="results JSON files of flashlib.bench's format (default: those "
                                                 "of README_GRIDS, for the README only: no plots)")
    parser.add_argument("--out-dir", help="where plots and markdown go (default benchmarks/results when FILES are "
                                          "given; none otherwise)")
    parser.add_argument("--readme", help="README whose results section to regenerate (default: the repository's "
                                         "README.md when FILES are not given)")
    args = parser.parse_args(argv)
    files = [Path(f) for f in args.files]
    out_dir = args.out_dir or (RESULTS_DIR if files else None)
    if not files:
        try:
            files = readme_grids()
        except FileNotFoundError as exc:
            parser.error(str(exc))
    readme = args.readme or (README if not args.files else None)
    for path in write_report(files, out_dir, readme):
        print(f"wrote {path}")
    return files


if __name__ == "__main__":
    main()
