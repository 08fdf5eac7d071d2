"""Host time of a kernel launch inside autograd's backward, against the same launch on the main thread.

    PYTHONPATH=. python3 benchmarks/launch_in_backward.py      (a CUDA GPU)

On a GPU, autograd runs backward functions on its own device thread. Each row times a loop of
backward passes through a Function whose backward does one piece of work (nothing, a no-op Triton
kernel, flashlib's raw forward or backward launcher; one head, N = 128, so the GPU stays idle and the
time is the host's), the same work timed inside the backward, and outside autograd; then the same
work in a plain Python thread. Used in benchmarks/TUNING.md (seventh finding).
"""
import time, torch, threading
import triton, triton.language as tl
from flashlib.kernels.attention_fwd import launch_attention_forward
from flashlib.kernels.attention_bwd import launch_attention_backward
from flashlib.spec import AttentionSpec

@triton.jit
def noop(x):
    pass

def host_us(fn, calls=1000):
    for _ in range(100): fn()
    torch.cuda.synchronize()
    best = 1e9
    for _ in range(3):
        s = time.perf_counter()
        for _ in range(calls): fn()
        e = time.perf_counter() - s
        torch.cuda.synchronize()
        best = min(best, e / calls * 1e6)
    return best

q, k, v, do = (torch.randn(1, 1, 128, 64, device="cuda", dtype=torch.float16) for _ in range(4))
gq, gk, gv = (t.clone().requires_grad_() for t in (q, k, v))
spec = AttentionSpec(causal=True)
o, lse = torch.empty_like(q), torch.empty(1, 1, 128, device="cuda")
dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
launch_attention_forward(q, k, v, o, lse, spec=spec)
inside = {}
def timed(name, fn):
    s = time.perf_counter(); fn(); inside.setdefault(name, []).append(time.perf_counter() - s)
WORK = {
    "nothing": lambda: None,
    "noop kernel": lambda: noop[(1,)](q),
    "raw fwd": lambda: launch_attention_forward(q, k, v, o, lse, spec=spec),
    "raw bwd": lambda: launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec=spec),
}
class Probe(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, name):
        ctx.name = name; return q.view_as(q)
    @staticmethod
    def backward(ctx, g):
        timed(ctx.name, WORK[ctx.name]); return g, None
for name in WORK:
    def step():
        Probe.apply(gq, name).backward(do); gq.grad = None
    total = host_us(step)
    inside.clear()
    host_us(step, 500)
    per = sum(inside[name]) / len(inside[name]) * 1e6
    print(f"{name:12s} step {total:7.1f} us | the work timed inside backward {per:7.1f} us | outside autograd {host_us(WORK[name]):7.1f} us", flush=True)
# the same work in a plain Python thread
res = {}
def worker(name):
    res[name] = host_us(WORK[name])
for name in ("noop kernel", "raw bwd"):
    th = threading.Thread(target=worker, args=(name,)); th.start(); th.join()
    print(f"{name} in a plain thread: {res[name]:.1f} us")
