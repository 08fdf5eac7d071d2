"""Packed variable-length attention: a batch of sequences of different lengths, without padding.

The sequences are concatenated along the token axis, ``q`` (total_q, H, D) and ``k``, ``v``
(total_k, H_kv, D), and ``cu_seqlens`` (B + 1,) int32 holds the cumulative lengths:
sequence b is rows ``cu_seqlens[b]`` to ``cu_seqlens[b + 1]``. This is the interface of
flash-attn's ``flash_attn_varlen_func``; it wastes no work and no memory on padding
(compare ``flash_attention(..., seq_lens=...)``, which computes on a padded batch).

The kernels are :func:`flashlib.flash_attention`'s own, launched with ``IS_VARLEN``: the
program of (query block, sequence, head) reads its sequence's start and length from
``cu_seqlens``, and the grid covers ``max_seqlen_q`` rows per sequence (blocks past a
shorter sequence's end return at once). Nothing is copied or padded.
"""
from __future__ import annotations

import math
import numbers

import torch

from . import runtime
from .attention import _check_window, _RefuseDoubleBackward, check_dtypes_and_device
from .kernels.attention_bwd import launch_attention_backward
from .kernels.attention_fwd import MAX_HEAD_DIM, MIN_HEAD_DIM, launch_attention_forward


# ---------------------------------------------------------------- argument checks
def _check_cu_seqlens(name: str, cu: torch.Tensor, total: int, total_name: str, device: torch.device) -> list[int]:
    """The sequence lengths that ``cu`` describes; a ValueError/TypeError naming ``name`` if it is not valid."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a (B + 1,) torch.int32 tensor of cumulative lengths; "
                        f"got a {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must be torch.int32; got {cu.dtype} (use {name}.int())")
    if cu.dim() != 1 or cu.shape[0] < 2:
        raise ValueError(f"{name} must have shape (B + 1,) with B >= 1 sequences; got {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} must be on the same device as the packed tensors ({device}); got {cu.device}")
    offsets = cu.tolist()  # one sync on a GPU
    if offsets[0] != 0:
        raise ValueError(f"{name} must start at 0; got {name}[0] = {offsets[0]}")
    lengths = [b - a for a, b in zip(offsets, offsets[1:])]
    if min(lengths) < 0:
        b = lengths.index(min(lengths))
        raise ValueError(f"{name} must be nondecreasing; got {name}[{b}] = {offsets[b]} > "
                         f"{name}[{b + 1}] = {offsets[b + 1]}")
    if offsets[-1] != total:
        raise ValueError(f"{name} must end at {total_name} = {total}; got {name}[-1] = {offsets[-1]}")
    return lengths


def _check_max_seqlen(name: str, value, lengths: list[int], cu_name: str) -> None:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int; got {value!r}")
    if value < max(lengths):
        raise ValueError(f"{name} must be >= every sequence length in {cu_name}; got {name} = {value}, "
                         f"longest sequence {max(lengths)}")


def check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                      causal=False, window=None, softmax_scale=None) -> None:
    """Raise a ValueError/TypeError naming the argument that is wrong, and what came in."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"Expected 3D packed tensors: {name} is a {type(t).__name__}, not a torch.Tensor")
    shapes = f"q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)}"
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"Expected 3D packed tensors, q (total_q, H, D) and k, v (total_k, H_kv, D); got {shapes}")
    if k.shape != v.shape or q.shape[2] != k.shape[2]:
        raise ValueError(f"Q, K, V shapes must match (same head_dim for q, k, v; k and v identical); got {shapes}")
    heads, kv_heads, head_dim = q.shape[1], k.shape[1], q.shape[2]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"GQA needs q heads ({heads}) to be a multiple of k/v heads ({kv_heads}); got {shapes}")
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"Unsupported head_dim {head_dim}: flash_attention_varlen supports {MIN_HEAD_DIM} to "
                         f"{MAX_HEAD_DIM}; got {shapes}")
    check_dtypes_and_device(q, k, v)
    lengths_q = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], "total_q (q.shape[0])", q.device)
    lengths_k = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], "total_k (k.shape[0])", q.device)
    if len(lengths_q) != len(lengths_k):
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must describe the same number of sequences; got "
                         f"{len(lengths_q)} and {len(lengths_k)} (shapes {tuple(cu_seqlens_q.shape)} and "
                         f"{tuple(cu_seqlens_k.shape)})")
    _check_max_seqlen("max_seqlen_q", max_seqlen_q, lengths_q, "cu_seqlens_q")
    _check_max_seqlen("max_seqlen_k", max_seqlen_k, lengths_k, "cu_seqlens_k")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool; got {causal!r}")
    _check_window(window)
    if softmax_scale is not None:
        if not isinstance(softmax_scale, numbers.Real) or isinstance(softmax_scale, bool):
            raise TypeError(f"softmax_scale must be a float or None; got {softmax_scale!r}")
        if not math.isfinite(softmax_scale):
            raise ValueError(f"softmax_scale must be finite; got {softmax_scale}")


# ---------------------------------------------------------------- autograd
def _forward(q, k, v, cu_q, cu_k, max_q, max_k, mask_args):
    """O (total_q, H, D) in q's dtype and L (H, total_q) float32."""
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[1], q.shape[0]), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse
    if k.shape[0] == 0:  # no key in any sequence: every row is fully masked
        return o.zero_(), lse.fill_(float("-inf"))
    q_run, k_run, v_run = runtime.upcast_for_interpreter(q, k, v)  # bf16 → fp32 in the interpreter
    o_run = o if q_run.dtype == o.dtype else torch.empty(q.shape, dtype=q_run.dtype, device=q.device)
    launch_attention_forward(q_run, k_run, v_run, o_run, lse, **mask_args, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                             max_seqlen_q=max_q, max_seqlen_k=max_k)
    if o_run is not o:
        o.copy_(o_run)
    return o, lse


class FlashAttentionVarlenFunction(torch.autograd.Function):
    """Autograd node of flash_attention_varlen: saves q, k, v, O, L and the offsets (never P);
    backward runs flash_attention's backward kernels on the packed tensors. Double backward raises."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, causal, window, softmax_scale):
        ctx.mask_args = dict(causal=causal, window=window, softmax_scale=softmax_scale)
        ctx.max_seqlens = (max_q, max_k)
        o, lse = _forward(q, k, v, cu_q, cu_k, max_q, max_k, ctx.mask_args)
        ctx.save_for_backward(q, k, v, o, lse, cu_q, cu_k)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, grad_o, grad_lse):
        q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        with torch.no_grad():
            dq = torch.empty(q.shape, dtype=q.dtype, device=q.device) if need_q else None
            dk, dv = ((torch.empty(k.shape, dtype=k.dtype, device=k.device),
                       torch.empty(v.shape, dtype=v.dtype, device=v.device)) if need_k or need_v else (None, None))
            if q.shape[0] == 0 or k.shape[0] == 0:  # no query or no key: no gradient flows
                grads = [g.zero_() if g is not None else None for g in (dq, dk, dv)]
            else:
                run = runtime.upcast_for_interpreter(q, k, v, o, grad_o)  # bf16 → fp32 in the interpreter
                outs = [g if g is None or g.dtype == run[0].dtype else torch.empty(g.shape, dtype=run[0].dtype,
                                                                                    device=g.device)
                        for g in (dq, dk, dv)]
                launch_attention_backward(*run[:4], lse, run[4], *outs, **ctx.mask_args,
                                          cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                          max_seqlen_q=ctx.max_seqlens[0], max_seqlen_k=ctx.max_seqlens[1])
                grads = [g if g is None or g is out else g.copy_(out) for g, out in zip((dq, dk, dv), outs)]
        grads = [grads[0], grads[1] if need_k else None, grads[2] if need_v else None]
        # create_graph=True: chain the gradients to a node that refuses to be differentiated.
        inputs_need_grad = grad_o.requires_grad or any(t.requires_grad for t in (q, k, v))
        if torch.is_grad_enabled() and inputs_need_grad:
            present = [i for i, g in enumerate(grads) if g is not None]
            chained = _RefuseDoubleBackward.apply(*(grads[i].detach().requires_grad_() for i in present))
            for i, g in zip(present, chained):
                grads[i] = g
        return (*grads, None, None, None, None, None, None, None)


def flash_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False, window=None,
                           softmax_scale: float | None = None, return_lse: bool = False):
    """Attention over packed sequences of different lengths, as flash-attn's ``flash_attn_varlen_func``.

    q (total_q, H, D); k and v (total_k, H_kv, D), H a multiple of H_kv (GQA); the
    sequences lie one after the other: sequence b is ``q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]]``
    attending to ``k[cu_seqlens_k[b]:cu_seqlens_k[b + 1]]`` (and v), and never sees another
    sequence. ``cu_seqlens_q``, ``cu_seqlens_k`` (B + 1,) torch.int32 on q's device, from 0,
    nondecreasing, ending at total_q and total_k (lengths may be 0); ``max_seqlen_q``,
    ``max_seqlen_k`` ints at least the longest lengths (they size the grid). See
    :func:`pack_sequences`.

    Masks per sequence, with :func:`flashlib.flash_attention`'s semantics: ``causal``
    aligned to the bottom right of each sequence (query i of a sequence with n_q queries
    and n_k keys sees keys ``j <= i + n_k - n_q``), ``window=(left, right)`` likewise;
    ``softmax_scale`` defaults to 1/sqrt(D). A query that sees no key gets O = 0, L = -inf.

    Returns O (total_q, H, D) in q's dtype, and with ``return_lse`` also L (H, total_q)
    float32, the row logsumexp (natural log). Differentiable in q, k and v (gradients in
    the packed layout); L carries no gradient; double backward raises.
    """
    check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, window,
                      softmax_scale)
    window = None if window is None else tuple(window)
    o, lse = FlashAttentionVarlenFunction.apply(q, k, v, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(),
                                                int(max_seqlen_q), int(max_seqlen_k), causal, window, softmax_scale)
    return (o, lse) if return_lse else o


# ---------------------------------------------------------------- packing
def pack_sequences(seqs: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Concatenate (n_i, H, D) sequences into ``(packed (sum n_i, H, D), cu_seqlens (B + 1,) int32, max n_i)``."""
    if not isinstance(seqs, (list, tuple)) or not seqs:
        raise ValueError(f"seqs must be a non-empty list of (n_i, H, D) tensors; got {seqs!r:.80}")
    for i, t in enumerate(seqs):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            got = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else f"a {type(t).__name__}"
            raise ValueError(f"seqs[{i}] must be a 3D (n_i, H, D) tensor; got {got}")
        first = seqs[0]
        if t.shape[1:] != first.shape[1:] or t.dtype != first.dtype or t.device != first.device:
            raise ValueError(f"seqs must share (H, D), dtype and device; seqs[0] is {tuple(first.shape[1:])} "
                             f"{first.dtype} on {first.device}, seqs[{i}] is {tuple(t.shape[1:])} {t.dtype} "
                             f"on {t.device}")
    lengths = torch.tensor([0] + [t.shape[0] for t in seqs])
    cu_seqlens = lengths.cumsum(0).to(device=seqs[0].device, dtype=torch.int32)
    return torch.cat(list(seqs)), cu_seqlens, int(lengths.max())


def unpack_sequences(packed: torch.Tensor, cu_seqlens: torch.Tensor) -> list[torch.Tensor]:
    """The sequences of a packed (total, ...) tensor as a list of views ``packed[cu[b]:cu[b + 1]]`` (no copy)."""
    if not isinstance(packed, torch.Tensor) or packed.dim() < 1:
        raise ValueError(f"packed must be a tensor with the tokens along dim 0; got {packed!r:.80}")
    _check_cu_seqlens("cu_seqlens", cu_seqlens, packed.shape[0], "packed.shape[0]", packed.device)
    offsets = cu_seqlens.tolist()
    return [packed[a:b] for a, b in zip(offsets, offsets[1:])]
