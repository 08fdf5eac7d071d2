"""Call a compiled kernel's C launcher directly, with the copy engine's tensor maps remembered (Triton 3.6).

A compiled Triton 3.6 kernel launches through three layers of Python on every call:
``CudaLauncher.__call__`` (scratch buffers), then a wrapper that walks every argument (about
45 for the attention forward) to replace each host tensor descriptor with what the C
launcher takes, a ``CUtensorMap`` followed by the shape and strides, and encodes each map in
the driver (``fill_tma_descriptor``) again, although nothing in it changed since the last
call. On the H100 host that walk and the four encodings cost about half of the forward's
launch (benchmarks/TUNING.md, fourteenth finding).

:func:`direct_launcher` returns a function that does the same job with less:

* the arguments between descriptors are copied as slices, not one by one;
* a tensor map is encoded once per (argument position, address, shape, strides): the map
  depends on nothing else (the element type, tile and swizzle are the binary's), so a
  remembered one is the map the driver would encode again;
* launch hooks and scratch are resolved once, and a binary that needs scratch memory
  (descriptors made inside the kernel), or has no host descriptor (where the wrapper is
  absent and a direct launch saves nothing measurable), is left to Triton.

It reads the structure of Triton 3.6's CUDA launcher (the wrapper's closure and the base
argument format) and returns None wherever that structure is not found, so any other Triton
version launches through Triton's own path. Tests compare what reaches the C launcher
through both paths (CPU, with a model of 3.6's wrapper) and the kernels' bits (GPU).
"""
from __future__ import annotations

import inspect
import sys
import types

import triton

#: Triton 3.6's format of the C launcher's leading arguments: grid (3), stream, function,
#: cooperative, PDL, global scratch, profile scratch, packed metadata, launch metadata, two hooks.
BASE_ARGS_FORMAT = "iiiKKppOOOOOO"

#: Tensor maps remembered per binary (by address, shape and strides); cleared when full.
TENSOR_MAPS_LIMIT = 256


def fill_tensor_map(*args):
    """The driver's encoding of a tensor map (``fill_tma_descriptor`` of Triton 3.6's CUDA utils)."""
    return triton.runtime.driver.active.utils.fill_tma_descriptor(*args)


def _wrapper_parts(wrapper):
    """(C launcher, descriptor positions, descriptor metadata) of Triton 3.6's descriptor wrapper, or None.

    A binary without host descriptors has no wrapper (Triton calls the C launcher itself): None,
    as a direct launch saves nothing measurable there (TUNING.md, fourteenth finding).
    """
    if not isinstance(wrapper, types.FunctionType) or wrapper.__name__ != "inner":
        return None
    closure = inspect.getclosurevars(wrapper).nonlocals
    if set(closure) != {"launcher", "tensordesc_indices", "tensordesc_meta"}:
        return None
    metas = list(closure["tensordesc_meta"])
    if any(not isinstance(m, dict) or m.get("fp4_padded") for m in metas):
        return None  # descriptors left to the frontend, or fp4 padding: Triton's path
    return closure["launcher"], tuple(sorted(closure["tensordesc_indices"])), tuple(metas)


def direct_launcher(compiled):
    """``launch(grid_x, grid_y, grid_z, stream, launch_metadata, enter_hook, exit_hook, args)`` for a compiled
    kernel with host descriptors, equivalent to ``compiled.run(...)``; None for any other binary and
    wherever this is not Triton 3.6's CUDA launcher.

    ``args`` are the kernel's arguments in parameter order, constexprs included, as
    ``JITFunction.run`` passes them.
    """
    run = getattr(compiled, "run", None)
    if type(run).__name__ != "CudaLauncher":
        return None
    driver = sys.modules.get(type(run).__module__)
    if getattr(driver, "_BASE_ARGS_FORMAT", None) != BASE_ARGS_FORMAT:
        return None
    make_arg = getattr(driver, "make_tensordesc_arg", None)
    if make_arg is None or len(inspect.signature(make_arg).parameters) != 2:
        return None
    if run.global_scratch_size or run.profile_scratch_size:
        return None  # Triton allocates these per launch
    parts = _wrapper_parts(run.launch)
    if parts is None:
        return None
    c_launch, positions, metas = parts
    to_host = driver.TMA_DTYPE_DEVICE_TO_HOST
    encodings = [(m["swizzle"], m["elem_size"], to_host[m["elem_type"]], list(m["block_size"])) for m in metas]
    cooperative, pdl = run.launch_cooperative_grid, run.launch_pdl
    function, packed = compiled.function, compiled.packed_metadata
    maps: dict = {}

    def launch(grid_x, grid_y, grid_z, stream, launch_metadata, enter_hook, exit_hook, args):
        final = [grid_x, grid_y, grid_z, stream, function, cooperative, pdl, None, None,  # no scratch buffers
                 packed, launch_metadata, enter_hook, exit_hook]
        start = 0
        for position, (swizzle, elem_size, elem_type, block) in zip(positions, encodings):
            final.extend(args[start:position])
            descriptor = args[position]
            shape, strides = descriptor.shape, descriptor.strides
            padding = 1 if descriptor.padding == "nan" else 0
            address = descriptor.base.data_ptr()
            key = (position, address, padding, *shape, *strides)
            tensor_map = maps.get(key)
            if tensor_map is None:
                if strides[-1] != 1:
                    raise ValueError(f"a tensor descriptor's last stride must be 1, got strides {list(strides)}")
                tensor_map = fill_tensor_map(address, swizzle, elem_size, elem_type, block, shape, strides, padding)
                if len(maps) >= TENSOR_MAPS_LIMIT:
                    maps.clear()
                maps[key] = tensor_map
            final.append(tensor_map)
            final.extend(shape)
            final.extend(strides)
            start = position + 1
        final.extend(args[start:])
        c_launch(*final)

    return launch
