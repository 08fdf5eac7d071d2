"""The paged cache against the contiguous one, per way of reading the block table (split-KV kernel).

``PYTHONPATH=. python3 benchmarks/decode_paged.py --out FILE.json``: CUDA-graph medians in microseconds,
fp16, D = 128, one query, pages shuffled over the pool; for each launch config, the contiguous cache,
and the paged cache. (The run stored in benchmarks/results/decode_paged_*.json compared two kernels
through a ``page_prefetch`` switch that is gone now: reading each block's page in the iteration that
uses it, and reading it one block ahead. The read ahead won everywhere and is the kernel's only way.)
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

SHAPES = [(1, 1, 131072), (64, 1, 16384), (8, 8, 32768), (1, 8, 131072), (64, 8, 8192), (8, 32, 16384),
          (1, 32, 1024)]


def graph_us(call) -> float:
    return graph_time_us(call, repeat=10)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               gpu=detect_gpu().as_dict(), torch=torch.__version__, triton=triton.__version__, rows=[])
    for batch, heads_kv, n_k in SHAPES:
        q = torch.randn(batch, 1, 32, 128, device="cuda", dtype=torch.float16)
        k, v = (torch.randn(batch, n_k, heads_kv, 128, device="cuda", dtype=torch.float16) for _ in range(2))
        o, lse = torch.empty_like(q), torch.empty(batch, 32, 1, device="cuda")
        lengths = torch.full((batch,), n_k, dtype=torch.int32, device="cuda")
        for page_size in (64, 256):
            pages = n_k // page_size
            order = torch.randperm(batch * pages, device="cuda")
            k_pool, v_pool = (torch.empty(batch * pages, page_size, heads_kv, 128, device="cuda", dtype=torch.float16)
                              for _ in range(2))
            k_pool[order] = k.view(batch * pages, page_size, heads_kv, 128)
            v_pool[order] = v.view(batch * pages, page_size, heads_kv, 128)
            table = order.view(batch, pages).int()
            for config in ((64, 3, 4), (32, 3, 4), (64, 3, 8)):
                row = dict(batch=batch, heads_kv=heads_kv, n_k=n_k, page_size=page_size, config=config)
                row["contiguous"] = graph_us(lambda: decode.launch_splitkv_attention(
                    q, k, v, o, lse, scale=0.088, k_lens=lengths, config=config))
                ref = o.clone()
                row["paged"] = graph_us(lambda: decode.launch_splitkv_attention(
                    q, k_pool, v_pool, o, lse, scale=0.088, k_lens=lengths, block_table=table, config=config))
                row["max_diff"] = float((o - ref).abs().max())
                out["rows"].append(row)
                print(f"B={batch} Hkv={heads_kv} N_k={n_k} page={page_size} {config}: contiguous "
                      f"{row['contiguous']:.1f}, paged {row['paged']:.1f} us (diff {row['max_diff']:.1e})", flush=True)
        torch.cuda.empty_cache()
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(out, handle, indent=1)


if __name__ == "__main__":
    main()
