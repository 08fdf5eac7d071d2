"""``flash_attention``: the FlashAttention kernels behind one checked function.

This module checks the arguments of a padded batch, in (B, H, N, D), (B, N, H, D)
or (B*H, N, D), and hands them to :func:`flashlib.ops.attention`, which views them
as (B, H, N, D) (strides only, no copy), allocates the outputs in the caller's layout,
and runs the forward and backward kernels (eagerly, or as a torch custom op under
torch.compile). Mask semantics are those of :func:`flashlib.reference.naive_attention`,
the ground truth it is tested against. ``flash_attention_v2`` is seed 003's name for
the (B, N, H, D) entry.
"""
from __future__ import annotations

import torch

from . import ops
from .decode import splitkv_attention
from .variants import VARIANTS, preferred_variant
from .arguments import (autocast_inputs, check_alibi_slopes, check_bool, check_dtypes_and_device, check_heads,
                        check_lengths, check_tensors, describe_shapes, make_spec, transformed, values_checked)
from .fp8 import fp8_attention, is_fp8
from .kernels.dropout import dropout_mask

LAYOUTS = ("bhnd", "bnhd")

#: The op settings of calls already checked, by call signature (see ``_call_signature``): a training
#: or serving loop repeats a handful of signatures, and checking each call anew costs more host time
#: than launching its kernel. Cleared when full, so odd callers cannot grow it without bound.
CHECKED_CALLS: dict[tuple, tuple] = {}
CHECKED_CALLS_LIMIT = 1024


def _check_seq_lens(seq_lens, batch: int, n_q: int, n_k: int, device: torch.device) -> None:
    if seq_lens is None:
        return
    check_lengths(seq_lens, "seq_lens", batch, device, "one length per sample")
    if batch and values_checked(seq_lens):
        low, high = int(seq_lens.min()), int(seq_lens.max())  # one sync on a GPU
        if low < 0 or high > max(n_q, n_k):
            raise ValueError(f"seq_lens must lie in [0, max(N_q, N_k)] = [0, {max(n_q, n_k)}]; "
                             f"got values from {low} to {high}")


def _bhnd_shape(t: torch.Tensor, layout: str) -> tuple[int, int, int, int]:
    """(B, H, N, D) of a tensor in ``layout`` (3D: (B*H, N, D) is B*H samples of one head), without a view."""
    shape = t.shape
    if len(shape) == 3:
        return shape[0], 1, shape[1], shape[2]
    return (shape[0], shape[1], shape[2], shape[3]) if layout == "bhnd" else (shape[0], shape[2], shape[1], shape[3])


def check_attention_args(q, k, v, causal=False, seq_lens=None, window=None, softmax_scale=None, layout="bhnd",
                         softcap=0.0, alibi_slopes=None, dropout_p=0.0, allow_fp8=False):
    """The :class:`~flashlib.spec.AttentionSpec` of a valid call and its ALiBi slopes as float32 (or None);
    else a ValueError/TypeError naming the argument that is wrong, and what came in."""
    check_tensors(q, k, v, (3, 4), "3D or 4D tensors", " ((B*H, N, D) or (B, H, N, D)), all alike")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    if q.dim() == 3 and layout != "bhnd":
        raise ValueError(f"layout={layout!r} needs 4D tensors; 3D tensors are (B*H, N, D): "
                         f"got {describe_shapes(q, k, v)}")
    spec = make_spec(causal, window, softmax_scale, softcap, alibi_slopes, dropout_p)
    check_dtypes_and_device(q, k, v, allow_fp8)
    batch, heads, n_q, head_dim = _bhnd_shape(q, layout)
    k_shape = _bhnd_shape(k, layout)
    if k.shape != v.shape or k_shape[0] != batch or k_shape[3] != head_dim:
        raise ValueError(f"Q, K, V shapes must match (layout {layout!r}: same batch and head_dim for q, k, v; "
                         f"k and v identical); got {describe_shapes(q, k, v)}")
    check_heads(q, k, v, heads, k_shape[1], head_dim, f" (layout {layout!r})")
    _check_seq_lens(seq_lens, batch, n_q, k_shape[2], q.device)
    return spec, check_alibi_slopes(alibi_slopes, batch, heads, q.device)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    seq_lens: torch.Tensor | None = None, window=None,
                    softmax_scale: float | None = None, layout: str = "bhnd",
                    return_lse: bool = False, *, softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None,
                    dropout_p: float = 0.0, return_dropout_mask: bool = False, variant: str = "auto",
                    q_descale: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
                    v_descale: torch.Tensor | None = None, out_dtype: torch.dtype | None = None):
    """softmax(q k^T * scale + mask) v, without ever storing the N_q x N_k matrix.

    Shapes: ``layout="bhnd"`` (default, as torch SDPA): q (B, H, N_q, D), k and v
    (B, H_kv, N_k, D); ``layout="bnhd"`` (as flash-attn and most models):
    q (B, N_q, H, D), k, v (B, N_k, H_kv, D), read through strides, never copied;
    3D (B*H, N, D) tensors are B*H batches of one head. H must be a multiple of
    H_kv (GQA; H_kv = 1 is MQA). D from 16 to 256. float16, bfloat16, float32
    (float32 products follow torch's float32 matmul precision: full float32 unless TF32 is
    allowed; in the interpreter bfloat16 is computed in float32).

    Masks, combined (the semantics of :func:`flashlib.reference.naive_attention`):

    * ``causal``: query i sees key j when ``j <= i + N_k - N_q``. With N_q != N_k
      the diagonal is aligned to the bottom right, as in flash-attn >= 2.1, so
      the last query (the newest token when decoding) sees every key::

          N_q = 3, N_k = 6, causal        N_q = 6, N_k = 3, causal
             k0 k1 k2 k3 k4 k5               k0 k1 k2
          q0  x  x  x  x  .  .            q0  .  .  .   (no key: O = 0, L = -inf)
          q1  x  x  x  x  x  .            q1  .  .  .
          q2  x  x  x  x  x  x            q2  .  .  .
                                          q3  x  .  .
                                          q4  x  x  .
                                          q5  x  x  x

    * ``window=(left, right)``: query i sees keys ``i' - left <= j <= i' + right``
      with ``i' = i + N_k - N_q``; -1 or None leaves a side unbounded, and so does
      any bound at least as long as the sequences (any int, ``sys.maxsize`` or past it,
      as flash-attn takes them). With ``causal`` the right bound is at most 0.
    * ``seq_lens`` (B,) int32: sample b has ``seq_lens[b]`` valid queries and keys
      (padding at the end). Keys past it are masked; outputs past it are 0.

    A query row that sees no key gets O = 0 (never NaN) and L = -inf; this is a
    choice (PyTorch's SDPA gives NaN there). A NaN or inf in an input row that is
    seen, by contrast, reaches O, L and the gradients exactly as in PyTorch, so that
    a diverging run is not hidden. Padding past ``seq_lens`` is never read: whatever it
    holds (``torch.empty`` garbage, NaN) changes nothing.

    Scores, in this order (flash-attn's definitions): ``s = softmax_scale * q.k``
    (default 1/sqrt(D)); ``softcap > 0`` makes it ``softcap * tanh(s / softcap)``;
    ``alibi_slopes`` (H,) or (B, H) (used in float32) subtract ``slope * |i + N_k - N_q - j|``.
    ``dropout_p`` drops each attention weight with that probability and scales the
    kept ones by 1 / (1 - p) (a counter-based hash in the kernel, its seed drawn on q's device
    by torch's generator there, so ``torch.manual_seed`` reproduces it and a CUDA graph's replays
    redraw it; recomputed by the backward; the mask is never stored; p is rounded to a
    multiple of 1/256, as in flash-attn); ``dropout_p=0``
    gives exactly the dropout-free result. ``return_dropout_mask=True`` also returns the
    (B, H, N_q, N_k) bool mask of kept weights, for tests (O(N^2) memory).

    Under ``torch.autocast`` float q, k, v are first cast to autocast's dtype, as SDPA's are (O then comes
    in that dtype, and the gradients flow back to the inputs' own dtypes).

    Returns O in q's dtype and layout; with ``return_lse`` also L, the row
    logsumexp of the scaled, modified, masked scores (natural log, before dropout),
    float32 (B, H, N_q) ((B*H, N_q) for 3D inputs).

    Autograd: differentiable in q, k and v (any of them may not require grad);
    ``loss.backward()`` fills their ``.grad`` in their own layout and dtype with the
    FlashAttention backward kernels (P recomputed from L, deterministic). Gradients
    past ``seq_lens`` are exactly 0. L carries no gradient, and ALiBi slopes are constants
    (slopes being differentiated are refused). Double backward raises
    (``.backward(create_graph=True)``, ``torch.autograd.grad``, ``hessian``);
    ``torch.func.grad``, ``vjp`` and ``vmap`` work. Forward-mode AD works (``torch.func.jvp``,
    ``jacfwd``, ``torch.autograd.forward_ad``: a JVP kernel computes O's tangent from the saved
    O and L, :mod:`flashlib.kernels.attention_jvp`); differentiating its result again raises. Under ``torch.compile``
    the call is the custom op ``flashlib::attention_forward`` (see :mod:`flashlib.ops`):
    ``fullgraph=True`` traces through it.

    ``variant`` picks the forward kernel: ``"fa2"`` (FlashAttention-2, training and
    prefill), ``"splitkv"`` (split-KV, for few queries over many keys: decoding; forward
    only, no dropout) or ``"auto"`` (default): split-KV when nothing needs a gradient, there is
    no dropout and :func:`flashlib.select_variant` chooses it for the shape. Both give the
    same O and L.

    FP8 (inference, Ada/Hopper GPUs; :mod:`flashlib.fp8`): q, k, v ``torch.float8_e4m3fn``
    with ``q_descale``, ``k_descale``, ``v_descale`` (float32, (1,) per tensor or (B, H_kv)
    per sample and K/V head; the real values are ``x8 * descale``), O in ``out_dtype``
    (bfloat16 by default, or float16). No seq_lens, dropout or gradient.
    """
    check_bool("return_lse", return_lse)  # before the checked calls' shortcut, whose key leaves it out
    q, k, v = autocast_inputs(q, k, v)
    signature = None
    if (seq_lens is None and alibi_slopes is None and q_descale is None and k_descale is None and v_descale is None
            and out_dtype is None and return_dropout_mask is False and not torch.compiler.is_compiling()):
        signature = _call_signature(q, k, v, causal, window, softmax_scale, layout, softcap, dropout_p, variant)
        settings = CHECKED_CALLS.get(signature) if signature is not None else None
        if settings is not None:
            o, lse, _ = ops.run(q, k, v, None, None, None, None, settings)
            return (o, lse) if return_lse else o
    fp8 = any(is_fp8(t) for t in (q, k, v)) or any(d is not None for d in (q_descale, k_descale, v_descale))
    spec, alibi_slopes = check_attention_args(q, k, v, causal, seq_lens, window, softmax_scale, layout, softcap,
                                              alibi_slopes, dropout_p, allow_fp8=fp8)
    if seq_lens is not None:  # the kernels read lengths[b] at offset b: a strided view (a column of a table) is copied
        seq_lens = seq_lens.contiguous()
    if fp8:
        if seq_lens is not None or return_dropout_mask or variant == "splitkv":
            raise ValueError("FP8 attention takes unpadded batches through the FlashAttention-2 kernel: "
                             "seq_lens, return_dropout_mask and variant='splitkv' are not supported with it")
        return fp8_attention(q, k, v, spec, layout, alibi_slopes=alibi_slopes, q_descale=q_descale,
                             k_descale=k_descale, v_descale=v_descale, out_dtype=out_dtype or torch.bfloat16,
                             return_lse=return_lse)
    if out_dtype is not None:
        raise ValueError(f"out_dtype is for FP8 inputs (O in bfloat16 or float16); {q.dtype} inputs give O in "
                         f"their own dtype: got out_dtype={out_dtype}")
    check_bool("return_dropout_mask", return_dropout_mask)
    if return_dropout_mask and torch.compiler.is_compiling():
        raise ValueError("return_dropout_mask is a debugging aid for eager mode, not for torch.compile")
    if _forward_variant(variant, q, k, v, layout, spec, return_dropout_mask) == "splitkv":
        o, lse = _splitkv(q, k, v, seq_lens, alibi_slopes, layout, spec)
        return (o, lse) if return_lse else o
    settings = ops.op_settings(spec, layout, q.shape[-1])
    if signature is not None and _always_fa2(variant, _bhnd_shape(q, layout)[2]):
        if len(CHECKED_CALLS) >= CHECKED_CALLS_LIMIT:
            CHECKED_CALLS.clear()
        CHECKED_CALLS[signature] = settings  # this signature always passes the checks and takes FlashAttention-2
    o, lse, seed = ops.run(q, k, v, seq_lens, None, None, alibi_slopes, settings)
    outputs = (o, lse) if return_lse else (o,)
    if return_dropout_mask:  # recomputed from the seed the forward drew, as the backward does
        batch, heads, n_q, _ = _bhnd_shape(q, layout)
        n_k = _bhnd_shape(k, layout)[2]
        outputs += (dropout_mask(int(seed[0]), spec.dropout_p, batch, heads, n_q, n_k, q.device),)
    return outputs if len(outputs) > 1 else o


def _call_signature(q, k, v, causal, window, softmax_scale, layout, softcap, dropout_p, variant) -> tuple | None:
    """Everything the argument checks of a call without tensor-valued options look at: the tensors'
    types, layouts (dense or sparse), shapes, dtypes and devices, and each option's value *and type*
    (``causal=1`` equals ``causal=True`` but must still be refused). None where an option cannot be a
    key (a list window) or q, k, v are not all tensors (the checks name what came in)."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        return None
    key = (type(q), type(k), type(v), q.layout, k.layout, v.layout, q.shape, k.shape, v.shape, q.dtype, k.dtype,
           v.dtype, q.device, k.device, v.device, type(causal), causal, type(softmax_scale), softmax_scale,
           type(layout), layout, type(softcap), softcap, type(dropout_p), dropout_p, type(variant), variant,
           type(window), window if type(window) is not tuple else (window, tuple(map(type, window))))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _always_fa2(variant: str, n_q: int) -> bool:
    """Whether a call takes FlashAttention-2 whatever its grad state: asked for, or the shape's choice."""
    return variant == "fa2" or (variant == "auto" and preferred_variant(n_q) == "fa2")


def _forward_variant(variant, q, k, v, layout, spec, return_dropout_mask) -> str:
    """"fa2" or "splitkv" for this call; a ValueError where the asked variant cannot serve it."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}; got {variant!r}")
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    # A gradient settles "auto" before the length is read: torch.compile then puts no guard on N_q (a
    # recompile as it crosses split-KV's bound) where the variant cannot change.
    if (variant == "auto" and needs_grad) or _always_fa2(variant, _bhnd_shape(q, layout)[2]):
        return "fa2"  # serves every call: no refusal to look for
    refusal = ("q, k or v requires grad (split-KV is forward only; use torch.no_grad() for inference)"
               if needs_grad else "dropout_p > 0 (split-KV has no dropout)" if spec.dropout_p > 0 or
               return_dropout_mask else
               "a torch.func transform (vmap, grad, jvp) or forward-mode AD is applied to it (split-KV has no "
               "rules for them)" if transformed(q, k, v) else None)
    if variant == "splitkv":
        if refusal:
            raise ValueError(f"variant='splitkv' cannot serve this call: {refusal}; use variant='fa2' or 'auto'")
        return variant
    return "fa2" if refusal else "splitkv"


def _splitkv(q, k, v, seq_lens, alibi_slopes, layout, spec):
    """(O, L) of a checked padded-batch call through the split-KV kernel, in flash_attention's shapes."""
    views = (q, k, v) if q.dim() == 4 else (q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1))
    o, lse = splitkv_attention(*views, layout, spec, seq_lens=seq_lens, alibi_slopes=alibi_slopes)
    if q.dim() == 3:
        return o.squeeze(1), lse.squeeze(1)
    return o, lse


def flash_attention_v2(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, **kwargs):
    """Seed 003's entry point: ``flash_attention`` on (B, N, H, D) tensors, as flash-attn's ``flash_attn_func``.

    q (B, N_q, H, D), k and v (B, N_k, H_kv, D); returns O (B, N_q, H, D). Every other
    keyword of :func:`flash_attention` (``seq_lens``, ``window``, ``softmax_scale``,
    ``softcap``, ``alibi_slopes``, ``dropout_p``, ``return_lse``) works the same.
    """
    if "layout" in kwargs:
        raise TypeError("flash_attention_v2 takes (B, N, H, D) tensors; for another layout call "
                        "flash_attention(..., layout=...)")
    return flash_attention(q, k, v, causal, layout="bnhd", **kwargs)
