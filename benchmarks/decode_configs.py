"""Sweep the split-KV kernel's launch (BLOCK_N, stages, warps) and split count on shapes of the decoding grid.

``PYTHONPATH=. python3 benchmarks/decode_configs.py --out FILE.json``: CUDA-graph medians in
microseconds of the split and merge kernels together, fp16, D = 128, one query per sequence.
What it found sets ``GPU_CONFIGS`` and ``choose_num_splits`` in :mod:`flashlib.kernels.decode`.
"""
from __future__ import annotations

import argparse
import datetime
import json

import torch
import triton

from flashlib import detect_gpu
from flashlib.bench_decode import graph_time_us
from flashlib.kernels import decode

SHAPES = [(1, 32, 32768), (1, 32, 4096), (8, 8, 32768), (64, 8, 8192), (1, 8, 131072), (64, 1, 4096),
          (64, 1, 1024), (1, 8, 1024), (1, 1, 131072), (8, 32, 8192)]
CONFIGS = [(bn, s, w) for bn in (32, 64, 128) for s in (2, 3, 4) for w in (4, 8)]
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128)


def graph_us(call) -> float:
    return graph_time_us(call, repeat=10)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    results = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   gpu=detect_gpu().as_dict(), torch=torch.__version__, triton=triton.__version__, shapes=[])
    for batch, heads_kv, n_k in SHAPES:
        q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(batch, n_k, heads_kv, 128, device="cuda", dtype=torch.float16) for _ in range(2))
        o, lse = torch.empty_like(q), torch.empty(batch, 32, 1, device="cuda")
        times = {}
        for config in CONFIGS:
            for splits in SPLITS:
                if splits > 1 and splits * 128 > n_k:
                    continue
                try:
                    times[f"{config}/{splits}"] = graph_us(lambda: decode.launch_splitkv_attention(
                        q, k, v, o, lse, scale=0.088, num_splits=splits, config=config))
                except Exception as exc:  # out of shared memory
                    times[f"{config}/{splits}"] = str(exc)[:80]
        ok = {key: t for key, t in times.items() if isinstance(t, float)}
        best = sorted(ok, key=ok.get)[:5]
        gb = 2 * batch * n_k * heads_kv * 128 * 2 / 1e9
        print(f"B={batch} Hkv={heads_kv} N_k={n_k}: " + ", ".join(f"{b} {ok[b]:.1f} us ({gb / ok[b] * 1e6:.0f} GB/s)"
                                                                  for b in best), flush=True)
        results["shapes"].append(dict(batch=batch, heads_kv=heads_kv, n_k=n_k, us=times, best=best))
        torch.cuda.empty_cache()
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
