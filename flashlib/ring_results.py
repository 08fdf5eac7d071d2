"""Stored measurements of ring attention across GPUs: read, tabulate, plot.

``benchmarks/ring_scaling.py`` runs on a machine of several GPUs and writes one JSON file
(``benchmarks/results/ring_scaling_*.json``): the correctness check on NCCL, one GPU's
``flash_attention`` on the whole sequence against :func:`flashlib.distributed.ring_attention` over
W GPUs, a profile of the ring's communication, and PyTorch's ``context_parallel`` on the same shapes.
Notebook 10 and the README show those numbers through this module, where no such machine is present.
Every ratio here is computed from the stored times, not read from the file.
"""
from __future__ import annotations

import json
from pathlib import Path

from .bench_results import RESULTS_DIR

#: The README's section of ring results lies between these markers (:func:`readme_section`).
README_START, README_END = "<!-- ring:start -->", "<!-- ring:end -->"
#: The files the README's section is made from, in its order: two H200s, then four H100s.
README_FILES = ("ring_scaling_2x_nvidia_h200_tuned.json", "ring_scaling_4x_nvidia_h100_80gb_hbm3_tuned.json")
_SECTIONS = ("meta", "check", "scaling", "overlap", "context_parallel")


def stored_ring_results(directory=None) -> list[Path]:
    """The stored runs of ``benchmarks/ring_scaling.py``, oldest name first."""
    return sorted(Path(RESULTS_DIR if directory is None else directory).glob("ring_scaling_*.json"))


def load_ring_results(path) -> dict:
    """One stored run; a ValueError naming the file if a section is missing."""
    with open(path) as f:
        result = json.load(f)
    missing = [key for key in _SECTIONS if key not in result]
    if missing:
        raise ValueError(f"{path}: not a ring_scaling.py result, it lacks {missing}")
    return result


def _ring_s(row: dict, what: str) -> float:
    return max(row["ring"][f"{what}_s"])  # the slowest rank sets the ring's time


def scaling_rows(result: dict) -> list[dict]:
    """Per (N, mask): seconds of one GPU on the whole sequence (rank 0's) and of the ring (the slowest
    rank), forward and forward+backward, the speed-up, the scaling efficiency (speed-up / W) and the
    tokens per second of forward+backward."""
    rows = []
    for row in result["scaling"]:
        world, tokens = row["world_size"], row["B"] * row["N"]
        out = dict(N=row["N"], mask=row["mask"], scheme=row["scheme"], world_size=world)
        for what in ("fwd", "fwd_bwd"):
            single, ring = row["single"][f"{what}_s"][0], _ring_s(row, what)
            out[what] = dict(single_s=single, ring_s=ring, speedup=single / ring, efficiency=single / ring / world)
        out["single_tokens_per_s"] = tokens / out["fwd_bwd"]["single_s"]
        out["ring_tokens_per_s"] = tokens / out["fwd_bwd"]["ring_s"]
        out["peak_bytes"] = dict(single=row["single"].get("peak_bytes"), ring=row["ring"].get("peak_bytes"))
        rows.append(out)
    return sorted(rows, key=lambda r: (r["mask"], r["N"]))


def context_parallel_rows(result: dict) -> list[dict]:
    """Per (N, mask, SDPA backend) that ran: context_parallel's forward+backward seconds, the flashlib
    ring's at the same point, and how many times faster the ring is (below 1: slower)."""
    ring = {(r["N"], r["mask"]): r["fwd_bwd"]["ring_s"] for r in scaling_rows(result)}
    rows = []
    for row in result["context_parallel"]:
        if "fwd_bwd_s" not in row or (row["N"], row["mask"]) not in ring:
            continue
        ours = ring[(row["N"], row["mask"])]
        rows.append(dict(N=row["N"], mask=row["mask"], backend=row["backend"], context_parallel_s=row["fwd_bwd_s"],
                         ring_s=ours, ring_speedup=row["fwd_bwd_s"] / ours))
    return sorted(rows, key=lambda r: (r["mask"], r["N"], r["backend"]))


def check_summary(result: dict) -> dict:
    """How many of the correctness cases passed, and the largest relative error of the ring against one
    GPU's flash_attention and against float64, per dtype."""
    by_dtype = {}
    for row in result["check"]:
        entry = by_dtype.setdefault(row["dtype"], dict(cases=0, passed=0, vs_flash_attention=0.0, vs_float64=0.0,
                                                       tolerance=row["tolerance"]))
        entry["cases"] += 1
        entry["passed"] += bool(row["passed"])
        entry["vs_flash_attention"] = max(entry["vs_flash_attention"], *row["ring_vs_flash_attention"].values())
        entry["vs_float64"] = max(entry["vs_float64"], *row["ring_vs_float64"].values())
    return by_dtype


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f}"


def markdown_scaling(result: dict) -> str:
    """The scaling rows as a Markdown table."""
    world = result["meta"]["world_size"]
    lines = [f"| N | mask (cut) | 1 GPU fwd / fwd+bwd (ms) | ring on {world} fwd / fwd+bwd (ms) | speed-up fwd / fwd+bwd "
             f"| efficiency fwd+bwd | tokens/s fwd+bwd, 1 GPU / ring |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in scaling_rows(result):
        f, t = r["fwd"], r["fwd_bwd"]
        lines.append(f"| {r['N'] // 1024}k | {r['mask']} ({r['scheme']}) | {_ms(f['single_s'])} / {_ms(t['single_s'])} "
                     f"| {_ms(f['ring_s'])} / {_ms(t['ring_s'])} | {f['speedup']:.2f}x / {t['speedup']:.2f}x "
                     f"| {100 * t['efficiency']:.0f}% | {r['single_tokens_per_s']:,.0f} / {r['ring_tokens_per_s']:,.0f} |")
    return "\n".join(lines)


def markdown_context_parallel(result: dict) -> str:
    """context_parallel against the ring as a Markdown table."""
    lines = ["| N | mask | SDPA backend under context_parallel | context_parallel fwd+bwd (ms) "
             "| flashlib ring fwd+bwd (ms) | ring's speed |", "| --- | --- | --- | --- | --- | --- |"]
    for r in context_parallel_rows(result):
        lines.append(f"| {r['N'] // 1024}k | {r['mask']} | {r['backend']} | {_ms(r['context_parallel_s'])} "
                     f"| {_ms(r['ring_s'])} | {r['ring_speedup']:.2f}x |")
    return "\n".join(lines)


def markdown_overlap(result: dict) -> str:
    """The profiled communication per (mask, rank) as a Markdown table: NCCL kernel time, the share of it
    that ran under a compute kernel, and what was left exposed, as a share of the step."""
    lines = ["| N | mask | rank | NCCL kernels (ms) | under compute | exposed (ms) | share of the step |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in result["overlap"]:
        if "nccl_us" not in r:
            continue
        lines.append(f"| {r['N'] // 1024}k | {r['mask']} | {r['rank']} | {r['nccl_us'] / 1e3:,.1f} "
                     f"| {100 * r['hidden_fraction']:.0f}% | {r['exposed_us'] / 1e3:,.1f} "
                     f"| {100 * r['exposed_fraction_of_step']:.1f}% of {r['step_us'] / 1e3:,.1f} ms |")
    return "\n".join(lines)


def _configs(configs) -> str:
    """The kernel configs of a run: "autotuned", the ``--configs`` text (newer runs) or one config per kernel
    (older runs)."""
    if configs == "autotuned":
        return "autotuned on every rank for its own shapes"
    if isinstance(configs, str):
        return f"as `--configs {configs}` (BLOCK_M x BLOCK_N / stages / warps; several: tuned among them)"
    pinned = ", ".join(f"{kernel} {bm}x{bn}/{stages}/{warps}" for kernel, (bm, bn, stages, warps) in configs.items())
    return f"pinned (BLOCK_M x BLOCK_N / stages / warps): {pinned}"


def describe(result: dict) -> str:
    meta = result["meta"]
    shape = result["scaling"][0] if result["scaling"] else {}
    return (f"{meta['world_size']} x {meta['gpu']}, {meta['backend']}, torch {meta['torch']}, triton {meta['triton']}, "
            f"{meta['date']}; B = {shape.get('B')}, H = {shape.get('H')}, D = {shape.get('D')}, "
            f"{shape.get('dtype')}; kernel configs {_configs(meta['configs'])}")


def _span(values) -> str:
    return f"{min(values):.2f}x" if max(values) - min(values) < 0.005 else f"{min(values):.2f}-{max(values):.2f}x"


def headline(result: dict, long_from: int = 131072) -> str:
    """One sentence: the ring's forward+backward speed-up over one GPU at N >= ``long_from``, and how fast the
    ring runs against context_parallel per SDPA backend, over every stored point."""
    world = result["meta"]["world_size"]
    long = [r["fwd_bwd"]["speedup"] for r in scaling_rows(result) if r["N"] >= long_from]
    parts = []
    if long:
        parts.append(f"At N >= {long_from // 1024}k the ring on {world} GPUs runs forward+backward {_span(long)} "
                     f"as fast as one GPU (scaling efficiency {100 * min(long) / world:.0f}% or more)")
    cp = context_parallel_rows(result)
    for backend in sorted({r["backend"] for r in cp}):
        ratios = [r["ring_speedup"] for r in cp if r["backend"] == backend]
        parts.append(f"against context_parallel with SDPA's {backend} inside it runs {_span(ratios)} as fast")
    return "; ".join(parts) + "."


def run_section(path) -> str:
    """One stored run as the README shows it: how it was measured, the headline, the check, both tables."""
    path = Path(path)
    result = load_ring_results(path)
    checks = check_summary(result)
    check_line = "; ".join(f"{dtype}: {c['passed']} of {c['cases']} cases within {c['tolerance']:g}, largest error "
                           f"{c['vs_flash_attention']:.1e} against one GPU, {c['vs_float64']:.1e} against float64"
                           for dtype, c in checks.items())
    return "\n".join([
        f"Measured with `benchmarks/ring_scaling.py` (`benchmarks/results/{path.name}`: {describe(result)}).", "",
        headline(result), "", f"Correctness on NCCL (every rank's O, dQ, dK, dV): {check_line}.", "",
        markdown_scaling(result), "", markdown_context_parallel(result)])


def readme_section(paths=None) -> str:
    """What goes between the README's ring markers: generated from the stored runs (default
    :data:`README_FILES`), never typed."""
    paths = [RESULTS_DIR / name for name in README_FILES] if paths is None else [Path(p) for p in paths]
    names = ", ".join(f"benchmarks/results/{p.name}" for p in paths)
    return "\n\n".join([f"<!-- generated by python -m flashlib.ring_results --readme README.md from {names} -->",
                        *(run_section(p) for p in paths)])


def plot_ring_scaling(result: dict):
    """Two panels against N: the ring's speed-up over one GPU (forward+backward solid, forward dashed; the
    ideal is W), and how fast the ring runs against context_parallel per SDPA backend (1: level). The figure
    is closed (shown once when a notebook cell returns it)."""
    import matplotlib.pyplot as plt

    rows, cp = scaling_rows(result), context_parallel_rows(result)
    world = result["meta"]["world_size"]
    masks = sorted({r["mask"] for r in rows})
    ns = sorted({r["N"] for r in rows})
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.4, 3.8))
    for color, mask in zip(("C0", "C1"), masks):
        mine = [r for r in rows if r["mask"] == mask]
        label = f"{mask} ({mine[0]['scheme']})"
        left.plot([r["N"] for r in mine], [r["fwd_bwd"]["speedup"] for r in mine], "o-", color=color,
                  label=f"{label}, fwd+bwd")
        left.plot([r["N"] for r in mine], [r["fwd"]["speedup"] for r in mine], "o--", color=color, alpha=0.6,
                  label=f"{label}, fwd")
        for marker, backend in zip(("s", "^"), sorted({r["backend"] for r in cp})):
            points = [r for r in cp if r["mask"] == mask and r["backend"] == backend]
            right.plot([r["N"] for r in points], [r["ring_speedup"] for r in points], marker + "-", color=color,
                       label=f"{mask}, against SDPA {backend.split('_')[0].lower()}")
    left.axhline(world, color="gray", linestyle=":", label=f"ideal: {world}x")
    right.axhline(1.0, color="gray", linestyle=":")
    left.set_ylim(0, world * 1.15)
    right.set_ylim(0, max([1.5] + [r["ring_speedup"] * 1.15 for r in cp]))
    for ax, title, ylabel in ((left, f"ring_attention on {world} GPUs against flash_attention on 1", "speed-up"),
                              (right, "ring_attention against context_parallel (fwd+bwd)", "times as fast")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ns, [f"{n // 1024}k" for n in ns])
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(describe(result).split(";")[0], fontsize=9)
    fig.tight_layout()
    plt.close(fig)
    return fig


def main(argv=None) -> None:
    import argparse

    from .report import replace_section

    parser = argparse.ArgumentParser(description="Print (or write into a README) the stored ring-attention results.")
    parser.add_argument("--readme", help="replace this README's section between the ring markers")
    parser.add_argument("--file", nargs="+", help=f"stored runs (default benchmarks/results/{', '.join(README_FILES)})")
    args = parser.parse_args(argv)
    section = readme_section(args.file)
    if args.readme:
        text = Path(args.readme).read_text()
        Path(args.readme).write_text(replace_section(text, section, README_START, README_END))
    else:
        print(section)


if __name__ == "__main__":
    main()
