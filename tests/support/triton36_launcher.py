"""A model of Triton 3.6's CUDA launcher, for testing :mod:`flashlib.kernels.direct_launch` on a CPU.

Written from the behaviour of ``triton/backends/nvidia/driver.py`` in Triton 3.6.0 (read on
the GPU machine, 2026-11-24): ``CudaLauncher.__call__`` adds the cooperative and PDL flags and
the two scratch buffers after (grid, stream, function), then a wrapper named ``inner``, whose
closure holds the C launcher, the descriptor positions and their metadata, replaces each host
tensor descriptor with (tensor map, *shape, *strides) and calls the C launcher with everything
flat. The C launcher and the driver's encoding are recorders here.
"""
from __future__ import annotations

from types import SimpleNamespace

_BASE_ARGS_FORMAT = "iiiKKppOOOOOO"
TMA_DTYPE_DEVICE_TO_HOST = {i: i for i in range(16)} | {8: 10, 9: 8, 10: 9}

#: Every call of the fake driver encoding, and every call of the fake C launcher.
ENCODED: list = []
LAUNCHED: list = []


def fill_tma_descriptor(address, swizzle, elem_size, elem_type, block, shape, strides, padding):
    """The driver's encoding: here a tuple of what it was given (equal inputs, equal maps)."""
    ENCODED.append(address)
    return ("map", address, swizzle, elem_size, elem_type, tuple(block), tuple(shape), tuple(strides), padding)


def make_tensordesc_arg(arg, metadata):
    padding = 1 if arg.padding == "nan" else 0
    tensor_map = fill_tma_descriptor(arg.base.data_ptr(), metadata["swizzle"], metadata["elem_size"],
                                     TMA_DTYPE_DEVICE_TO_HOST[metadata["elem_type"]], metadata["block_size"],
                                     arg.shape, arg.strides, padding)
    return [tensor_map, *arg.shape, *arg.strides]


def c_launcher(*args):
    LAUNCHED.append(args)


def wrap(launcher, kinds, metas):
    """The 3.6 wrapper over a signature whose argument kinds are ``kinds`` ("tensordesc" or anything else)."""
    tensordesc_indices = {i for i, kind in enumerate(kinds) if kind == "tensordesc"}
    tensordesc_meta = list(metas)

    def inner(*args):
        base = len(_BASE_ARGS_FORMAT)
        final_args = list(args[:base])
        seen = 0
        for i, arg in enumerate(args[base:]):
            if i in tensordesc_indices:
                final_args.extend(make_tensordesc_arg(arg, tensordesc_meta[seen]))
                seen += 1
            else:
                final_args.append(arg)
        return launcher(*final_args)

    return inner


class CudaLauncher:
    def __init__(self, kinds, metas, global_scratch_size=0, profile_scratch_size=0):
        self.launch = wrap(c_launcher, kinds, metas)
        self.global_scratch_size, self.profile_scratch_size = global_scratch_size, profile_scratch_size
        self.launch_cooperative_grid, self.launch_pdl = False, True

    def __call__(self, grid_x, grid_y, grid_z, stream, function, *args):
        assert not (self.global_scratch_size or self.profile_scratch_size), "scratch is not modelled"
        self.launch(grid_x, grid_y, grid_z, stream, function, self.launch_cooperative_grid, self.launch_pdl,
                    None, None, *args)


def compiled_kernel(kinds, metas, **scratch):
    """What a direct launch reads of a CompiledKernel: run, function, packed_metadata."""
    return SimpleNamespace(run=CudaLauncher(kinds, metas, **scratch), function=0xF00, packed_metadata=("packed",))
