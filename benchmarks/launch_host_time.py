"""Host time per call of each route into the attention kernels, and where it goes (cProfile).

    PYTHONPATH=. python benchmarks/launch_host_time.py ["raw fwd launcher" ...]

One head, N = 128, fp16: the GPU work is tiny and queued asynchronously, so a loop of calls
is bound by the host and the time per call is the host's (``front_door.host_us``, best of 3
loops of 1000 calls). The names given on the command line are then profiled with cProfile
(1000 calls each). benchmarks/TUNING.md, sixth finding, quotes the results
(benchmarks/results/launch_host_time_nvidia_h100_80gb_hbm3.txt).
"""
import cProfile
import io
import pstats
import sys

import torch
import triton

from flashlib import flash_attention
from flashlib.kernels.attention_bwd import launch_attention_backward
from flashlib.kernels.attention_fwd import launch_attention_forward
from flashlib.spec import AttentionSpec
from front_door import host_us


@triton.jit
def noop(x):
    pass


def routes() -> dict:
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16) for _ in range(4))
    o, lse = torch.empty_like(q), torch.empty(1, 1, 128, device="cuda")
    spec = AttentionSpec(causal=True)
    gq, gk, gv = (t.clone().requires_grad_() for t in (q, k, v))
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    return {
        "noop triton kernel": lambda: noop[(1,)](q),
        "empty_like": lambda: torch.empty_like(q),
        "raw fwd launcher": lambda: launch_attention_forward(q, k, v, o, lse, spec=spec),
        "raw fwd launcher tma off": lambda: launch_attention_forward(q, k, v, o, lse, spec=spec, use_tma=False),
        "raw bwd launcher": lambda: launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec=spec),
        "flash_attention nograd": lambda: flash_attention(q, k, v, causal=True),
        "flash_attention fwd+bwd": lambda: flash_attention(gq, gk, gv, causal=True).backward(do),
    }


def main():
    fns = routes()
    for name, fn in fns.items():
        print(f"{name:30s} {host_us(fn, calls=1000):8.1f} us", flush=True)
    for name in sys.argv[1:]:
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(1000):
            fns[name]()
        profile.disable()
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(22)
        print("=====", name)
        print(out.getvalue()[-6000:])


if __name__ == "__main__":
    main()
