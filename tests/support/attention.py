"""Inputs and GPU set-up shared by the attention tests (forward, backward, varlen).

One copy of each: how a test makes fresh random q, k, v (and dO) in a layout, how a
(B, N, H, D) or (B*H, N, D) tensor is read as (B, H, N, D), and how GPU tests pin
the kernels' block sizes so that a new shape does not autotune a dozen configs.
"""
from __future__ import annotations

import functools

import torch

from flashlib import runtime
from flashlib.kernels import attention_bwd, attention_fwd
from flashlib.spec import AttentionSpec

DEVICE = runtime.DEVICE
DTYPES = [torch.float32, torch.float16, torch.bfloat16]

#: Shapes the Gluon kernels' GPU tests check: (B, H, H_kv, N_q, N_k, layout): odd lengths, N_q != N_k both ways,
#: GQA, the (B, N, H, D) layout.
ODD_SHAPES = [(2, 4, 4, 1000, 1000, "bhnd"), (1, 2, 2, 77, 300, "bhnd"), (1, 2, 2, 300, 77, "bhnd"),
              (2, 8, 2, 512, 512, "bhnd"), (2, 4, 4, 384, 384, "bnhd")]

#: Calls that the Gluon kernels do not cover, each as a spec and launcher arguments (see :func:`uncovered_call`).
UNCOVERED_CASES = ["window", "softcap", "alibi", "seq_lens", "pointers", "fixed_blocks"]


def uncovered_call(case: str, heads: int = 2):
    """(spec, launcher keyword arguments) of one of :data:`UNCOVERED_CASES` for a sample of ``heads`` heads."""
    if case == "window":
        return AttentionSpec(window=(16, 0)), {}
    if case == "softcap":
        return AttentionSpec(softcap=30.0), {}
    if case == "alibi":
        return AttentionSpec(has_alibi=True), dict(alibi_slopes=torch.ones(heads, device=DEVICE))
    if case == "seq_lens":
        return AttentionSpec(), dict(seq_lens=torch.tensor([40], dtype=torch.int32, device=DEVICE))
    if case == "pointers":
        return AttentionSpec(), dict(use_tma=False)
    if case == "fixed_blocks":
        return AttentionSpec(), dict(block_m=32, block_n=32)
    raise ValueError(f"case must be one of {UNCOVERED_CASES}; got {case!r}")


#: Every kind of mask, as flash_attention's keyword arguments for (B = 2, N = 30) inputs: seq_lens as a list.
MASK_CASES = {
    "none": dict(),
    "causal": dict(causal=True),
    "window": dict(window=(6, 3)),
    "causal+window": dict(causal=True, window=(5, -1)),
    "seq_lens": dict(seq_lens=[30, 17]),
}


def alibi_slopes(kind, batch, heads):
    """ALiBi slopes as models use them (2^(-8 h / H)), "(H,)" per head or "(B, H)" per sample and head (halved from
    one sample to the next); None for ``kind`` None."""
    if kind is None:
        return None
    per_head = torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)])
    if kind == "(H,)":
        return per_head.to(DEVICE)
    return (per_head[None].repeat(batch, 1) * 0.5 ** torch.arange(batch)[:, None]).to(DEVICE)


#: The blocks a GPU test runs with when it does not test the autotuner.
FIXED_FORWARD = dict(block_m=64, block_n=32)
FIXED_BACKWARD = dict(block_m=32, block_n=32)


def make_inputs(batch, heads, kv_heads, n_q, n_k, head_dim, dtype, layout="bhnd", seed=0, grad_out=False,
                spread=1.0):
    """Fresh random q, k, v (and, with ``grad_out``, an output gradient do) in ``layout``.

    ``layout``: "bhnd", "bnhd", or "3d" ((B*H, N, D), needs heads == kv_heads). Values
    are drawn in float64 from a seeded generator, times ``spread``, then rounded to ``dtype``.
    """
    gen = torch.Generator().manual_seed(seed)

    def one(h, n):
        t = (torch.randn(batch, h, n, head_dim, generator=gen, dtype=torch.float64) * spread).to(DEVICE, dtype)
        if layout == "bnhd":
            return t.transpose(1, 2).contiguous()
        return t.reshape(batch * h, n, head_dim) if layout == "3d" else t

    tensors = (one(heads, n_q), one(kv_heads, n_k), one(kv_heads, n_k))
    return tensors + (one(heads, n_q),) if grad_out else tensors


def as_bhnd(t, layout):
    """``t`` in ``layout`` viewed as (B, H, N, D)."""
    if layout == "3d":
        return t.unsqueeze(1)
    return t if layout == "bhnd" else t.transpose(1, 2)


def pin_blocks(monkeypatch, modules, forward=True, backward=True):
    """On a GPU, make ``modules``' launchers use fixed blocks (no autotuning); nothing in the interpreter."""
    if runtime.INTERPRET:
        return
    for module in modules:
        if forward:
            monkeypatch.setattr(module, "launch_attention_forward",
                                functools.partial(attention_fwd.launch_attention_forward, **FIXED_FORWARD))
        if backward:
            monkeypatch.setattr(module, "launch_attention_backward",
                                functools.partial(attention_bwd.launch_attention_backward, **FIXED_BACKWARD))
