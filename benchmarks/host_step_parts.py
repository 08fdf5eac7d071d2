"""Where a training step's host time goes, on a GPU host.

    PYTHONPATH=. python3 benchmarks/host_step_parts.py      (a CUDA GPU)

One head, N = 128: the GPU stays idle, so each time is the host's (``front_door.host_us``).

1. The parts of a step: autograd's floor (a Function that does nothing), the raw forward and
   backward launchers, the launchers inside a Function (so the backward one runs on autograd's
   device thread), a ``flash_attention`` step, the same with its launchers replaced by no-ops,
   and whether every launch of a step comes from the compiled-binary cache.
2. One launch inside autograd's backward against the same launch on the main thread and in a
   plain Python thread: nothing, a no-op Triton kernel, the raw forward and backward launchers.

Used in benchmarks/TUNING.md (seventh finding); output in results/host_path_<gpu>.txt.
"""
from __future__ import annotations

import threading
import time

import torch
import triton
from front_door import host_us

import flashlib.ops as ops
from flashlib import flash_attention
from flashlib.kernels import launch as launch_module
from flashlib.kernels.attention_bwd import launch_attention_backward
from flashlib.kernels.attention_fwd import launch_attention_forward
from flashlib.spec import AttentionSpec


@triton.jit
def noop(x):
    pass


q, k, v, do = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16) for _ in range(4))
leaves = [t.clone().requires_grad_() for t in (q, k, v)]
spec = AttentionSpec(causal=True)
o, lse = torch.empty_like(q), torch.empty(1, 1, 128, device="cuda")
dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
launch_attention_forward(q, k, v, o, lse, spec=spec)  # a valid L for the backward launcher


def backward_through(fn) -> None:
    """fn(*leaves).backward(do), then the gradients dropped (as ``zero_grad(set_to_none=True)``)."""
    fn(*leaves).backward(do)
    for t in leaves:
        t.grad = None


def flash_step(*tensors):
    return flash_attention(*tensors, causal=True)


class Floor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, g):
        return torch.empty_like(g), torch.empty_like(g), torch.empty_like(g)


class RawLaunchers(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q_, k_, v_):
        launch_attention_forward(q, k, v, o, lse, spec=spec)
        return o.clone()

    @staticmethod
    def backward(ctx, g):
        launch_attention_backward(q, k, v, o, lse, g, dq, dk, dv, spec=spec)
        return dq, dk, dv


def step_parts() -> None:
    rows = {
        "autograd floor": host_us(lambda: backward_through(Floor.apply)),
        "raw forward launcher": host_us(lambda: launch_attention_forward(q, k, v, o, lse, spec=spec)),
        "raw backward launcher": host_us(lambda: launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv,
                                                                           spec=spec)),
        "raw launchers inside a Function": host_us(lambda: backward_through(RawLaunchers.apply)),
        "flash_attention step": host_us(lambda: backward_through(flash_step)),
    }
    counts = {"from the cache": 0, "through Triton": 0}
    real_launch, real_remember = launch_module._launch_compiled, launch_module._remember

    def counted(name, real):
        def call(*args):
            counts[name] += 1
            return real(*args)
        return call

    launch_module._launch_compiled = counted("from the cache", real_launch)
    launch_module._remember = counted("through Triton", real_remember)
    for _ in range(10):
        backward_through(flash_step)
    torch.cuda.synchronize()
    launch_module._launch_compiled, launch_module._remember = real_launch, real_remember
    print("launches of 10 steps:", counts)
    real_forward, real_backward = ops.launch_attention_forward, ops.launch_attention_backward
    ops.launch_attention_forward = ops.launch_attention_backward = lambda *args, **kwargs: None
    rows["flash_attention step, launchers no-op"] = host_us(lambda: backward_through(flash_step))
    with torch.no_grad():
        rows["flash_attention no grad, launcher no-op"] = host_us(lambda: flash_attention(q, k, v, causal=True))
    ops.launch_attention_forward, ops.launch_attention_backward = real_forward, real_backward
    for name, us in rows.items():
        print(f"{name:42s} {us:8.1f} us")


WORK = {
    "nothing": lambda: None,
    "noop kernel": lambda: noop[(1,)](q),
    "raw fwd": lambda: launch_attention_forward(q, k, v, o, lse, spec=spec),
    "raw bwd": lambda: launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec=spec),
}
inside: dict[str, list[float]] = {}


class Probe(torch.autograd.Function):
    """Its backward runs ``WORK[name]`` and times it there, on autograd's thread."""

    @staticmethod
    def forward(ctx, x, name):
        ctx.name = name
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        begin = time.perf_counter()
        WORK[ctx.name]()
        inside.setdefault(ctx.name, []).append(time.perf_counter() - begin)
        return g, None


def launches_in_backward() -> None:
    for name, work in WORK.items():
        def step():
            Probe.apply(leaves[0], name).backward(do)
            leaves[0].grad = None

        total = host_us(step)
        inside.clear()
        host_us(step, 500)
        per_call = sum(inside[name]) / len(inside[name]) * 1e6
        print(f"{name:12s} step {total:7.1f} us | the work timed inside backward {per_call:7.1f} us | "
              f"outside autograd {host_us(work):7.1f} us", flush=True)
    for name in ("noop kernel", "raw bwd"):
        result = {}
        thread = threading.Thread(target=lambda: result.update(us=host_us(WORK[name])))
        thread.start()
        thread.join()
        print(f"{name} in a plain thread: {result['us']:.1f} us")


if __name__ == "__main__":
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    step_parts()
    launches_in_backward()
