"""Where a training step's host time goes: autograd's floor, the raw launchers, the front door with its
launchers replaced by no-ops, and whether every launch of a step comes from the compiled-binary cache.

    PYTHONPATH=. python3 benchmarks/host_step_parts.py      (a CUDA GPU)

One head, N = 128: the GPU stays idle, so each time is the host's. Used in benchmarks/TUNING.md
(seventh finding).
"""
import time, torch
import flashlib.ops as ops
from flashlib import flash_attention
from flashlib.kernels import launch as L
from flashlib.kernels.attention_fwd import launch_attention_forward
from flashlib.kernels.attention_bwd import launch_attention_backward
from flashlib.spec import AttentionSpec

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
def step():
    flash_attention(gq, gk, gv, causal=True).backward(do)
    gq.grad = gk.grad = gv.grad = None
class Floor(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v); return torch.empty_like(q)
    @staticmethod
    def backward(ctx, g):
        return torch.empty_like(g), torch.empty_like(g), torch.empty_like(g)
class RawInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        launch_attention_forward(q.detach(), k.detach(), v.detach(), o, lse, spec=spec); return o.clone()
    @staticmethod
    def backward(ctx, g):
        launch_attention_backward(q, k, v, o, lse, g, dq, dk, dv, spec=spec); return dq, dk, dv
def floor():
    Floor.apply(gq, gk, gv).backward(do); gq.grad = gk.grad = gv.grad = None
def raw_in_bwd():
    RawInBackward.apply(gq, gk, gv).backward(do); gq.grad = gk.grad = gv.grad = None
rows = {}
rows["floor"] = host_us(floor)
rows["raw fwd"] = host_us(lambda: launch_attention_forward(q, k, v, o, lse, spec=spec))
rows["raw bwd"] = host_us(lambda: launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec=spec))
rows["raw launchers inside a Function"] = host_us(raw_in_bwd)
rows["step"] = host_us(step)
counts = {"hit": 0, "remember": 0}
real_lc, real_rem = L._launch_compiled, L._remember
def lc(*a): counts["hit"] += 1; return real_lc(*a)
def rem(*a): counts["remember"] += 1; return real_rem(*a)
L._launch_compiled, L._remember = lc, rem
for _ in range(10): step()
torch.cuda.synchronize()
print("10 steps: launches from the cache / through Triton:", counts)
L._launch_compiled, L._remember = real_lc, real_rem
rf, rb = ops.launch_attention_forward, ops.launch_attention_backward
ops.launch_attention_forward = lambda *a, **k: None
ops.launch_attention_backward = lambda *a, **k: None
rows["step, launchers no-op"] = host_us(step)
with torch.no_grad():
    rows["nograd, launcher no-op"] = host_us(lambda: flash_attention(q, k, v, causal=True))
ops.launch_attention_forward, ops.launch_attention_backward = rf, rb
for k_, v_ in rows.items(): print(f"{k_:40s} {v_:8.1f} us")
