"""The decoding benchmark: ``python -m flashlib.bench --mode decode``.

One new query (or a few) per sequence against a KV cache, over the grid of issue 15:
batch {1, 8, 64} x H_q = 32 with H_kv {32, 8, 1} x N_k {1k ... 128k} x N_q {1, 4} x
D {64, 128} x fp16/bf16. Implementations, all on the same tensors in one process:

* ``flashlib``: :func:`flashlib.flash_attention_with_kvcache` on a contiguous cache
  (split-KV kernel);
* ``flashlib_paged``: the same on a paged cache (pages of 64 tokens, shuffled in the pool);
* ``flashlib_fa2``: :func:`flashlib.flash_attention` with ``variant="fa2"`` (the
  FlashAttention-2 grid, what flashlib did before split-KV);
* ``sdpa_flash``, ``sdpa_cudnn``, ``sdpa_efficient``: PyTorch SDPA restricted to one
  backend, ``enable_gqa=True`` where H_kv < H_q.

Every impl runs without a causal mask: with N_q = 1 it is the same attention, and with
N_q = 4 the bottom-right causal mask of SDPA (``causal_lower_right``) is not served by
every backend; the work differs by at most 4 keys per row.

Two times per row, both medians in microseconds:

* ``us``: ``triton.testing.do_bench`` of the eager call, host time included. A small
  problem takes a few microseconds on the GPU, less than Python takes to launch it, so
  this measures the host there;
* ``us_graph``: ``triton.testing.do_bench_cudagraph``, the calls replayed from a CUDA
  graph: GPU time alone, as servers run decoding steps (vLLM and SGLang capture them).
  flashlib skips its value checks during capture (they need a sync). The targets are
  judged on this time. ``kv_gb_per_s`` is the K/V bytes read over it.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import runtime
from .attention import flash_attention
from .bench_results import DTYPES, OK, RESULTS_DIR, failure_status, gpu_slug, results_meta
from .decode import flash_attention_with_kvcache
from .gpu import detect_gpu
from .timing import free_memory, graph_time_ms, measure_ceilings
from .validation import relative_error

IMPLS = ("flashlib", "flashlib_paged", "flashlib_fa2", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient")
SDPA_IMPLS = {"sdpa_flash": "FLASH_ATTENTION", "sdpa_cudnn": "CUDNN_ATTENTION",
              "sdpa_efficient": "EFFICIENT_ATTENTION"}
GPU_GRID = dict(dtype="fp16,bf16", d="64,128", batch="1,8,64", heads_kv="32,8,1",
                nk="1024,4096,8192,16384,32768,131072", nq="1,4")
CPU_GRID = dict(dtype="fp16", d="32", batch="1,2", heads_kv="4,1", nk="64,256", nq="1,4")
HEADS_Q = {"gpu": 32, "cpu": 4}
PAGE_SIZE = 64
#: Points whose K and V together would take more than this are skipped (the H100 has 80 GB);
#: the paged copy is made only below half of it.
MAX_KV_BYTES = 36e9
ROW_FIELDS = ("impl", "dtype", "batch", "heads_q", "heads_kv", "n_q", "n_k", "head_dim", "us", "us_graph",
              "kv_gb_per_s", "rel_err", "status")


def kv_bytes(batch: int, heads_kv: int, n_k: int, head_dim: int, elem: int) -> int:
    """Bytes of K and V that one decoding step reads."""
    return 2 * batch * n_k * heads_kv * head_dim * elem


def paged_copy(k: torch.Tensor, v: torch.Tensor, generator: torch.Generator, page_size: int = PAGE_SIZE,
               shuffle: bool = True):
    """The (B, N_k, H_kv, D) caches' tokens in pages of ``page_size`` shuffled over a pool (in order with
    ``shuffle=False``: the block table is then ``arange``), and the block table."""
    batch, n_k = k.shape[:2]
    pages = -(-n_k // page_size)
    order = (torch.randperm(batch * pages, generator=generator) if shuffle else torch.arange(batch * pages)).to(k.device)

    def pool_of(cache):
        padded = torch.zeros(batch, pages * page_size, *cache.shape[2:], dtype=cache.dtype, device=cache.device)
        padded[:, :n_k] = cache
        pool = torch.empty(batch * pages, page_size, *cache.shape[2:], dtype=cache.dtype, device=cache.device)
        pool[order] = padded.view(batch * pages, page_size, *cache.shape[2:])
        return pool

    return pool_of(k), pool_of(v), order.view(batch, pages).to(torch.int32)


def sdpa_call(backend: str, q, k, v):
    """A call of SDPA on (B, H, N, D) views of the (B, N, H, D) tensors, one backend (a ``SDPBackend``
    name), GQA through ``enable_gqa``: how the decoding bench and its A/B scripts time SDPA."""
    q_t, k_t, v_t = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    gqa = k.shape[2] != q.shape[2]

    def run():
        with sdpa_kernel(getattr(SDPBackend, backend)):
            return F.scaled_dot_product_attention(q_t, k_t, v_t, enable_gqa=gqa)
    return run


def _calls(q, k, v, impls, generator) -> dict[str, Callable]:
    lengths = torch.full((q.shape[0],), k.shape[1], dtype=torch.int32, device=q.device)
    calls = {}
    if "flashlib" in impls:
        calls["flashlib"] = lambda: flash_attention_with_kvcache(q, k, v, cache_seqlens=lengths, causal=False)
    if "flashlib_paged" in impls and k.numel() * k.element_size() * 2 <= MAX_KV_BYTES / 2:
        k_pool, v_pool, table = paged_copy(k, v, generator)
        calls["flashlib_paged"] = lambda: flash_attention_with_kvcache(q, k_pool, v_pool, cache_seqlens=lengths,
                                                                       block_table=table, causal=False)
    if "flashlib_fa2" in impls:
        calls["flashlib_fa2"] = lambda: flash_attention(q, k, v, layout="bnhd", variant="fa2")
    for name, backend in SDPA_IMPLS.items():
        if name in impls:
            calls[name] = sdpa_call(backend, q, k, v)
    return calls


def graph_time_us(call: Callable, repeat: int = 20) -> float:
    """Median microseconds of ``call()`` replayed from a CUDA graph (GPU time alone; after one eager call,
    which compiles and warms up; :func:`flashlib.timing.graph_time_ms` drains the device before it times)."""
    call()
    return graph_time_ms(call, rep=repeat, return_mode="median") * 1e3


def _time_us(call: Callable, warmup: int, repeat: int) -> tuple[float, float | None]:
    """(eager median, CUDA-graph median) in microseconds; the interpreter has no graph."""
    if runtime.INTERPRET:
        samples = []
        for _ in range(max(1, repeat)):
            begin = time.perf_counter()
            call()
            samples.append((time.perf_counter() - begin) * 1e6)
        return statistics.median(samples), None
    import triton.testing

    eager = triton.testing.do_bench(call, warmup=warmup, rep=repeat, return_mode="median") * 1e3
    return eager, graph_time_us(call, repeat)


def bench_point(dtype: str, head_dim: int, batch: int, heads_q: int, heads_kv: int, n_k: int, n_q: int,
                impls, warmup: int, repeat: int, seed: int = 0) -> list[dict]:
    """The rows of one problem: every impl timed on the same fresh random tensors."""
    base = dict(dtype=dtype, batch=batch, heads_q=heads_q, heads_kv=heads_kv, n_q=n_q, n_k=n_k, head_dim=head_dim)
    elem = DTYPES[dtype].itemsize
    size = kv_bytes(batch, heads_kv, n_k, head_dim, elem)
    if size > MAX_KV_BYTES:
        return [dict(base, impl=name, status=f"skipped: K and V take {size / 1e9:.0f} GB") for name in impls]
    generator = torch.Generator().manual_seed(seed)
    device, torch_dtype = runtime.DEVICE, DTYPES[dtype]
    if runtime.INTERPRET:
        torch_dtype = torch.float32
    q = torch.randn(batch, n_q, heads_q, head_dim, device=device, dtype=torch_dtype)
    k = torch.randn(batch, n_k, heads_kv, head_dim, device=device, dtype=torch_dtype)
    v = torch.randn(batch, n_k, heads_kv, head_dim, device=device, dtype=torch_dtype)
    rows, reference = [], None
    with torch.no_grad():
        calls = _calls(q, k, v, impls, generator)
        for name in impls:
            if name not in calls:
                rows.append(dict(base, impl=name, status="skipped: no room for a paged copy"))
                continue
            try:
                out = calls[name]()
                out = out.transpose(1, 2) if name.startswith("sdpa") else out
                if reference is None:
                    reference = out.double()
                error = relative_error(out, reference)
                us, us_graph = _time_us(calls[name], warmup, repeat)
            except Exception as exc:  # an unsupported backend or shape: a row that says so
                rows.append(dict(base, impl=name, status=failure_status(exc)))
                continue
            bandwidth = size / (us_graph * 1e-6) / 1e9 if us_graph else None
            rows.append(dict(base, impl=name, us=us, us_graph=us_graph, kv_gb_per_s=bandwidth, rel_err=error,
                             status=OK))
    del q, k, v, calls
    free_memory()
    return rows


def fastest_sdpa(rows: list[dict], point: tuple, field: str = "us_graph") -> dict | None:
    """The SDPA row with the least ``field`` at ``point`` = (dtype, D, batch, H_kv, N_k, N_q)."""
    candidates = [r for r in rows if r["impl"] in SDPA_IMPLS and r.get("status") == OK and r.get(field)
                  and _point(r) == point]
    return min(candidates, key=lambda r: r[field], default=None)


def _point(row: dict) -> tuple:
    return row["dtype"], row["head_dim"], row["batch"], row["heads_kv"], row["n_k"], row["n_q"]


def summary(rows: list[dict], copy_gb_per_s: float | None, impl: str = "flashlib",
            field: str = "us_graph") -> list[str]:
    """Lines: impl's speed over the fastest SDPA backend per point, and its K/V bandwidth for N_k >= 8k."""
    lines = [f"{'dtype':5} {'D':>4} {'B':>3} {'Hkv':>3} {'Nq':>2} {'N_k':>7} {impl:>14} {'best SDPA':>16} "
             f"{'ratio':>6} {'GB/s':>6}"]
    ratios, slow_bandwidth = [], []
    for row in rows:
        if row["impl"] != impl or row.get("status") != OK or not row.get(field):
            continue
        best = fastest_sdpa(rows, _point(row), field)
        ratio = best[field] / row[field] if best else None
        if ratio:
            ratios.append(ratio)
        gbps = row.get("kv_gb_per_s")
        if copy_gb_per_s and gbps and row["n_k"] >= 8192 and gbps < 0.8 * copy_gb_per_s:
            slow_bandwidth.append(row)
        best_text = f"{best['impl'][5:]} {best[field]:.1f}" if best else "-"
        lines.append(f"{row['dtype']:5} {row['head_dim']:>4} {row['batch']:>3} {row['heads_kv']:>3} "
                     f"{row['n_q']:>2} {row['n_k']:>7} {row[field]:>11.1f} us {best_text:>16} "
                     f"{ratio or float('nan'):>6.2f} {gbps or float('nan'):>6.0f}")
    if ratios:
        lines.append(f"{impl} / fastest SDPA ({field}): min {min(ratios):.2f}, median "
                     f"{statistics.median(ratios):.2f}, >= 1.0 at {sum(r >= 1.0 for r in ratios)} of {len(ratios)}")
    if copy_gb_per_s:
        lines.append(f"points with N_k >= 8k below 80% of the {copy_gb_per_s:.0f} GB/s copy: {len(slow_bandwidth)}")
    return lines


def stored_decode_results(directory=None) -> list[Path]:
    """Stored decoding results (``benchmarks/results/decode_*.json``), newest name last."""
    return sorted(Path(directory or RESULTS_DIR).glob("decode_*.json"))


def load_decode_results(path) -> tuple[dict, list[dict]]:
    """(meta, rows) of a decoding results file: a run of ``python -m flashlib.bench --mode decode``.

    Other scripts' files beside it (``decode_*.json`` of the A/B and sweep scripts in ``benchmarks/``)
    raise ValueError: their rows have no ``impl`` and their meta no GPU description.
    """
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or "meta" not in data or "rows" not in data:
        raise ValueError(f"{path}: expected a decoding results file with 'meta' and 'rows'")
    if not isinstance(data["meta"].get("gpu"), dict) or not all(
            isinstance(r, dict) and "impl" in r and "dtype" in r for r in data["rows"]):
        raise ValueError(f"{path}: not a run of `python -m flashlib.bench --mode decode` (its meta needs a GPU "
                         f"description and every row an 'impl' and a 'dtype')")
    return data["meta"], [{**{f: None for f in ROW_FIELDS}, **r} for r in data["rows"]]


def plot_decode(rows: list[dict], dtype: str = "fp16", field: str = "us_graph", ax=None):
    """flashlib's speed over the fastest SDPA backend against N_k, one line per (batch, H_kv), per D and N_q."""
    import matplotlib.pyplot as plt

    keys = sorted({(r["head_dim"], r["n_q"]) for r in rows if r["dtype"] == dtype})
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4), squeeze=False, sharey=True)
    for axis, (head_dim, n_q) in zip(axes[0], keys):
        for batch, heads_kv in sorted({(r["batch"], r["heads_kv"]) for r in rows}):
            points = []
            for r in rows:
                if (r["impl"], r["dtype"], r["head_dim"], r["n_q"], r["batch"], r["heads_kv"]) != (
                        "flashlib", dtype, head_dim, n_q, batch, heads_kv) or not r.get(field):
                    continue
                best = fastest_sdpa(rows, _point(r), field)
                if best:
                    points.append((r["n_k"], best[field] / r[field]))
            if points:
                axis.plot(*zip(*sorted(points)), marker="o", label=f"B={batch}, H_kv={heads_kv}")
        axis.axhline(1.0, color="gray", linestyle="--", linewidth=1)
        axis.set_xscale("log", base=2)
        axis.set_title(f"{dtype}, D={head_dim}, N_q={n_q}")
        axis.set_xlabel("cached keys N_k")
    axes[0][0].set_ylabel("fastest SDPA time / flashlib time")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def _meta(command: str, warmup: int, repeat: int, copy_gb_per_s) -> dict:
    method = (f"us: triton.testing.do_bench median of the eager call (warmup {warmup} ms, rep {repeat} ms), host "
              f"time included; us_graph: triton.testing.do_bench_cudagraph median (rep {repeat} ms), GPU time "
              "alone; kv_gb_per_s: K+V bytes / us_graph. causal=False for every impl; rel_err against the first "
              "impl's output on the same tensors.")
    return results_meta(method=method, command=command, copy_gb_per_s=copy_gb_per_s, page_size=PAGE_SIZE)


def build_parser() -> argparse.ArgumentParser:
    grid = CPU_GRID if runtime.INTERPRET else GPU_GRID
    p = argparse.ArgumentParser(prog="python -m flashlib.bench --mode decode",
                                description="Time decoding (few queries over a KV cache): flashlib's split-KV "
                                            "kernel, contiguous and paged, beside FlashAttention-2 and SDPA.")
    p.add_argument("--mode", choices=["decode"], default="decode")
    for flag, help_text in (("dtype", "dtypes"), ("d", "head dims"), ("batch", "batch sizes"),
                            ("heads-kv", "K/V heads (H_q is 32)"), ("nk", "cached keys N_k"),
                            ("nq", "new queries per sequence N_q")):
        key = flag.replace("-", "_")
        p.add_argument(f"--{flag}", default=grid[key], help=f"comma list of {help_text} (default {grid[key]})")
    p.add_argument("--impl", default=",".join(IMPLS), help=f"comma list of {list(IMPLS)}")
    p.add_argument("--warmup", type=int, default=5, help="do_bench warm-up, ms (default 5)")
    p.add_argument("--repeat", type=int, default=20, help="do_bench repetition, ms (default 20)")
    p.add_argument("--time-budget", type=float, help="seconds after which no new point starts")
    p.add_argument("--out", help="PREFIX: writes PREFIX.json (default benchmarks/results/decode_<gpu> on a GPU, a "
                                 "temporary file in the interpreter)")
    return p


def main(argv: list[str] | None = None) -> list[dict]:
    started = time.perf_counter()
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)

    def ints(text, name):
        try:
            return [int(x) for x in text.split(",")]
        except ValueError:
            parser.error(f"--{name} must be a comma list of ints; got {text!r}")

    dtypes = args.dtype.split(",")
    impls = args.impl.split(",")
    for name, values, known in (("dtype", dtypes, DTYPES), ("impl", impls, IMPLS)):
        unknown = [x for x in values if x not in known]
        if unknown:
            parser.error(f"--{name}: unknown {unknown}; choose from {list(known)}")
    heads_q = HEADS_Q["cpu" if runtime.INTERPRET else "gpu"]
    points = [(dtype, d, b, hkv, nk, nq) for dtype in dtypes for d in ints(args.d, "d")
              for b in ints(args.batch, "batch") for hkv in ints(args.heads_kv, "heads-kv")
              for nk in ints(args.nk, "nk") for nq in ints(args.nq, "nq")]
    if runtime.INTERPRET:
        prefix = Path(args.out or Path(tempfile.gettempdir()) / "flashlib_decode_interpreter")
    else:
        prefix = Path(args.out) if args.out else RESULTS_DIR / f"decode_{gpu_slug(detect_gpu().name)}"
    print(runtime.mode_description())
    copy = measure_ceilings(args.warmup, args.repeat)["hbm_gb_per_s"]
    meta = _meta(" ".join(["python -m flashlib.bench", *(shlex.quote(a) for a in argv)]), args.warmup,
                 args.repeat, copy)
    rows: list[dict] = []
    for dtype, d, b, hkv, nk, nq in points:
        if args.time_budget is not None and time.perf_counter() - started > args.time_budget:
            print(f"time budget reached: {len(points) - len({_point(r) for r in rows})} points not run")
            break
        rows += bench_point(dtype, d, b, heads_q, hkv, nk, nq, impls, args.warmup, args.repeat)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        prefix.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n",
                                               encoding="utf-8")
    field = "us" if runtime.INTERPRET else "us_graph"
    print("\n".join(summary(rows, copy, "flashlib", field)))
    if "flashlib_paged" in impls:
        paged = [r["us_graph"] / c["us_graph"] for r in rows if r["impl"] == "flashlib_paged" and r.get("us_graph")
                 for c in rows if c["impl"] == "flashlib" and c.get("us_graph") and _point(c) == _point(r)]
        if paged:
            print(f"paged / contiguous time: median {statistics.median(paged):.3f}, max {max(paged):.3f}")
    print(f"saved {prefix.with_suffix('.json')}")
    return rows
