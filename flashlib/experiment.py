"""The block-size experiment: how fast is the tiled matmul for each (BLOCK_M, BLOCK_N)?

Tile size is the main knob of a tiled kernel. Bigger tiles reuse each loaded
element more often (higher arithmetic intensity) but need more registers and
shared memory and leave fewer programs to fill the GPU. This module measures
``matmul_kernel`` over a grid of (BLOCK_M, BLOCK_N) at a fixed BLOCK_K, checks
every result against a float64 product (a wrong result is never reported as
fast), and draws the grid as a heat map.

``python -m flashlib.experiment`` (``make experiment``) runs it. On a GPU the
PNG and CSV go to ``benchmarks/results/`` (relative to the working directory),
tagged with the GPU, versions and date. In Triton's interpreter the timings
measure numpy, not a GPU, so results are only printed and saved to a temporary
file (or ``--out``), and every figure says "interpreter timings".
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import math
import re
import tempfile
from pathlib import Path

import torch
import triton

from . import runtime
from .timing import matmul_tflops, time_ms
from .kernels.matmul import launch_matmul, matmul_kernel
from .validation import relative_error, tolerance

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
#: The smallest block tl.dot accepts along any dimension.
MIN_BLOCK = 16
OK = "ok"
_CSV_FIELDS = ["block_m", "block_n", "block_k", "ms", "tflops", "status",
               "M", "N", "K", "dtype", "device", "interpreter", "torch", "triton", "date"]


@dataclasses.dataclass(frozen=True)
class BlockSizeRun:
    """One cell of the grid: time and throughput, or why there are none (``status``)."""

    block_m: int
    block_n: int
    block_k: int
    ms: float = math.nan
    tflops: float = math.nan
    status: str = OK

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclasses.dataclass
class BlockSizeResults:
    """The whole grid, with what was measured where."""

    m: int
    n: int
    k: int
    dtype: str
    block_sizes: list[int]
    runs: list[BlockSizeRun]
    device: str
    interpreter: bool
    torch_version: str = torch.__version__
    triton_version: str = ""
    date: str = ""

    def run(self, block_m: int, block_n: int) -> BlockSizeRun:
        """The cell for (block_m, block_n)."""
        for r in self.runs:
            if (r.block_m, r.block_n) == (block_m, block_n):
                return r
        raise KeyError(f"no run for block_m={block_m}, block_n={block_n}; block sizes are {self.block_sizes}")

    def grid(self, metric: str = "tflops") -> list[list[float]]:
        """Rows block_m, columns block_n (both in ``block_sizes`` order); NaN where invalid."""
        if metric not in ("ms", "tflops"):
            raise ValueError(f"metric must be 'ms' or 'tflops', got {metric!r}")
        return [[getattr(self.run(bm, bn), metric) for bn in self.block_sizes] for bm in self.block_sizes]

    def best(self) -> BlockSizeRun | None:
        """The fastest valid cell (None if none ran)."""
        valid = [r for r in self.runs if r.ok]
        return min(valid, key=lambda r: r.ms) if valid else None

    def table(self) -> str:
        """The grid as text: TFLOP/s (MFLOP/s in the interpreter) per cell, reasons for invalid cells."""
        scale, unit = _unit(self)
        width = 9
        lines = [f"{self.m}x{self.n}x{self.k} {self.dtype}, BLOCK_K={self.runs[0].block_k}, {self.device}",
                 f"{unit} (rows BLOCK_M, columns BLOCK_N; '-' = invalid, see below)",
                 "BM \\ BN " + "".join(f"{bn:>{width}}" for bn in self.block_sizes)]
        for bm in self.block_sizes:
            cells = [self.run(bm, bn) for bn in self.block_sizes]
            lines.append(f"{bm:>7} " + "".join(
                f"{r.tflops * scale:>{width}.3g}" if r.ok else f"{'-':>{width}}" for r in cells))
        reasons = sorted({r.status for r in self.runs if not r.ok})
        lines += [f"  - {reason}" for reason in reasons]
        best = self.best()
        if best is not None:
            lines.append(f"best: BLOCK_M={best.block_m}, BLOCK_N={best.block_n}: "
                         f"{best.ms:.4g} ms, {best.tflops * scale:.3g} {unit}")
        if self.interpreter:
            lines.append("(interpreter timings: numpy on the CPU, not a GPU kernel)")
        return "\n".join(lines)

    def to_csv(self, path) -> Path:
        """Write one row per cell, each carrying the problem, device, versions and date."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = dict(M=self.m, N=self.n, K=self.k, dtype=self.dtype, device=self.device,
                    interpreter=int(self.interpreter), torch=self.torch_version,
                    triton=self.triton_version, date=self.date)
        with path.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=_CSV_FIELDS)
            writer.writeheader()
            for r in self.runs:
                writer.writerow({**dataclasses.asdict(r), **meta})
        return path

    @classmethod
    def from_csv(cls, path) -> "BlockSizeResults":
        """Read back what :meth:`to_csv` wrote (for showing stored GPU results)."""
        with Path(path).open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        if not rows:
            raise ValueError(f"{path}: no rows")
        runs = [BlockSizeRun(int(r["block_m"]), int(r["block_n"]), int(r["block_k"]),
                             float(r["ms"]), float(r["tflops"]), r["status"]) for r in rows]
        first = rows[0]
        sizes = sorted({r.block_m for r in runs} | {r.block_n for r in runs})
        return cls(int(first["M"]), int(first["N"]), int(first["K"]), first["dtype"], sizes, runs,
                   first["device"], bool(int(first["interpreter"])), first["torch"], first["triton"],
                   first["date"])


def _unit(results: BlockSizeResults) -> tuple[float, str]:
    """Scale TFLOP/s to a readable unit: interpreter speeds are a million times lower."""
    return (1e6, "MFLOP/s") if results.interpreter else (1.0, "TFLOP/s")


def default_block_k(dtype: torch.dtype) -> int:
    """BLOCK_K for the experiment: 32 in the interpreter and for fp32, 64 for 16-bit on a GPU."""
    if runtime.INTERPRET or dtype == torch.float32:
        return 32
    return 64


def _invalid_reason(block_m: int, block_n: int, block_k: int) -> str | None:
    for name, value in (("BLOCK_M", block_m), ("BLOCK_N", block_n), ("BLOCK_K", block_k)):
        if value < MIN_BLOCK:
            return f"{name} < {MIN_BLOCK}: tl.dot needs blocks of at least 16"
        if value & (value - 1):
            return f"{name} not a power of two: tl.arange needs one"
    return None


def _check_args(m, n, k, block_sizes, dtype, block_k) -> None:
    for name, value in (("m", m), ("n", n), ("k", k)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
    if not block_sizes or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block_sizes):
        raise ValueError(f"block_sizes must be a non-empty list of positive ints, got {block_sizes!r}")
    if len(set(block_sizes)) != len(block_sizes):
        raise ValueError(f"block_sizes must not repeat a size, got {block_sizes!r}")
    if dtype not in DTYPES.values():
        raise TypeError(f"dtype must be one of float16, bfloat16, float32, got {dtype!r}")
    if block_k is not None and (not isinstance(block_k, int) or block_k <= 0):
        raise ValueError(f"block_k must be a positive int or None, got {block_k!r}")


def _short(exc: Exception) -> str:
    message = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {message[:80]}"


def run_block_size_experiment(m: int, n: int, k: int, block_sizes, dtype: torch.dtype = torch.float16,
                              block_k: int | None = None, kernel=matmul_kernel,
                              warmup: int = 25, rep: int | None = None, seed: int = 0) -> BlockSizeResults:
    """Time ``kernel`` (``matmul_kernel``'s signature) for every (BLOCK_M, BLOCK_N) in block_sizes².

    Each cell is first run once and compared with the float64 product; a cell
    whose result is wrong, or that fails to compile or launch (e.g. too much
    shared memory), or whose blocks tl.dot cannot take, is kept with the reason
    in ``status`` and no time. ``rep`` defaults to 100 (ms of do_bench) on a GPU
    and 1 call in the interpreter. bfloat16 runs in float32 in the interpreter.
    """
    _check_args(m, n, k, list(block_sizes), dtype, block_k)
    block_sizes = list(block_sizes)
    block_k = block_k or default_block_k(dtype)
    rep = rep if rep is not None else runtime.pick(100, 1)
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen).to(runtime.DEVICE, dtype)
    b = torch.randn(k, n, generator=gen).to(runtime.DEVICE, dtype)
    ref = (a.double() @ b.double()).cpu()
    a_run, b_run = runtime.upcast_for_interpreter(a, b)
    limit = tolerance(dtype)

    runs = []
    for bm in block_sizes:
        for bn in block_sizes:
            reason = _invalid_reason(bm, bn, block_k)
            if reason is None:
                c = torch.zeros(m, n, device=runtime.DEVICE, dtype=a_run.dtype)
                try:
                    launch_matmul(kernel, a_run, b_run, c, bm, bn, block_k)
                    err = relative_error(c.to(dtype), ref)
                    if not err <= limit:
                        reason = f"wrong result: relative error above {limit:.0e}"
                    else:
                        ms = time_ms(lambda: launch_matmul(kernel, a_run, b_run, c, bm, bn, block_k),
                                     warmup=warmup, rep=rep)
                        runs.append(BlockSizeRun(bm, bn, block_k, ms, matmul_tflops(m, n, k, ms)))
                        continue
                except Exception as exc:  # noqa: BLE001 - a failing config is a result, not a crash
                    reason = _short(exc)
            runs.append(BlockSizeRun(bm, bn, block_k, status=reason))

    return BlockSizeResults(
        m, n, k, str(dtype).replace("torch.", ""), block_sizes, runs,
        device="Triton interpreter (CPU)" if runtime.INTERPRET else torch.cuda.get_device_name(),
        interpreter=runtime.INTERPRET, triton_version=triton.__version__,
        date=datetime.date.today().isoformat())


def plot_heatmap(results: BlockSizeResults, ax=None):
    """Figure: throughput per (BLOCK_M, BLOCK_N), best cell outlined, invalid cells crossed."""
    import numpy as np
    import matplotlib.pyplot as plt
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle

    scale, unit = _unit(results)
    values = np.array(results.grid("tflops"), dtype=float) * scale
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 5.2), layout="constrained")
        plt.close(fig)  # shown once, when returned to a notebook
    else:
        fig = ax.figure
    masked = np.ma.masked_invalid(values)
    image = ax.imshow(masked, cmap=colormaps["viridis"].with_extremes(bad="#eeeeee"), origin="upper")
    fig.colorbar(image, ax=ax, label=unit)
    finite = values[np.isfinite(values)]
    middle = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for i, bm in enumerate(results.block_sizes):
        for j, bn in enumerate(results.block_sizes):
            v = values[i, j]
            if np.isfinite(v):
                ax.text(j, i, f"{v:.3g}", ha="center", va="center", fontsize=9,
                        color="white" if v < middle else "black")
            else:
                ax.text(j, i, "×", ha="center", va="center", fontsize=14, color="grey")
    best = results.best()
    if best is not None:
        i, j = results.block_sizes.index(best.block_m), results.block_sizes.index(best.block_n)
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, ec="red", lw=2.5))
    ticks = range(len(results.block_sizes))
    ax.set_xticks(ticks, [str(b) for b in results.block_sizes])
    ax.set_yticks(ticks, [str(b) for b in results.block_sizes])
    ax.set_xlabel("BLOCK_N")
    ax.set_ylabel("BLOCK_M")
    where = "interpreter timings (numpy on the CPU, not a GPU)" if results.interpreter else results.device
    ax.set_title(f"tiled matmul {results.m}x{results.n}x{results.k} {results.dtype}, "
                 f"BLOCK_K={results.runs[0].block_k}\n{where}\n× = invalid or failed, red = fastest",
                 fontsize=10)
    return fig


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def default_output(results: BlockSizeResults) -> Path:
    """benchmarks/results/block_sizes_<gpu>_<dtype>_<MxNxK>.png on a GPU; a temp file in the interpreter."""
    name = f"block_sizes_{_slug(results.device)}_{results.dtype}_{results.m}x{results.n}x{results.k}.png"
    if results.interpreter:
        return Path(tempfile.gettempdir()) / f"flashlib_{name}"
    return Path("benchmarks") / "results" / name


def main(argv: list[str] | None = None) -> BlockSizeResults:
    """``python -m flashlib.experiment``: run the grid, print it, save a PNG heat map and a CSV."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", nargs=3, type=int, metavar=("M", "N", "K"),
                        help="problem size (default: runtime.sizes('matmul'))")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="default fp16 on a GPU, fp32 in the interpreter")
    parser.add_argument("--block-sizes", nargs="+", type=int,
                        help="BLOCK_M and BLOCK_N values (default: runtime.sizes('block_sizes'))")
    parser.add_argument("--block-k", type=int, help="BLOCK_K (default: 64 for 16-bit on a GPU, else 32)")
    parser.add_argument("--out", help="PNG (or CSV) path; the other file is written next to it. "
                                      "Default: benchmarks/results/ on a GPU, a temp file in the interpreter")
    args = parser.parse_args(argv)

    m, n, k = args.size or runtime.sizes("matmul")
    dtype = DTYPES[args.dtype or runtime.pick("fp16", "fp32")]
    block_sizes = args.block_sizes or runtime.sizes("block_sizes")
    print(runtime.mode_description())
    try:
        results = run_block_size_experiment(m, n, k, block_sizes, dtype, block_k=args.block_k)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    print(results.table())

    out = Path(args.out) if args.out else default_output(results)
    png, csv_path = out.with_suffix(".png"), out.with_suffix(".csv")
    png.parent.mkdir(parents=True, exist_ok=True)
    plot_heatmap(results).savefig(png, dpi=120)
    results.to_csv(csv_path)
    print(f"saved {png} and {csv_path}")
    return results


if __name__ == "__main__":
    main()
