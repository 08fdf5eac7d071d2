"""Packed variable-length attention: a batch of sequences of different lengths, without padding.

The sequences are concatenated along the token axis, ``q`` (total_q, H, D) and ``k``, ``v``
(total_k, H_kv, D), and ``cu_seqlens`` (B + 1,) int32 holds the cumulative lengths:
sequence b is rows ``cu_seqlens[b]`` to ``cu_seqlens[b + 1]``. This is the interface of
flash-attn's ``flash_attn_varlen_func``; it wastes no work and no memory on padding
(compare ``flash_attention(..., seq_lens=...)``, which computes on a padded batch).

The kernels are :func:`flashlib.flash_attention`'s own, launched with ``IS_VARLEN``: the
program of (query block, sequence, head) reads its sequence's start and length from
``cu_seqlens``, and the grid covers ``max_seqlen_q`` rows per sequence (blocks past a
shorter sequence's end return at once). Nothing is copied or padded. Only the checks
of the offsets are this module's own; the rest is :mod:`flashlib.ops`, as for
``flash_attention``.
"""
from __future__ import annotations

import numbers

import torch

from . import ops
from .arguments import (autocast_inputs, check_alibi_slopes, check_bool, check_dtypes_and_device, check_heads,
                        check_tensors, describe_shapes, make_spec, values_checked)


# ---------------------------------------------------------------- argument checks
def _check_cu_seqlens(name: str, cu: torch.Tensor, total: int, total_name: str,
                      device: torch.device) -> list[int] | None:
    """The sequence lengths that ``cu`` describes (None under torch.compile, which reads no values);
    a ValueError/TypeError naming ``name`` if it is not valid."""
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a (B + 1,) torch.int32 tensor of cumulative lengths; "
                        f"got a {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must be torch.int32; got {cu.dtype} (use {name}.int())")
    if cu.dim() != 1 or cu.shape[0] < 2:
        raise ValueError(f"{name} must have shape (B + 1,) with B >= 1 sequences; got {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} must be on the same device as the packed tensors ({device}); got {cu.device}")
    if not values_checked(cu):  # torch.compile: the kernels trust the offsets (no sync, no graph break)
        return None
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


def _check_max_seqlen(name: str, value, lengths: list[int] | None, cu_name: str) -> None:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int; got {value!r}")
    if lengths is not None and value < max(lengths):
        raise ValueError(f"{name} must be >= every sequence length in {cu_name}; got {name} = {value}, "
                         f"longest sequence {max(lengths)}")


def check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=False, window=None,
                      softmax_scale=None, softcap=0.0, alibi_slopes=None, dropout_p=0.0):
    """The :class:`~flashlib.spec.AttentionSpec` of a valid call and its ALiBi slopes as float32 (or None);
    else a ValueError/TypeError naming the argument that is wrong, and what came in."""
    check_tensors(q, k, v, (3,), "3D packed tensors", ", q (total_q, H, D) and k, v (total_k, H_kv, D)")
    if k.shape != v.shape or q.shape[2] != k.shape[2]:
        raise ValueError(f"Q, K, V shapes must match (same head_dim for q, k, v; k and v identical); "
                         f"got {describe_shapes(q, k, v)}")
    check_heads(q, k, v, q.shape[1], k.shape[1], q.shape[2])
    spec = make_spec(causal, window, softmax_scale, softcap, alibi_slopes, dropout_p)
    check_dtypes_and_device(q, k, v)
    lengths_q = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], "total_q (q.shape[0])", q.device)
    lengths_k = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], "total_k (k.shape[0])", q.device)
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must describe the same number of sequences; got "
                         f"{cu_seqlens_q.shape[0] - 1} and {cu_seqlens_k.shape[0] - 1} (shapes "
                         f"{tuple(cu_seqlens_q.shape)} and {tuple(cu_seqlens_k.shape)})")
    _check_max_seqlen("max_seqlen_q", max_seqlen_q, lengths_q, "cu_seqlens_q")
    _check_max_seqlen("max_seqlen_k", max_seqlen_k, lengths_k, "cu_seqlens_k")
    return spec, check_alibi_slopes(alibi_slopes, cu_seqlens_q.shape[0] - 1, q.shape[1], q.device)


def flash_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
                           max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False, window=None,
                           softmax_scale: float | None = None, return_lse: bool = False, softcap: float = 0.0,
                           alibi_slopes: torch.Tensor | None = None, dropout_p: float = 0.0):
    """Attention over packed sequences of different lengths, as flash-attn's ``flash_attn_varlen_func``.

    q (total_q, H, D); k and v (total_k, H_kv, D), H a multiple of H_kv (GQA); the
    sequences lie one after the other: sequence b is ``q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]]``
    attending to ``k[cu_seqlens_k[b]:cu_seqlens_k[b + 1]]`` (and v), and never sees another
    sequence. ``cu_seqlens_q``, ``cu_seqlens_k`` (B + 1,) torch.int32 on q's device, from 0,
    nondecreasing, ending at total_q and total_k (lengths may be 0); ``max_seqlen_q``,
    ``max_seqlen_k`` ints at least the longest lengths (they size the grid, up to total_q and total_k). See
    :func:`pack_sequences`.

    Masks and scores per sequence, with :func:`flashlib.flash_attention`'s semantics:
    ``causal`` aligned to the bottom right of each sequence (query i of a sequence with
    n_q queries and n_k keys sees keys ``j <= i + n_k - n_q``), ``window=(left, right)``
    likewise; ``softmax_scale`` defaults to 1/sqrt(D); ``softcap``, ``alibi_slopes``
    ((H,) or (B, H), distances within each sequence) and ``dropout_p`` as there. A query
    that sees no key gets O = 0, L = -inf.

    Returns O (total_q, H, D) in q's dtype, and with ``return_lse`` also L (H, total_q)
    float32, the row logsumexp (natural log). Differentiable in q, k and v (gradients in
    the packed layout); L carries no gradient; double backward raises. Under torch.compile
    the offsets are not read on the host (no sync): they must be valid. Under ``torch.autocast`` float q, k, v
    are first cast to autocast's dtype, as in :func:`flashlib.flash_attention`.
    """
    check_bool("return_lse", return_lse)
    q, k, v = autocast_inputs(q, k, v)
    spec, alibi_slopes = check_varlen_args(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal,
                                           window, softmax_scale, softcap, alibi_slopes, dropout_p)
    # No sequence is longer than the whole pack: an overestimate past it would only size a grid of empty programs
    # (2**40 rows once launched past CUDA's grid limit), so the grid stops at total_q and total_k.
    max_seqlen_q, max_seqlen_k = min(int(max_seqlen_q), q.shape[0]), min(int(max_seqlen_k), k.shape[0])
    o, lse, _ = ops.attention(q, k, v, None, cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous(), alibi_slopes,
                              max_seqlen_q, max_seqlen_k, "packed", spec)
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
