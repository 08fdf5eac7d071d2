"""Argument checks shared by every attention entry point (padded, (B, N, H, D), packed).

Each check raises a TypeError or ValueError that names the argument, says what was
expected and shows what came in. Checks that read tensor *values* (the range of
``seq_lens``, the offsets in ``cu_seqlens``) cost a device sync and would break a
``torch.compile`` graph; they run in eager mode only (``values_checked()``), where the
kernels then trust the values.
"""
from __future__ import annotations

import warnings

import torch
from torch.autograd import forward_ad

from . import runtime
from .kernels.attention_fwd import MAX_HEAD_DIM, MIN_HEAD_DIM
from .kernels.dropout import effective_dropout_p
from .spec import AttentionSpec

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def values_checked(*tensors: torch.Tensor) -> bool:
    """Whether checks may read these tensors' values: not while torch.compile traces (no sync, no graph
    break), nor while a CUDA graph is captured (a sync is illegal there; decoding steps are captured),
    nor under torch.func.vmap, whose batched tensors have no single value to read."""
    if torch.compiler.is_compiling():
        return False
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return False
    return not functorch_wrapped(*tensors)


def functorch_wrapped(*tensors: torch.Tensor) -> bool:
    """Whether a torch.func transform (vmap, grad, jvp) wraps any of the tensors."""
    return any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in tensors)


def forward_mode_active() -> bool:
    """Whether forward-mode AD is on: ``torch.func.jvp`` or ``jacfwd`` is running, or a dual level is open.
    Asked of torch's state, not of tensors, so dynamo reads it as a constant while it traces."""
    return forward_ad._current_level >= 0


def transform_or_forward_mode_active() -> bool:
    """Whether a torch.func transform (vmap, grad, jvp) or forward-mode AD is active: then only the
    autograd.Functions' rules may handle a call (a kernel would drop a tangent or a batch dimension silently)."""
    return torch._C._are_functorch_transforms_active() or forward_mode_active()


def check_bool(name: str, value) -> None:
    """A TypeError naming ``name`` unless ``value`` is a bool: a flag such as ``return_lse`` given "no" or 1 would
    otherwise be read as true, or as false, without a word."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool; got {value!r}")


def transformed(*tensors) -> bool:
    """Whether torch.func wraps the tensors (vmap, grad, jvp) or forward-mode AD gives them tangents: only
    FlashAttention-2's op has the rules for those, and the split-KV kernel would otherwise drop a tangent silently or
    fail inside Triton on a wrapped tensor. Shared by the entries that reach split-KV (:func:`flashlib.flash_attention`
    picking its variant, :func:`flashlib.flash_attention_with_kvcache` refusing the call). None entries are skipped.
    While torch.compile traces, the tensors are not asked (that would break the graph); whether a torch.func
    transform or a dual level is active is, which dynamo reads as a constant. With neither active, no tensor can
    be wrapped or carry a tangent, and asking that first spares a decoding step the tensors' unpacking (5.5 µs of
    host time against 0.13 on a CPU, session 72's review)."""
    active = transform_or_forward_mode_active()
    if not active or torch.compiler.is_compiling():
        return active
    tensors = [t for t in tensors if t is not None]
    if functorch_wrapped(*tensors):
        return True
    return any(forward_ad.unpack_dual(t).tangent is not None for t in tensors)


#: The dtypes autocast lowers (FP8 and integers pass as they are: the checks name them).
AUTOCAST_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def autocast_inputs(q, k, v) -> tuple:
    """q, k, v in autocast's dtype where ``torch.autocast`` is on for their device, as SDPA (one of autocast's
    lower-precision ops) takes them: under mixed precision a model's q and k often come out of RoPE in float32
    while v is already 16-bit, and the kernels need one dtype. Anything else passes unchanged."""
    if not (isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)):
        return q, k, v
    device = q.device.type
    if torch.compiler.is_compiling():  # Dynamo of torch 2.11 cannot trace is_autocast_available; a traced
        enabled = torch.is_autocast_enabled(device)  # tensor is on a device that has autocast (cuda, cpu)
    else:
        enabled = torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)  # none on "meta"
    if not enabled:
        return q, k, v
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) if t.dtype in AUTOCAST_DTYPES and t.dtype != dtype else t for t in (q, k, v))


def describe_shapes(q, k, v) -> str:
    """The shapes of q, k, v for an error message (built only when one is raised)."""
    return f"q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}, v.shape={tuple(v.shape)}"


def check_tensors(q, k, v, dims: tuple[int, ...], kind: str, shapes_expected: str) -> None:
    """q, k, v are tensors with a number of dimensions in ``dims``, all alike.

    ``kind`` names what is expected ("3D or 4D tensors"), ``shapes_expected`` spells the shapes out.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"Expected {kind}: {name} is a {type(t).__name__}, not a torch.Tensor")
        if t.layout != torch.strided:  # the kernels read memory through strides: a sparse tensor has none
            raise TypeError(f"Expected dense {kind}: {name} has layout {t.layout}; convert it with "
                            f"{name}.to_dense()")
    if q.dim() not in dims or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(f"Expected {kind}{shapes_expected}; got {describe_shapes(q, k, v)}")


def check_dtypes_and_device(q, k, v, allow_fp8: bool = False) -> None:
    """q, k, v share one supported dtype (float8_e4m3fn too with ``allow_fp8``) and sit on the device
    the kernels run on."""
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(f"q, k, v must have the same dtype; got q.dtype={q.dtype}, k.dtype={k.dtype}, "
                        f"v.dtype={v.dtype}")
    if q.dtype not in SUPPORTED_DTYPES and not (allow_fp8 and q.dtype == torch.float8_e4m3fn):
        raise TypeError(f"Unsupported dtype {q.dtype} for q, k, v: expected float16, bfloat16, float32 "
                        f"(or float8_e4m3fn with descale factors, for inference)")
    if q.device != k.device or q.device != v.device:
        raise ValueError(f"q, k, v must be on the same device; got q on {q.device}, k on {k.device}, "
                         f"v on {v.device}")
    if q.device.type != runtime.DEVICE.type:
        raise ValueError(f"q, k, v must be on {runtime.DEVICE.type} ({runtime.mode_description()}); "
                         f"got {q.device}")


def check_heads(q, k, v, heads: int, kv_heads: int, head_dim: int, where: str = "") -> None:
    """H a multiple of H_kv (GQA/MQA) and a head_dim the kernels support."""
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"GQA needs q heads ({heads}) to be a multiple of k/v heads ({kv_heads}){where}; "
                         f"got {describe_shapes(q, k, v)}")
    if not MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"Unsupported head_dim {head_dim}: flashlib's attention supports {MIN_HEAD_DIM} to "
                         f"{MAX_HEAD_DIM} (non-powers of two are padded in registers); got {describe_shapes(q, k, v)}")


def check_alibi_slopes(alibi_slopes, batch: int, heads: int, device: torch.device) -> torch.Tensor | None:
    """None, or the slopes as float32 (the kernels' dtype; a model cast to bfloat16 casts its slope
    buffer too): floating-point, of shape (H,) or (B, H), on q's device (flash-attn's convention)."""
    if alibi_slopes is None:
        return None
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes must be a floating-point tensor of shape (H,) or (B, H); "
                        f"got a {type(alibi_slopes).__name__}")
    if not alibi_slopes.is_floating_point():
        raise TypeError(f"alibi_slopes must be floating-point (float32 preferred); got {alibi_slopes.dtype}")
    if tuple(alibi_slopes.shape) not in ((heads,), (batch, heads)):
        raise ValueError(f"alibi_slopes must have shape (H,) = ({heads},) or (B, H) = ({batch}, {heads}); "
                         f"got {tuple(alibi_slopes.shape)}")
    if alibi_slopes.device != device:
        raise ValueError(f"alibi_slopes must be on the same device as q ({device}); got {alibi_slopes.device}")
    if differentiated(alibi_slopes):
        raise ValueError("alibi_slopes is being differentiated (it requires grad, carries a forward-mode tangent, "
                         "or is an input of torch.func.grad or jvp), but flash_attention treats the slopes as "
                         "constants and gives them no gradient and no tangent: pass alibi_slopes.detach(), or use "
                         "flashlib.reference.naive_attention to learn the slopes")
    return alibi_slopes.float()


def differentiated(t: torch.Tensor) -> bool:
    """Whether some derivative is being taken with respect to ``t``: it requires grad (with grad mode on; inside
    torch.func.grad too, where a tensor computed from the differentiated input does and a constant does not), or
    it carries a tangent (forward-mode AD, torch.func.jvp). Being wrapped by a transform says nothing: every tensor
    made inside torch.func.grad is, constants included. While torch.compile traces, only the first is asked (the
    other would break the graph, and the compiled call is the custom op)."""
    if torch.is_grad_enabled() and t.requires_grad:
        return True
    if torch.compiler.is_compiling():
        return False
    return forward_ad.unpack_dual(t).tangent is not None


def make_spec(causal, window, softmax_scale, softcap, alibi_slopes, dropout_p) -> AttentionSpec:
    """The checked :class:`~flashlib.spec.AttentionSpec` of a call (its constructor names what is wrong).

    ``softcap`` and ``dropout_p`` of None mean 0 (Hugging Face passes None for "off").
    """
    spec = AttentionSpec.checked(causal=causal, window=window,
                                 softmax_scale=softmax_scale, softcap=0.0 if softcap is None else softcap,
                                 has_alibi=alibi_slopes is not None, dropout_p=0.0 if dropout_p is None else dropout_p)
    if spec.dropout_p > 0 and effective_dropout_p(spec.dropout_p) == 0:
        warnings.warn(f"dropout_p={spec.dropout_p:g} rounds to 0 at the kernels' resolution (multiples of 1/256): "
                      "no attention weight is dropped. Pass 0, or at least 1/512", stacklevel=3)
    return spec


def check_lengths(lengths, name: str, batch: int, device: torch.device, meaning: str) -> None:
    """A (B,) torch.int32 tensor of per-sample lengths on q's device; ``meaning`` says what one length is."""
    if not isinstance(lengths, torch.Tensor):
        raise TypeError(f"{name} must be a (B,) torch.int32 tensor; got a {type(lengths).__name__}")
    if lengths.dtype != torch.int32:
        raise TypeError(f"{name} must be torch.int32; got {lengths.dtype} (use {name}.int())")
    if tuple(lengths.shape) != (batch,):
        raise ValueError(f"{name} must have shape (B,) = ({batch},), {meaning}; got {tuple(lengths.shape)}")
    if lengths.device != device:
        raise ValueError(f"{name} must be on the same device as q ({device}); got {lengths.device}")
