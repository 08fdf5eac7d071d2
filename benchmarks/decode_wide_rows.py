"""128-row split-KV programs against 64-row ones, where a K/V head has 128 query rows (MQA, N_q = 4).

``PYTHONPATH=. python3 benchmarks/decode_wide_rows.py --out FILE.json [--dtype float16] [--rounds 3]``:
for every (B, N_k, D) of the decoding grid with H_q = 32, H_kv = 1 and N_q = 4, CUDA-graph medians in
microseconds of the split-KV launch with 64 rows per program (the rule before
:func:`flashlib.kernels.decode.choose_rows_per_program`; ``block_m=64``) and with the library's choice
now, on a contiguous cache and on 64-token pages shuffled over a pool. Rounds interleave the two, so
a drifting clock hits both alike. Each row also says which BLOCK_M the rule chose, and the two outputs
are compared (they must agree to rounding).
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

HEADS_Q, HEADS_KV, N_Q = 32, 1, 4
BATCHES = (1, 8, 64)
N_KS = (1024, 4096, 8192, 16384, 32768, 131072)


def time_shape(batch: int, n_k: int, head_dim: int, dtype: torch.dtype, rounds: int) -> dict:
    q = torch.randn(batch, N_Q, HEADS_Q, head_dim, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, n_k, HEADS_KV, head_dim, device="cuda", dtype=dtype) for _ in range(2))
    lengths = torch.full((batch,), n_k, dtype=torch.int32, device="cuda")
    rows = HEADS_Q // HEADS_KV * N_Q
    chosen = decode.choose_rows_per_program(rows, batch * HEADS_KV, n_k, decode.multiprocessor_count(0), head_dim,
                                            q.element_size())
    row = dict(batch=batch, heads_q=HEADS_Q, heads_kv=HEADS_KV, n_q=N_Q, n_k=n_k, head_dim=head_dim,
               block_m_chosen=chosen, rows_per_head=rows)
    caches = {"contiguous": (k, v, None), "paged": paged_copy(k, v, torch.Generator().manual_seed(0), 64)}
    torch.cuda.synchronize()
    for name, (kc, vc, table) in caches.items():
        outputs = {}

        def call(block_m, out):
            decode.launch_splitkv_attention(q, kc, vc, out[0], out[1], scale=head_dim ** -0.5, k_lens=lengths,
                                            block_table=table, block_m=block_m)

        samples = {"rows64": [], "library": []}
        for label, block_m in (("rows64", 64), ("library", None)):
            outputs[label] = (torch.empty_like(q), torch.empty(batch, HEADS_Q, N_Q, device="cuda"))
            call(block_m, outputs[label])
        for _ in range(rounds):
            for label, block_m in (("rows64", 64), ("library", None)):
                samples[label].append(graph_time_us(lambda: call(block_m, outputs[label]), repeat=10))
        a, b = outputs["rows64"][0].float(), outputs["library"][0].float()
        us = {label: statistics.median(t) for label, t in samples.items()}
        row[name] = dict(us=us, ratio=us["library"] / us["rows64"],
                         max_rel_diff=((a - b).norm() / a.norm()).item(),
                         kv_gb_per_s=2 * batch * n_k * HEADS_KV * head_dim * q.element_size() / us["library"] / 1e3)
        print(f"{name:>10} B={batch:>2} N_k={n_k:>6} D={head_dim:>3}: BLOCK_M {chosen:>3}, 64 rows "
              f"{us['rows64']:8.1f} us, library {us['library']:8.1f} us ({row[name]['ratio']:.2f}x), "
              f"O differs by {row[name]['max_rel_diff']:.1e}", flush=True)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", help='"B,N_k;B,N_k;..." (default: every batch and N_k of the grid)')
    args = parser.parse_args()
    results = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   gpu=detect_gpu().as_dict(), torch=torch.__version__, triton=triton.__version__,
                   command="PYTHONPATH=. python3 benchmarks/decode_wide_rows.py " + " ".join(
                       f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
                   rows=[])
    shapes = ([(b, n) for b in BATCHES for n in N_KS] if args.shapes is None else
              [tuple(int(x) for x in part.split(",")) for part in args.shapes.split(";") if part.strip()])
    for head_dim in (int(d) for d in args.head_dims.split(",")):
        for batch, n_k in shapes:
            results["rows"].append(time_shape(batch, n_k, head_dim, getattr(torch, args.dtype), args.rounds))
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            with open(args.out, "w", encoding="utf-8") as handle:  # a cut run keeps its rows
                json.dump(results, handle, indent=1)
    ratios = [r[c]["ratio"] for r in results["rows"] for c in ("contiguous", "paged") if r["block_m_chosen"] > 64]
    if ratios:
        print(f"where 128 rows were chosen: library / 64 rows {min(ratios):.2f} - {max(ratios):.2f}, "
              f"median {statistics.median(ratios):.2f} over {len(ratios)} calls")


if __name__ == "__main__":
    main()
