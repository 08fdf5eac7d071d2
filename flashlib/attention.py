"""``flash_attention``: the FlashAttention kernels behind one checked function.

This module checks the arguments, turns every accepted layout into a (B, H, N, D)
*view* (strides only, no copy), allocates the outputs in the caller's layout and
dispatches to :mod:`flashlib.kernels.attention_fwd` (forward) and
:mod:`flashlib.kernels.attention_bwd` (backward, through ``FlashAttentionFunction``,
a ``torch.autograd.Function``). Mask semantics are those
of :func:`flashlib.reference.naive_attention`, the ground truth it is tested
against.
"""
from __future__ import annotations

import math
import numbers

import torch

from . import runtime
from .kernels.attention_bwd import launch_attention_backward
from .kernels.attention_fwd import MAX_HEAD_DIM, MIN_HEAD_DIM, launch_attention_forward

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LAYOUTS = ("bhnd", "bnhd")


def _as_bhnd(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A (B, H, N, D) view of a 3D (B*H, N, D) or 4D tensor in ``layout``: no copy."""
    if t.dim() == 3:
        return t.unsqueeze(1)
    return t if layout == "bhnd" else t.transpose(1, 2)


def _check_window(window) -> None:
    if window is None:
        return
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be a pair (left, right) of ints (-1 or None: unbounded); got {window!r}")
    for side, value in zip(("left", "right"), window):
        if value is None:
            continue
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise TypeError(f"window {side} bound must be an int (-1 or None: unbounded); got {value!r}")
        if value < -1:
            raise ValueError(f"window {side} bound must be >= 0, or -1 for unbounded; got window={tuple(window)}")


def _check_seq_lens(seq_lens, batch: int, n_q: int, n_k: int, device: torch.device) -> None:
    if seq_lens is None:
        return
    if not isinstance(seq_lens, torch.Tensor):
        raise TypeError(f"seq_lens must be a (B,) torch.int32 tensor; got a {type(seq_lens).__name__}")
    if seq_lens.dtype != torch.int32:
        raise TypeError(f"seq_lens must be torch.int32; got {seq_lens.dtype} (use seq_lens.int())")
    if tuple(seq_lens.shape) != (batch,):
        raise ValueError(f"seq_lens must have shape (B,) = ({batch},), one length per sample; "
                         f"got {tuple(seq_lens.shape)}")
    if seq_lens.device != device:
        raise ValueError(f"seq_lens must be on the same device as q ({device}); got {seq_lens.device}")
    if batch:
        low, high = int(seq_lens.min()), int(seq_lens.max())  # one sync on a GPU
        if low < 0 or high > max(n_q, n_k):
            raise ValueError(f"seq_lens must lie in [0, max(N_q, N_k)] = [0, {max(n_q, n_k)}]; "
                             f"got values from {low} to {high}")


def check_dtypes_and_device(q, k, v) -> None:
    """q, k, v share one supported dtype and sit on the device the kernels run on."""
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"q, k, v must have the same dtype; got q.dtype={q.dtype}, k.dtype={k.dtype}, "
                        f"v.dtype={v.dtype}")
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"Unsupported dtype {q.dtype} for q, k, v: expected float16, bfloat16 or float32")
    if q.device != k.device or q.device != v.device:
        raise ValueError(f"q, k, v must be on the same device; got q on {q.device}, k on {k.device}, "
                         f"v on {v.device}")
    if q.device.type != runtime.DEVICE.type:
        raise ValueError(f"q, k, v must be on {runtime.DEVICE.type} ({runtime.mode_description()}); "
                         f"got {q.device}")


def check_attention_args(q, k, v, causal=False, seq_lens=None, window=None,
                         softmax_scale=None, layout="bhnd") -> None:
    """Raise a ValueError/TypeError naming the argument that is wrong, and what came in."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"Expected 3D or 4D tensors: {name} is a {type(t).__name__}, not a torch.Tensor")
    shapes = f"q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)}"
    if q.dim() not in (3, 4) or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(f"Expected 3D or 4D tensors ((B*H, N, D) or (B, H, N, D)), all alike; got {shapes}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    if q.dim() == 3 and layout != "bhnd":
        raise ValueError(f"layout={layout!r} needs 4D tensors; 3D tensors are (B*H, N, D): got {shapes}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool; got {causal!r}")
    check_dtypes_and_device(q, k, v)

    q4, k4, v4 = (_as_bhnd(t, layout) for t in (q, k, v))
    batch, heads, n_q, head_dim = q4.shape
    if k4.shape != v4.shape or k4.shape[0] != batch or k4.shape[3] != head_dim:
        raise ValueError(f"Q, K, V shapes must match (layout {layout!r}: same batch and head_dim for q, k, v; "
                         f"k and v identical); got {shapes}")
    kv_heads = k4.shape[1]
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"GQA needs q heads ({heads}) to be a multiple of k/v heads ({kv_heads}) "
                         f"(layout {layout!r}); got {shapes}")
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"Unsupported head_dim {head_dim}: flash_attention supports {MIN_HEAD_DIM} to "
                         f"{MAX_HEAD_DIM} (non-powers of two are padded in registers); got {shapes}")
    _check_seq_lens(seq_lens, batch, n_q, k4.shape[2], q.device)
    _check_window(window)
    if softmax_scale is not None:
        if not isinstance(softmax_scale, numbers.Real) or isinstance(softmax_scale, bool):
            raise TypeError(f"softmax_scale must be a float or None; got {softmax_scale!r}")
        if not math.isfinite(softmax_scale):
            raise ValueError(f"softmax_scale must be finite; got {softmax_scale}")


def _empty_output(q4: torch.Tensor, layout: str, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised output stored in the caller's layout, seen as (B, H, N, D)."""
    batch, heads, n_q, head_dim = q4.shape
    if layout == "bnhd":
        return torch.empty((batch, n_q, heads, head_dim), dtype=dtype, device=q4.device).transpose(1, 2)
    return torch.empty((batch, heads, n_q, head_dim), dtype=dtype, device=q4.device)


def _forward(q4, k4, v4, seq_lens, causal, window, softmax_scale, layout):
    """O (B, H, N_q, D) view in the caller's layout and dtype, and L (B, H, N_q) float32."""
    batch, heads, n_q, _ = q4.shape
    o = _empty_output(q4, layout, q4.dtype)
    lse = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q4.device)
    if o.numel() == 0:
        return o, lse
    if k4.shape[2] == 0:  # no key at all: every row is fully masked
        return o.zero_(), lse.fill_(float("-inf"))
    q_run, k_run, v_run = runtime.upcast_for_interpreter(q4, k4, v4)  # bf16 → fp32 in the interpreter
    o_run = o if q_run.dtype == o.dtype else _empty_output(q4, layout, q_run.dtype)
    launch_attention_forward(q_run, k_run, v_run, o_run, lse, causal=causal, window=window,
                             seq_lens=None if seq_lens is None else seq_lens.contiguous(),
                             softmax_scale=softmax_scale)
    if o_run is not o:
        o.copy_(o_run)
    return o, lse


DOUBLE_BACKWARD_MESSAGE = (
    "flash_attention has no double backward (its backward kernels are not differentiable): "
    "gradients of gradients through it are not supported; use flashlib.reference.naive_attention "
    "for higher-order derivatives")


class _RefuseDoubleBackward(torch.autograd.Function):
    """Identity on the gradients, whose own backward raises: double backward fails loudly.

    A custom backward that runs kernels is not itself recorded by autograd; without this
    node, ``create_graph=True`` would give gradients silently treated as constants.
    """

    @staticmethod
    def forward(ctx, *grads):
        return grads

    @staticmethod
    def backward(ctx, *grad_grads):
        raise RuntimeError(DOUBLE_BACKWARD_MESSAGE)


def _backward(ctx, grad_o):
    """dq, dk, dv (None where not needed) from the saved tensors and the output gradient."""
    q4, k4, v4, o, lse, seq_lens = ctx.saved_tensors
    need_q, need_k, need_v = ctx.needs_input_grad[:3]
    layout = ctx.layout
    dq = _empty_output(q4, layout, q4.dtype) if need_q else None
    dk = _empty_output(k4, layout, k4.dtype) if need_k or need_v else None
    dv = _empty_output(v4, layout, v4.dtype) if need_k or need_v else None
    if q4.shape[2] == 0 or k4.shape[2] == 0:  # no query or no key: no gradient flows
        grads = [g.zero_() if g is not None else None for g in (dq, dk, dv)]
    else:
        run = runtime.upcast_for_interpreter(q4, k4, v4, o, grad_o)  # bf16 → fp32 in the interpreter
        outs = [g if g is None or g.dtype == run[0].dtype else _empty_output(g, layout, run[0].dtype)
                for g in (dq, dk, dv)]
        launch_attention_backward(*run[:4], lse, run[4], *outs, **ctx.mask_args,
                                  seq_lens=None if seq_lens is None else seq_lens.contiguous())
        grads = [g if g is None or g is out else g.copy_(out) for g, out in zip((dq, dk, dv), outs)]
    if not need_k:
        grads[1] = None
    if not need_v:
        grads[2] = None
    return grads


class FlashAttentionFunction(torch.autograd.Function):
    """Autograd node of flash_attention on (B, H, N, D) views.

    forward saves q, k, v, O and the logsumexp L (O(N) memory per row, never P);
    backward runs the kernels of :mod:`flashlib.kernels.attention_bwd`. L is an output
    without gradient (``mark_non_differentiable``). Double backward raises.
    """

    @staticmethod
    def forward(ctx, q4, k4, v4, seq_lens, causal, window, softmax_scale, layout):
        o, lse = _forward(q4, k4, v4, seq_lens, causal, window, softmax_scale, layout)
        ctx.save_for_backward(q4, k4, v4, o, lse, seq_lens)
        ctx.mask_args = dict(causal=causal, window=window, softmax_scale=softmax_scale)
        ctx.layout = layout
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, grad_o, grad_lse):
        with torch.no_grad():
            dq, dk, dv = _backward(ctx, grad_o)
        grads = [dq, dk, dv]
        # create_graph=True: the gradients would depend on q, k, v, dO through kernels autograd
        # cannot see; chain them to a node that refuses to be differentiated.
        inputs_need_grad = grad_o.requires_grad or any(t.requires_grad for t in ctx.saved_tensors[:3])
        if torch.is_grad_enabled() and inputs_need_grad:
            present = [i for i, g in enumerate(grads) if g is not None]
            chained = _RefuseDoubleBackward.apply(*(grads[i].detach().requires_grad_() for i in present))
            for i, g in zip(present, chained):
                grads[i] = g
        return (*grads, None, None, None, None, None)


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    seq_lens: torch.Tensor | None = None, window=None,
                    softmax_scale: float | None = None, layout: str = "bhnd",
                    return_lse: bool = False):
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
      with ``i' = i + N_k - N_q``; -1 or None leaves a side unbounded. With
      ``causal`` the right bound is at most 0.
    * ``seq_lens`` (B,) int32: sample b has ``seq_lens[b]`` valid queries and keys
      (padding at the end). Keys past it are masked; outputs past it are 0.

    A query row that sees no key gets O = 0 (never NaN) and L = -inf.
    ``softmax_scale`` defaults to 1/sqrt(D).

    Returns O in q's dtype and layout; with ``return_lse`` also L, the row
    logsumexp of the scaled masked scores (natural log), float32 (B, H, N_q)
    ((B*H, N_q) for 3D inputs).

    Autograd: differentiable in q, k and v (any of them may not require grad);
    ``loss.backward()`` fills their ``.grad`` in their own layout and dtype with the
    FlashAttention backward kernels (P recomputed from L, deterministic). Gradients
    past ``seq_lens`` are exactly 0. L carries no gradient; double backward raises.
    """
    check_attention_args(q, k, v, causal, seq_lens, window, softmax_scale, layout)
    window = None if window is None else tuple(window)
    q4, k4, v4 = (_as_bhnd(t, layout) for t in (q, k, v))
    o4, lse = FlashAttentionFunction.apply(q4, k4, v4, seq_lens, causal, window, softmax_scale, layout)
    if q.dim() == 3:
        o, lse = o4.squeeze(1), lse.squeeze(1)
    else:
        o = o4 if layout == "bhnd" else o4.transpose(1, 2)
    return (o, lse) if return_lse else o
