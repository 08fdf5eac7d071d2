"""The attention benchmark and its command line: ``python -m flashlib.bench``.

It times attention (flashlib beside PyTorch SDPA's backends, naive attention, and, where
they are provided, Triton's tutorial 06 and FlashAttention-4) over a grid of modes, dtypes,
masks, head dims and sequence lengths, in one process, and writes PREFIX.json and PREFIX.csv
with the GPU, versions and date (``benchmarks/README.md`` says how to run it and what the
files hold). ``--kernel matmul`` prints the tiled matmul's table instead; ``--mode decode``
hands over to :mod:`flashlib.bench_decode`.

The measurements are :mod:`flashlib.timing`'s, the files :mod:`flashlib.bench_results`'s
and the printed table :mod:`flashlib.report`'s.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import math
import os
import shlex
import sys
import time
import warnings
from pathlib import Path
from types import ModuleType
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import bench_decode, runtime
from .attention import flash_attention
from .bench_results import (DTYPES, OK, Unavailable, default_prefix, failure_status, results_meta, write_results,
                            wrong_output_status)
from .io_model import MODES, attention_flops
from .reference import naive_attention
from .report import format_table
from .timing import BenchmarkRunner, free_memory, measure_ceilings, peak_memory_bytes, print_comparison_table, time_ms
from .validation import relative_error


# ---------------------------------------------------------------- the attention benchmark

IMPLS = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "naive", "flashlib", "tutorial", "fa4")
#: Implementations that only exist on CUDA (on the CPU their rows say "unsupported: needs CUDA").
CUDA_ONLY = ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "tutorial", "fa4")
#: Implementations without a backward: their bwd and train rows say FORWARD_ONLY.
FORWARD_ONLY_IMPLS = ("tutorial",)
FORWARD_ONLY = "forward only"
#: Where the tutorial's forward is read from: this variable, else benchmarks/anchors/tutorial06.py (never committed).
TUTORIAL_ENV = "FLASHLIB_TUTORIAL06"
TUTORIAL_DEFAULT = Path(__file__).resolve().parents[1] / "benchmarks" / "anchors" / "tutorial06.py"
TUTORIAL_MISSING = f"not found: set {TUTORIAL_ENV} to Triton's python/tutorials/06-fused-attention.py"
FA4_MISSING = "not installed: pip install flash-attn-4 nvidia-cutlass-dsl"

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


def tutorial_path() -> Path:
    """The tutorial's file: $FLASHLIB_TUTORIAL06, else benchmarks/anchors/tutorial06.py."""
    return Path(os.environ.get(TUTORIAL_ENV) or TUTORIAL_DEFAULT)


def load_tutorial(path=None) -> ModuleType:
    """Triton's tutorial 06 (fused attention) loaded from ``path`` (default :func:`tutorial_path`).

    The module must define ``attention(q, k, v, causal, sm_scale)`` on (B, H, N, D) tensors,
    returning O. Raises :class:`Unavailable` (its message a row's status) when the file is missing.
    """
    path = Path(path) if path is not None else tutorial_path()
    if not path.is_file():
        raise Unavailable(TUTORIAL_MISSING)
    return _load_module(str(path.resolve()))


@functools.lru_cache(maxsize=None)
def _load_module(path: str) -> ModuleType:
    """The module of the Python file at ``path``, executed once per path."""
    name = "flashlib_anchor_" + Path(path).stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # what inspect (and so triton.jit) looks a function's module up in
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    if not callable(getattr(module, "attention", None)):
        raise Unavailable(f"unsupported: {path} defines no attention(q, k, v, causal, sm_scale)")
    return module


@functools.lru_cache(maxsize=None)
def _tutorial_attention(path: str | None) -> Callable:
    return load_tutorial(path or None).attention


def _tutorial(q, k, v, causal):
    """The tutorial on one sample of B * H heads (a free view of contiguous inputs; the same work).

    Heads and samples are independent, so folding is exact. Why fold: the TMA forward of tutorial 06
    as released with Triton 3.x addresses a (sample, head) at row ``off_z + off_h * N_CTX`` of the
    flattened tensor, which is right only for one sample; with several its programs overlap one
    another's rows, and its output is wrong (relative error 0.6-1.4 at B = 4 and 16)."""
    attention = _tutorial_attention(os.environ.get(TUTORIAL_ENV))  # cached: the timed call reads no file
    b, h, n, d = q.shape
    folded = (t.reshape(1, b * h, n, d) for t in (q, k, v))
    return attention(*folded, causal, d ** -0.5).reshape(b, h, n, d)


def _fa4(q, k, v, causal):
    """FlashAttention-4 (CuTe DSL) on (B, N, H, D) views of our (B, H, N, D) tensors; O back as (B, H, N, D)."""
    try:
        from flash_attn.cute import flash_attn_func  # once imported, a look-up in sys.modules
    except ImportError as exc:
        raise Unavailable(FA4_MISSING) from exc
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
    return (out[0] if isinstance(out, tuple) else out).transpose(1, 2)  # it may return (out, lse)


#: name -> fn(q, k, v, causal) on (B, H, N, D) tensors; SDPA restricted to one backend each. An impl
#: that cannot run here raises :class:`Unavailable`, whose message becomes its rows' status.
ATTENTION_IMPLS: dict[str, Callable] = {
    "sdpa_flash": _sdpa("FLASH_ATTENTION"), "sdpa_cudnn": _sdpa("CUDNN_ATTENTION"),
    "sdpa_efficient": _sdpa("EFFICIENT_ATTENTION"), "naive": _naive, "flashlib": _flashlib,
    "tutorial": _tutorial, "fa4": _fa4,
}


def _attempt(action: Callable):
    """(action(), "ok"), or (None, a status) when it raises; memory is freed after a failure."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return action(), OK
        except Exception as exc:  # noqa: BLE001 (one backend failing must not end the run)
            status = failure_status(exc, [str(w.message) for w in caught])
    free_memory()  # out of the except block: the traceback, and the tensors it held, are gone
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


def checked_corners(batch: int, heads: int, ref_heads: int) -> list[tuple[slice, slice]]:
    """Where each output is compared with float64: the first ``ref_heads`` heads of the first sample
    and the last ones of the last sample (a float64 reference of every head would cost more than the
    benchmark). Two corners, so that a kernel that gets a sample's or a head's offset wrong fails."""
    first = (slice(0, 1), slice(0, ref_heads))
    last = (slice(batch - 1, batch), slice(heads - ref_heads, heads))
    return [first] if first == last else [first, last]


def _bench_point(dtype: str, d: int, causal: bool, n: int, batch: int, heads: int, impls, modes,
                 warmup: int, repeat: int, ref_heads: int, seed: int) -> list[dict]:
    """Every (impl, mode) row of one problem, with fresh seeded inputs and one float64 reference."""
    runtime.manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, d, device=runtime.DEVICE, dtype=DTYPES[dtype]).requires_grad_()
               for _ in range(3))
    do = torch.randn(batch, heads, n, d, device=runtime.DEVICE, dtype=DTYPES[dtype])
    corners = checked_corners(batch, heads, min(ref_heads, heads))
    with torch.no_grad():
        ref, _ = _attempt(lambda: [naive_attention(*(t.detach()[corner].double() for t in (q, k, v)), causal=causal)
                                   for corner in corners])
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
                    return None if ref is None else max(relative_error(out[corner], r)
                                                        for corner, r in zip(corners, ref))
            rel_err, status = _attempt(check)  # also compiles and autotunes the forward before timing
            if rel_err is not None and not math.isfinite(rel_err):
                rel_err, status = None, "error: non-finite output (NaN or inf)"
            else:
                status = wrong_output_status(rel_err, dtype, runtime.INTERPRET) or status
        for mode in modes:
            ms = mem = None
            mode_status, mode_err = status, rel_err
            if name in FORWARD_ONLY_IMPLS and mode != "fwd":
                mode_status, mode_err = FORWARD_ONLY, None
            if mode_status == OK:
                measured, mode_status = _attempt(
                    lambda: _time_and_memory(fn, q, k, v, do, causal, mode, warmup, repeat))
                if measured is not None:
                    ms, mem = measured
            for t in (q, k, v):
                t.grad = None
            flops = attention_flops(batch, heads, n, d, causal=causal, mode=mode)
            rows.append(dict(impl=name, mode=mode, **base, ms=ms,
                             tflops=flops / (ms * 1e-3) / 1e12 if ms else None,
                             peak_mem_bytes=mem, rel_err=mode_err, status=mode_status))
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
        free_memory()
        log(f"[{i + 1:3d}/{len(points)} {time.perf_counter() - start:5.0f} s] {dtype} D={d} "
            f"causal={causal} N={n} B={b} H={h}")
        if on_point is not None:
            on_point(rows)
    return rows


def attention_method(warmup: int, repeat: int, ref_heads: int) -> str:
    """How the rows were measured: the "method" of a results file's meta."""
    if runtime.INTERPRET:
        timing = ("time.perf_counter median of a few calls: Triton INTERPRETER timings on the CPU (numpy), "
                  "not GPU timings; peak memory from torch.profiler (torch tensors only)")
    else:
        timing = (f"triton.testing.do_bench median (warmup {warmup} ms, rep {repeat} ms, L2 flushed), "
                  "all in one process; peak_mem_bytes = torch.cuda.max_memory_allocated during one call "
                  "above the memory allocated before it (inputs, and for bwd the forward's saved tensors, "
                  "are not counted)")
    return (f"{timing}. Shapes: batch = 16384 // N, heads = 2048 // D unless set (interpreter: "
            f"{CPU_BATCH} x {CPU_HEADS}). fwd: forward with requires_grad inputs; bwd: o.backward(do) "
            "after one forward, grads reset each call; train: forward + backward. FLOPs 4*B*H*N^2*D "
            "forward, halved when causal; bwd 2.5x, train 3.5x. rel_err: max|o - ref| / max|ref| of the "
            f"forward output against float64 naive attention computed for batch 0, heads 0..{ref_heads - 1} "
            "only (to fit memory at N = 16k); the output is compared on that slice.")


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
                                description="Time attention (flashlib, SDPA backends, naive, Triton's tutorial 06, "
                                            "FlashAttention-4) on a grid, or "
                                            "the tiled matmul (--kernel matmul). Defaults: the " + where + " grid.")
    p.add_argument("--kernel", choices=["attention", "matmul"], default="attention")
    p.add_argument("--mode", default=d["mode"], help=f"comma list of {list(MODES)} (default {d['mode']}); "
                                                     "or decode: the decoding grid (see flashlib.bench_decode)")
    p.add_argument("--dtype", default=None, help=f"comma list of {list(DTYPES)} (default {d['dtype']}; "
                                                 "--kernel matmul: one of fp16, bf16, fp32)")
    p.add_argument("--causal", default=d["causal"], help="both, true or false (default both)")
    p.add_argument("--d", default=d["d"], help=f"head dims (default {d['d']})")
    p.add_argument("--N", "--n", dest="N", default=d["N"], help=f"sequence lengths (default {d['N']})")
    p.add_argument("--impl", default=d["impl"], help=f"comma list of {list(IMPLS)} (default {d['impl']}). "
                                                     f"tutorial: the forward of the file ${TUTORIAL_ENV} (default "
                                                     "benchmarks/anchors/tutorial06.py); fa4: flash_attn.cute. "
                                                     "Each absent one gets rows that say so")
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
    if "decode" in argv or "--mode=decode" in argv:  # decoding has its own grid and rows
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
    meta = results_meta(method=attention_method(args.warmup, args.repeat, args.ref_heads),
                        command=" ".join(["python -m flashlib.bench", *(shlex.quote(a) for a in argv)]),
                        ceilings=ceilings)
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
