"""FP8 attention for inference on Hopper: float8 (e4m3) Q, K, V with descale factors, O in 16 bits.

FP8 halves the bytes of Q, K and V and doubles the tensor cores' rate, so the forward
can run faster than in float16 (FlashAttention-3 reports about 1.2 PFLOP/s on an H100).
A model keeps its tensors quantized as ``x8 = x / descale`` (``descale`` per tensor, or
per sample and K/V head); the kernel multiplies the descales back in, folding q's and
k's into the softmax scale and v's into the output, and feeds P to the tensor cores in
FP8 too (its values lie in [0, 1]).

    q8, q_descale = quantize_fp8(q)            # per-tensor, or per_head=True for (B, H_kv)
    o = flash_attention(q8, k8, v8, causal=True, q_descale=q_descale, k_descale=k_descale,
                        v_descale=v_descale)   # bfloat16 by default (out_dtype=)

Store V with the keys innermost (``v.transpose(-1, -2).contiguous().transpose(-1, -2)`` in
(B, H, N, D)) to spare the call a transposing copy: FP8 tensor cores want P V's reduction
dimension contiguous. Descale factors on the GPU are checked there (a factor <= 0 stops the
kernel with a device-side assert), never with a host sync.

Forward only (FP8 tensors carry no gradient), for unpadded batches in either layout,
with causal, window, GQA, softcap and ALiBi. The interpreter and GPUs without FP8 tensor
cores (before Ada/Hopper) get a clear error.
"""
from __future__ import annotations

import functools

import torch

from . import runtime
from .gpu import detect_gpu
from .kernels.attention_fwd import launch_attention_forward
from .ops import as_bhnd

#: The FP8 format the kernels take: 4 exponent and 3 mantissa bits, largest finite value 448.
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
OUT_DTYPES = (torch.bfloat16, torch.float16)


def is_fp8(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == FP8_DTYPE


def quantize_fp8(x: torch.Tensor, layout: str = "bhnd", per_head: bool = False, kv_heads: int | None = None):
    """``(x8, descale)`` with ``x8 * descale ~= x``: the amax scaled to the largest FP8 value.

    4D ``x`` in ``layout``. ``per_head``: one factor per (sample, K/V head), shape (B, H_kv),
    as the kernels take them; for queries pass ``kv_heads`` (each factor then covers a GQA group
    of query heads). Otherwise one factor per tensor, shape (1,).
    """
    if not per_head:
        descale = torch.clamp(x.abs().amax().float().reshape(1), min=1e-12) / FP8_MAX
        return (x.float() / descale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), descale
    bhnd = as_bhnd(x, layout)
    batch, heads = bhnd.shape[:2]
    groups = kv_heads or heads
    if heads % groups:
        raise ValueError(f"kv_heads ({groups}) must divide the heads of x ({heads})")
    grouped = bhnd.reshape(batch, groups, heads // groups, *bhnd.shape[2:])
    descale = torch.clamp(grouped.abs().amax(dim=(2, 3, 4)).float(), min=1e-12) / FP8_MAX  # (B, H_kv)
    x8 = (grouped.float() / descale[:, :, None, None, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    x8 = x8.reshape(bhnd.shape)
    return (x8 if layout == "bhnd" else x8.transpose(1, 2)), descale


def _check_descale(name: str, descale, batch: int, kv_heads: int, device) -> torch.Tensor:
    """A (B, H_kv) float32 tensor of positive factors from None (1), a per-tensor (1,)/() or a (B, H_kv) one."""
    if descale is None:
        return torch.ones(batch, kv_heads, dtype=torch.float32, device=device)
    if not isinstance(descale, torch.Tensor) or not descale.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor of shape (1,) or (B, H_kv) = ({batch}, "
                        f"{kv_heads}); got {descale!r}")
    if descale.device != device:
        raise ValueError(f"{name} must be on q's device {device}; got {descale.device}")
    if descale.numel() == 1:
        descale = descale.reshape(1, 1).expand(batch, kv_heads)
    elif tuple(descale.shape) != (batch, kv_heads):
        raise ValueError(f"{name} must have shape (1,) (per tensor) or (B, H_kv) = ({batch}, {kv_heads}) "
                         f"(per sample and K/V head); got {tuple(descale.shape)}")
    descale = descale.float()
    good = (descale > 0).all() & descale.isfinite().all()
    message = f"{name} must hold finite factors > 0"
    if descale.device.type == "cpu":
        if not bool(good):
            raise ValueError(f"{message}; got {descale}")
    else:  # checked on the GPU, without a sync: a host sync per call cost 30-45% at N = 4096 (measured)
        torch._assert_async(good, message)
    return descale


def _check_device(q: torch.Tensor) -> None:
    if runtime.INTERPRET or q.device.type != "cuda":
        raise RuntimeError("FP8 attention needs a GPU with FP8 tensor cores (Ada or Hopper, compute "
                           f"capability >= 8.9); it does not run in Triton's interpreter ({runtime.mode_description()})")
    gpu = _gpu(q.device.index if q.device.index is not None else torch.cuda.current_device())
    if not gpu.supports_fp8:
        raise RuntimeError(f"FP8 attention needs compute capability >= 8.9 (Ada or Hopper); "
                           f"{gpu.name} has {'.'.join(map(str, gpu.compute_capability))}")


@functools.lru_cache(maxsize=None)
def _gpu(index: int):
    """``detect_gpu`` asked once per device (every FP8 call checks it)."""
    return detect_gpu(index)


def keys_innermost(v: torch.Tensor) -> torch.Tensor:
    """V (B, H, N, D) stored with the keys innermost, rows of a multiple of 16 bytes (the copy engine's
    alignment; the padding is never read): FP8 tensor cores read P V's reduction dimension contiguous.
    ``v`` itself when it already is."""
    batch, heads, n_k, head_dim = v.shape
    if v.stride(2) == 1 and all(s % 16 == 0 for s in (v.stride(0), v.stride(1), v.stride(3))):
        return v
    padded = torch.empty(batch, heads, head_dim, -(-n_k // 16) * 16, dtype=v.dtype, device=v.device)
    padded[..., :n_k].copy_(v.transpose(2, 3))
    return padded[..., :n_k].transpose(2, 3)


def fp8_attention(q, k, v, spec, layout: str, *, alibi_slopes=None, q_descale=None, k_descale=None,
                  v_descale=None, out_dtype=torch.bfloat16, return_lse: bool = False):
    """The forward of :func:`flashlib.flash_attention` for float8_e4m3fn q, k, v (already shape-checked).

    Returns O in ``out_dtype`` and q's layout (and L, float32 (B, H, N_q), with ``return_lse``).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not is_fp8(t):
            raise TypeError(f"FP8 attention needs q, k, v all {FP8_DTYPE}; {name} is {t.dtype}")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be torch.bfloat16 or torch.float16 for FP8 inputs; got {out_dtype}")
    if spec.dropout_p > 0:
        raise ValueError("FP8 attention is for inference: dropout_p must be 0")
    q4, k4, v4 = (as_bhnd(t, layout) for t in (q, k, v))
    batch, heads, n_q, _ = q4.shape
    kv_heads = k4.shape[1]
    descale = torch.stack([_check_descale(name, d, batch, kv_heads, q.device) for name, d in
                           (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))])
    _check_device(q)
    if q.numel() == 0 or k4.shape[2] == 0:  # nothing to compute, or no key: every row fully masked
        o = torch.zeros(q.shape, dtype=out_dtype, device=q.device)
        lse = torch.full((batch, heads, n_q), float("-inf"), device=q.device)
        return (o, lse.squeeze(1) if q.dim() == 3 else lse) if return_lse else o
    v_keys_inner = keys_innermost(v4)
    o = torch.empty(q.shape, dtype=out_dtype, device=q.device)
    o4 = as_bhnd(o, layout)
    lse = torch.empty(batch, heads, n_q, dtype=torch.float32, device=q.device)
    launch_attention_forward(q4, k4, v_keys_inner, o4, lse, spec, alibi_slopes=alibi_slopes,
                             descale=descale.contiguous())
    if return_lse:
        return o, (lse.squeeze(1) if q.dim() == 3 else lse)
    return o
