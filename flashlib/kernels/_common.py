"""What the attention kernels share: constants, and the rule for loading through tensor descriptors.

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


def descriptors_supported(device: torch.device) -> bool:
    """Whether kernels on ``device`` may use tensor descriptors: Hopper and later, or the interpreter."""
    if runtime.INTERPRET:
        return True
    return device.type == "cuda" and _hopper_or_later(device.index if device.index is not None
                                                      else torch.cuda.current_device())


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
