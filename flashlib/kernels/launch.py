"""Launch Triton kernels with little host time: the autotuner's choice and the compiled binary, remembered.

At short sequences an attention call is bound by the host, not the GPU. On the H100 host
(2026-11-24, ``benchmarks/launch_host_time.py``; benchmarks/TUNING.md, sixth finding) launching the
forward kernel cost 200 us of Python, a no-op Triton kernel 16 us. Two layers of Triton's
launch path are repeated on every call although their answer rarely changes:

1. ``Autotuner.run`` rebuilds a dict of every argument and its key. :func:`launch_tuned`
   asks the autotuner once per key and then launches the plain JIT kernel with the
   config it chose (after the config's ``pre_hook``, which sets the block shapes of host
   tensor descriptors).
2. ``JITFunction.run`` binds and specializes every argument (about 40 here) to find the
   compiled binary. On a GPU, :func:`launch` and :func:`launch_tuned` remember the binary
   under a *signature* of the arguments that decides everything Triton specializes on:
   exact integer values (Triton specializes on ``== 1``, divisibility by 16 and the
   integer width), each tensor's dtype and 16-byte alignment, each host descriptor's
   dtype, alignment, shape, strides and block shape, the type of each float, and the
   constexpr and launch keywords. The same signature therefore always means the same
   binary, and a hit calls the binary's launcher directly. Integers beyond 32 bits (a batch
   stride of a large tensor; once the dropout seed, new on every call, now read from device
   memory) count by what Triton specializes them on (64-bit signed or unsigned, divisibility
   by 16), not by value, so they hit too.
3. On Triton 3.6 a hit skips the launcher's own Python wrapper as well, and the copy engine's
   tensor maps of host descriptors are encoded once per address and shape
   (:mod:`.direct_launch`).
4. The Gluon Hopper kernels take Gluon's host descriptors, which a signature counts by everything
   Triton specializes them on (dtype, tile, shared-memory layout) and by their padding, shape and
   strides besides; switched by :data:`GLUON_DESCRIPTORS`.

Anything else (an unknown argument type, the interpreter) takes Triton's own path.
"""
from __future__ import annotations

import functools
import inspect

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import runtime
from ._common import tensor_of
from .direct_launch import direct_launcher

try:  # Gluon's host descriptors, which the Gluon Hopper kernels take (Triton 3.5 and later)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
except ImportError:  # pragma: no cover - older Triton
    GluonDescriptor = None

#: (autotuner, key values..., dtypes...) -> the triton.Config it chose.
_CHOSEN: dict = {}

#: signature -> (compiled kernel, names and defaults of the parameters after the positional ones,
#: block shapes of host descriptors by position, the config's keywords, the direct launcher or None).
#: Bounded: cleared when full.
_COMPILED: dict = {}
_COMPILED_LIMIT = 4096

#: Whether launches go through the compiled-binary cache: on a GPU, never in the interpreter.
COMPILED_CACHE = not runtime.INTERPRET

#: Whether a remembered binary launches through :mod:`.direct_launch` where Triton's launcher allows it
#: (False: always through the binary's own ``run``; ``benchmarks/launch_host_time.py --direct-ab`` compares).
DIRECT_LAUNCH = True


#: Whether a launch with Gluon host descriptors (the Gluon Hopper kernels) goes through the cache; else through
#: ``JITFunction.run``, which binds every argument and has Triton 3.6's wrapper encode every descriptor again on each
#: call (8 for the dK/dV kernel, 5 for dQ). Timed on an H100 (head_dim 128, N = 1024, fp16 and bf16, session 67,
#: benchmarks/TUNING.md sixtieth finding): from the cache an eager backward where both Gluon kernels run takes
#: 0.75-0.84x the host time (96-187 µs a call less) and a Gluon forward 0.78-0.81x (32-49 µs less), with bitwise
#: the same results (``test_gpu_gluon_kernels_from_the_cache_give_triton_paths_bits``). False sends them back
#: through ``JITFunction.run``.
GLUON_DESCRIPTORS = True

#: The smallest integer Triton passes as 64-bit, and the smallest it passes as unsigned 64-bit.
INT32_END, UINT64_START = 2**31, 2**63


def _current_stream() -> tuple[int, int]:
    """(device index, raw CUDA stream) of the current device, as Triton's own launch asks for them."""
    driver = triton.runtime.driver.active
    device = driver.get_current_device()
    return device, driver.get_current_stream(device)


def _integer_key(a: int):
    """An integer as the signature counts it: by value within 32 bits (Triton specializes on
    ``== 1`` and divisibility by 16 there), else by what Triton specializes on: signed or unsigned
    64-bit, divisible by 16 or not. A 64-bit integer that changes from call to call thus keeps its binary."""
    if -INT32_END <= a < INT32_END:
        return a
    return ("u64" if a >= UINT64_START else "i64", a % 16 == 0)


def signature(fn, args, kwargs):
    """A hashable key that decides which binary Triton runs ``fn`` with, or None (unknown argument type)."""
    key = [fn]
    append = key.append  # the loop runs over ~45 arguments per launch: written for host time
    for a in args:
        kind = type(a)
        if kind is int:
            append(a if -INT32_END <= a < INT32_END else _integer_key(a))
        elif a is None or kind is bool:
            append(a)
        elif kind is float:
            append(float)
        elif kind is torch.Tensor or isinstance(a, torch.Tensor):
            append((a.dtype, a.data_ptr() % 16 == 0))
        elif kind is TensorDescriptor:
            base = a.base
            append((base.dtype, base.data_ptr() % 16 == 0, tuple(a.shape), tuple(a.strides), tuple(a.block_shape)))
        elif kind is GluonDescriptor and GLUON_DESCRIPTORS:
            append((kind, a.base.dtype, tuple(a.shape), tuple(a.strides), tuple(a.block_shape), a.layout, a.padding))
        else:
            return None
    key.extend(kwargs.items())
    return tuple(key)


def _remember(key, fn, compiled, n_positional, config_kwargs, args, kwargs) -> None:
    """Store a compiled binary for ``key`` with what a direct launch needs to rebuild its argument list.

    The keywords (constexprs and launch options) are part of ``key``, so the arguments after the
    positional ones are the same for every launch under it: they are resolved once, here.
    """
    if key is None or compiled is None or not hasattr(compiled, "run"):
        return
    named = {**kwargs, **(config_kwargs or {})}
    tail = []
    for param in _parameters(fn.fn)[n_positional:]:
        if param.name not in named and param.default is inspect.Parameter.empty:
            return  # a parameter this call did not give: leave it to Triton's own path
        tail.append(named.get(param.name, param.default))
    shapes = tuple((i, list(a.block_shape)) for i, a in enumerate(args) if type(a) is TensorDescriptor)
    if len(_COMPILED) >= _COMPILED_LIMIT:
        _COMPILED.clear()
    _COMPILED[key] = (compiled, tuple(tail), shapes, named, direct_launcher(compiled))


@functools.lru_cache(maxsize=None)
def _parameters(function) -> list:
    """The parameters of a kernel's Python function, in order (asked once per kernel)."""
    return list(inspect.signature(function).parameters.values())


def _launch_compiled(entry, grid, args, stream) -> None:
    """Run a remembered binary: the arguments in the kernel's order, as ``JITFunction.run`` passes them."""
    compiled, tail, shapes, named, direct = entry
    for i, shape in shapes:  # fresh host descriptors carry placeholder block shapes
        args[i].block_shape = shape
    ordered = (*args, *tail)
    if callable(grid):
        grid = grid(named)
    grid_x, grid_y, grid_z = (*grid, 1, 1)[:3]
    hooks = triton.knobs.runtime
    enter_hook = hooks.launch_enter_hook
    if direct is not None and DIRECT_LAUNCH:  # Triton 3.6: launch metadata is None unless a hook is set
        metadata = None if enter_hook is None else compiled.launch_metadata(grid, stream, *ordered)
        direct(grid_x, grid_y, grid_z, stream, metadata, enter_hook, hooks.launch_exit_hook, ordered)
        return
    compiled.run(grid_x, grid_y, grid_z, stream, compiled.function, compiled.packed_metadata,
                 compiled.launch_metadata(grid, stream, *ordered), enter_hook, hooks.launch_exit_hook, *ordered)


def _launch_remembered(fn, grid, args, kwargs):
    """Launch the binary remembered for this call, if any: (whether it launched, the call's cache key)."""
    if not COMPILED_CACHE:
        return False, None
    key = signature(fn, args, kwargs)
    if key is None:
        return False, None
    device, stream = _current_stream()
    key = (device, key)
    entry = _COMPILED.get(key)
    if entry is not None:
        _launch_compiled(entry, grid, args, stream)
    return entry is not None, key


def forget() -> None:
    """Forget every chosen config and remembered binary, and the autotuners' own choices: for
    benchmarks that change an autotuner's configs or a launcher's switch between two runs."""
    for choice in _CHOSEN:
        choice[0].cache.clear()
    _CHOSEN.clear()
    _COMPILED.clear()


def launch(fn, grid, *args, **kwargs) -> None:
    """``fn[grid](*args, **kwargs)`` for a ``triton.jit`` function, from the compiled-binary cache on a GPU."""
    launched, key = _launch_remembered(fn, grid, args, kwargs)
    if launched:
        return
    compiled = fn[grid](*args, **kwargs)
    _remember(key, fn, compiled, len(args), None, args, kwargs)


def launch_tuned(autotuned, grid, *args, **kwargs) -> None:
    """``autotuned[grid](*args, **kwargs)``, skipping the autotuner once it has chosen for this key.

    The key is the autotuner's own: its ``key`` arguments plus the dtypes of the tensor
    arguments (a host tensor descriptor counts with its tensor's dtype), so a config is never
    reused where the autotuner would have tuned again. On a GPU the binary of the chosen config
    is remembered too (see :func:`signature`).
    """
    launched, key = _launch_remembered(autotuned, grid, args, kwargs)
    if launched:
        return
    named = kwargs if all(name in kwargs for name in autotuned.keys) else dict(zip(autotuned.arg_names, args),
                                                                                   **kwargs)
    choice = (autotuned, *(named[name] for name in autotuned.keys),
              *(str(t.dtype) for t in map(tensor_of, args) if hasattr(t, "dtype")))
    config = _CHOSEN.get(choice)
    if config is None:
        autotuned[grid](*args, **kwargs)
        _CHOSEN[choice] = autotuned.best_config
        return
    if config.pre_hook is not None:  # e.g. block shapes of host tensor descriptors
        config.pre_hook({**dict(zip(autotuned.arg_names, args)), **kwargs, **config.kwargs})
    compiled = autotuned.fn[grid](*args, **kwargs, **config.all_kwargs())
    _remember(key, autotuned.fn, compiled, len(args), config.all_kwargs(), args, kwargs)
