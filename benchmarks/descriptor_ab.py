"""Same-process A/B of tensor descriptors, in pure GPU time (CUDA graphs), FA2 benchmark shapes, fp16.

    PYTHONPATH=. python benchmarks/descriptor_ab.py forward    # host descriptors against in-kernel ones
    PYTHONPATH=. python benchmarks/descriptor_ab.py backward   # descriptors against pointers

``triton.testing.do_bench_cudagraph`` replays the launches in a CUDA graph, so the host's
time is out of the measurement. benchmarks/TUNING.md (sixth finding) quotes the results
(benchmarks/results/launch_host_time_nvidia_h100_80gb_hbm3.txt).
"""
import sys

import torch

from flashlib.kernels import attention_fwd
from flashlib.kernels.attention_bwd import launch_attention_backward
from flashlib.kernels.attention_fwd import launch_attention_forward
from flashlib.spec import AttentionSpec
from flashlib.timing import graph_time_ms

REAL_MODE = attention_fwd.descriptor_mode


def forced(mode):
    """A descriptor-mode rule that takes ``mode`` for plain batches (padded ones keep the real rule)."""
    def pick(use_tma, *, padded):
        return REAL_MODE(use_tma, padded=padded) if padded or mode == "host" else "device"
    return pick


def main():
    which = sys.argv[1] if len(sys.argv) > 1 else "forward"
    variants = ("host", "device") if which == "forward" else (True, False)
    for d in (64, 128):
        for n in (1024, 4096, 16384):
            for causal in (False, True):
                b, h = 16384 // n, 2048 // d
                q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.float16) for _ in range(4))
                o, lse = torch.empty_like(q), torch.empty(b, h, n, device="cuda")
                spec = AttentionSpec(causal=causal)
                launch_attention_forward(q, k, v, o, lse, spec=spec)
                dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
                flops = 4 * b * h * n * n * d / (2 if causal else 1) * (1 if which == "forward" else 2.5)
                row = []
                for variant in variants:
                    if which == "forward":
                        attention_fwd.descriptor_mode = forced(variant)
                        # use_gluon=False: the Triton kernels' descriptors; the route would take Gluon's (session 64)
                        fn = lambda: launch_attention_forward(q, k, v, o, lse, spec=spec, use_gluon=False)  # noqa: E731
                    else:
                        fn = lambda: launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec=spec,  # noqa: E731
                                                               use_tma=variant, use_gluon=False)
                    fn()
                    ms = graph_time_ms(fn, rep=100)
                    row.append(f"{variant}: {ms * 1e3:7.1f} us {flops / ms / 1e9:5.0f} TF")
                print(f"D{d} N{n} causal={causal}: " + " | ".join(row), flush=True)
    attention_fwd.descriptor_mode = REAL_MODE


if __name__ == "__main__":
    main()
