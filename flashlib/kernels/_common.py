"""What the attention kernels share: constants, the band geometry, and loading through tensor descriptors.

The forward (:mod:`.attention_fwd`), the backward (:mod:`.attention_bwd`) and the decoding
kernel (:mod:`.decode`) take from here the one definition of: which key a query sees
(:func:`band_mask`), which blocks of the band a program visits (:func:`key_block_range`,
:func:`query_block_range`), where a sample lies in a padded or packed batch
(:func:`sample_bounds`, :func:`row_stats_offset`, :func:`packed_as_bhnd`), how scores are
formed (:func:`scores_log2`), and the block sizes of the interpreter.

Tensor descriptors (``tl.make_tensor_descriptor``) hand a tile's copy to Hopper's copy
engine (TMA): one instruction moves a whole (rows, head_dim) tile into shared memory,
bounded by the descriptor's shape (rows past it read as zero, stores past it are
dropped), with no address arithmetic in the program's registers. The copy engine asks
for 16-byte aligned rows: the base address and every stride but the last (which must be
1) a multiple of 16 bytes. Tensors that are not (a slice at an odd offset, a head_dim of
20 halves) take the kernels' pointer path, which is also what GPUs before Hopper run.

Descriptors made inside a kernel live in a small global scratch buffer that Triton asks
its allocator for at launch; :func:`use_torch_scratch` gives Triton one backed by
PyTorch's caching allocator (so it also works under CUDA-graph capture).
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import runtime

LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) == exp2(x * LOG2E)
LN2 = tl.constexpr(0.6931471805599453)  # ln(2): ln(x) == log2(x) * LN2

#: The copy engine's alignment, in bytes, of a tile's base address and row strides.
DESCRIPTOR_ALIGNMENT = 16

#: The block sizes used in the interpreter, where autotuning would only measure numpy.
INTERPRETER_BLOCKS = dict(BLOCK_M=32, BLOCK_N=32)


def _scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Triton's allocator protocol: ``size`` bytes on the current device (CPU in the interpreter)."""
    device = "cpu" if runtime.INTERPRET else "cuda"
    return torch.empty(size, dtype=torch.int8, device=device)


def use_torch_scratch() -> None:
    """Let Triton allocate the descriptors' scratch memory through PyTorch.

    Triton keeps its allocator in a context variable, which a new thread (autograd's
    backward thread, for example) does not inherit: call this in the launching thread,
    right before launching a kernel that makes descriptors.
    """
    triton.set_allocator(_scratch)


def cuda_index(device: torch.device) -> int:
    """The index of a CUDA ``device``, the current device's where it names none ("cuda")."""
    return device.index if device.index is not None else torch.cuda.current_device()


def descriptors_supported(device: torch.device) -> bool:
    """Whether kernels on ``device`` may use tensor descriptors: Hopper and later, or the interpreter."""
    if runtime.INTERPRET:
        return True
    return device.type == "cuda" and _hopper_or_later(cuda_index(device))


@functools.lru_cache(maxsize=None)
def multiprocessor_count(device_index: int) -> int:
    """SMs of a CUDA device (cached: the property query costs host time on every call)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def _hopper_or_later(device_index: int) -> bool:
    """Asked once per GPU: every launch asks, and the host's time per launch counts at short N."""
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def descriptor_ready(t: torch.Tensor) -> bool:
    """Whether ``t``'s rows can be tiles of a tensor descriptor: unit last stride, 16-byte aligned rows."""
    strides = t.stride()
    if strides[-1] != 1:
        return False
    size, bits = t.element_size(), t.data_ptr()
    for stride in strides[:-1]:  # every multiple of 16 leaves the low four bits of the OR clear
        bits |= stride * size
    return bits % DESCRIPTOR_ALIGNMENT == 0


def descriptor_mode(use_tma: bool, *, padded: bool) -> str:
    """The kernels' ``TMA`` constexpr: ``"none"`` (pointers), ``"host"`` or ``"device"``.

    Host descriptors (made here once per launch, the cheapest) cover a whole (B, H, N, D)
    tensor, so they bound tiles by N only. Padded (``seq_lens``) or packed (varlen) batches
    need tiles bounded by each sample's rows, so that padding is never read: there each
    program makes its own descriptors (``"device"``, which needs :func:`use_torch_scratch`),
    which costs it a few hundred cycles.
    """
    if not use_tma:
        return "none"
    return "device" if padded else "host"


def tile_sources(mode: str, tensors):
    """What the kernels receive for (B, H, N, D) tensors: host descriptors in ``"host"`` mode, else the tensors.

    The descriptors' block shapes are placeholders until :func:`set_block_shapes` fills them
    in for the launch's config.
    """
    if mode != "host":
        return tuple(tensors)
    return tuple(host_descriptor(t) for t in tensors)


#: (dtype, dims) -> a descriptor made (and validated) by Triton, whose fields :func:`host_descriptor` copies.
_DESCRIPTOR_TEMPLATES: dict = {}


def host_descriptor(t: torch.Tensor) -> TensorDescriptor:
    """A host TensorDescriptor over the whole of ``t`` (checked by :func:`descriptor_ready`), placeholder tile.

    Triton's constructor validates its arguments in Python, 5-10 us per descriptor on the
    H100 host, four per launch. The first descriptor of each dtype is made by it; later ones
    copy its fields (whatever this Triton version has) with the tensor, shape and strides replaced.
    """
    placeholder = [1] * (t.dim() - 1) + [16]
    template = _DESCRIPTOR_TEMPLATES.get((t.dtype, t.dim()))
    if template is None:
        template = TensorDescriptor(t, list(t.shape), list(t.stride()), placeholder)
        if hasattr(template, "__dict__"):
            template.base = None  # only its other fields are copied: do not keep the first tensor alive
        _DESCRIPTOR_TEMPLATES[(t.dtype, t.dim())] = template
    if not hasattr(template, "__dict__"):  # a Triton whose descriptor has slots: construct it
        return TensorDescriptor(t, list(t.shape), list(t.stride()), placeholder)
    descriptor = object.__new__(TensorDescriptor)
    descriptor.__dict__.update(template.__dict__)
    descriptor.base, descriptor.shape, descriptor.strides = t, list(t.shape), list(t.stride())
    descriptor.block_shape = placeholder
    return descriptor


def set_block_shapes(nargs: dict, rows: dict) -> None:
    """Give host descriptors the tile of a config: ``rows`` maps an argument name to its block-size name.

    For example ``{"Q": "BLOCK_M", "K": "BLOCK_N"}``: Q's tiles are (1, 1, BLOCK_M, BLOCK_D).
    Arguments that are plain tensors are left alone. Used as the configs' ``pre_hook``.
    """
    for name, block in rows.items():
        source = nargs[name]
        if hasattr(source, "block_shape"):
            source.block_shape = [1, 1, nargs[block], nargs["BLOCK_D"]]


@triton.jit
def load_rows(src, off_b, off_h, row, TMA: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """The (BLOCK_R, BLOCK_D) tile at ``row`` of (batch, head) from a descriptor.

    ``"host"``: ``src`` is a (B, H, N, D) descriptor with (1, 1, BLOCK_R, BLOCK_D) tiles.
    ``"device"``: ``src`` is the (rows, D) descriptor of one sample and head.
    """
    if TMA == "host":
        return src.load([off_b, off_h, row, 0]).reshape(BLOCK_R, BLOCK_D)
    else:
        return src.load([row, 0])


@triton.jit
def store_rows(dst, off_b, off_h, row, tile, TMA: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """Store a (BLOCK_R, BLOCK_D) tile at ``row`` of (batch, head) through a descriptor (see :func:`load_rows`)."""
    if TMA == "host":
        dst.store([off_b, off_h, row, 0], tile.reshape(1, 1, BLOCK_R, BLOCK_D))
    else:
        dst.store([row, 0], tile)


def tensor_of(source):
    """The tensor behind a kernel argument: a host descriptor's base, or the tensor itself."""
    return getattr(source, "base", source)


# ---------------------------------------------------------------- scores and the band
@triton.jit
def tanh(x):
    """tanh through exp2 (the interpreter has no tanh), to float32's relative precision.

    1 - 2 / (e^(2x) + 1) is exact at +-inf, but near 0 its error stays about 6e-8 absolute while tanh(x) ~ x
    shrinks: a softcap of 1e4 lost 4.6e-4 of the output that way, 1e8 all of it. Below |x| = 0.34 the Taylor
    series to x^9 takes over; its first omitted term, 1382/155925 x^11, is under 2e-7 of tanh(x) there."""
    x2 = x * x
    series = x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0 + x2 * (62.0 / 2835.0)))))
    return tl.where(x2 < 0.34 * 0.34, series, 1.0 - 2.0 / (tl.math.exp2(x * (2.0 * LOG2E)) + 1.0))


@triton.jit
def scores_log2(qk, q_pos, k_pos, score_scale, softcap_scale, slope_log2,
                HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """Scores in log2 units from the raw products ``qk``, and tanh of the softcap (for the backward).

    ``s = scale * qk``; with a softcap ``s = softcap * tanh(s / softcap)``; with ALiBi
    ``s -= slope * |q_pos - k_pos|``, where ``q_pos`` is the query's key position
    ``i + N_k - N_q``. The launcher folds the constants: ``score_scale`` is
    ``softcap * log2(e)`` with a softcap, else ``scale * log2(e)``; ``softcap_scale`` is
    ``scale / softcap``; ``slope_log2`` is ``slope * log2(e)``. ``q_pos`` and ``k_pos``
    broadcast to ``qk``'s shape, so the backward's transposed tiles use it too.
    """
    if HAS_SOFTCAP:
        t = tanh(qk * softcap_scale)
        s = t * score_scale
    else:
        t = qk
        s = qk * score_scale
    if HAS_ALIBI:
        s = s - slope_log2 * tl.abs(q_pos - k_pos).to(tl.float32)
    return s, t


@triton.jit
def score_scales(sm_scale, SOFTCAP, HAS_SOFTCAP: tl.constexpr):
    """(``score_scale``, ``softcap_scale``) of :func:`scores_log2` for softmax scale ``sm_scale`` and, with
    ``HAS_SOFTCAP``, the softcap ``SOFTCAP``."""
    if HAS_SOFTCAP:  # one return: the compiler refuses returns of two types in one function
        score_scale = SOFTCAP * LOG2E
        softcap_scale = sm_scale / SOFTCAP
    else:
        score_scale = sm_scale * LOG2E
        softcap_scale = 1.0
    return score_scale, softcap_scale


@triton.jit
def band_mask(q_pos, k_pos, k_len, window_left, window_right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """The element mask "query i sees key j": True where it does, in ``q_pos``, ``k_pos``'s broadcast shape.

    Bottom-right aligned (:func:`flashlib.reference.attention_mask`): ``q_pos`` is the query's
    key position ``i' = i + N_k - N_q``, and it sees the keys ``i' - left <= j <= i' + right``
    with ``j < k_len``. A side whose ``HAS_LEFT``/``HAS_RIGHT`` is False is unbounded, and
    its comparison is not compiled at all. Query rows past the sample's length are the
    caller's to mask (the kernels skip them or read their L as +inf).
    """
    visible = k_pos < k_len
    if HAS_LEFT:
        visible = visible & (k_pos >= q_pos - window_left)
    if HAS_RIGHT:
        visible = visible & (k_pos <= q_pos + window_right)
    return visible


@triton.jit
def key_block_range(m0, q_len, k_len, offset, WINDOW_LEFT, WINDOW_RIGHT,
                    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key blocks [lo, hi) that the valid rows of query block ``m0`` see; [full_lo, full_hi) seen whole.

    Query row i sits at key position ``i' = i + offset`` and sees
    ``i' - left <= j <= i' + right``, ``j < k_len`` (:func:`band_mask`). Blocks outside
    [lo, hi) are never loaded (block early exit); the forward and the dQ kernel of the
    backward share this. Rows that see no key at all (padding rows, or a window whose
    reach lies past k_len) give an empty range.
    """
    row_lo = m0 + offset  # i' of the first row
    row_hi = tl.minimum(m0 + BLOCK_M, q_len) - 1 + offset  # i' of the last valid row
    lo = 0
    hi = k_len
    full_lo = 0
    full_hi = k_len
    if HAS_LEFT:
        lo = tl.maximum(row_lo - WINDOW_LEFT, 0)
        full_lo = tl.cdiv(tl.maximum(row_hi - WINDOW_LEFT, 0), BLOCK_N) * BLOCK_N
    if HAS_RIGHT:
        hi = tl.minimum(row_hi + WINDOW_RIGHT + 1, k_len)
        full_hi = tl.minimum(tl.maximum(row_lo + WINDOW_RIGHT + 1, 0), k_len)
    visible = (m0 < q_len) & (hi > lo)  # padding rows, or a window's reach past k_len: nothing to see
    lo = (lo // BLOCK_N) * BLOCK_N  # lo >= 0, so // is the same floor in numpy and on the GPU
    full_hi = (full_hi // BLOCK_N) * BLOCK_N
    hi = tl.where(visible, hi, lo)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def query_block_range(n0, q_len, k_len, offset, WINDOW_LEFT, WINDOW_RIGHT,
                      HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query blocks [lo, hi) whose rows see some key of key block ``n0``; [full_lo, full_hi) see it whole.

    The transpose of :func:`key_block_range`, for the dK/dV kernel of the backward: key j is
    seen by rows with ``j - right <= i + offset <= j + left`` and ``i < q_len``. A block in
    [full_lo, full_hi) has all its rows valid, and every row sees every key of the key
    block, which lies whole below ``k_len``: no mask there.
    """
    col_lo = n0
    col_hi = tl.minimum(n0 + BLOCK_N, k_len) - 1  # the last valid key of the block
    lo = 0
    hi = q_len
    full_lo = 0
    full_hi = q_len
    if HAS_RIGHT:  # rows above the diagonal (or the right window edge) do not see the block
        lo = tl.maximum(col_lo - WINDOW_RIGHT - offset, 0)
        full_lo = tl.maximum(col_hi - WINDOW_RIGHT - offset, 0)
    if HAS_LEFT:  # rows further down than the window's reach do not see it
        hi = tl.minimum(col_hi + WINDOW_LEFT - offset + 1, q_len)
        full_hi = tl.minimum(tl.maximum(col_lo + WINDOW_LEFT - offset + 1, 0), q_len)
    visible = (n0 < k_len) & (hi > lo)  # padding keys, or keys only rows past q_len would see
    lo = (lo // BLOCK_M) * BLOCK_M  # all >= 0 here, so // floors alike in numpy and on the GPU
    full_lo = tl.cdiv(full_lo, BLOCK_M) * BLOCK_M
    full_hi = (full_hi // BLOCK_M) * BLOCK_M
    hi = tl.where(visible, hi, lo)
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    full_hi = tl.where(n0 + BLOCK_N <= k_len, full_hi, full_lo)  # cut by k_len: every block masked
    return lo, full_lo, full_hi, hi


# ---------------------------------------------------------------- padded and packed batches
def packed_as_bhnd(t: torch.Tensor, batch: int) -> torch.Tensor:
    """A packed (total, H, D) tensor seen as (B, H, total, D) with batch stride 0: no copy.

    Every sample sees all rows; the kernels (``IS_VARLEN``) start each one at its cu_seqlens offset.
    """
    return t.transpose(0, 1).unsqueeze(0).expand(batch, -1, -1, -1)


@triton.jit
def sample_bounds(off_b, SEQ_LENS, CU_SEQLENS_Q, CU_SEQLENS_K, N_CTX_Q, N_CTX_K,
                  HAS_SEQ_LENS: tl.constexpr, IS_VARLEN: tl.constexpr):
    """Where sample ``off_b`` lies along N: ``(q_start, n_q, q_len, k_start, n_k, k_len)``.

    Its query rows are ``[q_start, q_start + n_q)`` of Q (``n_q`` bounds every load and
    store), of which the first ``q_len`` are valid; likewise for keys. The causal
    diagonal is aligned on ``n_k - n_q``. A padded batch: start 0, n = N_CTX, len =
    min(seq_len, N_CTX) with seq_lens. A packed batch (``IS_VARLEN``, as flash-attn's
    varlen functions): start = cu_seqlens[b] (int64, for the pointer arithmetic),
    n = len = cu_seqlens[b + 1] - cu_seqlens[b]. The forward and both backward
    kernels share this.
    """
    if IS_VARLEN:
        q_first = tl.load(CU_SEQLENS_Q + off_b)
        k_first = tl.load(CU_SEQLENS_K + off_b)
        n_q = tl.load(CU_SEQLENS_Q + off_b + 1) - q_first
        n_k = tl.load(CU_SEQLENS_K + off_b + 1) - k_first
        return q_first.to(tl.int64), n_q, n_q, k_first.to(tl.int64), n_k, n_k
    else:
        q_len = N_CTX_Q
        k_len = N_CTX_K
        if HAS_SEQ_LENS:
            seq_len = tl.load(SEQ_LENS + off_b)
            q_len = tl.minimum(seq_len, N_CTX_Q)
            k_len = tl.minimum(seq_len, N_CTX_K)
        return 0, N_CTX_Q, q_len, 0, N_CTX_K, k_len


@triton.jit
def row_stats_offset(off_b, off_h, H, N_CTX_Q, q_start, IS_VARLEN: tl.constexpr):
    """Index of the sample's first row in the float32 row statistics (L, and D in the backward):
    contiguous (B, H, N_q) for a padded batch, (H, total_q) for a packed one."""
    if IS_VARLEN:
        return off_h.to(tl.int64) * N_CTX_Q + q_start
    else:
        return (off_b * H + off_h).to(tl.int64) * N_CTX_Q
