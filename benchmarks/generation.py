"""Tokens per second of flashlib.model's GPT generating with and without the paged KV cache, and on SDPA.

``PYTHONPATH=. python3 benchmarks/generation.py --out FILE.json`` (a CUDA GPU). Greedy decoding of
``new`` tokens after a ``prompt``-token prompt, batch ``batch``, fp16 weights; the same model
(weights) for every run. The cached runs decode with CUDA graphs (``generate``'s default on a GPU)
and with eager steps. Also checks, in float32, that greedy tokens are identical with and without
the cache.
"""
from __future__ import annotations

import argparse
import datetime
import json
import time

import torch
import triton

from flashlib import detect_gpu
from flashlib.model import GPT, GPTConfig, generate

CONFIG = dict(vocab_size=256, context=2048, n_layers=8, n_heads=16, n_kv_heads=4, head_dim=64)


def seconds(model, prompt, new, **kwargs) -> tuple[float, torch.Tensor]:
    torch.cuda.synchronize()
    begin = time.perf_counter()
    out = generate(model, prompt, new, temperature=0, **kwargs)
    torch.cuda.synchronize()
    return time.perf_counter() - begin, out


def tokens_per_s(model, prompt, new, **kwargs) -> tuple[float, float, torch.Tensor]:
    """(tokens/s of a whole ``generate`` call: prefill, graph capture and every step; tokens/s of the
    decoding steps alone: the difference between ``new`` and ``new // 4`` new tokens, which removes
    the one-time work; the tokens)."""
    generate(model, prompt, 4, temperature=0, **kwargs)  # compile and autotune first
    whole, out = seconds(model, prompt, new, **kwargs)
    short, _ = seconds(model, prompt, new // 4, **kwargs)
    batch = prompt.shape[0]
    return batch * new / whole, batch * (new - new // 4) / (whole - short), out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=256)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = GPT(GPTConfig(**CONFIG)).cuda()
    prompt = torch.randint(0, CONFIG["vocab_size"], (args.batch, args.prompt), device="cuda")
    # float32: greedy tokens with and without the cache
    same = torch.equal(generate(model, prompt[:, :64], 64, temperature=0),
                       generate(model, prompt[:, :64], 64, temperature=0, kv_cache=True))
    model.half()
    runs, steps = {}, {}
    runs["flashlib, paged KV cache, CUDA graph"], steps["flashlib, paged KV cache, CUDA graph"], cached = \
        tokens_per_s(model, prompt, args.new, kv_cache=True)
    runs["flashlib, paged KV cache, eager steps"], steps["flashlib, paged KV cache, eager steps"], cached_eager = \
        tokens_per_s(model, prompt, args.new, kv_cache=True, cuda_graph=False)
    runs["flashlib, no cache"], steps["flashlib, no cache"], plain = \
        tokens_per_s(model.set_attention("flashlib"), prompt, args.new)
    runs["SDPA, no cache"], steps["SDPA, no cache"], _ = tokens_per_s(model.set_attention("sdpa"), prompt, args.new)
    result = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  gpu=detect_gpu().as_dict(), torch=torch.__version__, triton=triton.__version__,
                  command=f"PYTHONPATH=. python3 benchmarks/generation.py --batch {args.batch} --prompt "
                          f"{args.prompt} --new {args.new}", model=CONFIG, dtype="float16", batch=args.batch,
                  prompt=args.prompt, new=args.new, greedy_tokens_same_with_and_without_cache_fp32=same,
                  fp16_greedy_tokens_equal_fraction=float((cached == plain).float().mean()),
                  fp16_graph_and_eager_cached_tokens_equal=bool(torch.equal(cached, cached_eager)),
                  tokens_per_s=runs, decoding_steps_tokens_per_s=steps)
    print(json.dumps(result, indent=1))
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
