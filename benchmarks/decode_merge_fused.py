"""A/B of where a split-KV grid's partials are merged: a second kernel, or the split kernel's last program.

``PYTHONPATH=.:benchmarks python3 benchmarks/decode_merge_fused.py --out FILE.json``: for each shape (the
decoding grid's split points where flashlib trailed SDPA, and two long caches), CUDA-graph medians in
microseconds of the library's split-KV call in three forms, interleaved over ``--rounds`` after a warm-up:

* ``kernel``: the merge kernel, launched as a programmatic dependent of the split grid (the default);
* ``fused_zeros``: ``decode.MERGE_IN_SPLIT_KERNEL``, with the completion counters zeroed by the call
  (one memset per call);
* ``fused_kept``: the same with one zeroed counter buffer kept across calls (the kernel leaves it zero),
  the lower bound of what the counters cost.

Also SDPA's fastest backend and the largest difference of O from ``kernel`` (rounding: the in-kernel
merge adds the partials in another order).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics

import torch

from flashlib import detect_gpu
from flashlib.kernels import decode

from decode_configs import warm_up  # noqa: E402  (benchmarks/ is the script's own folder)
from decode_merge_pdl import HEADS_Q, SHAPES, sdpa_us  # noqa: E402

LONG = [(1, 8, 1, 131072, 128), (1, 32, 1, 32768, 128), (8, 8, 1, 32768, 64)]
MODES = ("kernel", "fused_zeros", "fused_kept")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtype", default="float16")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    default = decode.MERGE_IN_SPLIT_KERNEL
    rows = []
    for batch, heads_kv, n_q, n_k, d in SHAPES + LONG:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(batch, n_q, HEADS_Q, d, device="cuda", dtype=dtype, generator=gen)
        k, v = (torch.randn(batch, n_k, heads_kv, d, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
        kept = torch.zeros(batch * heads_kv * 64, dtype=torch.int32, device="cuda")
        buffers = {m: (torch.empty_like(q), torch.empty(batch, HEADS_Q, n_q, device="cuda")) for m in MODES}

        def call(mode):
            decode.MERGE_IN_SPLIT_KERNEL = mode != "kernel"
            o, lse = buffers[mode]
            decode.launch_splitkv_attention(q, k, v, o, lse, scale=d ** -0.5,
                                            counters=kept if mode == "fused_kept" else None)

        outs, times = {}, {m: [] for m in MODES}
        for mode in MODES:
            call(mode)
            outs[mode] = buffers[mode][0].clone()
            warm_up(lambda m=mode: call(m))
        from flashlib.bench_decode import graph_time_us
        for _ in range(args.rounds):
            for mode in MODES:
                times[mode].append(graph_time_us(lambda m=mode: call(m), repeat=10))
        decode.MERGE_IN_SPLIT_KERNEL = default
        row = dict(batch=batch, heads_q=HEADS_Q, heads_kv=heads_kv, n_q=n_q, n_k=n_k, head_dim=d,
                   **{f"{m}_us": statistics.median(times[m]) for m in MODES}, sdpa_us=sdpa_us(q, k, v),
                   max_abs_diff={m: (outs[m].float() - outs["kernel"].float()).abs().max().item() for m in MODES},
                   counters_left=int(kept.abs().sum()))
        rows.append(row)
        print(f"B{batch} Hkv{heads_kv} Nq{n_q} Nk{n_k} D{d}: " + " ".join(f"{m} {row[m + '_us']:.2f}" for m in MODES)
              + f" sdpa {row['sdpa_us']:.2f} us | sdpa/" + " sdpa/".join(
                  f"{m} {row['sdpa_us'] / row[m + '_us']:.3f}" for m in MODES)
              + f" | diff {row['max_abs_diff']} left {row['counters_left']}", flush=True)
    gpu = detect_gpu()
    meta = dict(gpu=gpu.name, torch=torch.__version__, triton=__import__("triton").__version__,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
                dtype=args.dtype, rounds=args.rounds,
                command=f"PYTHONPATH=.:benchmarks python3 benchmarks/decode_merge_fused.py --rounds {args.rounds} "
                        f"--dtype {args.dtype}")
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
