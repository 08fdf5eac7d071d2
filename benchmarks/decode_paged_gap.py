"""The paged cache's time over the contiguous cache's, at every point of the decoding grid for one head dim.

``PYTHONPATH=. python3 benchmarks/decode_paged_gap.py --out FILE.json [--head-dim 64] [--dtype float16]
[--rounds 2] [--against OTHER.json]``: for each (B, H_kv, N_q, N_k) of the decoding grid (H_q = 32), CUDA-graph
medians in microseconds of the split-KV launch the library chooses, on a contiguous cache and on a copy in
64-token pages shuffled over a pool (as ``python -m flashlib.bench --mode decode``). Rounds interleave the two
caches. Each row also records the launch (BLOCK_M, BLOCK_N, splits) and how far the two outputs differ.

Run by two checkouts of flashlib in turn (``PYTHONPATH=before`` then ``PYTHONPATH=.``; each needs
``plan_splitkv_launch``, session 27 on), the contiguous launch, which neither changes, tells the drift between the
runs apart from the change; ``--against`` prints both runs' paged / contiguous ratios side by side.
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch

from flashlib.bench_decode import GPU_GRID, HEADS_Q, PAGE_SIZE, graph_time_us, paged_copy
from flashlib.bench_results import results_meta
from flashlib.kernels import decode

METHOD = ("us: flashlib.bench_decode.graph_time_us (do_bench_cudagraph median, rep 10 ms) per round, median over "
          "rounds; contiguous and paged interleaved in each round; rel_diff: paged O against contiguous O")


def grid_points(head_dim: int) -> list[tuple[int, int, int, int]]:
    """(B, H_kv, N_q, N_k) of the decoding grid."""
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    return [(b, h, nq, nk) for b in ints(GPU_GRID["batch"]) for h in ints(GPU_GRID["heads_kv"])
            for nq in ints(GPU_GRID["nq"]) for nk in ints(GPU_GRID["nk"])
            if 2 * b * h * nk * head_dim * 2 <= 8e9]


def the_launch(batch: int, heads_kv: int, n_q: int, n_k: int, head_dim: int, elem: int) -> dict:
    """BLOCK_M, splits, (BLOCK_N, stages, warps) and the paged launch's register cap the library picks here."""
    plan = decode.plan_splitkv_launch(batch, HEADS_Q["gpu"], heads_kv, n_q, n_k, head_dim, elem,
                                      decode.multiprocessor_count(0), PAGE_SIZE)
    block_n, stages, warps = plan.config
    return dict(block_m=plan.block_m, splits=plan.num_splits, block_n=block_n, stages=stages, warps=warps,
                paged_maxnreg=plan.maxnreg)


def time_point(batch, heads_kv, n_q, n_k, head_dim, dtype, rounds) -> dict:
    heads = HEADS_Q["gpu"]
    q = torch.randn(batch, n_q, heads, head_dim, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, n_k, heads_kv, head_dim, device="cuda", dtype=dtype) for _ in range(2))
    lengths = torch.full((batch,), n_k, dtype=torch.int32, device="cuda")
    caches = {"contiguous": (k, v, None), "paged": paged_copy(k, v, torch.Generator().manual_seed(0), PAGE_SIZE)}
    outputs, calls = {}, {}
    for name, (kc, vc, table) in caches.items():
        out = (torch.empty_like(q), torch.empty(batch, heads, n_q, device="cuda"))
        outputs[name] = out
        calls[name] = (lambda kc=kc, vc=vc, table=table, out=out: decode.launch_splitkv_attention(
            q, kc, vc, out[0], out[1], scale=head_dim ** -0.5, k_lens=lengths, block_table=table))
        calls[name]()
    samples = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            samples[name].append(graph_time_us(call, repeat=10))
    us = {name: statistics.median(t) for name, t in samples.items()}
    a, b = outputs["contiguous"][0].float(), outputs["paged"][0].float()
    return dict(batch=batch, heads_q=heads, heads_kv=heads_kv, n_q=n_q, n_k=n_k, head_dim=head_dim,
                launch=the_launch(batch, heads_kv, n_q, n_k, head_dim, q.element_size()), us=us,
                paged_over_contiguous=us["paged"] / us["contiguous"],
                rel_diff=((a - b).norm() / a.norm()).item())


def compare(mine: dict, other: dict) -> None:
    """Both runs' paged / contiguous ratios, and the contiguous drift between them, per point."""
    key = lambda r: (r["batch"], r["heads_kv"], r["n_q"], r["n_k"], r["head_dim"])  # noqa: E731
    theirs = {key(r): r for r in other["rows"]}
    print(f"{'B':>3} {'H_kv':>4} {'N_q':>3} {'N_k':>6}  BLOCK_N  other  this  contiguous this/other")
    for row in mine["rows"]:
        old = theirs.get(key(row))
        if old is not None:
            print(f"{row['batch']:>3} {row['heads_kv']:>4} {row['n_q']:>3} {row['n_k']:>6}  {row['launch']['block_n']:>7}"
                  f"  {old['paged_over_contiguous']:.2f}  {row['paged_over_contiguous']:.2f}"
                  f"  {row['us']['contiguous'] / old['us']['contiguous']:.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--against", help="an earlier run's file, to print side by side")
    args = parser.parse_args()
    command = "PYTHONPATH=. python3 benchmarks/decode_paged_gap.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out", "against"))
    results = dict(meta=results_meta(method=METHOD, command=command), rows=[])
    for point in grid_points(args.head_dim):
        results["rows"].append(time_point(*point, args.head_dim, getattr(torch, args.dtype), args.rounds))
        torch.cuda.empty_cache()
        with open(args.out, "w", encoding="utf-8") as handle:  # a cut run keeps its rows
            json.dump(results, handle, indent=1)
    ratios = [r["paged_over_contiguous"] for r in results["rows"]]
    print(f"paged / contiguous over {len(ratios)} points: median {statistics.median(ratios):.3f}, "
          f"max {max(ratios):.2f}, within 10%: {sum(x <= 1.1 for x in ratios)}")
    if args.against:
        with open(args.against, encoding="utf-8") as handle:
            compare(results, json.load(handle))


if __name__ == "__main__":
    main()
