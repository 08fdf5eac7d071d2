"""How far notebook 08's loss curves drift apart on this machine, per attention and float32 precision.

Notebook 08 trains one GPT from the same weights on the same batches with SDPA and with
flashlib attention and requires their loss curves to agree within a tolerance. This script
measures the drift that tolerance must allow: each run's largest relative gap to the SDPA
run at full float32 precision ("ieee"), for

* naive attention and flashlib at full float32 (the notebook's default),
* SDPA and flashlib with TF32 allowed (``torch.backends.cuda.matmul.fp32_precision = "tf32"``:
  cuBLAS's linear layers and flashlib's ``tl.dot`` then round their inputs to 10 bits),
* the notebook's bug, SDPA without the causal mask, which the tolerance must reject.

Usage (the GPU run of the notebook; the interpreter runs its tiny CPU config)::

    PYTHONPATH=. python3 benchmarks/loss_gap.py --out benchmarks/results/loss_gap_<gpu>.json
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import json
import platform
import time

import flashlib  # noqa: F401  (first: picks the interpreter without a GPU)
import torch
import torch.nn.functional as F
import triton

from flashlib import gpu, reference, runtime
from flashlib import model as gpt


def sdpa_not_causal(q, k, v):
    """The notebook's bug: attention without the causal mask."""
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    k, v = reference.expand_kv_heads(k, q.shape[1]), reference.expand_kv_heads(v, q.shape[1])
    return F.scaled_dot_product_attention(q, k, v).transpose(1, 2)


@contextlib.contextmanager
def float32_precision(setting: str):
    """torch's float32 matmul precision ("ieee" or "tf32") inside the block, restored after."""
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    matmul.fp32_precision = setting
    try:
        yield
    finally:
        matmul.fp32_precision = before


#: (name, attention, float32 precision) of each run; "sdpa" at "ieee" is the reference.
RUNS = [
    ("sdpa", "sdpa", "ieee"),
    ("naive", "naive", "ieee"),
    ("flashlib", "flashlib", "ieee"),
    ("sdpa, tf32", "sdpa", "tf32"),
    ("flashlib, tf32", "flashlib", "tf32"),
    ("bug: not causal", sdpa_not_causal, "ieee"),
]


def measure() -> dict:
    text = gpt.load_text()
    tok = gpt.CharTokenizer(text)
    data = tok.encode(text)
    experiment = runtime.pick(**gpt.EXPERIMENT)
    torch.manual_seed(0)
    base = gpt.GPT(gpt.GPTConfig(vocab_size=tok.vocab_size, **experiment["model"])).to(runtime.DEVICE)
    curves, seconds = {}, {}
    for name, attention, precision in RUNS:
        with float32_precision(precision):
            start = time.perf_counter()
            curves[name] = gpt.train(copy.deepcopy(base).set_attention(attention), data, **experiment["train"])
            seconds[name] = time.perf_counter() - start
        print(f"{name:>16}: {seconds[name]:6.1f} s, loss {curves[name][0]:.4f} -> {curves[name][-1]:.4f}", flush=True)
    gaps = {f"{name} vs sdpa": gpt.relative_loss_gap(curve, curves["sdpa"])
            for name, curve in curves.items() if name != "sdpa"}
    gaps["flashlib, tf32 vs sdpa, tf32"] = gpt.relative_loss_gap(curves["flashlib, tf32"], curves["sdpa, tf32"])
    compared = experiment["compared_steps"]
    early = {f"{name} vs sdpa": gpt.relative_loss_gap(curve[:compared], curves["sdpa"][:compared])
             for name, curve in curves.items() if name != "sdpa"}
    early["flashlib, tf32 vs sdpa, tf32"] = gpt.relative_loss_gap(curves["flashlib, tf32"][:compared],
                                                                  curves["sdpa, tf32"][:compared])
    print(f"largest relative gap between two loss curves (sdpa alone: at full float32), "
          f"first {compared} steps | all steps:")
    for name, gap in gaps.items():
        print(f"  {name:>30}: {early[name]:.2e} | {gap:.2e}")
    info = gpu.detect_gpu()
    return dict(
        gpu=info.name, cuda=info.cuda_version, torch=torch.__version__, triton=triton.__version__,
        python=platform.python_version(),
        date=datetime.date.today().isoformat(), experiment=experiment, vocab_size=tok.vocab_size,
        max_relative_gap=gaps, max_relative_gap_compared_steps=early, seconds=seconds, losses=curves,
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    results = measure()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print("wrote", args.out)


if __name__ == "__main__":
    main()
