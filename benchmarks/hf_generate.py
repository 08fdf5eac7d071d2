"""Tokens per second of a Hugging Face Llama generating on flashlib, against the same model on sdpa.

    PYTHONPATH=. python3 benchmarks/hf_generate.py --out FILE.json      (a CUDA GPU)

A Llama-style model built from a config with random weights (no download), in ``--dtype``, greedy
decoding of ``--new`` tokens after a batch of left-padded prompts (lengths spread from half of
``--prompt`` to all of it), with each of Transformers' caches:

* ``dynamic``: eager steps, which flashlib takes through the split-KV kernel over the cache in place, with no host
  read; ``--plan-per-layer`` also times them with each layer deriving the lengths, the tokens' order and the block
  table from the mask itself, instead of once a forward;
* ``static``: the steps that ``generate`` compiles by itself on a GPU (Inductor, CUDA graphs), where
  flashlib's steps read nothing on the host and get sdpa's mask, of one shape, so that one graph
  serves every step.

For ``attn_implementation="sdpa"`` and flashlib's: tokens/s of a whole ``generate`` call, of the decoding steps
alone (the difference between ``--new`` and ``--new // 4`` tokens, which removes the prompt, compiling and capture),
and the share of flashlib's tokens equal to sdpa's (greedy: in 16 bits a near tie may flip a token, and the rest
of that sequence with it, so this need not be 1; float32 must give 1). On a CPU (``--device cpu``, tiny sizes)
it checks itself: the tests run it so.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import time

import torch
import triton

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def build(impl: str, config, state, device, dtype):
    """The model on ``impl``'s attention, with ``state``'s weights."""
    import transformers

    model = transformers.LlamaForCausalLM._from_config(config, attn_implementation=impl, dtype=torch.float32)
    model.load_state_dict(state)
    return model.to(device, dtype).eval()


def prompts(batch: int, length: int, vocab: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) of ``batch`` left-padded prompts of lengths from ``length // 2`` to ``length``."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (batch, length), generator=gen)
    lengths = torch.linspace(length // 2, length, batch).round().long()
    mask = (torch.arange(length)[None, :] >= length - lengths[:, None]).long()
    return ids.masked_fill(mask == 0, 0).to(device), mask.to(device)


def timed(model, ids, mask, new: int, cache: str) -> tuple[float, torch.Tensor]:
    """Seconds of one greedy ``generate`` call, and its new tokens."""
    options = {"attention_mask": mask, "max_new_tokens": new, "min_new_tokens": new, "do_sample": False,
               "pad_token_id": 0, "cache_implementation": None if cache == "dynamic" else "static"}
    synchronize = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    synchronize()
    begin = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, **options)
    synchronize()
    return time.perf_counter() - begin, out[:, ids.shape[1]:]


def measure(model, ids, mask, new: int, cache: str) -> dict:
    """Tokens/s of a whole call and of the decoding steps alone (after warm-up calls that compile), and the tokens.

    Each length is warmed up: a static cache holds prompt + new tokens, a length that its compiled step is
    specialized to (session 55, on an H100: warming up the short call alone left the long call's compiling in the
    time, and a static cache's decoding ran at a quarter of a dynamic one's)."""
    for n in (new, new // 4):
        timed(model, ids, mask, n, cache)  # compile, autotune, capture
    whole, tokens = timed(model, ids, mask, new, cache)
    short, _ = timed(model, ids, mask, new // 4, cache)
    batch = ids.shape[0]
    # None where the longer call was not the slower one: steps too short to tell apart from the timer's noise (on a
    # CPU at tiny sizes), not a rate
    decode = batch * (new - new // 4) / (whole - short) if whole > short else None
    return {"tokens_per_s": batch * new / whole, "decode_tokens_per_s": decode, "tokens": tokens}


def rate(tokens_per_s) -> str:
    """A rate as printed: whole tokens/s, or "n/a" where none was measured."""
    return "n/a" if tokens_per_s is None else f"{tokens_per_s:.0f}"


def run(args, command_args) -> dict:
    import transformers

    import flashlib.hf

    device = torch.device(args.device)
    name = flashlib.hf.register()
    heads = args.hidden // args.head_dim
    config = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 3,
                                      num_hidden_layers=args.layers, num_attention_heads=heads,
                                      num_key_value_heads=max(1, heads // 4), head_dim=args.head_dim,
                                      max_position_embeddings=args.prompt + args.new + 8, pad_token_id=0)
    torch.manual_seed(0)
    state = transformers.LlamaForCausalLM._from_config(config, dtype=torch.float32).state_dict()
    ids, mask = prompts(args.batch, args.prompt, args.vocab, device)
    rows = []
    for cache in args.caches.split(","):
        # (row name, attn_implementation, whether flashlib's layers share one padding plan a forward)
        variants = [("sdpa", "sdpa", True), ("flashlib", name, True)]
        # a static cache's steps get sdpa's 4D mask, which each layer reduces to a padding mask of its own: no plan
        if cache == "dynamic" and args.plan_per_layer:
            variants.append(("flashlib_plan_per_layer", name, False))
        results = {}
        for row_name, impl, shared in variants:
            model = build(impl, config, state, device, DTYPES[args.dtype])
            setting, flashlib.hf.SHARE_PADDING_PLAN = flashlib.hf.SHARE_PADDING_PLAN, shared
            try:
                results[row_name] = measure(model, ids, mask, args.new, cache)
            finally:
                flashlib.hf.SHARE_PADDING_PLAN = setting
            del model
            torch._dynamo.reset()
        for row_name, result in results.items():
            same = (result["tokens"] == results["sdpa"]["tokens"]).float().mean().item()
            rows.append({"cache": cache, "impl": row_name,
                         "tokens_per_s": round(result["tokens_per_s"], 1),
                         "decode_tokens_per_s": None if result["decode_tokens_per_s"] is None
                         else round(result["decode_tokens_per_s"], 1),
                         "tokens_equal_to_sdpa": round(same, 4)})
        print(f"{cache:>8}: " + ", ".join(f"{row['impl']} {rate(row['decode_tokens_per_s'])} tok/s decoding "
                                          f"({rate(row['tokens_per_s'])} whole)" for row in rows[-len(results):])
              + f"; flashlib's tokens equal sdpa's: {rows[-len(results) + 1]['tokens_equal_to_sdpa']:.1%}",
              flush=True)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    return {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__,
            "transformers": transformers.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": "PYTHONPATH=. python3 benchmarks/hf_generate.py " + " ".join(command_args),
            "config": {key: getattr(args, key) for key in ("batch", "prompt", "new", "layers", "hidden", "head_dim",
                                                           "vocab", "dtype")},
            "rows": rows}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the results here as JSON")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--caches", default="dynamic,static")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--plan-per-layer", action="store_true",
                        help="also time the dynamic cache's eager steps with flashlib.hf.SHARE_PADDING_PLAN = False "
                             "(each layer derives the lengths, order and block table from the mask itself)")
    args = parser.parse_args(argv)
    if args.new < 8:
        parser.error(f"--new must be at least 8 (the decoding rate is the difference of --new and --new // 4 "
                     f"tokens); got {args.new}")
    result = run(args, sys.argv[1:] if argv is None else argv)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
