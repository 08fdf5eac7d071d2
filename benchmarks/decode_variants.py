"""Measure the two choices of decoding: how many key chunks (split-KV), and which kernel (select_variant).

``PYTHONPATH=. python3 benchmarks/decode_variants.py --out benchmarks/results/decode_variants_<gpu>.json``

1. ``splits``: for shapes from the decoding grid, the CUDA-graph time of the split-KV kernel
   at every split count from 1 to 128 beside the heuristic's own choice
   (:func:`flashlib.kernels.decode.choose_num_splits`), so the heuristic can be judged.
2. ``crossover``: split-KV against FlashAttention-2 as the queries per sequence grow, the
   measurement behind :data:`flashlib.variants.SPLITKV_MAX_QUERIES`.

Times are ``triton.testing.do_bench_cudagraph`` medians in microseconds (GPU time alone).
"""
from __future__ import annotations

import argparse
import datetime
import json

import torch
import triton

from flashlib import detect_gpu, flash_attention
from flashlib.bench_decode import graph_time_us
from flashlib.kernels import decode


def graph_us(call) -> float:
    return graph_time_us(call, repeat=20)


def inputs(batch, heads_kv, n_k, n_q, head_dim, heads=32):
    q = torch.randn(batch, n_q, heads, head_dim, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(batch, n_k, heads_kv, head_dim, device="cuda", dtype=torch.float16) for _ in range(2))
    return q, k, v


def split_sweep(batch, heads_kv, n_k, head_dim=128) -> dict:
    q, k, v = inputs(batch, heads_kv, n_k, 1, head_dim)
    o = torch.empty_like(q)
    lse = torch.empty(batch, q.shape[2], 1, device="cuda")

    def run(splits):
        return lambda: decode.launch_splitkv_attention(q, k, v, o, lse, scale=head_dim ** -0.5, num_splits=splits)

    times = {str(s): graph_us(run(s)) for s in (1, 2, 4, 8, 16, 32, 64, 128) if s * 256 <= n_k or s == 1}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    chosen = decode.choose_num_splits(batch * heads_kv, n_k, sms)
    times["heuristic"] = graph_us(run(None))
    best = min((t, s) for s, t in times.items() if s != "heuristic")
    return dict(batch=batch, heads_kv=heads_kv, n_k=n_k, head_dim=head_dim, heuristic_splits=chosen, us=times,
                best_splits=best[1], heuristic_over_best=times["heuristic"] / best[0])


def crossover(batch, heads_kv, n_k, n_q, head_dim=128) -> dict:
    q, k, v = inputs(batch, heads_kv, n_k, n_q, head_dim)
    with torch.no_grad():
        fa2 = graph_us(lambda: flash_attention(q, k, v, layout="bnhd", variant="fa2"))
        split = graph_us(lambda: flash_attention(q, k, v, layout="bnhd", variant="splitkv"))
    return dict(batch=batch, heads_kv=heads_kv, n_k=n_k, n_q=n_q, head_dim=head_dim, fa2_us=fa2, splitkv_us=split,
                fa2_over_splitkv=fa2 / split)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  gpu=detect_gpu().as_dict(), torch=torch.__version__, triton=triton.__version__,
                  command="PYTHONPATH=. python3 benchmarks/decode_variants.py --out " + args.out,
                  splits=[], crossover=[])
    for batch, heads_kv, n_k in [(1, 32, 4096), (1, 8, 32768), (1, 8, 131072), (1, 1, 131072), (8, 8, 8192),
                                 (8, 32, 32768), (8, 1, 16384), (64, 8, 4096), (64, 1, 32768)]:
        row = split_sweep(batch, heads_kv, n_k)
        result["splits"].append(row)
        print(f"splits B={batch} Hkv={heads_kv} N_k={n_k}: heuristic {row['heuristic_splits']} "
              f"({row['us']['heuristic']:.1f} us), best {row['best_splits']} ({row['us'][row['best_splits']]:.1f} us)",
              flush=True)
    for batch, heads_kv, n_k in [(1, 8, 32768), (8, 32, 4096), (8, 8, 16384), (64, 8, 2048)]:
        for n_q in (1, 4, 16, 32, 64, 128, 256):
            row = crossover(batch, heads_kv, n_k, n_q)
            result["crossover"].append(row)
            print(f"crossover B={batch} Hkv={heads_kv} N_k={n_k} N_q={n_q}: fa2 {row['fa2_us']:.1f} us, "
                  f"splitkv {row['splitkv_us']:.1f} us ({row['fa2_over_splitkv']:.2f}x)", flush=True)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
