"""Compile time and run time of the attention kernels in full float32, per block size.

Full-float32 ``tl.dot`` ("ieee", torch's default float32 precision, which flashlib follows)
runs on the CUDA cores: every thread multiplies its share of the tile with scalar FMAs, so
large tiles spill registers and give ptxas huge straight-line code. This script measures,
for head_dim 32/64/128 and blocks 32x32 to 128x128, the first call (compile) and the
steady time of the causal forward, dK/dV and dQ kernels, each in its own process, 14 at a
time (so times are rough: processes share the GPU). Its result chose
``flashlib.kernels.attention_fwd.FULL_FLOAT32_BLOCKS``.

Usage (on a GPU): ``PYTHONPATH=. python3 benchmarks/float32_blocks.py``
"""
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

CHILD = r'''
import sys, time, json, torch, flashlib, triton.testing
from flashlib.kernels import attention_fwd as F, attention_bwd as B
from flashlib.spec import AttentionSpec
D, bm, bn, which = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.manual_seed(0)
b, h, n = (32, 8, 256) if D == 32 else (2, 4, 1024)   # D = 32: notebook 08's GPU model
q, k, v, do = (torch.randn(b, h, n, D, device="cuda") for _ in range(4))
o, lse = torch.empty_like(q), torch.empty(b, h, n, device="cuda")
def fwd():
    F.launch_attention_forward(q, k, v, o, lse, spec=AttentionSpec(causal=True), block_m=bm, block_n=bn)
def bwd():
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    B.launch_attention_backward(q, k, v, o, lse, do, dq if which == "dq" else None,
                                dk if which == "dkdv" else None, dv if which == "dkdv" else None,
                                spec=AttentionSpec(causal=True), block_m=bm, block_n=bn)
t0 = time.perf_counter(); fwd(); torch.cuda.synchronize(); first = time.perf_counter() - t0
fn = fwd if which == "fwd" else bwd
if which != "fwd":
    t0 = time.perf_counter(); fn(); torch.cuda.synchronize(); first = time.perf_counter() - t0
ms = triton.testing.do_bench(fn, warmup=5, rep=30)
print(json.dumps(dict(D=D, bm=bm, bn=bn, which=which, compile_s=round(first, 1), ms=round(ms, 3))))
'''


def one(job):
    D, bm, bn, which = job
    start = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-c", CHILD, str(D), str(bm), str(bn), which],
                             capture_output=True, text=True, timeout=150)
        line = out.stdout.strip().splitlines()[-1] if out.returncode == 0 else "ERR " + out.stderr[-300:]
    except subprocess.TimeoutExpired:
        line = "TIMEOUT"
    return f"{job} wall {time.perf_counter() - start:.0f}s: {line}"


def main():
    jobs = [(D, bm, bn, which) for D in (32, 64, 128)
            for bm, bn in ((32, 32), (64, 32), (64, 64), (128, 64), (128, 128))
            for which in ("fwd", "dkdv", "dq")]
    with ThreadPoolExecutor(14) as pool:
        for line in pool.map(one, jobs):
            print(line, flush=True)


if __name__ == "__main__":
    main()
