"""Ground truth: attention written plainly in PyTorch.

Every kernel and every exercise check in flashlib is compared with these
functions, in float64. They materialise the full N x N score matrix, which is
exactly what FlashAttention avoids, and they spell out the mask semantics once:

* ``causal``: query i may see key j when ``j <= i + (n_k - n_q)``, i.e. the mask is
  aligned to the *bottom right* corner when queries and keys differ in length
  (as in flash-attn >= 2.1: the last query sees every key, as in decoding)::

      n_q = 2, n_k = 5, causal            n_q = 5, n_k = 5, causal
        k0 k1 k2 k3 k4                      k0 k1 k2 k3 k4
      q0 x  x  x  x  .                    q0 x  .  .  .  .
      q1 x  x  x  x  x                    q1 x  x  .  .  .
                                          ...
* ``window=(left, right)``: query i sees keys ``i' - left <= j <= i' + right`` with
  ``i' = i + n_k - n_q``; ``-1`` (or None) means unbounded on that side.
  ``causal`` is ``window=(-1, 0)``.
* ``seq_lens`` (B,): sample b has ``seq_lens[b]`` valid queries *and* keys (padding
  at the end). Keys past the length are masked; queries past it are masked rows:
  output 0 and logsumexp -inf.
* a query row with no visible key gets output 0 (never NaN) and logsumexp -inf.
* GQA/MQA: k and v may have fewer heads than q when q's head count is a multiple;
  query head h reads key/value head ``h // (H_q // H_kv)``.
* score modifiers, in this order: ``s = scale * q.k``; ``softcap > 0`` makes it
  ``softcap * tanh(s / softcap)``; ``alibi_slopes`` (H,) or (B, H) subtract
  ``slope * |i + n_k - n_q - j|`` (flash-attn's ALiBi). The logsumexp is of these scores.
* dropout: ``dropout_mask`` (B, H, n_q, n_k) bool, True where a weight is kept, scales
  the kept softmax weights by ``1 / (1 - dropout_p)`` before they multiply V (the
  logsumexp is before dropout). :func:`dropout_keep_reference` spells out which weights the
  kernels keep for a seed.

Shapes are (B, H, N, D) ("bhnd"), the layout of ``torch.nn.functional.scaled_dot_product_attention``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .spec import softmax_scale_for, window_bounds


def stable_softmax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Softmax that subtracts the row max first, so exp never overflows.

    Rows that are entirely -inf give 0 rather than NaN.
    """
    row_max = x.amax(dim=dim, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(x - row_max)
    total = e.sum(dim=dim, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


def attention_mask(n_q: int, n_k: int, *, causal: bool = False, window=None,
                   seq_lens: torch.Tensor | None = None, batch: int = 1,
                   device=None) -> torch.Tensor:
    """Boolean mask (B, 1, n_q, n_k), True where query i may attend to key j."""
    rows = torch.arange(n_q, device=device).view(-1, 1) + (n_k - n_q)
    cols = torch.arange(n_k, device=device).view(1, -1)
    allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    left, right = window_bounds(causal, window)
    if left is not None:
        allowed &= cols >= rows - left
    if right is not None:
        allowed &= cols <= rows + right
    allowed = allowed.view(1, 1, n_q, n_k).expand(batch, 1, n_q, n_k)
    if seq_lens is not None:
        lens = seq_lens.to(device=device, dtype=torch.long).view(-1, 1, 1, 1)
        allowed = allowed & (cols.view(1, 1, 1, n_k) < lens)
    return allowed


def expand_kv_heads(k: torch.Tensor, n_q_heads: int) -> torch.Tensor:
    """Repeat key/value heads so that each query head has its own (GQA → MHA)."""
    n_kv_heads = k.shape[1]
    if n_q_heads % n_kv_heads != 0:
        raise ValueError(f"GQA needs q heads ({n_q_heads}) to be a multiple of k/v heads ({n_kv_heads})")
    return k.repeat_interleave(n_q_heads // n_kv_heads, dim=1)


def naive_attention(q, k, v, *, causal=False, softmax_scale=None, window=None,
                    seq_lens=None, return_lse=False, softcap=0.0, alibi_slopes=None,
                    dropout_p=0.0, dropout_mask=None):
    """softmax(Q K^T * scale + mask) V with the full N x N matrix in memory.

    q: (B, H, N_q, D); k, v: (B, H_kv, N_k, D). Computed in the inputs' dtype
    (pass float64 tensors for ground truth). Returns O (B, H, N_q, D) and, with
    ``return_lse``, the row logsumexp (B, H, N_q) of the scaled, modified, masked scores.
    ``dropout_mask`` is required when ``dropout_p > 0``: the reference draws no random numbers.
    """
    if dropout_p > 0 and dropout_mask is None:
        raise ValueError("naive_attention needs the dropout_mask (B, H, N_q, N_k) to apply dropout_p > 0")
    batch, n_heads, n_q, head_dim = q.shape
    n_k = k.shape[2]
    k = expand_kv_heads(k, n_heads)
    v = expand_kv_heads(v, n_heads)
    scale = softmax_scale_for(head_dim, softmax_scale)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if alibi_slopes is not None:
        distance = (torch.arange(n_q, device=q.device).view(-1, 1) + (n_k - n_q)
                    - torch.arange(n_k, device=q.device).view(1, -1)).abs()
        slopes = alibi_slopes.to(device=q.device, dtype=scores.dtype)
        slopes = slopes.view(1, n_heads, 1, 1) if slopes.dim() == 1 else slopes.view(batch, n_heads, 1, 1)
        scores = scores - slopes * distance.to(scores.dtype)
    masked = causal or window is not None or seq_lens is not None
    if masked:
        allowed = attention_mask(n_q, n_k, causal=causal, window=window,
                                 seq_lens=seq_lens, batch=batch, device=q.device)
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = stable_softmax(scores, dim=-1)
    if dropout_p > 0:
        probs = probs * dropout_mask.to(probs.dtype) / (1.0 - dropout_p)
    out = torch.matmul(probs, v)
    if seq_lens is not None:
        q_valid = torch.arange(n_q, device=q.device).view(1, 1, -1, 1) < seq_lens.to(q.device).view(-1, 1, 1, 1)
        out = out * q_valid
    if not return_lse:
        return out
    lse = torch.logsumexp(scores, dim=-1)
    if seq_lens is not None:  # a padding query is a masked row: no key, logsumexp -inf
        lse = lse.masked_fill(~q_valid[..., 0], float("-inf"))
    return out, lse


_WORD = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 tensors holding uint32 values (every product reduced to 32 bits)."""
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & _WORD
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & _WORD
    return x ^ (x >> 15)


def dropout_keep_reference(seed: int, stream: int, n_q: int, n_k: int, dropout_p: float) -> torch.Tensor:
    """(n_q, n_k) bool: the weights the attention kernels keep in stream ``sample * H + head`` (CPU, int64).

    Weight (i, j) takes byte ``2 * ((i // 8) % 2) + (j // 8) % 2`` of the 32-bit word of its query group
    ``a = 8 (i // 16) + i % 8`` and key group ``b = 8 (j // 16) + j % 8``::

        key  = mix32(mix32(mix32(stream + 0x68E31DA4) ^ (seed >> 32)) ^ (seed & 0xFFFFFFFF))
        word = mix32(((a * 0x9E3779B9 + key) mod 2^32) ^ ((b * 0x85EBCA6B) mod 2^32))

    and is kept when that byte is at least ``dropout_p * 256`` (``dropout_p`` a multiple of 1/256,
    as :func:`flashlib.kernels.dropout.effective_dropout_p` rounds it).
    """
    def one(value):
        return _mix32(torch.tensor([value & _WORD], dtype=torch.int64))

    key = _mix32(_mix32(one(stream + 0x68E31DA4) ^ ((seed >> 32) & _WORD)) ^ (seed & _WORD))
    i, j = torch.arange(n_q).view(-1, 1), torch.arange(n_k).view(1, -1)
    a, b = 8 * (i // 16) + i % 8, 8 * (j // 16) + j % 8
    word = _mix32(((a * 0x9E3779B9 + key) & _WORD) ^ ((b * 0x85EBCA6B) & _WORD))
    byte = (word >> (8 * (2 * ((i // 8) % 2) + (j // 8) % 2))) & 0xFF
    return byte >= round(dropout_p * 256)


def cached_keys(cache: torch.Tensor, b: int, length: int, block_table: torch.Tensor | None = None) -> torch.Tensor:
    """The first ``length`` tokens (length, H_kv, D) of sequence ``b`` of a KV cache.

    A contiguous cache is (B, N_cache, H_kv, D); a paged one is (num_pages, page_size, H_kv, D),
    whose token t of sequence b sits in page ``block_table[b, t // page_size]`` at row ``t % page_size``.
    """
    if block_table is None:
        return cache[b, :length]
    page_size = cache.shape[1]
    pages = block_table[b, :(length + page_size - 1) // page_size].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:length]


def kvcache_attention(q, k_cache, v_cache, cache_seqlens, *, block_table=None, causal=True, window=None,
                      softmax_scale=None, softcap=0.0, alibi_slopes=None, return_lse=False):
    """Attention of q (B, N_q, H, D) over the first ``cache_seqlens[b]`` cached tokens of each sequence.

    The queries are the last N_q of those tokens (bottom-right alignment, as
    :func:`flashlib.flash_attention_with_kvcache`). Sequence by sequence with
    :func:`naive_attention`; returns O (B, N_q, H, D) and, with ``return_lse``, L (B, H, N_q).
    """
    outs, lses = [], []
    for b in range(q.shape[0]):
        n = int(cache_seqlens[b])
        if n == 0:  # nothing cached: every query is a row with no key
            outs.append(torch.zeros_like(q[b:b + 1]))
            lses.append(torch.full((1, q.shape[2], q.shape[1]), float("-inf"), dtype=q.dtype, device=q.device))
            continue
        k = cached_keys(k_cache, b, n, block_table).transpose(0, 1)[None]
        v = cached_keys(v_cache, b, n, block_table).transpose(0, 1)[None]
        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[b:b + 1]
        o, lse = naive_attention(q[b:b + 1].transpose(1, 2), k.to(q.dtype), v.to(q.dtype), causal=causal,
                                 window=window, softmax_scale=softmax_scale, softcap=softcap,
                                 alibi_slopes=slopes, return_lse=True)
        outs.append(o.transpose(1, 2))
        lses.append(lse)
    o, lse = torch.cat(outs), torch.cat(lses)
    return (o, lse) if return_lse else o


def sdpa_attention(q, k, v, *, causal=False, softmax_scale=None):
    """PyTorch's fused attention (flash, memory-efficient, cuDNN or math backend).

    Same layout as :func:`naive_attention`; GQA is expanded here. Note that SDPA's
    ``is_causal`` aligns the mask top-left when N_q != N_k, unlike flash-attn; we
    build the bottom-right mask explicitly in that case.
    """
    n_q, n_k = q.shape[2], k.shape[2]
    k = expand_kv_heads(k, q.shape[1])
    v = expand_kv_heads(v, q.shape[1])
    if causal and n_q != n_k:
        mask = attention_mask(n_q, n_k, causal=True, device=q.device)[0, 0]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=softmax_scale)
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=softmax_scale)


def attention_memory_bytes(seq_len: int, head_dim: int, *, batch: int = 1, heads: int = 1,
                           dtype_bytes: int = 2) -> dict:
    """Bytes naive attention needs for its tensors: Q, K, V, O (O(N d)) and S, P (O(N^2))."""
    qkvo = 4 * batch * heads * seq_len * head_dim * dtype_bytes
    scores = batch * heads * seq_len * seq_len * dtype_bytes
    return {"qkvo": qkvo, "scores": scores, "probs": scores, "total": qkvo + 2 * scores}
