"""Ways of reading a paged cache's block table, timed side by side in one process.

``PYTHONPATH=. python3 benchmarks/decode_paged_read_ab.py --variant NAME=PATH[+STAGES] ... --out FILE.json
[--head-dims 64,128] [--dtype float16] [--rounds 2] [--time-budget S]``

Each ``--variant`` is a copy of ``flashlib/kernels/decode.py`` (another revision's, say, from ``git show
REV:flashlib/kernels/decode.py``), loaded as a module of its own so that its kernel compiles apart from the
others; ``+STAGES`` adds that many pipeline stages to the launch the copy plans (such a launch is not
register-capped: ``plan_splitkv_launch`` caps only the configs it chooses itself). For each point of the decoding
grid (H_q = 32, as ``decode_paged_gap.py``) the script times, in CUDA-graph medians, the library's contiguous
launch and every variant's paged launch over 64-token pages shuffled over a pool, rounds interleaved, and
records how far each paged output differs from the contiguous one (it must be 0 or nearly: same keys, same
order of blocks). One process and one copy of the data per point, so the variants share their contiguous
baseline and the data's placement.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import time

import torch

from flashlib.bench_decode import HEADS_Q, PAGE_SIZE, graph_time_us, paged_copy
from flashlib.bench_results import results_meta
from flashlib.kernels import decode

from decode_paged_gap import grid_points

METHOD = ("us: flashlib.bench_decode.graph_time_us (do_bench_cudagraph median, rep 10 ms) per round, median over "
          "rounds; the contiguous launch and each variant's paged launch interleaved in each round")


def load_variant(spec: str):
    """(name, module, extra stages) from NAME=PATH[+STAGES]."""
    name, _, rest = spec.partition("=")
    path, _, extra = rest.partition("+")
    module_spec = importlib.util.spec_from_file_location(f"flashlib.kernels.decode_variant_{name}", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return name, module, int(extra or 0)


def paged_call(module, extra_stages, q, k, v, table, lengths, out):
    batch, n_q, heads, head_dim = q.shape
    plan = module.plan_splitkv_launch(batch, heads, k.shape[2], n_q, table.shape[1] * k.shape[1], head_dim,
                                      q.element_size(), decode.multiprocessor_count(0), k.shape[1])
    block_n, stages, warps = plan.config
    # An overridden config is never register-capped (plan_splitkv_launch), so the copy plans its own launch
    # unless stages are added; added stages then run uncapped.
    config = (block_n, stages + extra_stages, warps) if extra_stages else None
    return (config or plan.config), lambda: module.launch_splitkv_attention(
        q, k, v, out[0], out[1], scale=head_dim ** -0.5, k_lens=lengths, block_table=table, config=config)


def time_point(batch, heads_kv, n_q, n_k, head_dim, dtype, rounds, variants) -> dict:
    heads = HEADS_Q["gpu"]
    q = torch.randn(batch, n_q, heads, head_dim, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, n_k, heads_kv, head_dim, device="cuda", dtype=dtype) for _ in range(2))
    lengths = torch.full((batch,), n_k, dtype=torch.int32, device="cuda")
    kp, vp, table = paged_copy(k, v, torch.Generator().manual_seed(0), PAGE_SIZE)
    outputs = {"contiguous": (torch.empty_like(q), torch.empty(batch, heads, n_q, device="cuda"))}
    calls = {"contiguous": lambda: decode.launch_splitkv_attention(
        q, k, v, outputs["contiguous"][0], outputs["contiguous"][1], scale=head_dim ** -0.5, k_lens=lengths)}
    configs = {}
    for name, module, extra in variants:
        outputs[name] = (torch.empty_like(q), torch.empty(batch, heads, n_q, device="cuda"))
        configs[name], calls[name] = paged_call(module, extra, q, kp, vp, table, lengths, outputs[name])
    samples = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            samples[name].append(graph_time_us(call, repeat=10))
    us = {name: statistics.median(t) for name, t in samples.items()}
    base = outputs["contiguous"][0].float()
    rel_diff = {name: ((outputs[name][0].float() - base).norm() / base.norm()).item() for name, *_ in variants}
    return dict(batch=batch, heads_q=heads, heads_kv=heads_kv, n_q=n_q, n_k=n_k, head_dim=head_dim,
                configs=configs, us=us, over_contiguous={name: us[name] / us["contiguous"] for name, *_ in variants},
                rel_diff=rel_diff)


def summary(rows: list[dict], names: list[str]) -> None:
    for head_dim in sorted({r["head_dim"] for r in rows}):
        mine = [r for r in rows if r["head_dim"] == head_dim]
        for name in names:
            ratios = [r["over_contiguous"][name] for r in mine]
            print(f"D={head_dim} {name:>12}: {len(ratios)} points, paged / contiguous median "
                  f"{statistics.median(ratios):.3f}, max {max(ratios):.2f}, within 10% {sum(x <= 1.1 for x in ratios)}, "
                  f"max rel_diff {max(r['rel_diff'][name] for r in mine):.1e}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", action="append", required=True, help="NAME=PATH[+STAGES]")
    parser.add_argument("--out", required=True)
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--time-budget", type=float, default=1e9, help="seconds; stops between points")
    args = parser.parse_args()
    variants = [load_variant(spec) for spec in args.variant]
    command = "PYTHONPATH=. python3 benchmarks/decode_paged_read_ab.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k not in ("out", "variant")) + "".join(
        f" --variant {spec}" for spec in args.variant)
    results = dict(meta=results_meta(method=METHOD, command=command), rows=[])
    began = time.perf_counter()
    for head_dim in (int(d) for d in args.head_dims.split(",")):
        for point in grid_points(head_dim):
            if time.perf_counter() - began > args.time_budget:
                results["meta"]["cut"] = f"stopped at {point} D={head_dim} by --time-budget"
                break
            results["rows"].append(time_point(*point, head_dim, getattr(torch, args.dtype), args.rounds, variants))
            torch.cuda.empty_cache()
            with open(args.out, "w", encoding="utf-8") as handle:  # a cut run keeps its rows
                json.dump(results, handle, indent=1)
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
    summary(results["rows"], [name for name, *_ in variants])


if __name__ == "__main__":
    main()
