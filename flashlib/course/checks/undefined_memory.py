"""What lies around and under a learner's kernel in a check: memory it must not rely on.

On a GPU, the lanes a masked ``tl.load`` leaves out (without ``other=``) are
undefined, and the memory past a tensor's last row is whatever was there. Triton's
interpreter gives 0 for the first and the check decides the second, so the kernel
checks make both visible: :func:`nan_in_masked_lanes` fills masked-off lanes with
NaN while a check launches (and can record what each load reads, for
:func:`addresses_outside`), and :func:`in_padded_rows` puts a tensor in a buffer
whose extra rows hold NaN (or 0, to tell the two causes apart), its rows further
apart than D where a case asks (:func:`rows_read_by_head_dim_steps` says what a
kernel that assumes they are D apart reads instead).
"""
from __future__ import annotations

import contextlib

import torch

from ... import runtime

#: What the memory after the last row of q, k and v holds, per case (the last element of the args).
AFTER_NAN, AFTER_ZERO = "nan", "zero"

#: The words every hint about a masked load without other= starts with.
UNDEFINED_LANES = ("a masked tl.load without other= reads undefined values in the masked lanes "
                   "(this check fills them with NaN; on a GPU they hold whatever the registers held)")


_UNSET = object()


class WildAccess(RuntimeError):
    """A kernel in the interpreter loaded or stored where none of its tensors lies: refused before it happens,
    since the interpreter would read or write raw memory there (and end the process, Jupyter's kernel too)."""


@contextlib.contextmanager
def nan_in_masked_lanes(reads: list | None = None):
    """Inside the block, a masked ``tl.load`` without ``other=`` fills its masked-off lanes with NaN.

    Triton's interpreter fills them with 0, which hides the bug: on a GPU those lanes
    are undefined. Only the interpreter is patched (on a GPU this does nothing), only
    floating-point loads, and only inside the block: the interpreter's own method is
    restored on the way out, whatever happens inside (an exception, a time limit).
    A load with ``other=``, or without a mask, is left as it is.

    ``reads``: a list that receives, for every load, the addresses of the lanes it reads (a numpy array; the
    masked-off lanes left out), for :func:`addresses_outside`. A load past a tensor's edge whose values never
    reach a stored element changes no output, yet on a GPU it reads foreign memory, or faults.

    A load or store of a lane that lies in none of the buffers of the tensors the block's launches were given
    (a loop that runs too long, a pointer moved by the wrong stride) raises :class:`WildAccess` instead of
    letting the interpreter touch that memory: a segmentation fault there would end the learner's process
    with no feedback at all.
    """
    if not runtime.INTERPRET:
        yield
        return
    try:
        import numpy as np
        from triton.runtime import interpreter

        builder = interpreter.interpreter_builder
        np_dtype, handle = interpreter._get_np_dtype, interpreter.TensorHandle
        original = builder.create_masked_load
    except (ImportError, AttributeError):  # another Triton: leave the interpreter as it is
        yield
        return

    def create_masked_load(ptrs, mask, other, cache_policy, is_volatile):
        _refuse_wild("loads", ptrs, mask, ranges, np_dtype)
        if reads is not None:
            reads.append(_kept_lanes(ptrs, mask))
        if other is None and not mask.data.all():
            dtype_tt = ptrs.get_element_ty()
            dtype = np_dtype(dtype_tt)
            if np.issubdtype(dtype, np.floating):
                other = handle(np.full(ptrs.data.shape, np.nan, dtype=dtype), dtype_tt)
        return original(ptrs, mask, other, cache_policy, is_volatile)

    original_store = builder.create_masked_store

    def create_masked_store(ptrs, value, mask, cache_policy):
        _refuse_wild("stores", ptrs, mask, ranges, np_dtype)
        return original_store(ptrs, value, mask, cache_policy)

    ranges: list[tuple[int, int]] = []  # (first byte, past the last) of every buffer a launch was given
    executor = interpreter.GridExecutor
    original_args = executor._init_args_hst

    def init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = original_args(self, args_dev, kwargs)
        ranges.extend(_buffers(list(args_hst) + list(kwargs_hst.values())))
        return args_hst, kwargs_hst

    patched = {"create_masked_load": create_masked_load, "create_masked_store": create_masked_store}
    own = {name: vars(builder).get(name, _UNSET) for name in patched}
    for name, function in patched.items():
        setattr(builder, name, function)
    executor._init_args_hst = init_args_hst
    try:
        yield
    finally:
        executor._init_args_hst = original_args
        for name, before in own.items():
            if before is _UNSET:
                delattr(builder, name)
            else:
                setattr(builder, name, before)


def _buffers(values) -> list[tuple[int, int]]:
    """The byte ranges of the storages of the tensors in ``values`` (in tuples, and a descriptor's base)."""
    out = []
    for value in values:
        if isinstance(value, tuple):
            out += _buffers(value)
        elif hasattr(value, "base") and hasattr(getattr(value, "base"), "untyped_storage"):
            out += _buffers([value.base])
        elif isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            out.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
    return out


def _kept_lanes(ptrs, mask):
    """The addresses of the lanes of ``ptrs`` that ``mask`` keeps, flat, as uint64 (a scalar access has 0-d
    pointers)."""
    import numpy as np

    return np.ravel(ptrs.data)[np.ravel(np.broadcast_to(mask.data, np.shape(ptrs.data)))].astype(np.uint64)


def _refuse_wild(what: str, ptrs, mask, ranges, np_dtype) -> None:
    """Raise :class:`WildAccess` if a lane of ``ptrs`` that ``mask`` keeps lies in none of ``ranges`` (bytes)."""
    import numpy as np

    if not ranges:  # no launch seen (another Triton): nothing to compare with
        return
    addresses = _kept_lanes(ptrs, mask)
    if not addresses.size:
        return
    size = np.uint64(np.dtype(np_dtype(ptrs.get_element_ty())).itemsize)
    inside = np.zeros(addresses.shape, dtype=bool)
    for start, end in ranges:
        inside |= (addresses >= np.uint64(start)) & (addresses + size <= np.uint64(end))
    if not inside.all():
        raise WildAccess(f"the kernel {what} {int((~inside).sum())} element(s) outside every tensor it was given: "
                         "a loop that runs too long, or pointers moved too far. On a GPU this reads or writes "
                         "foreign memory, or faults")


def addresses_outside(reads: list, *tensors: torch.Tensor) -> int:
    """How many of the addresses in ``reads`` (:func:`nan_in_masked_lanes`) lie in no element of ``tensors``
    (views: their own elements, not the buffers around them)."""
    import numpy as np

    if not reads:
        return 0
    inside = [_element_addresses(t) for t in tensors]
    read = np.concatenate(reads)
    return int((~np.isin(read, np.concatenate(inside))).sum())


def reads_in_padding(reads: list, *views: torch.Tensor) -> int:
    """How many of the addresses in ``reads`` (:func:`nan_in_masked_lanes`) lie in the buffer around one of
    ``views`` (:func:`in_padded_rows`) but in none of its own elements: loads past a tensor's last row that a
    kernel was given other tensors to read too (whose elements :func:`addresses_outside` would have to list)."""
    import numpy as np

    if not reads:
        return 0
    read = np.concatenate(reads)
    count = 0
    for view in views:
        storage = view.untyped_storage()
        start, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
        in_buffer = (read >= np.uint64(start)) & (read < np.uint64(end))
        own = _element_addresses(view)
        count += int((in_buffer & ~np.isin(read, own)).sum())
    return count


def stray_reads_problem(context: dict, where: str, advice: str) -> str | None:
    """The judge's words on the count of stray loads a check's launch left in ``context["stray_reads"]``
    (:func:`addresses_outside`, :func:`reads_in_padding`): None for 0; else ``where`` (what was read outside
    what) with the count, then ``advice``. A count that is not a plain int >= 0 (the reply is the learner
    process's) is itself the failure."""
    stray = context.get("stray_reads")
    if isinstance(stray, bool) or not isinstance(stray, int) or stray < 0:
        return f"the count of stray loads did not come back as a count (got {type(stray).__name__})"
    return f"{where} ({stray} loaded elements): {advice}" if stray else None


def _element_addresses(t: torch.Tensor):
    """The address of each element of ``t`` (its own elements, any strides), as numpy uint64."""
    import numpy as np

    return np.asarray(t.data_ptr() + t.element_size() * _element_offsets(t), dtype=np.uint64)


def _element_offsets(t: torch.Tensor):
    """The offset, in elements from ``t.data_ptr()``, of each element of ``t`` (any strides), as numpy."""
    offsets = torch.zeros((), dtype=torch.int64)
    for size, stride in zip(t.shape, t.stride()):
        offsets = offsets.unsqueeze(-1) + torch.arange(size, dtype=torch.int64) * stride
    return offsets.reshape(-1).numpy()


def in_padded_rows(t: torch.Tensor, pad: int, fill: float, row_stride: int | None = None) -> torch.Tensor:
    """``t`` (B, H, N, D) as a view inside a buffer with ``pad`` rows of ``fill`` after each head's N rows.

    ``row_stride`` (at least D): the elements between the starts of two rows, the gap after each row's D
    holding ``fill`` too. A kernel must step through rows with the stride it is given (a head-major view
    of (B, N, H, D) tensors has rows H * D apart); one that steps by HEAD_DIM reads wrong rows here.
    """
    batch, heads, n, d = t.shape
    width = d if row_stride is None else row_stride
    if width < d:
        raise ValueError(f"row_stride {row_stride} is shorter than a row ({d} elements)")
    buffer = torch.full((batch, heads, n + pad, width), fill, dtype=t.dtype, device=t.device)
    view = buffer[:, :, :n, :d]
    view.copy_(t)
    return view


def rows_read_by_head_dim_steps(t: torch.Tensor, block: int, row_stride: int, fill: float):
    """What a kernel reads as ``t``'s rows (B, H, N, D) when it moves from one block of rows to the next by
    ``block * HEAD_DIM`` elements while the rows are ``row_stride`` apart (:func:`in_padded_rows`): the row
    n of block b is then row ``b * block * D / row_stride + n``, or ``fill`` past the last one. float64 on
    the CPU; None where that is not a whole row (the kernel would read rows across their ends)."""
    n, d = t.shape[2], t.shape[3]
    if (block * d) % row_stride:
        return None
    positions = torch.arange(n)
    source = positions // block * (block * d // row_stride) + positions % block
    padded = torch.cat([t.detach().double().cpu(), torch.full_like(t[:, :, :1], fill, dtype=torch.float64,
                                                                    device="cpu")], dim=2)
    return padded[:, :, torch.where(source < n, source, n)]
