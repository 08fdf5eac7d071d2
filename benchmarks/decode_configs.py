"""Sweep the split-KV kernel's launch (BLOCK_N, stages, warps) and split count on shapes of the decoding grid.

``PYTHONPATH=. python3 benchmarks/decode_configs.py --out FILE.json [--head-dim 64] [--n-q 4] [--paged]``:
CUDA-graph medians in microseconds of the split and merge kernels together, one dtype and head dim.
Each shape also gets the time of the library's own choice (``launch_config`` and ``choose_num_splits``),
so a row says how far the heuristic is from the best config found. ``--rounds`` times every config
several times, interleaved, after a warm-up, and keeps the median (configs within 2-3% of each other are
within noise). With ``--paged`` the cache is also cut into pages of ``--page-size`` tokens shuffled over a
pool, and every config is timed on it too.
What it found sets ``launch_config`` and ``choose_num_splits`` in :mod:`flashlib.kernels.decode`.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time

import torch
import triton

from flashlib import detect_gpu
from flashlib.bench_decode import SDPA_IMPLS, graph_time_us, paged_copy, sdpa_call
from flashlib.kernels import decode

#: (batch, H_kv, N_k) of the first sweep (D = 128, N_q = 1), whose results are stored.
SHAPES = [(1, 32, 32768), (1, 32, 4096), (8, 8, 32768), (64, 8, 8192), (1, 8, 131072), (64, 1, 4096),
          (64, 1, 1024), (1, 8, 1024), (1, 1, 131072), (8, 32, 8192)]
CONFIGS = [(bn, s, w) for bn in (32, 64, 128) for s in (2, 3, 4) for w in (4, 8)]
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128)
HEADS_Q = 32


def parse_hints(text: str) -> list[tuple[str, str]]:
    """``"evict_first,;,.cg"`` -> [("evict_first", ""), ("", ".cg")]: K/V load hints, each timed on the library's launch."""
    return [tuple(part.split(",")) if "," in part else (part, "") for part in text.split(";") if part.strip()]


def hints_text(hints: tuple[str, str]) -> str:
    return "+".join(h for h in hints if h)


def graph_us(call) -> float:
    return graph_time_us(call, repeat=10)


def warm_up(call, seconds: float = 0.3) -> None:
    """Run ``call`` for a while first, so the GPU's clocks have ramped up before the first timing."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(20):
            call()
        torch.cuda.synchronize()


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``"1,32,4096;64,8,1024"`` -> [(1, 32, 4096), (64, 8, 1024)]."""
    return [tuple(int(x) for x in part.split(",")) for part in text.split(";") if part.strip()]


def sweep_shape(batch, heads_kv, n_k, args, deadline) -> dict:
    dtype = getattr(torch, args.dtype)
    q = torch.randn(batch, args.n_q, HEADS_Q, args.head_dim, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, n_k, heads_kv, args.head_dim, device="cuda", dtype=dtype) for _ in range(2))
    o, lse = torch.empty_like(q), torch.empty(batch, HEADS_Q, args.n_q, device="cuda")
    lengths = torch.full((batch,), n_k, dtype=torch.int32, device="cuda")
    caches = {"contiguous": (k, v, None)}
    if args.paged:
        caches["paged"] = paged_copy(k, v, torch.Generator().manual_seed(0), args.page_size)
    row = dict(batch=batch, heads_kv=heads_kv, n_k=n_k, head_dim=args.head_dim, n_q=args.n_q, dtype=args.dtype)
    for name, (kc, vc, table) in caches.items():
        def run(config=None, splits=None, hints=decode.NO_LOAD_HINTS):
            decode.launch_splitkv_attention(q, kc, vc, o, lse, scale=args.head_dim ** -0.5, k_lens=lengths,
                                            block_table=table, num_splits=splits, config=config,
                                            block_m=args.block_m, kv_load_hints=hints)
        warm_up(run)
        samples = {"heuristic": []}
        sdpa = {} if table is not None else {impl: sdpa_call(backend, q, k, v) for impl, backend in SDPA_IMPLS.items()
                                             if impl in args.sdpa}
        for _ in range(args.rounds):  # rounds interleave the configs, so a drifting clock hits them all alike
            samples["heuristic"].append(graph_us(run))
            for hints in args.hints:
                if hints != decode.NO_LOAD_HINTS:
                    samples.setdefault(f"heuristic/{hints_text(hints)}", []).append(graph_us(lambda: run(hints=hints)))
            for impl, call in sdpa.items():
                if not isinstance(samples.get(impl), str):
                    try:
                        samples.setdefault(impl, []).append(graph_us(call))
                    except Exception as exc:  # a backend that does not serve this shape
                        samples[impl] = str(exc)[:80]
            for config in args.configs:
                for splits in args.splits:
                    if (splits > 1 and splits * 128 > n_k) or time.monotonic() > deadline:
                        continue
                    splits = splits or None  # 0: the library's split count
                    key = f"{config}/{splits}"
                    if isinstance(samples.get(key), str):
                        continue
                    try:
                        samples.setdefault(key, []).append(graph_us(lambda: run(config, splits)))
                    except Exception as exc:  # out of shared memory
                        samples[key] = str(exc)[:80]
        times = {key: statistics.median(t) if isinstance(t, list) else t for key, t in samples.items()}
        ok = {key: t for key, t in times.items() if isinstance(t, float) and key not in SDPA_IMPLS}
        best = sorted(ok, key=ok.get)[:5]
        gb = 2 * batch * n_k * heads_kv * args.head_dim * q.element_size() / 1e9
        print(f"{name} B={batch} Hkv={heads_kv} N_k={n_k} D={args.head_dim} N_q={args.n_q}: heuristic "
              f"{times['heuristic']:.1f} us; best " + ", ".join(f"{b} {ok[b]:.1f}" for b in best)
              + f" ({gb / ok[best[0]] * 1e6:.0f} GB/s)"
              + "".join(f"; {impl} {t:.1f}" for impl, t in times.items() if impl in SDPA_IMPLS and isinstance(t, float))
              + "".join(f"; {key} {t:.1f}" for key, t in times.items() if key.startswith("heuristic/")), flush=True)
        row[name] = dict(us=times, best=best)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--n-q", type=int, default=1)
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--shapes", type=parse_shapes, default=SHAPES, help='"B,H_kv,N_k;B,H_kv,N_k;..."')
    parser.add_argument("--configs", type=lambda t: [tuple(int(x) for x in c.split(",")) for c in t.split(";")],
                        default=CONFIGS, help='"BLOCK_N,stages,warps;..."')
    parser.add_argument("--splits", type=lambda t: [int(x) for x in t.split(",")], default=SPLITS,
                        help="comma list; 0 is the library's own split count")
    parser.add_argument("--block-m", type=int, help="query rows per program (default: the library's choice)")
    parser.add_argument("--rounds", type=int, default=1, help="times every config is timed, interleaved (median)")
    parser.add_argument("--paged", action="store_true")
    parser.add_argument("--page-size", type=int, default=64)
    parser.add_argument("--hints", type=parse_hints, default=[], help='K/V load hints timed on the library\'s '
                        'launch: "evict_first;evict_last;,.cg" (eviction policy, cache modifier)')
    parser.add_argument("--sdpa", type=lambda t: [x for x in t.split(",") if x], default=[],
                        help="SDPA backends timed in the same rounds (contiguous cache): sdpa_flash,sdpa_cudnn,"
                             "sdpa_efficient")
    parser.add_argument("--time-budget", type=float, default=1e9, help="seconds; later configs are skipped")
    args = parser.parse_args()
    deadline = time.monotonic() + args.time_budget
    results = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   gpu=detect_gpu().as_dict(), torch=torch.__version__, triton=triton.__version__,
                   args={k: v for k, v in vars(args).items() if k != "out"}, shapes=[])
    for batch, heads_kv, n_k in args.shapes:
        results["shapes"].append(sweep_shape(batch, heads_kv, n_k, args, deadline))
        torch.cuda.empty_cache()
        with open(args.out, "w", encoding="utf-8") as handle:  # written after every shape: a cut run keeps its rows
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
