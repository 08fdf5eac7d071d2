"""A/B of the split-KV merge launched as a programmatic dependent launch (PDL) or after the split grid.

``PYTHONPATH=. python3 benchmarks/decode_merge_pdl.py --out FILE.json``: for each shape (the decoding
grid's points where flashlib trailed SDPA, all split), CUDA-graph medians in microseconds of the library's
split-KV call with ``decode.MERGE_LAUNCHES_EARLY`` on and off, interleaved over ``--rounds`` after a
warm-up, plus SDPA's fastest backend, and the largest difference of O between the two (must be 0: the
same kernels, only the launch differs).
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics

import torch

from flashlib import detect_gpu
from flashlib.bench_decode import SDPA_IMPLS, graph_time_us, sdpa_call
from flashlib.kernels import decode

from decode_configs import warm_up  # noqa: E402  (benchmarks/ is the script's own folder)

#: (batch, H_kv, N_q, N_k, D), H_q = 32: the fp16 grid's points below 0.99x SDPA that split.
SHAPES = [(64, 1, 1, 1024, 128), (1, 1, 1, 1024, 64), (64, 1, 1, 1024, 64), (8, 8, 1, 1024, 64),
          (1, 1, 1, 1024, 128), (1, 8, 1, 8192, 128), (1, 32, 1, 1024, 128), (64, 1, 1, 4096, 128),
          (8, 1, 1, 1024, 128), (1, 32, 1, 4096, 64), (1, 8, 1, 8192, 64), (1, 8, 1, 1024, 64),
          (1, 32, 1, 16384, 64), (1, 8, 1, 131072, 64), (1, 8, 1, 16384, 128), (8, 8, 1, 1024, 128)]
HEADS_Q = 32
DEFAULT_EARLY = decode.MERGE_LAUNCHES_EARLY


def sdpa_us(q, k, v) -> float:
    """The fastest of SDPA's flash, cuDNN and efficient backends, called as the decoding bench calls them."""
    best = float("inf")
    for backend in SDPA_IMPLS.values():
        try:
            best = min(best, graph_time_us(sdpa_call(backend, q, k, v), repeat=10))
        except RuntimeError:
            continue
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dtype", default="float16")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    for batch, heads_kv, n_q, n_k, d in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(batch, n_q, HEADS_Q, d, device="cuda", dtype=dtype, generator=gen)
        k, v = (torch.randn(batch, n_k, heads_kv, d, device="cuda", dtype=dtype, generator=gen) for _ in range(2))
        outs = {}
        times = {True: [], False: []}

        def call(early, o, lse):
            decode.MERGE_LAUNCHES_EARLY = early
            decode.launch_splitkv_attention(q, k, v, o, lse, scale=d ** -0.5)

        buffers = {e: (torch.empty_like(q), torch.empty(batch, HEADS_Q, n_q, device="cuda")) for e in times}
        for early in times:
            call(early, *buffers[early])
            outs[early] = buffers[early][0].clone()
            warm_up(lambda e=early: call(e, *buffers[e]))
        for _ in range(args.rounds):
            for early in times:
                times[early].append(graph_time_us(lambda e=early: call(e, *buffers[e]), repeat=10))
        decode.MERGE_LAUNCHES_EARLY = DEFAULT_EARLY
        row = dict(batch=batch, heads_q=HEADS_Q, heads_kv=heads_kv, n_q=n_q, n_k=n_k, head_dim=d,
                   early_us=statistics.median(times[True]), after_us=statistics.median(times[False]),
                   sdpa_us=sdpa_us(q, k, v), max_abs_diff=(outs[True].float() - outs[False].float()).abs().max().item())
        rows.append(row)
        print(f"B{batch} Hkv{heads_kv} Nq{n_q} Nk{n_k} D{d}: early {row['early_us']:.2f} after {row['after_us']:.2f} "
              f"sdpa {row['sdpa_us']:.2f} us | sdpa/early {row['sdpa_us'] / row['early_us']:.3f} "
              f"sdpa/after {row['sdpa_us'] / row['after_us']:.3f} | diff {row['max_abs_diff']}", flush=True)
    gpu = detect_gpu()
    meta = dict(gpu=gpu.name, torch=torch.__version__, triton=__import__("triton").__version__,
                date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
                dtype=args.dtype, rounds=args.rounds,
                command=f"PYTHONPATH=. python3 benchmarks/decode_merge_pdl.py --rounds {args.rounds} --dtype {args.dtype}")
    with open(args.out, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
