"""Timing and memory measurements, and the benchmark command line.

On a GPU, times are ``triton.testing.do_bench`` medians (warm-up, cache flush,
CUDA events). In the interpreter we time with ``time.perf_counter`` and *say so*:
those numbers measure numpy, not a kernel, and are only for seeing that the
benchmark runs.

``python -m flashlib.bench`` times attention (flashlib beside PyTorch SDPA's
backends and naive attention) over a grid of modes, dtypes, masks, head dims and
sequence lengths, in one process, and writes PREFIX.json and PREFIX.csv with the
GPU, versions and date (``benchmarks/README.md`` says how to run it and what the
files hold). ``--kernel matmul`` prints the tiled matmul's table instead.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import gc
import json
import math
import os
import platform
import re
import shlex
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import runtime
from .attention import flash_attention
from .gpu import detect_gpu
from .io_model import MODES, attention_flops
from .reference import naive_attention
from .validation import relative_error


def time_ms(fn: Callable[[], object], warmup: int = 25, rep: int = 100, grad_to_none=None) -> float:
    """Median milliseconds of ``fn()``: do_bench on a GPU, perf_counter in the interpreter.

    On the GPU ``warmup`` and ``rep`` are milliseconds (as in do_bench); in the
    interpreter they are clamped to a couple of calls. ``grad_to_none``: tensors whose
    ``.grad`` is reset before each call (so a timed backward does not accumulate).
    """
    if not runtime.INTERPRET:
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grad_to_none,
                                             return_mode="median"))

    def call():
        for t in grad_to_none or ():
            t.grad = None
        fn()

    return _cpu_time_ms(call, rep)


def _cpu_time_ms(call: Callable[[], object], rep: int, warmup_budget_s: float = 2.0) -> float:
    """Median milliseconds of ``call()`` off the GPU, after a warm-up that lasts until it is stable.

    The first calls pay one-off costs (thread pools, allocations, lazy imports) that can be
    a thousand times one call of a small op; the warm-up goes on until two calls in a row
    agree within 25% (at most 10 calls or ``warmup_budget_s``). A call shorter than a few
    milliseconds is repeated inside each sample, so the clock's resolution does not count.
    """
    previous, started = None, time.perf_counter()
    for _ in range(10):
        begin = time.perf_counter()
        call()
        last = time.perf_counter() - begin
        if previous is not None and abs(last - previous) <= 0.25 * max(last, previous):
            break
        previous = last
        if time.perf_counter() - started > warmup_budget_s:
            break
    inner = min(1000, max(1, int(0.005 / max(last, 1e-7))))
    samples = []
    for _ in range(max(1, min(rep, 5 if last < 0.2 else 3))):
        begin = time.perf_counter()
        for _ in range(inner):
            call()
        samples.append((time.perf_counter() - begin) * 1e3 / inner)
    return statistics.median(samples)


@contextlib.contextmanager
def _stderr_silenced():
    """Hide what C++ writes to file descriptor 2 (the profiler's start/stop lines)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_memory_bytes(fn: Callable[[], object]) -> int:
    """Peak memory allocated *by* ``fn()`` above what was allocated before it.

    CUDA: torch's allocator statistics. CPU: torch's profiler, which records every
    allocation and free of CPU tensors; we replay them to find the peak.
    """
    if runtime.DEVICE.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    from torch.profiler import ProfilerActivity, profile

    with _stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # Allocations are charged to the op that made them (its *self* memory), frees
    # appear as "[memory]" events with negative sizes; replay them in time order.
    current = peak = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        current += event.self_cpu_memory_usage
        peak = max(peak, current)
    return peak


def matmul_tflops(m: int, n: int, k: int, ms: float) -> float:
    """2·M·N·K floating-point operations in ``ms`` milliseconds, in TFLOP/s."""
    return 2.0 * m * n * k / (ms * 1e-3) / 1e12


class BenchmarkRunner:
    """Times a function against torch on a list of sizes and prints a comparison."""

    def __init__(self, dtype: torch.dtype = torch.float16, warmup: int = 25, rep: int = 100):
        self.dtype = dtype if not runtime.INTERPRET else torch.float32
        self.warmup, self.rep = warmup, rep

    def benchmark_matmul(self, fn: Callable, sizes: Iterable[tuple[int, int, int]],
                         baseline: Callable = torch.matmul) -> list[dict]:
        """Time ``fn(a, b)`` and ``baseline(a, b)`` for each (M, N, K); return rows."""
        results = []
        for m, n, k in sizes:
            a = torch.randn(m, k, device=runtime.DEVICE, dtype=self.dtype)
            b = torch.randn(k, n, device=runtime.DEVICE, dtype=self.dtype)
            ms_fn = time_ms(lambda: fn(a, b), self.warmup, self.rep)
            ms_base = time_ms(lambda: baseline(a, b), self.warmup, self.rep)
            results.append(dict(
                M=m, N=n, K=k, dtype=str(self.dtype).replace("torch.", ""),
                ms=ms_fn, baseline_ms=ms_base,
                tflops=matmul_tflops(m, n, k, ms_fn), baseline_tflops=matmul_tflops(m, n, k, ms_base),
                speedup=ms_base / ms_fn, interpreter=runtime.INTERPRET,
            ))
        return results


def print_comparison_table(results: list[dict], name: str = "triton", baseline: str = "torch") -> None:
    """Print one line per size: times, TFLOP/s and speedup versus the baseline."""
    if not results:
        print("(no results)")
        return
    print(f"{'M':>6} {'N':>6} {'K':>6} {name + ' ms':>12} {baseline + ' ms':>12} "
          f"{name + ' TFLOP/s':>16} {baseline + ' TFLOP/s':>16} {'speedup':>8}")
    for r in results:
        print(f"{r['M']:>6} {r['N']:>6} {r['K']:>6} {r['ms']:>12.3f} {r['baseline_ms']:>12.3f} "
              f"{r['tflops']:>16.3g} {r['baseline_tflops']:>16.3g} {r['speedup']:>7.2f}x")
    if any(r["interpreter"] for r in results):
        print("Note: these are Triton *interpreter* timings on the CPU (numpy), not GPU kernel "
              "timings; they say nothing about speed on a GPU.")


# ---------------------------------------------------------------- the attention benchmark

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
IMPLS = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "naive", "flashlib")
#: SDPA backends that only exist on CUDA (on the CPU their rows say "unsupported: needs CUDA").
CUDA_ONLY = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient")
ROW_FIELDS = ("impl", "mode", "dtype", "causal", "N", "D", "batch", "heads",
              "ms", "tflops", "peak_mem_bytes", "rel_err", "status")
OK = "ok"
OUT_OF_MEMORY = "out of memory"
#: Where measured GPU results live: benchmarks/results of the repository.
RESULTS_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "results"

#: Default grids: the full one on a GPU (``make bench-all``), a tiny one in the interpreter.
GPU_DEFAULTS = dict(mode="fwd,bwd,train", dtype="fp16,bf16", causal="both", d="64,128",
                    N="512,1024,2048,4096,8192,16384", impl=",".join(IMPLS), warmup=25, repeat=100)
CPU_DEFAULTS = dict(mode="fwd,bwd,train", dtype="fp16", causal="both", d="32", N="64,128",
                    impl="naive,flashlib", warmup=1, repeat=1)
#: Batch and heads in the interpreter (on a GPU: the FlashAttention-2 benchmark shapes).
CPU_BATCH, CPU_HEADS = 1, 2


def fa2_shape(n: int, d: int) -> tuple[int, int]:
    """(batch, heads) of the FlashAttention-2 benchmarks: batch * N = 16384, heads * D = 2048."""
    return max(1, 16384 // n), max(1, 2048 // d)


def _sdpa(backend: str) -> Callable:
    chosen = getattr(SDPBackend, backend)

    def run(q, k, v, causal):
        with sdpa_kernel(chosen):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return run


def _naive(q, k, v, causal):
    return naive_attention(q, k, v, causal=causal)


def _flashlib(q, k, v, causal):
    return flash_attention(q, k, v, causal=causal)


#: name -> fn(q, k, v, causal) on (B, H, N, D) tensors; SDPA restricted to one backend each.
ATTENTION_IMPLS: dict[str, Callable] = {
    "sdpa_flash": _sdpa("FLASH_ATTENTION"), "sdpa_cudnn": _sdpa("CUDNN_ATTENTION"),
    "sdpa_efficient": _sdpa("EFFICIENT_ATTENTION"), "naive": _naive, "flashlib": _flashlib,
}


def _short(text: str, width: int = 100) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[:width - 3] + "..."


def failure_status(exc: BaseException, warned: Iterable[str] = ()) -> str:
    """A row's status for an exception: "out of memory", "unsupported: <why>" or "error: <what>".

    A backend refuses a shape or dtype with ValueError/TypeError (flashlib) or SDPA's
    "No available kernel" (the reason is in the warnings SDPA emitted just before).
    """
    text = str(exc).strip()
    if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in text.lower() \
            or "can't allocate memory" in text:
        return OUT_OF_MEMORY
    if "No available kernel" in text or "No viable backend" in text:  # SDPA (torch <= 2.11 / later)
        reasons = [w for w in warned if not w.rstrip().endswith("because:") and "runtime disabled" not in w]
        return f"unsupported: {_short(reasons[0] if reasons else text)}"
    if isinstance(exc, (ValueError, TypeError, NotImplementedError)):
        return f"unsupported: {_short(text or type(exc).__name__)}"
    return f"error: {type(exc).__name__}: {_short(text)}"


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _attempt(action: Callable):
    """(action(), "ok"), or (None, a status) when it raises; memory is freed after a failure."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return action(), OK
        except Exception as exc:  # noqa: BLE001 (one backend failing must not end the run)
            status = failure_status(exc, [str(w.message) for w in caught])
    _free_memory()  # out of the except block: the traceback, and the tensors it held, are gone
    return None, status


def _time_and_memory(fn, q, k, v, do, causal, mode, warmup, repeat):
    """(ms, peak bytes) of one mode: fwd; bwd (o.backward(do) after one forward); train (both)."""
    leaves = [q, k, v]
    if mode == "fwd":
        def call():
            return fn(q, k, v, causal)
    elif mode == "bwd":
        o = fn(q, k, v, causal)

        def call():
            o.backward(do, retain_graph=True)
    else:
        def call():
            fn(q, k, v, causal).backward(do)
    # time first: a kernel's autotuning (first call) must not count as memory
    ms = time_ms(call, warmup, repeat, grad_to_none=leaves)
    for t in leaves:
        t.grad = None
    mem = peak_memory_bytes(call)
    for t in leaves:
        t.grad = None
    return ms, mem


def _bench_point(dtype: str, d: int, causal: bool, n: int, batch: int, heads: int, impls, modes,
                 warmup: int, repeat: int, ref_heads: int, seed: int) -> list[dict]:
    """Every (impl, mode) row of one problem, with fresh seeded inputs and one float64 reference."""
    runtime.manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, d, device=runtime.DEVICE, dtype=DTYPES[dtype]).requires_grad_()
               for _ in range(3))
    do = torch.randn(batch, heads, n, d, device=runtime.DEVICE, dtype=DTYPES[dtype])
    hr = min(ref_heads, heads)
    with torch.no_grad():
        ref, _ = _attempt(lambda: naive_attention(*(t.detach()[:1, :hr].double() for t in (q, k, v)),
                                                  causal=causal))
    base = dict(dtype=dtype, causal=causal, N=n, D=d, batch=batch, heads=heads)
    rows = []
    for name in impls:
        fn = ATTENTION_IMPLS[name]
        if name in CUDA_ONLY and runtime.DEVICE.type != "cuda":
            rel_err, status = None, "unsupported: needs CUDA"
        else:
            def check():
                with torch.no_grad():
                    out = fn(q, k, v, causal)
                    return None if ref is None else relative_error(out[:1, :hr], ref)
            rel_err, status = _attempt(check)  # also compiles and autotunes the forward before timing
            if rel_err is not None and not math.isfinite(rel_err):
                rel_err, status = None, "error: non-finite output (NaN or inf)"
        for mode in modes:
            ms = mem = None
            mode_status = status
            if status == OK:
                measured, mode_status = _attempt(
                    lambda: _time_and_memory(fn, q, k, v, do, causal, mode, warmup, repeat))
                if measured is not None:
                    ms, mem = measured
            for t in (q, k, v):
                t.grad = None
            flops = attention_flops(batch, heads, n, d, causal=causal, mode=mode)
            rows.append(dict(impl=name, mode=mode, **base, ms=ms,
                             tflops=flops / (ms * 1e-3) / 1e12 if ms else None,
                             peak_mem_bytes=mem, rel_err=rel_err, status=mode_status))
    return rows  # the inputs die here; the caller frees the cache


def run_attention_benchmark(*, modes=MODES, dtypes=("fp16",), causals=(False, True), head_dims=(64,),
                            seq_lens=(1024,), impls=IMPLS, warmup: int = 25, repeat: int = 100,
                            batch: int | None = None, heads: int | None = None, ref_heads: int = 2,
                            seed: int = 0, time_budget_s: float | None = None,
                            on_point: Callable[[list[dict]], None] | None = None,
                            log: Callable[[str], None] = print) -> list[dict]:
    """Time every (dtype, D, causal, N) problem for every impl and mode; return the rows.

    Shapes: ``batch``/``heads`` if given, else the FlashAttention-2 benchmarks' on a GPU
    (:func:`fa2_shape`) and 1 x 2 in the interpreter. ``on_point(rows)`` runs after each
    problem (to save partial results); past ``time_budget_s`` no new problem starts.
    """
    for name, values, known in (("modes", modes, MODES), ("dtypes", dtypes, DTYPES),
                                ("impls", impls, ATTENTION_IMPLS)):
        unknown = [x for x in values if x not in known]
        if unknown or not values:
            raise ValueError(f"{name} must be a non-empty list drawn from {list(known)}, got {list(values)}")
    points = [(dt, d, c, n) for dt in dtypes for d in head_dims for c in causals for n in seq_lens]
    rows: list[dict] = []
    start = time.perf_counter()
    for i, (dtype, d, causal, n) in enumerate(points):
        elapsed = time.perf_counter() - start
        if time_budget_s is not None and elapsed > time_budget_s:
            log(f"time budget of {time_budget_s:g} s spent: {len(points) - i} of {len(points)} problems not run")
            break
        b, h = fa2_shape(n, d) if not runtime.INTERPRET else (CPU_BATCH, CPU_HEADS)
        b, h = batch or b, heads or h
        rows += _bench_point(dtype, d, causal, n, b, h, impls, modes, warmup, repeat, ref_heads, seed)
        _free_memory()
        log(f"[{i + 1:3d}/{len(points)} {time.perf_counter() - start:5.0f} s] {dtype} D={d} "
            f"causal={causal} N={n} B={b} H={h}")
        if on_point is not None:
            on_point(rows)
    return rows


def measure_ceilings(warmup: int = 25, repeat: int = 100) -> dict:
    """The GPU's measured roofs: a 1 GiB device-to-device copy and an 8192^3 fp16 matmul.

    None for both in the interpreter (numpy has no roofline worth drawing).
    """
    if runtime.DEVICE.type != "cuda":
        return {"hbm_gb_per_s": None, "matmul_tflops": None}
    ceilings = {"hbm_gb_per_s": _copy_gb_per_s(warmup, repeat), "matmul_tflops": _matmul_peak(warmup, repeat)}
    _free_memory()
    return ceilings


def _copy_gb_per_s(warmup: int, repeat: int) -> float:
    src = torch.rand(2 ** 28, device="cuda")  # 1 GiB of float32
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), warmup, repeat)
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9  # read + write


def _matmul_peak(warmup: int, repeat: int) -> float:
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.float16) for _ in range(2))
    return matmul_tflops(8192, 8192, 8192, time_ms(lambda: a @ b, warmup, repeat))


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia_h100_80gb_hbm3' (for file names)."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def default_prefix(dtypes) -> Path:
    """benchmarks/results/attention_<gpu> (attention_<dtypes>_<gpu> for a subset of dtypes) on a GPU;
    a temporary file in the interpreter, whose timings are not results."""
    if runtime.INTERPRET:
        return Path(tempfile.gettempdir()) / "flashlib_attention_interpreter"
    tag = "" if set(dtypes) == set(DTYPES) else "_".join(dtypes) + "_"
    return RESULTS_DIR / f"attention_{tag}{gpu_slug(detect_gpu().name)}"


def results_meta(*, warmup: int, repeat: int, ref_heads: int, ceilings: dict, command: str) -> dict:
    """What was measured where, how and when: the "meta" of a results file."""
    import triton

    import flashlib

    if runtime.INTERPRET:
        timing = ("time.perf_counter median of a few calls: Triton INTERPRETER timings on the CPU (numpy), "
                  "not GPU timings; peak memory from torch.profiler (torch tensors only)")
    else:
        timing = (f"triton.testing.do_bench median (warmup {warmup} ms, rep {repeat} ms, L2 flushed), "
                  "all in one process; peak_mem_bytes = torch.cuda.max_memory_allocated during one call "
                  "above the memory allocated before it (inputs, and for bwd the forward's saved tensors, "
                  "are not counted)")
    method = (f"{timing}. Shapes: batch = 16384 // N, heads = 2048 // D unless set (interpreter: "
              f"{CPU_BATCH} x {CPU_HEADS}). fwd: forward with requires_grad inputs; bwd: o.backward(do) "
              "after one forward, grads reset each call; train: forward + backward. FLOPs 4*B*H*N^2*D "
              "forward, halved when causal; bwd 2.5x, train 3.5x. rel_err: max|o - ref| / max|ref| of the "
              f"forward output against float64 naive attention computed for batch 0, heads 0..{ref_heads - 1} "
              "only (to fit memory at N = 16k); the output is compared on that slice.")
    return dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                gpu=detect_gpu().as_dict(), torch=torch.__version__, triton=triton.__version__,
                flashlib=flashlib.__version__, python=platform.python_version(),
                interpreter=runtime.INTERPRET, method=method, command=command, ceilings=ceilings)


def _finite_or_none(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


def write_results(prefix, meta: dict, rows: list[dict]) -> tuple[Path, Path]:
    """Write PREFIX.json ({"meta", "rows"}) and PREFIX.csv (one line per row, with GPU/versions/date)."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    clean = [{f: _finite_or_none(r.get(f)) for f in ROW_FIELDS} for r in rows]
    json_path, csv_path = Path(f"{prefix}.json"), Path(f"{prefix}.csv")
    tmp = json_path.with_name(json_path.name + ".tmp")
    tmp.write_text(json.dumps({"meta": meta, "rows": clean}, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    tmp.replace(json_path)  # a run killed mid-write leaves the previous file whole
    extra = dict(gpu=meta["gpu"]["name"], torch=meta["torch"], triton=meta["triton"], date=meta["date"],
                 interpreter=meta["interpreter"])
    with csv_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*ROW_FIELDS, *extra])
        writer.writeheader()
        for r in clean:
            writer.writerow({**r, **extra})
    return json_path, csv_path


def load_results(path) -> tuple[dict, list[dict]]:
    """(meta, rows) of a results file written by :func:`write_results`; absent row fields are None."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("meta"), dict) or not isinstance(data.get("rows"), list):
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path}: expected flashlib.bench results, a JSON object with 'meta' (object) and "
                         f"'rows' (list); got {got}")
    rows = [{**{f: None for f in ROW_FIELDS}, **r} for r in data["rows"]]
    return data["meta"], rows


def _date_of(path: Path) -> str:
    try:
        return str(json.loads(path.read_text(encoding="utf-8"))["meta"]["date"])
    except (OSError, ValueError, KeyError, TypeError):
        mtime = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc)
        return mtime.isoformat(timespec="seconds")


def stored_results(pattern: str = "attention_*.json", directory=None) -> list[Path]:
    """Results files in benchmarks/results of the repository (or ``directory``), newest first
    (by the date inside, else the file's modification time)."""
    folder = Path(directory) if directory is not None else RESULTS_DIR
    return sorted(folder.glob(pattern), key=_date_of, reverse=True)


# ---------------------------------------------------------------- the printed table

_ABBREVIATIONS = {OK: "", OUT_OF_MEMORY: "oom"}
_LABELS = {"sdpa_flash": "flash", "sdpa_cudnn": "cudnn", "sdpa_efficient": "effic"}


def _cell(row: dict | None, interpreter: bool) -> str:
    if row is None:
        return "-"
    if row["status"] != OK:
        return _ABBREVIATIONS.get(row["status"], row["status"].split(":")[0][:5])
    return f"{row['ms']:.3g}" if interpreter else f"{row['tflops']:.1f}"


def format_table(rows: list[dict], interpreter: bool = runtime.INTERPRET) -> str:
    """One line per (mode, dtype, D, causal, N), one column per impl; then flashlib's ratios,
    its peak memory at the largest N, and each failure reason once."""
    from .report import memory_comparison, summary_ratios

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
    for baseline in ("sdpa_flash", "sdpa_cudnn"):
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


# ---------------------------------------------------------------- the command line

def _parse_list(parser, text: str, name: str, allowed=None, kind=str) -> list:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--{name} must be a comma-separated list of {kind.__name__}s, got {text!r}")
    bad = [x for x in values if allowed is not None and x not in allowed]
    if bad or not values:
        parser.error(f"--{name} must be a comma-separated list drawn from {list(allowed)}, got {text!r}")
    return values


def _parse_causal(parser, text: str) -> list[bool]:
    choices = {"both": [False, True], "true": [True], "false": [False]}
    if text.lower() not in choices:
        parser.error(f"--causal must be 'both', 'true' or 'false', got {text!r}")
    return choices[text.lower()]


def build_parser() -> argparse.ArgumentParser:
    d = CPU_DEFAULTS if runtime.INTERPRET else GPU_DEFAULTS
    where = "interpreter" if runtime.INTERPRET else "GPU"
    p = argparse.ArgumentParser(prog="python -m flashlib.bench",
                                description="Time attention (flashlib, SDPA backends, naive) on a grid, or "
                                            "the tiled matmul (--kernel matmul). Defaults: the " + where + " grid.")
    p.add_argument("--kernel", choices=["attention", "matmul"], default="attention")
    p.add_argument("--mode", default=d["mode"], help=f"comma list of {list(MODES)} (default {d['mode']}); "
                                                     "or decode: the decoding grid (see flashlib.bench_decode)")
    p.add_argument("--dtype", default=None, help=f"comma list of {list(DTYPES)} (default {d['dtype']}; "
                                                 "--kernel matmul: one of fp16, bf16, fp32)")
    p.add_argument("--causal", default=d["causal"], help="both, true or false (default both)")
    p.add_argument("--d", default=d["d"], help=f"head dims (default {d['d']})")
    p.add_argument("--N", "--n", dest="N", default=d["N"], help=f"sequence lengths (default {d['N']})")
    p.add_argument("--impl", default=d["impl"], help=f"comma list of {list(IMPLS)} (default {d['impl']})")
    p.add_argument("--warmup", type=int, help=f"do_bench warm-up, ms (default {d['warmup']}; matmul 25)")
    p.add_argument("--repeat", type=int, help=f"do_bench repetition, ms (default {d['repeat']}; matmul 100)")
    p.add_argument("--batch", type=int, help="batch size (default 16384 // N; interpreter 1)")
    p.add_argument("--heads", type=int, help="heads (default 2048 // D; interpreter 2)")
    p.add_argument("--ref-heads", type=int, default=2, help="heads of batch 0 checked against float64 (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-budget", type=float, help="seconds (from the start of main) after which no new problem "
                                                     "starts; results so far are written after every problem anyway")
    p.add_argument("--no-ceilings", action="store_true", help="skip measuring the copy bandwidth and matmul peak")
    p.add_argument("--out", help="PREFIX: writes PREFIX.json and PREFIX.csv (default: benchmarks/results/"
                                 "attention_<gpu> on a GPU, a temporary file in the interpreter)")
    return p


def _matmul_main(args) -> None:
    from .matmul import triton_matmul

    name = args.dtype or "fp16"
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
    if name not in dtypes:
        raise SystemExit(f"--dtype for --kernel matmul must be one of {list(dtypes)}, got {name!r}")
    print(runtime.mode_description())
    runner = BenchmarkRunner(dtype=dtypes[name], warmup=args.warmup, rep=args.repeat)
    print_comparison_table(runner.benchmark_matmul(triton_matmul, runtime.sizes("matmul_sweep")),
                           name="flashlib", baseline="torch")


def main(argv: list[str] | None = None) -> list[dict] | None:
    """``python -m flashlib.bench``: the attention grid (or ``--kernel matmul``'s table)."""
    started = time.perf_counter()
    argv = sys.argv[1:] if argv is None else list(argv)
    if "decode" in argv or "--mode=decode" in argv:
        # Decoding has its own grid and rows; flashlib.bench_decode builds on this module, so it is
        # imported here, where it is needed, rather than at the top (it imports this module).
        from . import bench_decode

        return bench_decode.main(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    defaults = CPU_DEFAULTS if runtime.INTERPRET else GPU_DEFAULTS
    if args.kernel == "matmul":
        args.warmup = 25 if args.warmup is None else args.warmup
        args.repeat = 100 if args.repeat is None else args.repeat
        _matmul_main(args)
        return None
    args.warmup = defaults["warmup"] if args.warmup is None else args.warmup
    args.repeat = defaults["repeat"] if args.repeat is None else args.repeat
    dtypes = _parse_list(parser, args.dtype or defaults["dtype"], "dtype", DTYPES)
    grid = dict(modes=_parse_list(parser, args.mode, "mode", MODES), dtypes=dtypes,
                causals=_parse_causal(parser, args.causal),
                head_dims=_parse_list(parser, args.d, "d", kind=int),
                seq_lens=_parse_list(parser, args.N, "N", kind=int),
                impls=_parse_list(parser, args.impl, "impl", IMPLS))
    for flag in ("batch", "heads", "ref_heads"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    prefix = Path(args.out) if args.out else default_prefix(dtypes)
    print(runtime.mode_description())
    ceilings = ({"hbm_gb_per_s": None, "matmul_tflops": None} if args.no_ceilings
                else measure_ceilings(args.warmup, args.repeat))
    meta = results_meta(warmup=args.warmup, repeat=args.repeat, ref_heads=args.ref_heads, ceilings=ceilings,
                        command=" ".join(["python -m flashlib.bench", *(shlex.quote(a) for a in argv)]))
    if ceilings["hbm_gb_per_s"] is not None:
        print(f"ceilings: copy {ceilings['hbm_gb_per_s']:.0f} GB/s, fp16 matmul {ceilings['matmul_tflops']:.0f} "
              "TFLOP/s")
    rows = run_attention_benchmark(**grid, warmup=args.warmup, repeat=args.repeat, batch=args.batch,
                                   heads=args.heads, ref_heads=args.ref_heads, seed=args.seed,
                                   time_budget_s=(None if args.time_budget is None
                                                  else args.time_budget - (time.perf_counter() - started)),
                                   on_point=lambda rows: write_results(prefix, meta, rows))
    json_path, csv_path = write_results(prefix, meta, rows)
    print(format_table(rows))
    print(f"saved {json_path} and {csv_path}")
    return rows


if __name__ == "__main__":
    main()
