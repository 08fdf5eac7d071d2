"""Is the paged cache's gap to the contiguous one the kernel's or the memory's? Pages in order against shuffled.

``PYTHONPATH=. python3 benchmarks/decode_paged_locality.py --out FILE.json``: CUDA-graph medians in
microseconds of the library's split-KV call (its own split count and launch config) on the same K/V,
stored three ways: contiguous; paged with the pages in order in the pool (the block table is
``arange``: the kernel does all of its paged work, the memory sees the contiguous addresses); and paged
with the pages shuffled over the pool (as ``python -m flashlib.bench --mode decode`` stores them). If
in-order pages run as fast as contiguous and shuffled ones do not, the gap comes from where the pages
lie (DRAM and TLB locality of small pages), not from the kernel's table reads. Page sizes 64 and 256
tokens; shapes where the decoding grid's paged times trailed most (MQA, D = 64).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics

import torch
import triton

from flashlib import detect_gpu
from flashlib.bench_decode import graph_time_us, paged_copy
from flashlib.kernels import decode

#: (batch, H_kv, N_q, N_k, D), H_q = 32.
SHAPES = [(64, 1, 4, 32768, 64), (64, 1, 1, 16384, 64), (8, 1, 4, 131072, 64), (1, 1, 1, 131072, 64),
          (64, 1, 4, 32768, 128), (8, 8, 1, 32768, 64)]
HEADS_Q = 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for batch, heads_kv, n_q, n_k, d in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(batch, n_q, HEADS_Q, d, device="cuda", dtype=torch.float16, generator=gen)
        k, v = (torch.randn(batch, n_k, heads_kv, d, device="cuda", dtype=torch.float16, generator=gen)
                for _ in range(2))
        lengths = torch.full((batch,), n_k, dtype=torch.int32, device="cuda")
        o, lse = torch.empty_like(q), torch.empty(batch, HEADS_Q, n_q, device="cuda")
        calls = {"contiguous": lambda: decode.launch_splitkv_attention(q, k, v, o, lse, scale=d ** -0.5,
                                                                        k_lens=lengths)}
        pools = {}
        for page_size in (64, 256):
            for order_name, shuffle in (("in_order", False), ("shuffled", True)):
                kp, vp, table = paged_copy(k, v, torch.Generator().manual_seed(0), page_size, shuffle=shuffle)
                pools[(page_size, order_name)] = (kp, vp, table)
                calls[f"paged{page_size}_{order_name}"] = (
                    lambda kp=kp, vp=vp, table=table: decode.launch_splitkv_attention(
                        q, kp, vp, o, lse, scale=d ** -0.5, k_lens=lengths, block_table=table))
        outputs = {}
        for name, call in calls.items():
            call()
            outputs[name] = o.clone()
        times = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                times[name].append(graph_time_us(call, repeat=10))
        row = dict(batch=batch, heads_q=HEADS_Q, heads_kv=heads_kv, n_q=n_q, n_k=n_k, head_dim=d,
                   us={name: statistics.median(t) for name, t in times.items()},
                   max_abs_diff=max(float((out - outputs["contiguous"]).abs().max()) for out in outputs.values()))
        rows.append(row)
        base = row["us"]["contiguous"]
        print(f"B{batch} Hkv{heads_kv} Nq{n_q} Nk{n_k} D{d}: contiguous {base:.1f} us; "
              + ", ".join(f"{name} {us / base:.2f}x" for name, us in row["us"].items() if name != "contiguous")
              + f" | diff {row['max_abs_diff']:.1e}", flush=True)
        del pools, calls
        torch.cuda.empty_cache()
    meta = dict(gpu=detect_gpu().name, torch=torch.__version__, triton=triton.__version__,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
                command=f"PYTHONPATH=. python3 benchmarks/decode_paged_locality.py --rounds {args.rounds}")
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(dict(meta=meta, rows=rows), handle, indent=1)


if __name__ == "__main__":
    main()
