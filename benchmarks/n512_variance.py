"""Is the training step at N = 512 bound by the autotuner's choice or by the host?

    python benchmarks/n512_variance.py

Times flashlib's forward + backward at N = 512, D = 64, causal, fp16, B = 32, H = 32 in three
fresh processes (each autotunes anew) and prints, for each, the do_bench median and the configs
the three autotuned kernels chose. Same configs with different times point at the host.
"""
import subprocess
import sys

STEP = r'''
import torch, triton.testing, flashlib
from flashlib import flash_attention
from flashlib.kernels import tuned
q, k, v, do = (torch.randn(32, 32, 512, 64, device="cuda", dtype=torch.float16) for _ in range(4))
leaves = [t.requires_grad_() for t in (q, k, v)]
def step():
    flash_attention(*leaves, causal=True).backward(do)
ms = triton.testing.do_bench(step, warmup=25, rep=100, grad_to_none=leaves, return_mode="median")
chosen = {key[0].fn.__name__: (c.kwargs, c.num_warps, c.num_stages) for key, c in tuned._CHOSEN.items()}
print(f"{ms:.3f} ms", chosen)
'''

if __name__ == "__main__":
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", STEP], capture_output=True, text=True)
        print(out.stdout.strip() or out.stderr[-500:])
