"""Decoding: attention over a KV cache, contiguous or paged, with the split-KV kernel.

``flash_attention_with_kvcache`` is flash-attn's ``flash_attn_with_kvcache`` for flashlib:
a generating model keeps the keys and values of every token it has seen in a cache,
appends the new tokens' k and v at each step, and attends from the new queries to all
of them. The cache is either one tensor per sample (B, N_cache, H_kv, D) or pages
(num_pages, page_size, H_kv, D) with a block table per sample, as vLLM's
PagedAttention: a sequence grows page by page, and pages come from one shared pool.

The attention runs on :mod:`flashlib.kernels.decode` (split-KV, GQA heads packed). It is
also :func:`flashlib.flash_attention`'s ``variant="splitkv"``, through
:func:`splitkv_attention`. Both are forward only (inference). Under ``torch.compile`` the
kernel is the custom op ``flashlib::splitkv_attention``; eager calls skip the op's Python
dispatch (tens of microseconds, as long as a decoding step's kernel).
"""
from __future__ import annotations

import numbers

import torch

from . import runtime
from .arguments import (check_alibi_slopes, check_bool, check_dtypes_and_device, check_heads, check_lengths,
                        make_spec, transformed, values_checked)
from .kernels.decode import launch_splitkv_attention
from .spec import AttentionSpec

#: ``window`` sides and ``num_splits``/``max_keys`` travel through the custom op as ints; -1: none/default.
UNSET = -1


def _bnhd(t: torch.Tensor, layout: str) -> torch.Tensor:
    """(B, N, H, D) view of a 4D tensor in ``layout`` ("bnhd" or "bhnd"): no copy."""
    return t if layout == "bnhd" else t.transpose(1, 2)


def splitkv_impl(q, k, v, k_lens, seq_lens, block_table, alibi_slopes, layout, softmax_scale, causal,
                 window_left, window_right, softcap, max_keys, num_splits):
    """O in q's shape, dtype and layout, and L (B, H, N_q) float32: split-KV attention, arguments checked.

    q is 4D in ``layout``; k, v the cache in the same layout (or pages, (num_pages,
    page_size, H_kv, D), with ``block_table``). See :func:`launch_splitkv_attention`.
    """
    q_v = _bnhd(q, layout)
    batch, n_q, heads, head_dim = q_v.shape
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((batch, heads, n_q), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse
    q_run, k_run, v_run = runtime.upcast_for_interpreter(q, k, v)  # bf16 → fp32 in the interpreter
    o_run = o if q_run.dtype == o.dtype else torch.empty(q.shape, dtype=q_run.dtype, device=q.device)
    cache_layout = "bnhd" if block_table is not None else layout
    launch_splitkv_attention(
        _bnhd(q_run, layout), _bnhd(k_run, cache_layout), _bnhd(v_run, cache_layout), _bnhd(o_run, layout), lse,
        scale=softmax_scale, causal=causal,
        window=(None if window_left == UNSET else window_left, None if window_right == UNSET else window_right),
        softcap=softcap, alibi_slopes=alibi_slopes, k_lens=k_lens, seq_lens=seq_lens, block_table=block_table,
        max_keys=None if max_keys == UNSET else max_keys, num_splits=None if num_splits == UNSET else num_splits)
    if o_run is not o:
        o.copy_(o_run)
    return o, lse


@torch.library.custom_op("flashlib::splitkv_attention", mutates_args=())
def splitkv_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_lens: torch.Tensor | None,
                         seq_lens: torch.Tensor | None, block_table: torch.Tensor | None,
                         alibi_slopes: torch.Tensor | None, layout: str, softmax_scale: float, causal: bool,
                         window_left: int, window_right: int, softcap: float, max_keys: int,
                         num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``splitkv_impl`` as a torch custom op: what ``torch.compile`` sees."""
    return splitkv_impl(q, k, v, k_lens, seq_lens, block_table, alibi_slopes, layout, softmax_scale, causal,
                        window_left, window_right, softcap, max_keys, num_splits)


@splitkv_attention_op.register_fake
def _splitkv_fake(q, k, v, k_lens, seq_lens, block_table, alibi_slopes, layout, softmax_scale, causal,
                  window_left, window_right, softcap, max_keys, num_splits):
    batch, n_q, heads, _ = _bnhd(q, layout).shape
    return q.new_empty(q.shape), q.new_empty((batch, heads, n_q), dtype=torch.float32)


def splitkv_attention(q, k, v, layout: str, spec: AttentionSpec, *, k_lens=None, seq_lens=None, block_table=None,
                      alibi_slopes=None, max_keys: int | None = None, num_splits: int | None = None):
    """(O, L) of checked arguments through the split-KV kernel: the custom op while ``torch.compile``
    traces, ``splitkv_impl`` directly otherwise. The one place where a spec becomes the op's arguments."""
    left, right = spec.bounds()
    args = (q, k, v, k_lens, seq_lens, block_table, alibi_slopes, layout, spec.scale(q.shape[-1]), spec.causal,
            UNSET if left is None else left, UNSET if right is None else right, spec.softcap,
            UNSET if max_keys is None else max_keys, UNSET if num_splits is None else num_splits)
    if torch.compiler.is_compiling():
        return splitkv_attention_op(*args)
    return splitkv_impl(*args)


# ---------------------------------------------------------------- the KV-cache entry
def _check_cache_seqlens(cache_seqlens, batch: int, device: torch.device) -> torch.Tensor | None:
    if cache_seqlens is None:
        return None
    if isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool):
        most = torch.iinfo(torch.int32).max
        if not 0 <= cache_seqlens <= most:
            raise ValueError(f"cache_seqlens must be >= 0 and fit an int32 (at most {most}); "
                             f"got {cache_seqlens}")
        return torch.full((batch,), int(cache_seqlens), dtype=torch.int32, device=device)
    check_lengths(cache_seqlens, "cache_seqlens", batch, device, "the cached tokens of each sequence (or an int)")
    return cache_seqlens.contiguous()  # the kernels read lengths[b] at offset b: a strided view is copied


def _check_block_table(block_table, batch: int, device: torch.device) -> None:
    if not isinstance(block_table, torch.Tensor):
        raise TypeError(f"block_table must be a (B, max_pages) torch.int32 tensor; "
                        f"got a {type(block_table).__name__}")
    if block_table.dtype != torch.int32:
        raise TypeError(f"block_table must be torch.int32; got {block_table.dtype}")
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"block_table must have shape (B, max_pages) with B = {batch}; "
                         f"got {tuple(block_table.shape)}")
    if block_table.device != device:
        raise ValueError(f"block_table must be on q's device ({device}); got {block_table.device}")
    if block_table.stride(1) != 1:
        raise ValueError("block_table must be contiguous along its last dim (use block_table.contiguous())")


def _check_new_tokens(k, v, batch: int, heads_kv: int, head_dim: int, cache_dtype, device) -> int:
    """N_new of the appended k, v (0 without them)."""
    if (k is None) != (v is None):
        raise ValueError(f"k and v are appended together: pass both or neither; got k "
                         f"{'None' if k is None else tuple(k.shape)} and v {'None' if v is None else tuple(v.shape)}")
    if k is None:
        return 0
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a (B, N_new, H_kv, D) tensor; got a {type(t).__name__}")
        if t.dim() != 4 or t.shape[0] != batch or t.shape[2] != heads_kv or t.shape[3] != head_dim:
            raise ValueError(f"{name} must have shape (B, N_new, H_kv, D) = ({batch}, N_new, {heads_kv}, "
                             f"{head_dim}), as the cache; got {tuple(t.shape)}")
        if t.dtype != cache_dtype:
            raise TypeError(f"{name} must have the cache's dtype {cache_dtype}; got {t.dtype}")
        if t.device != device:
            raise ValueError(f"{name} must be on q's device ({device}); got {t.device}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got k {tuple(k.shape)} and v {tuple(v.shape)}")
    return k.shape[1]


def _check_values(cache_seqlens, n_new: int, capacity: int, block_table, page_size: int, num_pages: int) -> int:
    """The longest sequence after the append, after checking that every sequence fits, that every
    block-table entry it reads names a page, and that no two sequences append into one slot of a
    shared page: one device sync for all of it."""
    total = cache_seqlens.long() + n_new  # in int64: a length near 2^31 must not wrap round to fit
    zero = torch.zeros((), dtype=torch.int64, device=cache_seqlens.device)
    bad_pages = shared_slots = zero
    if block_table is not None:
        pages_used = (total + page_size - 1) // page_size  # per sample
        used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] < pages_used[:, None]
        bad = used & ((block_table < 0) | (block_table >= num_pages))
        bad_pages = bad.sum()
        if n_new and block_table.shape[1]:  # (an empty table cannot take an append: the capacity check says so)
            slots = _append_slots(block_table, cache_seqlens, n_new, page_size, within_table=True)
            slots = slots.flatten().sort().values
            shared_slots = (slots[1:] == slots[:-1]).sum() if slots.numel() > 1 else zero
    low, high, n_bad, n_shared = torch.stack([cache_seqlens.min().long(), total.max(), bad_pages,
                                              shared_slots]).tolist()
    if low < 0:
        raise ValueError(f"cache_seqlens must be >= 0; got a minimum of {low}")
    if high > capacity:
        b = int(total.argmax())
        pages = f" ({capacity // page_size} pages of {page_size} in block_table)" if block_table is not None else ""
        if not n_new:
            raise ValueError(f"cache_seqlens[{b}] = {high} is more than the cache holds: {capacity} tokens{pages}")
        raise ValueError(f"the append would overflow the cache: sequence {b} has {int(cache_seqlens[b])} cached "
                         f"tokens + {n_new} new = {high} > the cache's capacity of {capacity} tokens{pages}")
    if n_bad:
        b, j = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"block_table[{b}, {j}] = {int(block_table[b, j])} is out of range: the paged "
                         f"cache has {num_pages} pages (indices 0 to {num_pages - 1})")
    if n_shared:
        raise ValueError(f"block_table gives {n_shared} slot(s) of the pages being appended to more than one "
                         "sequence: appends into a page that sequences share would overwrite each other's tokens "
                         "(copy the page before appending, as copy-on-write does)")
    return high


def _append_slots(block_table, cache_seqlens, n_new: int, page_size: int, within_table: bool = False) -> torch.Tensor:
    """(B, N_new) int64: the paged cache's slot (page * page_size + offset) of each appended token.

    ``within_table``: for the checks, which read the slots in the same sync as the lengths, so before they know that
    every append fits: a token past the table (or before it, from a negative length) takes the page of its nearest
    entry instead of failing the gather, and the checks then refuse it by name (the capacity check comes first)."""
    positions = cache_seqlens.long()[:, None] + torch.arange(n_new, device=block_table.device)[None, :]
    entries = positions // page_size
    if within_table:
        entries = entries.clamp(0, block_table.shape[1] - 1)
    pages = torch.gather(block_table.long(), 1, entries)
    return pages * page_size + positions % page_size


def _append(k_cache, v_cache, k, v, cache_seqlens, block_table) -> None:
    """Write k, v (B, N_new, H_kv, D) into the cache at positions cache_seqlens[b] + t, in place."""
    batch, n_new = k.shape[:2]
    positions = cache_seqlens.long()[:, None] + torch.arange(n_new, device=k.device)[None, :]  # (B, N_new)
    if block_table is None:
        samples = torch.arange(batch, device=k.device)[:, None].expand(batch, n_new)
        k_cache[samples, positions] = k
        v_cache[samples, positions] = v
    else:
        page_size = k_cache.shape[1]
        slots = _append_slots(block_table, cache_seqlens, n_new, page_size)
        k_cache[slots // page_size, slots % page_size] = k
        v_cache[slots // page_size, slots % page_size] = v


def _check_writable(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Caches that k, v are appended to: no two of their elements share memory (an expanded cache, stride 0 over
    its sequences, would take every sequence's append in one place), and k_cache is not v_cache."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if may_overlap_itself(t):
            raise ValueError(f"{name} is appended to in place, so each of its elements needs memory of its own; got "
                             f"shape {tuple(t.shape)} with strides {t.stride()} (an expanded or overlapping view: "
                             f"pass {name}.contiguous() or a cache allocated for it)")
    same = k_cache is v_cache or (not torch.compiler.is_compiling()  # a traced tensor has no address
                                  and k_cache.numel() and k_cache.data_ptr() == v_cache.data_ptr())
    if same:
        raise ValueError("k_cache and v_cache are the same memory: appending would write each new value over its "
                         "key; pass two caches")


def may_overlap_itself(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory: False when its dims, ordered by stride, each step past
    everything the smaller ones span (as any tensor allocated or sliced from one does). Conservative: an exotic
    interleaving of strides that does not overlap is reported as overlapping."""
    span = 0
    for stride, size in sorted((stride, size) for size, stride in zip(t.shape, t.stride()) if size > 1):
        if stride <= span:
            return True
        span += stride * (size - 1)
    return False


def flash_attention_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                 k: torch.Tensor | None = None, v: torch.Tensor | None = None,
                                 cache_seqlens: torch.Tensor | int | None = None,
                                 block_table: torch.Tensor | None = None, causal: bool = True, window=None,
                                 softmax_scale: float | None = None, return_lse: bool = False, *,
                                 softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None,
                                 num_splits: int | None = None, check_values: bool = True):
    """Attention of new queries over a KV cache, appending the new keys and values first (in place).

    Shapes, (B, N, H, D) as flash-attn:

    * q: (B, N_q, H, D), the new queries;
    * a contiguous cache: k_cache, v_cache (B, N_cache, H_kv, D); or a paged one:
      (num_pages, page_size, H_kv, D) with ``block_table`` (B, max_pages) int32, where
      ``block_table[b, p]`` is the page that holds tokens ``p * page_size`` to
      ``(p + 1) * page_size - 1`` of sequence b;
    * ``cache_seqlens`` (B,) int32 (or an int for all): tokens already cached per sequence.
      None means every cache is full (only without k, v);
    * k, v (B, N_new, H_kv, D), optional: written into the cache at ``cache_seqlens[b]``
      onwards, before attending. ``cache_seqlens`` itself is not changed: add N_new to it
      for the next step. A cache appended to must own its memory: an expanded view (one prompt
      shared by every sequence) or one tensor passed as both caches is refused.

    Sequence b then holds ``cache_seqlens[b] + N_new`` tokens, and query i sits at
    position ``i + cache_seqlens[b] + N_new - N_q`` of it: ``causal`` (default True) lets it
    see the keys up to its own position (bottom-right aligned, as flash-attn), ``window``
    = (left, right) bounds the keys it sees as in :func:`flashlib.flash_attention`, and so do
    ``softmax_scale``, ``softcap`` and ``alibi_slopes``. H a multiple of H_kv (GQA/MQA).

    Returns O (B, N_q, H, D) in q's dtype, and with ``return_lse`` L (B, H, N_q) float32.
    Forward only: a q, cache or k/v that requires grad (with grad enabled) is refused, and so is any
    argument under a torch.func transform (vmap, grad, jvp) or carrying a forward-mode tangent.
    ``num_splits`` overrides the kernel's choice of key chunks (1: no split).

    ``check_values=False`` skips the checks that read ``cache_seqlens`` and ``block_table`` on the
    device (that the append fits, that each page index exists, that no two sequences append into one slot of a
    shared page): one sync per call, which stalls
    a decoding loop that launches the next layer while this one runs. The caller then vouches
    for them (:class:`flashlib.model.PagedKVCache` counts its tokens on the host). They are
    skipped by themselves under ``torch.compile`` and during CUDA-graph capture.
    """
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v)):
        if isinstance(t, torch.Tensor) and t.layout != torch.strided:  # the kernels read memory through strides
            raise TypeError(f"{name} must be a dense tensor; got layout {t.layout} (convert it with {name}.to_dense())")
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise ValueError(f"q must be a 4D (B, N_q, H, D) tensor; got "
                         f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4D tensor, (B, N_cache, H_kv, D) or pages (num_pages, page_size, "
                             f"H_kv, D); got {tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape; got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    check_dtypes_and_device(q, k_cache, v_cache)
    batch, n_q, heads, head_dim = q.shape
    heads_kv = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"q and the cache must have the same head_dim; got q {tuple(q.shape)} and k_cache "
                         f"{tuple(k_cache.shape)}")
    check_heads(q, k_cache, v_cache, heads, heads_kv, head_dim, " (q is (B, N_q, H, D), the cache (..., H_kv, D))")
    paged = block_table is not None
    if paged:
        _check_block_table(block_table, batch, q.device)
        num_pages, page_size = k_cache.shape[:2]
        if page_size == 0:
            raise ValueError(f"a paged cache is (num_pages, page_size, H_kv, D) with page_size >= 1; got k_cache "
                             f"{tuple(k_cache.shape)}")
        capacity = block_table.shape[1] * page_size
    else:
        if k_cache.shape[0] != batch:
            raise ValueError(f"a contiguous cache is (B, N_cache, H_kv, D) with B = {batch} (q's batch); got "
                             f"k_cache {tuple(k_cache.shape)} (a paged cache needs block_table)")
        num_pages, page_size, capacity = 0, 0, k_cache.shape[1]
    if any(t.stride(-1) != 1 for t in (k_cache, v_cache)):
        raise ValueError("k_cache and v_cache must be contiguous along head_dim (stride 1 in the last dim)")
    n_new = _check_new_tokens(k, v, batch, heads_kv, head_dim, k_cache.dtype, q.device)
    cache_seqlens = _check_cache_seqlens(cache_seqlens, batch, q.device)
    if cache_seqlens is None:
        if n_new:
            raise ValueError("appending k, v needs cache_seqlens: where each sequence's new tokens go")
        cache_seqlens = torch.full((batch,), capacity, dtype=torch.int32, device=q.device)
    spec = make_spec(causal, window, softmax_scale, softcap, alibi_slopes, 0.0)
    alibi_slopes = check_alibi_slopes(alibi_slopes, batch, heads, q.device)
    if num_splits is not None and (not isinstance(num_splits, int) or isinstance(num_splits, bool)
                                   or num_splits < 1):
        raise ValueError(f"num_splits must be None (the kernel chooses) or an int >= 1; got {num_splits!r}")
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k_cache, v_cache, k, v)):
        raise ValueError("flash_attention_with_kvcache is forward only (inference): call it under "
                         "torch.no_grad() or torch.inference_mode(), or use flash_attention to train")
    if transformed(q, k_cache, v_cache, k, v, cache_seqlens, block_table, alibi_slopes):
        raise ValueError("flash_attention_with_kvcache is forward only (inference) and has no rules for a torch.func "
                         "transform (vmap, grad, jvp) or forward-mode AD applied to it: a tangent would be dropped "
                         "or a batch misread; use flash_attention, whose FlashAttention-2 op has those rules")
    check_bool("return_lse", return_lse)

    max_keys = None
    check_bool("check_values", check_values)
    if batch and check_values and values_checked(q):
        max_keys = _check_values(cache_seqlens, n_new, capacity, block_table, page_size, num_pages)
    if n_new:
        _check_writable(k_cache, v_cache)
        _append(k_cache, v_cache, k, v, cache_seqlens, block_table)
    k_lens = cache_seqlens + n_new if n_new else cache_seqlens
    o, lse = splitkv_attention(q, k_cache, v_cache, "bnhd", spec, k_lens=k_lens, block_table=block_table,
                               alibi_slopes=alibi_slopes, max_keys=max_keys, num_splits=num_splits)
    return (o, lse) if return_lse else o
