"""A/B of the backward: the deterministic two kernels, the one-kernel atomic-dQ variant (pointer atomics;
TMA reduce with use_tma=True at D = 64, the default at D = 128) and SDPA cuDNN; fp16, FA2 shapes.
Run on a GPU: PYTHONPATH=. python3 benchmarks/atomic_dq_ab.py float16 (writes $OUT/fused_bwd_float16.json)."""
import sys, time, json, os
import torch, triton
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from flashlib.kernels.attention_fwd import launch_attention_forward
from flashlib.kernels import attention_bwd as ab
from flashlib.spec import AttentionSpec

dtype = getattr(torch, sys.argv[1]) if len(sys.argv) > 1 else torch.float16
out = []
def rel(a, b): return ((a.float() - b.float()).norm() / b.float().norm()).item()
torch.manual_seed(0)
for D in (64, 128):
    for N in (1024, 4096, 16384):
        for causal in (False, True):
            B, H = 16384 // N, 2048 // D
            q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=dtype) for _ in range(4))
            spec = AttentionSpec(causal=causal)
            o = torch.empty_like(q); lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
            launch_attention_forward(q, k, v, o, lse, spec=spec)
            res = {}
            grads = {}
            for name, det, tma in (("det", True, None), ("fused", False, None), ("fused_tma", False, True)):
                if name == "fused_tma" and D == 128:
                    continue
                dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
                fn = lambda: ab.launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec=spec, deterministic=det, use_tma=tma)
                fn(); torch.cuda.synchronize()
                grads[name] = (dq.clone(), dk.clone(), dv.clone())
                res[name] = triton.testing.do_bench(fn, warmup=25, rep=150)
            errs = [rel(a, b) for n_ in grads if n_ != "det" for a, b in zip(grads[n_], grads["det"])]
            nan = any(t.isnan().any().item() for n_ in grads for t in grads[n_])
            qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
                g = lambda: torch.autograd.grad(og, (qg, kg, vg), do, retain_graph=True)
                g()
                res["cudnn"] = triton.testing.do_bench(g, warmup=25, rep=150)
            fl = 4 * B * H * N * N * D * 2.5 / (2 if causal else 1)
            row = dict(D=D, N=N, causal=causal, **{k_: fl / ms / 1e9 for k_, ms in res.items()}, err_vs_det=errs, nan=nan)
            cfg = {name: str(getattr(t, "best_config", None)) for name, t in
                   (("fused", ab.attention_bwd_fused_kernel_autotuned), ("dkdv", ab.attention_bwd_dkdv_kernel_autotuned))}
            row["configs"] = cfg
            print(f"D{D} N{N} causal={causal}: det {row['det']:.0f} fused {row['fused']:.0f} fused_tma {row.get('fused_tma', 0):.0f} cudnn {row['cudnn']:.0f} TF/s"
                  f" | fused/cudnn {row['fused']/row['cudnn']:.2f} det/cudnn {row['det']/row['cudnn']:.2f} | err {max(errs):.1e} nan={nan} | {cfg['fused']}", flush=True)
            out.append(row)
            del q, k, v, do, o, lse, qg, kg, vg, og
json.dump(out, open(os.path.join(os.environ.get("OUT", "."), f"fused_bwd_{sys.argv[1] if len(sys.argv)>1 else 'float16'}.json"), "w"), indent=1)
