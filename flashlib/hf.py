"""flashlib as an attention implementation of Hugging Face Transformers.

>>> import flashlib.hf
>>> name = flashlib.hf.register()                       # doctest: +SKIP
>>> model = AutoModelForCausalLM.from_pretrained(path, attn_implementation=name)  # doctest: +SKIP

:func:`register` adds two functions to Transformers' public registries, under one name:

* :func:`flashlib_attention_forward` to ``transformers.AttentionInterface``: what every
  attention layer calls, with query (B, H, N_q, D) and key, value (B, H_kv, N_k, D);
* :func:`flashlib_attention_mask` to ``transformers.masking_utils.AttentionMaskInterface``:
  what the model calls once per forward to build the mask it hands to every layer. Without
  it the model would pass no mask at all for an unknown name, and padding would be lost.

The mask is built the way flash-attention-2 gets it: for the causal pattern (and its
sliding-window version) the layer receives the 2D (B, N_k) padding mask, or None when
nothing is padded, and rebuilds causality and the window itself from ``module.is_causal``
and ``sliding_window``; no N_q x N_k mask is ever made. Any other pattern (packed sequences,
image-token overlays, chunked or bidirectional attention) gets the exact 4D boolean mask of
``sdpa``, which the layer accepts when it reduces to padding plus what it rebuilds, or to
sequences packed into rows (block-diagonal causal: padding-free training, where position_ids
restart; those go through ``flash_attention_varlen``), and otherwise refuses with an error
naming it: flashlib never ignores a mask silently. Packed sequences also come as
flash-attention's ``cu_seq_lens_q/k`` keywords (``DataCollatorWithFlattening``), taken as given.

Under ``torch.compile`` (and while a CUDA graph is captured) nothing is read on the host (one graph): padding,
decoding steps, bidirectional layers' 4D masks (checked on the device) and ``cu_seq_lens``. A causal layer's 4D
mask is still read there, and the graph breaks: only the host can tell packed sequences from padding (see the
README).

The name is not "flashlib": Transformers >= 5 treats every implementation whose name contains
"flash" as a flash-attn build and tries to load it as a kernel from the Hub (``from_pretrained``
fails with "Could not find the currently requested flash attention implementation"), so
:func:`register` refuses such names.

Importing this module needs no Transformers; :func:`register` does (``pip install flashlib[hf]``).
"""
from __future__ import annotations

import importlib
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch.utils.weak import WeakIdKeyDictionary

from . import runtime
from .arguments import make_spec, values_checked
from .attention import flash_attention
from .decode import splitkv_attention
from .variants import preferred_variant
from .varlen import flash_attention_varlen

#: The default implementation name: ``attn_implementation="triton_fa"`` after ``register()``.
DEFAULT_NAME = "triton_fa"

#: Keywords some models pass that change the result and that flashlib does not implement.
UNSUPPORTED = ("s_aux", "position_bias", "block_table", "cache")


def register(name: str = DEFAULT_NAME) -> str:
    """Register flashlib with Transformers as ``attn_implementation=name``; returns ``name``.

    Idempotent. Raises ImportError without Transformers, ValueError for a name that
    Transformers would read as something else (see the module's docstring).
    """
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError as error:
        raise ImportError("flashlib.hf.register needs Hugging Face Transformers (with its masking_utils): "
                          "pip install flashlib[hf]") from error
    if not isinstance(name, str) or not name or "flash" in name or "/" in name or "|" in name:
        raise ValueError(f"name must be a non-empty str without 'flash', '/' or '|': Transformers reads a name with "
                         f"'flash' as a flash-attn build (and loads it from the Hub), and one with '/' or '|' as a "
                         f"Hub kernel or a paged variant; got {name!r}")
    existing = AttentionInterface().get(name)  # ours again (also from a reloaded flashlib.hf) is fine
    if name == "eager" or (existing is not None and getattr(existing, "__module__", None) != __name__):
        raise ValueError(f"attention implementation {name!r} already exists in Transformers; choose another name")
    global _masking_utils
    _masking_utils = importlib.import_module("transformers.masking_utils")
    AttentionInterface.register(name, flashlib_attention_forward)
    AttentionMaskInterface.register(name, flashlib_attention_mask)
    return name


#: transformers.masking_utils, imported by :func:`register`, not by the mask function: Dynamo (torch 2.11) cannot
#: trace ``from transformers import masking_utils``, since ``transformers`` is a lazy module ("Bad import result").
_masking_utils = None


# ---------------------------------------------------------------- the mask, built once per forward
def flashlib_attention_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None,
                            attention_mask=None, **kwargs):
    """The mask every layer receives: the (B, N_k) bool padding mask or None where the pattern is causal
    (the layer rebuilds it), else ``sdpa``'s exact 4D bool mask (which the layer checks).

    The layer's causal mask is aligned to the bottom right: queries are the last N_q of the N_k keys.
    That holds without a cache and with a dynamic one (``kv_offset + kv_length == q_offset + q_length``).
    A static cache holds empty slots past the last query: the 2D mask then stops at the last query, and
    the layer drops the keys past it (as flash-attention-2 does).

    A static cache's decoding step (one query; its offset is a tensor) with a padding mask gets sdpa's 4D mask
    instead, whose one row is the keys that query sees and whose shape stays the same from step to step
    (Transformers' ``generate`` makes it before its compiled step, whose CUDA graph then serves every step; a 2D
    mask growing by a token a step would compile anew at every step, and the last step would switch to it).
    """
    masking_utils = _masking_utils if _masking_utils is not None else importlib.import_module(
        "transformers.masking_utils")  # called before register(), as a test may
    args = {"batch_size": batch_size, "q_length": q_length, "kv_length": kv_length, "q_offset": q_offset,
            "kv_offset": kv_offset, "attention_mask": attention_mask}
    # A static cache's decoding step gets sdpa's mask below: its one row is the keys the query sees (see above)
    static_step = q_length == 1 and attention_mask is not None and isinstance(q_offset, torch.Tensor)
    end = None if static_step else _query_end(q_offset, q_length, attention_mask)
    if end is not None and _rebuilt_by_the_layer(mask_function, masking_utils, attention_mask, kwargs):
        if kv_offset + kv_length == end:
            if attention_mask is not None and not values_checked(attention_mask):  # Transformers' own function
                return attention_mask[:, -kv_length:].bool()  # asks the host whether all are tokens: a graph break
            mask = masking_utils.flash_attention_mask(mask_function=mask_function, **args, **kwargs)
            return None if mask is None else _with_a_shared_plan(mask.bool())
        if kv_offset == 0 and kv_length > end:
            if attention_mask is None:
                return torch.ones(batch_size, end, dtype=torch.bool, device=kwargs.get("device"))
            return _with_a_shared_plan(attention_mask[:, :end].bool())
    kwargs["allow_is_causal_skip"] = False  # sdpa's None means "top-left causal", which the layer would misread
    return masking_utils.sdpa_mask(mask_function=mask_function, **args, **kwargs)


def _query_end(q_offset, q_length: int, attention_mask) -> int | None:
    """The position after the last query, ``q_offset + q_length``. A static cache's offset is a tensor: read on the
    host (one sync, once per forward) where values may be read. While tracing, or capturing a CUDA graph, it is the
    padding mask's length instead, which covers every position so far (as Transformers' ``generate`` keeps it), held
    to the offset by an assertion on the device; None (the 4D mask) without a padding mask."""
    if not isinstance(q_offset, torch.Tensor) or values_checked(q_offset):
        return int(q_offset) + q_length
    if attention_mask is None:
        return None
    end = attention_mask.shape[-1]
    torch._assert_async(q_offset + q_length == end, "flashlib's Transformers attention under torch.compile takes "
                        "the queries as the last positions of the 2D attention_mask, which must cover every position "
                        "up to them (attention_mask of length q_offset + q_length)")
    return end


def _rebuilt_by_the_layer(mask_function, masking_utils, attention_mask, kwargs) -> bool:
    """Whether the layer rebuilds the pattern itself (:func:`_is_causal_pattern`), also under torch.compile.

    Dynamo cannot read a closure's cells, so while tracing the sliding-window closure is handed whole to
    :func:`_is_causal_pattern`, run as plain Python once (``torch.compiler.assume_constant_result``). Dynamo can hand
    over only closures whose cells hold no tensors, so it gets only what ``create_sliding_window_causal_mask`` builds
    with nothing added: an ``and_masks`` closure with ``local_size`` the config's sliding window, no custom mask
    functions (``use_vmap``), and a padding mask or ``allow_is_causal_skip`` (Transformers adds packed sequences, a
    tensor, only without a padding mask, and then turns that off). Any other closure while tracing gets the 4D mask:
    read on the host, a graph break, never a wrong result."""
    if not torch.compiler.is_compiling() or mask_function is masking_utils.causal_mask_function:
        return _is_causal_pattern(mask_function, masking_utils)
    window = kwargs.get("local_size")
    if ((attention_mask is None and not kwargs.get("allow_is_causal_skip")) or kwargs.get("use_vmap") or window is None
            or window != getattr(kwargs.get("config"), "sliding_window", None)
            or getattr(mask_function, "__code__", None) is not masking_utils.and_masks().__code__):
        return False
    return _is_causal_pattern_while_tracing(mask_function, masking_utils)


def _is_causal_pattern(mask_function, masking_utils) -> bool:
    """Whether ``mask_function`` is masking_utils' causal pattern or its sliding-window version
    (``and_masks(sliding_window_overlay(w), causal_mask_function)``): the two the layer rebuilds.

    The sliding-window one is a closure, recognised by its code objects; should that ever fail,
    the answer is False and the layer gets the exact 4D mask instead (slower, never wrong).
    """
    causal = masking_utils.causal_mask_function
    if mask_function is causal:
        return True
    try:
        if mask_function.__code__ is not masking_utils.and_masks(causal).__code__:
            return False
        (parts,) = (cell.cell_contents for cell in mask_function.__closure__)
        window_code = masking_utils.sliding_window_overlay(1).__code__
        return len(parts) == 2 and parts[0].__code__ is window_code and parts[1] is causal
    except (AttributeError, TypeError, ValueError):
        return False


_is_causal_pattern_while_tracing = torch.compiler.assume_constant_result(_is_causal_pattern)


# ---------------------------------------------------------------- the attention, in every layer
def flashlib_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                               sliding_window=None, softcap=None, **kwargs):
    """Transformers' attention call on flashlib: returns ``(attn_output (B, N_q, H, D), None)``.

    * causal: ``kwargs["is_causal"]``, else ``module.is_causal`` (as sdpa and flash-attention-2),
      aligned to the bottom right, so the N_q queries of a cached step are the last N_q positions;
    * ``sliding_window=w``: window ``(w - 1, w - 1)`` (flash-attention-2's convention, capped to
      ``(w - 1, 0)`` when causal: the query and the w - 1 keys before it, as sdpa's mask);
    * ``scaling``, ``dropout``, ``softcap``: flashlib's ``softmax_scale``, ``dropout_p``, ``softcap``;
    * ``attention_mask``: None (nothing padded): one plain call; a 2D (B, N_k) padding mask (True or 1
      = token): a decoding step (few queries, no gradient, no dropout) is :func:`flash_attention_with_kvcache`
      over each row's key tokens where they lie (no host read, eager or compiled, but an eager sliding-window
      forward's check that its padding is at an edge: one sync); otherwise right padding with
      N_q == N_k is ``seq_lens`` (no copy), any other padding is unpadded into ``flash_attention_varlen`` and
      padded back; under torch.compile or a CUDA graph's capture, where the lengths cannot be read on the host,
      each row's tokens are moved to its front for ``seq_lens`` (N_q == N_k), else one varlen call of fixed
      size; a 4D mask (B or 1, 1 or H, N_q, N_k), boolean or additive (0 / -inf), is
      reduced to the padding mask, or refused with a ValueError if it says more than padding plus the causal and
      window bounds above (a bidirectional layer's is checked on the device while tracing; a causal layer's is read
      on the host, since it may be packed sequences); with one query, its row is the keys it sees.

    A layer that is not causal and has no window (an encoder, or cross-attention, whose N_q queries need not be
    key positions at all) takes the mask as key padding only: every query row attends to the valid keys, as in
    sdpa, through ``flash_attention_varlen`` with all queries kept. In a causal or windowed layer the
    queries are the last N_q key positions, and outputs at padded query positions are 0 (sdpa leaves values
    there that nothing reads). With padding, a sliding window counts valid tokens, as flash-attention-2 does,
    which equals sdpa's count of positions unless padding sits between tokens: that case raises.
    """
    if kwargs.get("output_attentions"):  # as sdpa says it: the model returns no attention weights
        warnings.warn("flashlib's Transformers attention does not return attention weights (output_attentions=True "
                      "gives none): FlashAttention never forms them. Use attn_implementation='eager' to see them",
                      stacklevel=2)
    unsupported = [name for name in UNSUPPORTED if kwargs.get(name) is not None]
    if unsupported:
        raise NotImplementedError(f"flashlib's Transformers attention does not implement {unsupported}: "
                                  "use attn_implementation='sdpa' or 'eager' for this model")
    causal = kwargs.get("is_causal")
    causal = bool(getattr(module, "is_causal", True) if causal is None else causal)
    window = None if sliding_window is None else (sliding_window - 1, sliding_window - 1)
    options = {"causal": causal, "window": window, "softmax_scale": scaling, "softcap": softcap or 0.0,
               "dropout_p": dropout or 0.0}
    head_dim, v_head_dim = query.shape[-1], value.shape[-1]
    if v_head_dim != head_dim:  # e.g. MLA: flashlib needs one head dim; zero columns add nothing to the output
        value = F.pad(value, (0, head_dim - v_head_dim))
    # (B, N, H, D) views of the projections (no copy); the output comes back in that layout, as Transformers wants
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    given = _given_sequences(kwargs, q.shape[0])
    if given is not None:  # packed sequences, as Transformers' DataCollatorWithFlattening hands them over
        out = _attend_given_sequences(q, k, v, attention_mask, given, options)
    elif attention_mask is None:
        out = flash_attention(q, k, v, layout="bnhd", **options)
    elif isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4 and q.shape[1] == 1:
        # One query: its row is the keys it sees, causal and window bounds included (a static cache's step)
        keys = _keys_of_one_query(attention_mask, q.shape[0], k.shape[1])
        out = _attend_keys_padded(q, k, v, keys, dict(options, causal=False, window=None))
    else:
        try:
            mask = _padding_mask(attention_mask, options, *q.shape[:2], k.shape[1])
        except ValueError:  # not padding: perhaps sequences packed into rows (position_ids that restart)
            packed = _packed_sequences(attention_mask, options, *q.shape[:2], k.shape[1])
            if packed is None:
                raise
            out = _attend_packed(q, k, v, *packed, options)
        else:
            attend = _attend_keys_padded if _keys_only(options) else _attend_padded
            out = attend(q, k, v, mask, options)
    return out[..., :v_head_dim], None


def _given_sequences(kwargs, batch: int):
    """(cu_seqlens_q, cu_seqlens_k, max_q, max_k) from flash-attention's keywords, or None without them."""
    names = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
    given = [kwargs.get(name) for name in names]
    if all(value is None for value in given):
        return None
    if any(value is None for value in given) or batch != 1:
        raise ValueError(f"flashlib's Transformers attention takes packed sequences as one row (batch 1) with all of "
                         f"{list(names)}; got batch {batch} and {[n for n, v in zip(names, given) if v is not None]}")
    cu_q, cu_k, max_q, max_k = given
    return cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k)


def _attend_given_sequences(q, k, v, attention_mask, given, options):
    """Attention within each of the packed sequences that ``cu_seq_lens_q/k`` delimit in the one row of (1, N, H, D)
    q, k, v. A mask passed beside them must say the same (sdpa's block-diagonal mask of the same sequences)."""
    cu_q, cu_k, max_q, max_k = given
    if attention_mask is not None and not values_checked(attention_mask, cu_q, cu_k):
        _assert_the_same_sequences(attention_mask, cu_q, cu_k, options, q.shape[1], k.shape[1])
    elif attention_mask is not None:
        packed = _packed_sequences(attention_mask, options, 1, q.shape[1], k.shape[1])
        if packed is None or packed[0].numel() != q.shape[1] or not (
                torch.equal(packed[1], cu_q) and torch.equal(packed[1], cu_k)):
            raise ValueError(DIFFERENT_SEQUENCES)
    return flash_attention_varlen(q[0], k[0], v[0], cu_q, cu_k, max_q, max_k, **options)[None]


DIFFERENT_SEQUENCES = ("flashlib's Transformers attention got cu_seq_lens_q/k and an attention_mask that describe "
                       "different sequences")


def _assert_the_same_sequences(mask, cu_q, cu_k, options, n_q: int, n_k: int) -> None:
    """While tracing (no host read): assert on the device that a 4D mask beside ``cu_seq_lens_q/k`` is sdpa's
    block-diagonal causal mask (windowed as the layer is) of those sequences, which fill the row, or that a 2D one
    pads nothing (eager, Transformers drops an all-ones mask before the layer sees it); a ValueError for what the
    shapes alone rule out."""
    if cu_q.shape != cu_k.shape or n_q != n_k:
        raise ValueError(DIFFERENT_SEQUENCES)
    fills = (cu_q[0] == 0) & (cu_q[-1] == n_q) & (cu_q == cu_k).all()
    if mask.dim() == 2 and tuple(mask.shape) == (1, n_k):
        _require(mask.bool().all() & fills, DIFFERENT_SEQUENCES, on_device=True)
        return
    if mask.dim() != 4 or not options["causal"] or tuple(mask.shape[2:]) != (n_q, n_k):
        raise ValueError(DIFFERENT_SEQUENCES)
    positions = torch.arange(n_q, device=mask.device)
    sequence = torch.searchsorted(cu_q.long(), positions, right=True)  # 1, 2, ...: the sequence of each token
    expected = (sequence[:, None] == sequence[None, :]) & (positions[None, :] <= positions[:, None])
    left = options["window"][0] if options["window"] is not None else -1
    if left >= 0:
        expected &= positions[:, None] - positions[None, :] <= left
    allowed = _allowed(mask, "an attention_mask beside cu_seq_lens_q/k", on_device=True)
    _require((allowed == expected) & fills, DIFFERENT_SEQUENCES, on_device=True)


def _packed_sequences(mask, options, batch: int, n_q: int, n_k: int):
    """(token index, cu_seqlens, longest) of the sequences packed into the rows of a 4D mask that is exactly
    block-diagonal causal (and windowed as the layer is), padding left out; None for any other mask.

    A token is a query row that sees some key; it begins a sequence when the first key it sees is itself.
    The mask must then be, in every row, each token seeing the tokens of its own sequence up to itself (and
    within the window, counted in tokens): what ``flash_attention_varlen`` computes on the tokens gathered.
    """
    if mask.dim() != 4 or n_q != n_k or not options["causal"]:
        return None
    if mask.shape[0] not in (1, batch) or tuple(mask.shape[2:]) != (n_q, n_k):
        return None
    allowed = _allowed(mask, f"a {tuple(mask.shape)} {mask.dtype} attention_mask").expand(batch, n_q, n_k)
    tokens = allowed.any(-1)
    if not bool((tokens == allowed.any(-2)).all()):  # a key no query of its own sees, or the reverse
        return None
    positions = torch.arange(n_q, device=mask.device)
    begins = tokens & (allowed.to(torch.uint8).argmax(-1) == positions)
    sequence = begins.flatten().cumsum(0).view(tokens.shape)  # 1, 2, ...: the sequence of each token
    rank = tokens.flatten().cumsum(0).view(tokens.shape)  # the token's place among all tokens
    expected = ((sequence[:, :, None] == sequence[:, None, :]) & tokens[:, :, None] & tokens[:, None, :]
                & (rank[:, None, :] <= rank[:, :, None]))
    left = options["window"][0] if options["window"] is not None else -1
    if left >= 0:
        expected &= rank[:, :, None] - rank[:, None, :] <= left
    if not bool((allowed == expected).all()) or not bool(begins.any()):
        return None
    index = tokens.flatten().nonzero().squeeze(1)
    lengths = torch.bincount(sequence.flatten()[index] - 1)
    return index, F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0)), int(lengths.max())


def _attend_packed(q, k, v, index, cu_seqlens, longest, options):
    """Attention of (B, N, H, D) q, k, v within the packed sequences of :func:`_packed_sequences`; 0 at padding."""
    return _varlen_of_tokens(q, k, v, index, index, cu_seqlens, cu_seqlens, longest, longest, options)


def _varlen_of_tokens(q, k, v, q_index, k_index, cu_q, cu_k, max_q, max_k, options):
    """Attention of the tokens of (B, N, H, D) q, k, v that the flat indices pick (``q_index`` None: every query),
    packed for ``flash_attention_varlen`` (as flash-attention-2's unpadding), and the output back in (B, N_q, H, D),
    0 where no query was picked. Only the picked tokens are read: padding, whatever it holds, never is."""
    batch, n_q, n_k = q.shape[0], q.shape[1], k.shape[1]
    q_rows, k_rows, v_rows = (t.reshape(batch * n, *t.shape[2:]) for t, n in ((q, n_q), (k, n_k), (v, n_k)))
    out = flash_attention_varlen(q_rows if q_index is None else q_rows[q_index], k_rows[k_index], v_rows[k_index],
                                 cu_q, cu_k, max_q, max_k, **options)
    if q_index is not None:
        out = out.new_zeros(batch * n_q, *out.shape[1:]).index_copy(0, q_index, out)
    return out.view(batch, n_q, *out.shape[1:])


def _keys_of_one_query(mask, batch: int, n_k: int) -> torch.Tensor:
    """The (B, N_k) bool of the keys that the one query row of a (B or 1, H or 1, 1, N_k) mask sees (checked on the
    device while tracing: nothing here can be packed sequences, which need N_q == N_k > 1)."""
    if mask.shape[0] not in (1, batch) or tuple(mask.shape[2:]) != (1, n_k):
        raise ValueError(f"flashlib's Transformers attention got {_mask_name(mask, 1, n_k)}: a 4D mask must be "
                         f"(B or 1, H or 1, N_q, N_k) with B = {batch}")
    on_device = not values_checked(mask)
    return _allowed(mask, _mask_name(mask, 1, n_k, on_device), on_device)[:, 0].expand(batch, n_k)


def _mask_name(mask, n_q: int, n_k: int, on_device: bool = False) -> str:
    """How an error names a mask: with its shape and the layer's, but in an assertion on the device, whose message
    must be a constant while tracing, where shapes may be symbolic."""
    if on_device:
        return f"a 4D {mask.dtype} attention_mask"
    return f"a {tuple(mask.shape)} {mask.dtype} attention_mask (N_q = {n_q}, N_k = {n_k})"


def _keys_only(options) -> bool:
    """Whether the mask pads keys only: a bidirectional layer without a window (an encoder's self-attention, or
    cross-attention, whose queries are not key positions at all), where every query sees every valid key."""
    return not options["causal"] and options["window"] is None


def _attend_keys_padded(q, k, v, mask, options):
    """Bidirectional attention of (B, N_q, H, D) q to the keys that the (B, N_k) bool ``mask`` keeps: every query
    row is valid (as in sdpa), whether the queries are the keys' own positions (an encoder) or another sequence
    (cross-attention, where N_q may differ from N_k)."""
    batch, n_q, n_k = q.shape[0], q.shape[1], k.shape[1]
    if _split_kv(q, k, v, options):  # a decoding step: no host read, the keys read in place
        return _cached_attention(q, k, v, _padding_plan(mask), options)
    lengths = mask.sum(-1, dtype=torch.int32)
    readable = values_checked(mask)  # not under torch.compile or a CUDA graph's capture
    if readable and bool((lengths == n_k).all()):  # one sync, as in _attend_padded: nothing to move
        return flash_attention(q, k, v, layout="bnhd", **options)
    if not readable:
        return _varlen_in_place(q, k, v, None, mask, options)
    k_index = mask.flatten().nonzero().squeeze(1)
    cu_q = torch.arange(0, (batch + 1) * n_q, n_q, dtype=torch.int32, device=q.device)
    cu_k = F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    return _varlen_of_tokens(q, k, v, None, k_index, cu_q, cu_k, n_q, int(lengths.max()), options)


def _varlen_in_place(q, k, v, queries, keys, options):
    """Attention of the tokens that the (B, N_q) ``queries`` (None: every query) and (B, N_k) ``keys`` bool masks
    keep in (B, N, H, D) q, k, v, as :func:`_varlen_of_tokens` unpads them, without a host read: the kept rows of
    all rows move, in order, to the front of the flat (B * N) rows and the rest, zeroed, to the end (whatever they
    held, NaN included, reaches nothing: the kernels never read those rows nor write their gradients, which the
    zeroing drops), and ``cu_seqlens`` count the kept rows on the device: one varlen call of static shapes. The
    output comes back in (B, N_q, H, D), 0 at queries not kept."""
    batch, n_q, n_k = q.shape[0], q.shape[1], k.shape[1]

    def pack(t, kept):
        order = _kept_first(kept.flatten())
        return torch.where(kept[:, :, None, None], t, 0).reshape(-1, *t.shape[2:])[order], order

    def offsets(kept):
        return F.pad(kept.sum(-1, dtype=torch.int32).cumsum(0, dtype=torch.int32), (1, 0))

    (k_rows, _), (v_rows, _) = pack(k, keys), pack(v, keys)
    if queries is None:
        q_rows = q.reshape(batch * n_q, *q.shape[2:])
        cu_q = torch.arange(0, (batch + 1) * n_q, n_q, dtype=torch.int32, device=q.device)
    else:
        (q_rows, order), cu_q = pack(q, queries), offsets(queries)
    out = flash_attention_varlen(q_rows, k_rows, v_rows, cu_q, offsets(keys), n_q, n_k, **options)
    if queries is not None:  # rows past the kept queries were never written
        out = out[torch.argsort(order)].masked_fill(~queries.reshape(-1, 1, 1), 0)
    return out.view(batch, n_q, *out.shape[1:])


def _attend_padded(q, k, v, mask, options):
    """Attention of (B, N, H, D) q, k, v with a (B, N_k') bool padding mask (N_k' <= N_k: a static cache's
    keys past the mask are empty slots and dropped)."""
    batch, n_q, n_k = q.shape[0], q.shape[1], mask.shape[1]
    k, v = k[:, :n_k], v[:, :n_k]
    # torch.compile or a CUDA graph's capture: no host read. A decoding step, eager too: the unpadding below syncs a
    # few times a layer (eager generation at half sdpa's speed: TUNING.md, forty-fourth finding), the split-KV kernel
    # not at all (but a sliding window's check of the padding, once a forward: see _attend_tokens_first).
    if not values_checked(mask) or (n_q < n_k and _split_kv(q, k, v, options)):
        return _attend_tokens_first(q, k, v, mask, options)
    lengths = mask.sum(-1, dtype=torch.int32)
    right_rows, left_rows = _padded_at_an_edge(mask, lengths)
    right = bool(right_rows.all())  # one sync, as flash-attention-2's unpadding
    if right and n_q == n_k:
        seq_lens = None if bool((lengths == n_k).all()) else lengths
        return flash_attention(q, k, v, seq_lens=seq_lens, layout="bnhd", **options)
    if options["window"] is not None and not right and not bool(left_rows.all()):
        raise ValueError(WINDOW_NEEDS_EDGE_PADDING)
    # Unpad (as flash-attention-2's _upad_input): the queries are the last n_q key positions
    q_mask = mask[:, n_k - n_q:]
    q_lengths = q_mask.sum(-1, dtype=torch.int32)
    q_index, k_index = q_mask.flatten().nonzero().squeeze(1), mask.flatten().nonzero().squeeze(1)
    cu_q, cu_k = (F.pad(n.cumsum(0, dtype=torch.int32), (1, 0)) for n in (q_lengths, lengths))
    return _varlen_of_tokens(q, k, v, q_index, k_index, cu_q, cu_k, int(q_lengths.max()), int(lengths.max()),
                             options)


def _attend_tokens_first(q, k, v, mask, options):
    """Attention of (B, N_q, H, D) q to (B, N_k, H_kv, D) k, v with a (B, N_k) bool padding mask, the queries being
    the last N_q key positions, without reading a value on the host (:func:`_attend_padded`'s unpadding reads the
    lengths: a graph break under torch.compile, a sync that a CUDA graph's capture forbids, a few syncs a layer in an
    eager decoding step).

    With N_q == N_k each row's tokens are moved, in order, to its front (a stable sort of the mask), which leaves the
    padding at the end, ``seq_lens`` masks it, and the output moves back (a copy of q, k, v and O). In a decoding step
    (N_q < N_k, inference only) the split-KV kernel of :func:`flash_attention_with_kvcache` reads each row's key tokens
    in place (:func:`_cached_attention`) and the query tokens move to the end of the queries, so that, bottom-right
    aligned to the ``cache_seqlens`` key tokens, query token r of n sees the key tokens up to its own (with many
    queries, gradients or dropout, :func:`_varlen_in_place`; see :func:`_split_kv`). Padded queries give 0. The
    tokens attend to each other exactly as unpadded (a sliding window counts tokens); padding between tokens with a
    window, which the unpadding refuses, is refused here too (a ValueError, or an assertion on the device while
    tracing)."""
    n_q, n_k = q.shape[1], mask.shape[1]
    plan = _padding_plan(mask)
    if options["window"] is not None:
        plan.require_padding_at_an_edge()
    queries = mask[:, n_k - n_q:]
    if n_q != n_k and not _split_kv(q, k, v, options):
        return _varlen_in_place(q, k, v, queries, mask, options)
    if n_q == n_k:
        tokens_first = plan.order[:, :, None, None]
        q, k, v = (t.take_along_dim(tokens_first, dim=1) for t in (q, k, v))
        out = flash_attention(q, k, v, seq_lens=plan.lengths, layout="bnhd", **options)
        return out.take_along_dim(torch.argsort(tokens_first, dim=1), dim=1)
    if n_q == 1:  # one query is its row's last already (a step of generation: nothing to move); where it is padding
        return _cached_attention(q, k, v, plan, options, plan.last_query_lengths())  # it sees no key: its output is 0
    tokens_last = _kept_first(~queries)[:, :, None, None]
    out = _cached_attention(q.take_along_dim(tokens_last, dim=1), k, v, plan, options)
    return out.take_along_dim(torch.argsort(tokens_last, dim=1), dim=1).masked_fill(plan.padded_queries(n_q), 0)


def _cached_attention(q, k, v, plan, options, lengths=None):
    """The split-KV kernel of :func:`flashlib.decode.flash_attention_with_kvcache` (for few queries over many keys),
    through its entry :func:`flashlib.decode.splitkv_attention`, of (B, N_q, H, D) q
    over the key tokens that ``plan``'s padding mask keeps (a :class:`_PaddingPlan`), taken in order as the first
    tokens of each row, where ``cache_seqlens`` = their counts (``plan.lengths``, or ``lengths``) bounds them; no host
    read. Causal: query i is aligned to the bottom right of its row's key tokens. Inference only (no gradient, no
    dropout).

    The kernel reads the kept tokens where they lie, through a block table of one-token pages
    (:func:`_token_pages`): moving them to the front instead would copy the whole cache, every layer, every step.
    """
    pages = _token_pages(k, v, plan)
    if pages is None:  # strides that one-token pages cannot express: move the tokens
        tokens_first = plan.order[:, :, None, None]
        k, v = (t.take_along_dim(tokens_first, dim=1) for t in (k, v))
        table = None
    else:
        k, v, table = pages
    # Straight to the split-KV entry that flash_attention_with_kvcache ends in: its checks of shapes, dtypes, lengths
    # and table (and their host read) have nothing to find in what the model and the plan built above, and in an eager
    # decoding step, where the host bounds the layer, they were a quarter of its Python (benchmarks/TUNING.md,
    # forty-eighth finding). The spec is checked as there.
    spec = make_spec(options["causal"], options["window"], options["softmax_scale"], options["softcap"], None, 0.0)
    return splitkv_attention(q, k, v, "bnhd", spec, k_lens=plan.lengths if lengths is None else lengths,
                             block_table=table)[0]


def _token_pages(k: torch.Tensor, v: torch.Tensor, plan: "_PaddingPlan"):
    """(k_pages, v_pages, block_table): (B, N_k, H_kv, D) k, v seen, without a copy, as a paged cache of one-token
    pages (num_pages, 1, H_kv, D) whose ``block_table`` (B, N_k) int32 lists row b's tokens in ``plan.order``: page
    ``b * (stride_b // stride_n) + n`` is token n of row b, so the pages step by a token's stride (their heads overlap
    the next tokens' memory: a view that is only read). None (the caller copies the tokens instead) where the strides
    do not allow it (k and v laid out differently, head_dim not contiguous, a row's stride not a multiple of a
    token's), for empty tensors, where the page indices would overflow int32, and where the interpreter would upcast
    the view (bfloat16 on a CPU: a copy of every overlapping page, H_kv times the cache)."""
    batch, n_k, heads_kv, head_dim = k.shape
    stride_b, stride_n, stride_h, _ = k.stride()
    if (k.stride() != v.stride() or k.stride(3) != 1 or stride_n <= 0 or (batch > 1 and stride_b % stride_n)
            or batch == 0 or n_k == 0 or runtime.dot_safe_dtype(k.dtype) != k.dtype):  # see upcast_for_interpreter
        return None
    tokens_per_row = stride_b // stride_n if batch > 1 else n_k
    num_pages = (batch - 1) * tokens_per_row + n_k
    if num_pages > torch.iinfo(torch.int32).max:
        return None
    size, strides = (num_pages, 1, heads_kv, head_dim), (stride_n, stride_n, stride_h, 1)
    # as_strided keeps each view's own storage offset, also under Inductor (tests/test_hf.py checks a view's); asking
    # for it (storage_offset()) would break the graph
    return k.as_strided(size, strides), v.as_strided(size, strides), plan.block_table(tokens_per_row)


class _PaddingPlan:
    """What the attention derives from a (B, N_k) bool padding mask: each row's token count, its tokens' order, the
    block table of one-token pages, the padded queries, a sliding window's check of the padding.

    A *shared* plan serves every layer of one eager forward (:func:`_with_a_shared_plan`) and keeps what it makes: an
    eager decoding step's attention kernel is short, and remade in every layer these small launches (a sum, a stable
    sort, the table's arithmetic) and the check's host read would add host time to each layer's one kernel, where sdpa
    builds its 4D mask once a forward and each layer makes one call. A layer's own plan (while tracing or capturing,
    or for a mask that did not come from the model's mask function) keeps only what it is asked twice in the layer
    (the lengths, the order): caching by size would add guards on those sizes under torch.compile."""

    def __init__(self, mask: torch.Tensor, shared: bool = False):
        # A shared plan is kept beside its mask (in _SHARED_PLANS, weakly keyed) and holds the mask weakly too, so
        # that neither keeps the other alive; a layer's own plan holds it plainly (it may be traced, and Dynamo need
        # not follow a weak reference)
        self._held, self._weak = (None, weakref.ref(mask)) if shared else (mask, None)
        self.version = _version(mask) if shared else None  # the values it was made from (see _padding_plan)
        self._lengths = self._order = None  # each made when first asked for
        self._edges_checked = False
        self._kept = {}  # a shared plan's other tensors, by what they are (see _once)

    def _once(self, key, make):
        """``make()``, kept under ``key`` by a shared plan and made anew each time by a layer's own."""
        if self._weak is None:
            return make()
        if key not in self._kept:
            self._kept[key] = make()
        return self._kept[key]

    @property
    def mask(self) -> torch.Tensor:
        return self._held if self._weak is None else self._weak()

    @property
    def lengths(self) -> torch.Tensor:
        """(B,) int32: each row's token count."""
        if self._lengths is None:
            self._lengths = self.mask.sum(-1, dtype=torch.int32)
        return self._lengths

    @property
    def order(self) -> torch.Tensor:
        """(B, N_k) indices that move each row's tokens, in order, to its front (:func:`_kept_first`)."""
        if self._order is None:
            self._order = _kept_first(self.mask)
        return self._order

    def require_padding_at_an_edge(self) -> None:
        """A sliding window's check that every row is padded at its end only or at its start only (else a ValueError;
        while tracing, an assertion on the device): on the host once for all the layers that share the plan."""
        if not self._edges_checked:
            right, left = _padded_at_an_edge(self.mask, self.lengths)
            _require(right | left, WINDOW_NEEDS_EDGE_PADDING, on_device=not values_checked(self.mask))
            self._edges_checked = self._weak is not None

    def block_table(self, tokens_per_row: int) -> torch.Tensor:
        """(B, N_k) int32: row b's tokens in order as the pages ``b * tokens_per_row + n`` (:func:`_token_pages`)."""
        def make():
            rows = torch.arange(self.mask.shape[0], device=self.mask.device)[:, None] * tokens_per_row
            return (rows + self.order).to(torch.int32)

        return self._once(("block table", tokens_per_row), make)

    def last_query_lengths(self) -> torch.Tensor:
        """(B,) int32: each row's token count, 0 where its last position (a one-query step's query) is padding: a
        row with no key gets output 0 from the kernel, without a ``masked_fill`` (a launch) in every layer."""
        return self._once("last query lengths", lambda: torch.where(self.mask[:, -1], self.lengths, 0))

    def padded_queries(self, n_q: int) -> torch.Tensor:
        """(B, N_q, 1, 1) bool: which of the last ``n_q`` positions are padding (their outputs are 0)."""
        return self._once(("padded queries", n_q), lambda: ~self.mask[:, self.mask.shape[1] - n_q:, None, None])


#: Whether the layers of one eager forward share one :class:`_PaddingPlan` of the padding mask that the model builds
#: for them all; ``benchmarks/hf_generate.py --plan-per-layer`` times both settings.
SHARE_PADDING_PLAN = True

#: The shared plans, by their masks (weakly: an entry goes when its mask goes). Beside the mask, not an attribute on
#: it, so that saving or copying the mask (a hook's torch.save, a deepcopy) sees a plain tensor.
_SHARED_PLANS = WeakIdKeyDictionary()


def _version(mask: torch.Tensor) -> int | None:
    """The mask's version counter, which counts in-place writes (a view's included); None for an inference tensor,
    which has none (nothing can write to it outside inference mode)."""
    return None if mask.is_inference() else mask._version


def _with_a_shared_plan(mask: torch.Tensor) -> torch.Tensor:
    """``mask``, a (B, N_k) bool padding mask that :func:`flashlib_attention_mask` has just made for one forward, given
    a :class:`_PaddingPlan` for every layer to share (``SHARE_PADDING_PLAN``). Only eagerly: while torch.compile traces,
    a CUDA graph is captured or a torch.func transform runs, the mask's values cannot be read, and each layer makes its
    own plan (the graph holds what it computes; Inductor merges what it can)."""
    if SHARE_PADDING_PLAN and values_checked(mask):
        _SHARED_PLANS[mask] = _PaddingPlan(mask, shared=True)
    return mask


def _padding_plan(mask: torch.Tensor) -> _PaddingPlan:
    """The :class:`_PaddingPlan` of a (B, N_k) bool padding mask: the one shared by the forward's layers
    (:func:`_with_a_shared_plan`) while the mask's values are those it was made from, else a new one for this layer.
    Never a shared one while tracing or capturing: a plan made outside a graph must not be read inside it."""
    if values_checked(mask):
        plan = _SHARED_PLANS.get(mask)
        if plan is not None and plan.version == _version(mask):
            return plan
    return _PaddingPlan(mask)


def _kept_first(kept: torch.Tensor) -> torch.Tensor:
    """Indices that put the True entries of ``kept`` first along its last dim, each group in its own order (a
    stable sort): a row's tokens moved to its front, its padding to its end."""
    return torch.argsort((~kept).to(torch.uint8), dim=-1, stable=True)


def _padded_at_an_edge(mask: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of a (B, N) padding mask with ``lengths`` tokens a row: (padded at the end only, at the start only)."""
    positions = torch.arange(mask.shape[1], device=mask.device)
    return ((mask == (positions < lengths[:, None])).all(-1),
            (mask == (positions >= mask.shape[1] - lengths[:, None])).all(-1))


def _split_kv(q, k, v, options) -> bool:
    """Whether :func:`flash_attention_with_kvcache`'s split-KV kernel serves this call: few queries per sequence
    (:func:`flashlib.select_variant`'s rule), no gradient and no dropout, which it does not compute."""
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    return preferred_variant(q.shape[1]) == "splitkv" and not needs_grad and not options["dropout_p"]


WINDOW_NEEDS_EDGE_PADDING = ("flashlib's Transformers attention with a sliding window needs left or right padding: "
                             "with padding between tokens the window would count tokens, not positions as sdpa does")


#: An additive mask's value that hides its key: softmax gives it exp(bias + score - max) = 0 in float32 (and
#: float64) for any scores below thousands, as sdpa's sum would. Masks are written with -inf, the dtype's
#: minimum, -1e9 or -1e4.
MASKED_BIAS = -1e4


def _require(condition: torch.Tensor, message: str, on_device: bool = False) -> None:
    """A check of a mask's values: read on the host, a ValueError with ``message``; ``on_device`` (while tracing,
    where reading it would break the graph), an assertion on the device with the same message."""
    if on_device:
        torch._assert_async(condition.all(), message)
    elif not bool(condition.all()):
        raise ValueError(message)


def _allowed(mask: torch.Tensor, what: str, on_device: bool = False) -> torch.Tensor:
    """The (B, N_q, N_k) bool of a 4D mask, boolean or additive (0 / -inf), the same for every head; else a
    ValueError that says it is a bias or differs between heads (``what`` names the mask; see :func:`_require`)."""
    if mask.dtype == torch.bool:
        allowed = mask
    else:  # additive: 0 where allowed, a large negative number (or -inf) where not
        allowed = mask == 0
        _require(allowed | (mask <= MASKED_BIAS),
                 f"flashlib's Transformers attention got {what} that adds a bias to the scores (values other than 0 "
                 f"and at most {MASKED_BIAS:g}, or -inf): flashlib takes masks, not biases; use sdpa or eager",
                 on_device)
    _require(allowed == allowed[:, :1], f"flashlib's Transformers attention got {what} that differs between heads",
             on_device)
    return allowed[:, 0]


def _padding_mask(mask, options, batch: int, n_q: int, n_k: int) -> torch.Tensor:
    """The (B, N_k) bool padding mask of a 2D padding mask or of a 4D mask that is padding plus the causal and
    window bounds of ``options``; a ValueError naming what came in for anything else."""
    if not isinstance(mask, torch.Tensor) or mask.dim() not in (2, 4):
        what = f"shape {tuple(mask.shape)}" if isinstance(mask, torch.Tensor) else f"a {type(mask).__name__}"
        raise ValueError(f"flashlib's Transformers attention takes a 2D (B, N_k) padding mask or a 4D mask; got {what}")
    # The mask's name (its shape in text) only where an error is raised: made on every call, it would make
    # torch.compile(dynamic=True) specialize each step to its sizes
    keys_only = _keys_only(options)
    if mask.dim() == 2:
        if keys_only and tuple(mask.shape) != (batch, n_k):
            raise ValueError(f"flashlib's Transformers attention got {_mask_name(mask, n_q, n_k)}: a bidirectional "
                             f"layer's 2D mask must be (B, N_k) with B = {batch}")
        if not keys_only and (mask.shape[0] != batch or not n_q <= mask.shape[1] <= n_k):
            raise ValueError(f"flashlib's Transformers attention got {_mask_name(mask, n_q, n_k)}: a 2D mask must be "
                             f"(B, L) with B = {batch} and N_q <= L <= N_k")
        return mask.bool()
    if mask.shape[0] not in (1, batch) or tuple(mask.shape[2:]) != (n_q, n_k) or (n_q > n_k and not keys_only):
        raise ValueError(f"flashlib's Transformers attention got {_mask_name(mask, n_q, n_k)}: a 4D mask must be "
                         f"(B or 1, H or 1, N_q, N_k) with B = {batch}"
                         + ("" if keys_only else " and N_q <= N_k (queries are the last keys)"))
    # A bidirectional layer's 4D mask is padding or refused: while tracing, the device checks it. A causal layer's
    # may be packed sequences instead (the ValueError leads there), which only the host can tell
    on_device = keys_only and not values_checked(mask)
    what = _mask_name(mask, n_q, n_k, on_device)
    allowed = _allowed(mask, what, on_device)
    keys = allowed.any(dim=1)  # a key that no query sees is padding
    rows = torch.arange(n_q, device=mask.device)[:, None] + (n_k - n_q)
    cols = torch.arange(n_k, device=mask.device)[None, :]
    band = torch.ones(n_q, n_k, dtype=torch.bool, device=mask.device)
    left, right = options["window"] or (-1, -1)
    if options["causal"]:
        band &= cols <= rows
    if left >= 0:
        band &= cols >= rows - left
    if right >= 0:
        band &= cols <= rows + right
    expected = band & keys[:, None, :]
    ignored = torch.zeros(allowed.shape[:2], dtype=torch.bool, device=mask.device)  # every query row is checked ...
    if not keys_only:  # ... but those of padded queries that see nothing (output 0) in a causal or windowed layer
        ignored = ~allowed.any(-1) & ~keys[:, n_k - n_q:]
    pattern = ("causal" if options["causal"] else "bidirectional") + (
        f" with window {options['window']}" if options["window"] else "")
    _require((allowed == expected) | ignored[..., None],
             f"flashlib's Transformers attention got {what} that is not padding plus the {pattern} pattern of this "
             "layer (queries = the last N_q keys): e.g. packed sequences, an image-token or chunked pattern, a static "
             "cache or a custom 4D mask. Use attn_implementation='sdpa' or 'eager' for it", on_device)
    return keys.expand(batch, n_k)
