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
   binary, and a hit calls the binary's launcher directly.

Anything else (an unknown argument type, the interpreter) takes Triton's own path.
"""
from __future__ import annotations

import inspect

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import runtime
from ._common import tensor_of

#: (autotuner, key values..., dtypes...) -> the triton.Config it chose.
_CHOSEN: dict = {}

#: signature -> (compiled kernel, names and defaults of the parameters after the positional ones,
#: block shapes of host descriptors by position, the config's keywords). Bounded: cleared when full.
_COMPILED: dict = {}
_COMPILED_LIMIT = 4096

#: Whether launches go through the compiled-binary cache: on a GPU, never in the interpreter.
COMPILED_CACHE = not runtime.INTERPRET


def _current_stream() -> tuple[int, int]:
    """(device index, raw CUDA stream) of the current device, as Triton's own launch asks for them."""
    driver = triton.runtime.driver.active
    device = driver.get_current_device()
    return device, driver.get_current_stream(device)


def signature(fn, args, kwargs):
    """A hashable key that decides which binary Triton runs ``fn`` with, or None (unknown argument type)."""
    key = [fn]
    for a in args:
        kind = type(a)
        if a is None or kind is int or kind is bool:
            key.append(a)
        elif kind is float:
            key.append(float)
        elif isinstance(a, torch.Tensor):
            key.append((a.dtype, a.data_ptr() % 16 == 0))
        elif kind is TensorDescriptor:
            base = a.base
            key.append((base.dtype, base.data_ptr() % 16 == 0, tuple(a.shape), tuple(a.strides),
                        tuple(a.block_shape)))
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
    for param in list(inspect.signature(fn.fn).parameters.values())[n_positional:]:
        if param.name not in named and param.default is inspect.Parameter.empty:
            return  # a parameter this call did not give: leave it to Triton's own path
        tail.append(named.get(param.name, param.default))
    shapes = tuple((i, list(a.block_shape)) for i, a in enumerate(args) if type(a) is TensorDescriptor)
    if len(_COMPILED) >= _COMPILED_LIMIT:
        _COMPILED.clear()
    _COMPILED[key] = (compiled, tuple(tail), shapes, named)


def _launch_compiled(entry, grid, args) -> None:
    """Run a remembered binary: the arguments in the kernel's order, as ``JITFunction.run`` passes them."""
    compiled, tail, shapes, named = entry
    for i, shape in shapes:  # fresh host descriptors carry placeholder block shapes
        args[i].block_shape = shape
    ordered = (*args, *tail)
    if callable(grid):
        grid = grid(named)
    grid_x, grid_y, grid_z = (*grid, 1, 1)[:3]
    _, stream = _current_stream()
    hooks = triton.knobs.runtime
    compiled.run(grid_x, grid_y, grid_z, stream, compiled.function, compiled.packed_metadata,
                 compiled.launch_metadata(grid, stream, *ordered), hooks.launch_enter_hook, hooks.launch_exit_hook,
                 *ordered)


def _launch_remembered(fn, grid, args, kwargs):
    """Launch the binary remembered for this call, if any: (whether it launched, the call's cache key)."""
    if not COMPILED_CACHE:
        return False, None
    key = signature(fn, args, kwargs)
    if key is None:
        return False, None
    key = (_current_stream()[0], key)
    entry = _COMPILED.get(key)
    if entry is not None:
        _launch_compiled(entry, grid, args)
    return entry is not None, key


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
