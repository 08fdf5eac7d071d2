"""The front door measured on a GPU: host overhead per call, training at N = 512 against SDPA flash,
and what dropout, softcap and ALiBi cost.

    python benchmarks/front_door.py --out benchmarks/results/front_door_<gpu>.json

1. Host overhead. A tiny problem (one head, N = 128) keeps the GPU idle, so a loop of
   calls is bound by the host: the time per call is the host's. It is measured for the
   raw forward and backward launchers on preallocated tensors, for ``flash_attention``
   (argument checks, allocation, autograd when a gradient is wanted), for a training step,
   for autograd's own floor (a Function that does nothing), and for the custom op
   ``flashlib::attention_forward`` that torch.compile uses. Overhead = front door minus
   raw launcher(s) (and minus the floor, for a training step). ``--sections profile``
   prints a cProfile of the front door's host path.
2. Training step (forward + backward) at N = 512, fp16, the FlashAttention-2 benchmark shapes
   (B * N = 16384, H * D = 2048), flashlib against SDPA's flash backend, ``do_bench`` medians,
   and the kernels' own GPU time per step (torch.profiler), which shows a host-bound point;
   ``--train-dropout P`` gives both the same ``dropout_p``; ``--train-modes eager,reduce-overhead``
   also runs both under ``torch.compile(mode="reduce-overhead")`` (CUDA graphs: no host in the step).
3. Score modifiers and dropout at N = 4096: forward and forward + backward with each one on,
   as a ratio to the plain kernel.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time

import torch
import torch.nn.functional as F
import triton
import triton.testing
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashlib
from flashlib import flash_attention
from flashlib.kernels.attention_bwd import launch_attention_backward
from flashlib.kernels.attention_fwd import launch_attention_forward
from flashlib.spec import AttentionSpec


def host_us(fn, calls=3000, warmup=200, repeats=3) -> float:
    """Microseconds of host time per call of ``fn``: the best of ``repeats`` loops of ``calls`` calls issued without
    a sync, after ``warmup`` calls and a drained device. The GPU's queue absorbs the work of the calls as long as it
    is short (here a tiny problem) or the calls few (``benchmarks/short_rows_probe.py``: 50 calls of real sizes)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = time.perf_counter() - start
        torch.cuda.synchronize()
        best = min(best, elapsed / calls * 1e6)
    return best


def host_overhead() -> dict:
    q, k, v = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16) for _ in range(3))
    o, lse = torch.empty_like(q), torch.empty(1, 1, 128, device="cuda")
    spec = AttentionSpec(causal=True)
    grad_q, grad_k, grad_v = (t.clone().requires_grad_() for t in (q, k, v))
    settings = (q, k, v, None, None, None, None, 0, 0, "bhnd", True, -1, 0, 0.125, 0.0, 0.0)
    rows = {
        "raw launcher": host_us(lambda: launch_attention_forward(q, k, v, o, lse, spec=spec)),
        "flash_attention, no grad": host_us(lambda: flash_attention(q, k, v, causal=True)),
        "flash_attention, requires_grad": host_us(lambda: flash_attention(grad_q, grad_k, grad_v, causal=True)),
        "torch.ops.flashlib.attention_forward": host_us(lambda: torch.ops.flashlib.attention_forward(*settings)),
        "SDPA flash (for scale)": host_us(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    }
    do = torch.randn_like(q)

    def train_step():
        flash_attention(grad_q, grad_k, grad_v, causal=True).backward(do)
        grad_q.grad = grad_k.grad = grad_v.grad = None

    def floor_step():  # what autograd itself costs: a Function that allocates its outputs and does nothing
        _Floor.apply(grad_q, grad_k, grad_v).backward(do)
        grad_q.grad = grad_k.grad = grad_v.grad = None

    def raw_backward():
        launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec=spec)

    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    rows["raw backward launcher"] = host_us(raw_backward)
    rows["flash_attention, forward + backward"] = host_us(train_step, calls=1000)
    rows["autograd floor, forward + backward"] = host_us(floor_step, calls=1000)
    rows["overhead of flash_attention over the launcher"] = rows["flash_attention, no grad"] - rows["raw launcher"]
    rows["overhead of a training step over the launchers and autograd's floor"] = (
        rows["flash_attention, forward + backward"] - rows["raw launcher"] - rows["raw backward launcher"]
        - rows["autograd floor, forward + backward"])
    return rows


class _Floor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, grad):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def host_profile(top: int = 25) -> None:
    """cProfile of the host path (one head, N = 128), the functions that cost most printed first."""
    import cProfile
    import pstats
    q, k, v, do = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    steps = {"flash_attention, no grad": lambda: flash_attention(q, k, v, causal=True),
             "flash_attention, forward + backward": lambda: flash_attention(*leaves, causal=True).backward(do)}
    for name, step in steps.items():
        for _ in range(50):
            step()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(1000):
            step()
        profile.disable()
        torch.cuda.synchronize()
        print(f"== cProfile, 1000 calls: {name}", flush=True)
        pstats.Stats(profile).sort_stats("tottime").print_stats(top)


def bench(fn, grads=None) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=grads, return_mode="median"))


def kernel_ms(fn, grads, steps: int = 20) -> float:
    """GPU time of the kernels of one call of ``fn`` (torch.profiler): what the step costs when the host
    keeps up. Beside do_bench's wall time it says whether a point is bound by the host or the kernels."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            for g in grads:
                g.grad = None
            fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    total_us = sum(e.self_device_time_total for e in prof.key_averages() if e.device_type == cuda)
    return total_us / steps / 1000


def train_step_n512(rows: list, save, dropout_p: float = 0.0, modes=("eager",)) -> list[dict]:
    """Training steps at N = 512 (``dropout_p`` for both flashlib and SDPA flash, which supports it), in each
    of ``modes``: "eager", or a ``torch.compile`` mode (both sides compiled alike; "reduce-overhead"
    replays forward and backward from CUDA graphs, which takes the host out of the step)."""
    for mode in modes:
        for d in (64, 128):
            n, heads = 512, 2048 // d
            batch = 16384 // n
            for causal in (False, True):
                q, k, v, do = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.float16) for _ in range(4))
                leaves = [t.requires_grad_() for t in (q, k, v)]

                def attend(q, k, v, causal=causal):
                    return flash_attention(q, k, v, causal=causal, dropout_p=dropout_p)

                def sdpa_attend(q, k, v, causal=causal):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, dropout_p=dropout_p)

                if mode != "eager":
                    torch._dynamo.reset()
                    attend, sdpa_attend = torch.compile(attend, mode=mode), torch.compile(sdpa_attend, mode=mode)

                graphed = mode in ("reduce-overhead", "max-autotune")

                def new_step():
                    """Under CUDA graphs a step may reuse the last one's memory, the grads included (do_bench's
                    first runs keep them): drop them, as an optimizer's zero_grad(set_to_none=True) does."""
                    if graphed:
                        torch.compiler.cudagraph_mark_step_begin()
                        for t in leaves:
                            t.grad = None

                def ours(attend=attend):
                    new_step()
                    attend(*leaves).backward(do)

                def sdpa(sdpa_attend=sdpa_attend):
                    new_step()
                    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                        sdpa_attend(*leaves).backward(do)

                t_ours, t_sdpa = bench(ours, leaves), bench(sdpa, leaves)
                rows.append(dict(mode=mode, d=d, n=n, batch=batch, heads=heads, causal=causal, dropout_p=dropout_p,
                                 flashlib_ms=t_ours, sdpa_flash_ms=t_sdpa, speed_vs_sdpa_flash=t_sdpa / t_ours,
                                 flashlib_kernels_ms=kernel_ms(ours, leaves),
                                 sdpa_flash_kernels_ms=kernel_ms(sdpa, leaves)))
                print(rows[-1], flush=True)
                save()
    return rows


def modifiers_n4096(rows: list, save, only=None) -> list[dict]:
    for d in (64, 128):
        n, heads, batch = 4096, 2048 // d, 4
        q, k, v, do = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.float16) for _ in range(4))
        leaves = [t.requires_grad_() for t in (q, k, v)]
        slopes = torch.tensor([2.0 ** (-8 * (h + 1) / heads) for h in range(heads)], device="cuda")
        variants = {"plain": {}, "dropout 0.1": dict(dropout_p=0.1), "softcap 30": dict(softcap=30.0),
                    "alibi": dict(alibi_slopes=slopes)}
        if only is not None and ("plain" not in only or not set(only) <= set(variants)):
            raise SystemExit(f"--modifiers: expected names among {sorted(variants)}, 'plain' included (the "
                             f"baseline); got {only}")
        variants = {name: extra for name, extra in variants.items() if only is None or name in only}
        for causal in (False, True):
            base = {}
            for name, extra in variants.items():
                fwd = bench(lambda: flash_attention(q, k, v, causal=causal, **extra))
                train = bench(lambda: flash_attention(*leaves, causal=causal, **extra).backward(do), leaves)
                if name == "plain":
                    base = dict(fwd=fwd, train=train)
                rows.append(dict(d=d, n=n, causal=causal, variant=name, fwd_ms=fwd, train_ms=train,
                                 fwd_vs_plain=fwd / base["fwd"], train_vs_plain=train / base["train"]))
                print(rows[-1], flush=True)
            save()
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--sections", default="host,train,modifiers",
                        help="comma list of host, profile, train, modifiers (default host, train, modifiers)")
    parser.add_argument("--train-dropout", type=float, default=0.0,
                        help="dropout_p of the N = 512 training steps, for flashlib and SDPA flash (default 0)")
    parser.add_argument("--train-modes", default="eager",
                        help="comma list of eager and torch.compile modes (e.g. reduce-overhead) for the training "
                        "steps, both sides alike (default eager)")
    parser.add_argument("--modifiers", help="comma list of the modifier rows to run (default all: "
                        "'plain,dropout 0.1,softcap 30,alibi'; plain is the baseline, keep it)")
    args = parser.parse_args()
    modes = ("eager", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
    if not set(args.train_modes.split(",")) <= set(modes):
        parser.error(f"--train-modes takes a comma list of {', '.join(modes)}; got {args.train_modes!r}")
    results = dict(
        gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
        flashlib=flashlib.__version__, python=platform.python_version(),
        date=datetime.date.today().isoformat(), command="python benchmarks/front_door.py " + " ".join(sys.argv[1:]),
        host_overhead_us={}, train_step_n512=[], modifiers_n4096=[],
    )

    def save():  # after each row: a run cut short keeps what it measured
        if args.out:
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)

    sections = args.sections.split(",")
    if "host" in sections:
        results["host_overhead_us"] = host_overhead()
        print(json.dumps(results["host_overhead_us"], indent=1), flush=True)
        save()
    if "profile" in sections:
        host_profile()
    if "train" in sections:
        train_step_n512(results["train_step_n512"], save, args.train_dropout, args.train_modes.split(","))
    if "modifiers" in sections:
        modifiers_n4096(results["modifiers_n4096"], save,
                        args.modifiers.split(",") if args.modifiers else None)


if __name__ == "__main__":
    main()
