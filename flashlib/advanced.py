"""``make advanced``: the library's advanced features, each run once and checked.

Each example builds random inputs, runs flashlib forward and backward, and compares
the output and every input gradient with :func:`flashlib.reference.naive_attention`
computed in float64 from the same inputs (relative error, tolerance of the inputs'
dtype). It prints one verdict line per example and what the feature is for, and
exits non-zero if any comparison fails. Small sizes in Triton's interpreter (a
few seconds each), larger ones on a GPU.

``python -m flashlib.advanced [--seed N]``
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from . import runtime
from .attention import flash_attention
from .reference import naive_attention
from .validation import relative_error, tolerance
from .varlen import flash_attention_varlen, pack_sequences

#: (batch, heads, seq_len, head_dim) of the examples, and the dtype flashlib computes in.
SIZES = runtime.pick(gpu=dict(batch=2, heads=8, seq_len=1024, head_dim=64),
                     cpu=dict(batch=1, heads=4, seq_len=64, head_dim=32))
DTYPE = runtime.pick(gpu=torch.float16, cpu=torch.float32)
#: Sequence lengths of the packed (varlen) example: different, one very short.
VARLEN_LENGTHS = runtime.pick(gpu=[700, 1024, 17, 300], cpu=[40, 64, 5, 23])


@dataclass(frozen=True)
class Example:
    """One feature: how to make its inputs, how flashlib computes it, what it must equal."""

    name: str
    why: str
    input_names: Sequence[str]
    make_inputs: Callable[[torch.Generator], list[torch.Tensor]]
    flash: Callable[..., torch.Tensor]       # flashlib on the inputs (in DTYPE)
    reference: Callable[..., torch.Tensor]   # the same in plain PyTorch (gets float64 inputs)


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, device=runtime.DEVICE, dtype=torch.float32).to(DTYPE)


def _qkv(heads: int, kv_heads: int, batch: int | None = None):
    """Inputs (B, H, N, D) for q and (B, H_kv, N, D) for k, v."""
    b, n, d = batch or SIZES["batch"], SIZES["seq_len"], SIZES["head_dim"]
    return lambda gen: [_randn(gen, b, heads, n, d), _randn(gen, b, kv_heads, n, d), _randn(gen, b, kv_heads, n, d)]


def _fused_qkv(gen: torch.Generator) -> list[torch.Tensor]:
    """One (B, N, 3, H, D) tensor, as a fused QKV projection produces it."""
    return [_randn(gen, SIZES["batch"], SIZES["seq_len"], 3, SIZES["heads"], SIZES["head_dim"])]


def _bnhd_flash(qkv):
    """q, k, v are strided (B, N, H, D) views into the fused tensor: no copy is made."""
    return flash_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], layout="bnhd")


def _bnhd_reference(qkv):
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    return naive_attention(q, k, v).transpose(1, 2)


def _seq_lens() -> torch.Tensor:
    """Per-sample valid lengths for the padded batch (of at least 2): full, a third, ..."""
    n = SIZES["seq_len"]
    lens = [n, n // 3, 3 * n // 4, 1][: max(2, SIZES["batch"])]
    return torch.tensor(lens, dtype=torch.int32, device=runtime.DEVICE)


def _packed(gen: torch.Generator) -> list[torch.Tensor]:
    """q (total, H, D), k and v (total, H / 2, D): the sequences packed end to end."""
    heads, d = SIZES["heads"], SIZES["head_dim"]
    return [pack_sequences([_randn(gen, n, h, d) for n in VARLEN_LENGTHS])[0]
            for h in (heads, heads // 2, heads // 2)]


def _cu_seqlens() -> tuple[torch.Tensor, int]:
    offsets = torch.tensor([0] + VARLEN_LENGTHS).cumsum(0)
    return offsets.to(device=runtime.DEVICE, dtype=torch.int32), max(VARLEN_LENGTHS)


def _varlen_flash(q, k, v):
    cu, longest = _cu_seqlens()
    return flash_attention_varlen(q, k, v, cu, cu, longest, longest, causal=True)


def _varlen_reference(q, k, v):
    """Each sequence on its own, (n, H, D) -> (1, H, n, D), then packed again."""
    cu, _ = _cu_seqlens()
    bounds = cu.tolist()
    outs = []
    for start, stop in zip(bounds, bounds[1:]):
        seq = [t[start:stop].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
        outs.append(naive_attention(*seq, causal=True)[0].transpose(0, 1))
    return torch.cat(outs)


def _window(left: int, right: int, causal: bool):
    return (lambda q, k, v: flash_attention(q, k, v, causal=causal, window=(left, right)),
            lambda q, k, v: naive_attention(q, k, v, causal=causal, window=(left, right)))


def examples() -> list[Example]:
    """The advanced examples, in the order they are printed."""
    heads, n = SIZES["heads"], SIZES["seq_len"]
    band, local = _window(n // 8, n // 8, causal=False), _window(n // 4, 0, causal=True)
    qkv_names = ("Q", "K", "V")
    return [
        Example(f"GQA: {heads} query heads share {heads // 2} K/V heads",
                "Llama and Mistral do this: query head h reads K/V head h // group, so the K/V cache is "
                "smaller by the group size; dK and dV sum over each group.",
                qkv_names, _qkv(heads, heads // 2), flash_attention, naive_attention),
        Example(f"MQA: {heads} query heads share 1 K/V head",
                "GQA's extreme (PaLM, Falcon): one K/V head for every query head.",
                qkv_names, _qkv(heads, 1), flash_attention, naive_attention),
        Example(f"sliding window ({n // 8}, {n // 8}), not causal",
                "each query sees only its neighbours (Longformer-style local attention); key blocks outside "
                "the band are never loaded, so the work grows as N * window instead of N^2.",
                qkv_names, _qkv(heads, heads), *band),
        Example(f"sliding window ({n // 4}, 0) with causal",
                "local causal attention, as in Mistral's layers: each query sees the last "
                f"{n // 4} keys before it and itself.",
                qkv_names, _qkv(heads, heads), *local),
        Example("layout bhnd: q, k, v as (B, H, N, D)",
                "the layout of torch's scaled_dot_product_attention, flashlib's default.",
                qkv_names, _qkv(heads, heads), flash_attention, naive_attention),
        Example("layout bnhd: q, k, v as views of one fused (B, N, 3, H, D) tensor",
                "the layout a QKV projection produces; the kernels read the strided views directly (no "
                "transpose, no copy), O comes back as (B, N, H, D) and the gradient lands in the fused tensor.",
                ("QKV",), _fused_qkv, _bnhd_flash, _bnhd_reference),
        Example(f"padded batch, seq_lens={_seq_lens().tolist()}, causal",
                "each sample is padded to N: keys past its length are masked and padded query rows give 0 "
                "(and no gradient), but the padding still costs compute (see varlen below).",
                qkv_names, _qkv(heads, heads, batch=len(_seq_lens())),
                lambda q, k, v: flash_attention(q, k, v, causal=True, seq_lens=_seq_lens()),
                lambda q, k, v: naive_attention(q, k, v, causal=True, seq_lens=_seq_lens().to(q.device))),
        Example(f"packed varlen: sequences of {VARLEN_LENGTHS} tokens, causal, GQA",
                "flash_attention_varlen: the sequences packed end to end with cu_seqlens offsets "
                "(flash-attn's varlen interface); no padding at all, and each sequence sees only itself.",
                qkv_names, _packed, _varlen_flash, _varlen_reference),
    ]


def compare(example: Example, gen: torch.Generator) -> dict[str, float]:
    """Relative errors of O and of each input's gradient, flashlib against the float64 reference.

    Both get the same inputs (the reference in float64) and the same random upstream
    gradient dO.
    """
    inputs = example.make_inputs(gen)
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    ref_leaves = [t.detach().double().requires_grad_() for t in inputs]
    out, ref = example.flash(*leaves), example.reference(*ref_leaves)
    grad_out = torch.randn(ref.shape, generator=gen, device=ref.device, dtype=torch.float32).double()
    if out.shape == ref.shape:
        out.backward(grad_out.to(out.dtype))
    ref.backward(grad_out)
    errors = {"O": relative_error(out, ref)}
    for name, leaf, ref_leaf in zip(example.input_names, leaves, ref_leaves):
        got = leaf.grad if leaf.grad is not None else torch.full_like(leaf, float("nan"))
        errors[f"d{name}"] = relative_error(got, ref_leaf.grad)
    return errors


def run(seed: int = 0) -> bool:
    """Run every example, print one verdict line each and why it matters; True if all agree."""
    tol = tolerance(DTYPE)
    print(f"{runtime.mode_description()}")
    print(f"flashlib in {str(DTYPE)[6:]} against naive attention in float64, relative error <= {tol:.0e}; "
          f"sizes {SIZES}, seed {seed}\n")
    gen = torch.Generator(device=runtime.DEVICE).manual_seed(seed)
    failed = []
    for example in examples():
        try:
            errors = compare(example, gen)
        except Exception as exc:  # noqa: BLE001  (report it as this example's failure, run the others)
            errors, numbers = {"O": float("inf")}, f"raised {type(exc).__name__}: {exc}"
        else:
            numbers = "  ".join(f"{name} {err:.1e}" for name, err in errors.items())
        ok = all(err <= tol for err in errors.values())
        print(f"[{'ok ' if ok else 'FAIL'}] {example.name}: {numbers}")
        print(f"       {example.why}")
        if not ok:
            failed.append(example.name)
    print()
    if failed:
        print(f"{len(failed)} example(s) disagree with the reference: {', '.join(failed)}")
    else:
        print(f"All {len(examples())} advanced examples agree with the reference, forward and backward.")
    return not failed


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flashlib.advanced", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    args = parser.parse_args(argv)
    raise SystemExit(0 if run(args.seed) else 1)


if __name__ == "__main__":
    main()
