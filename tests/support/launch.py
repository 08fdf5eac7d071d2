"""A stand-in for a compiled kernel, so that a test on the CPU can check what a launcher passes to a GPU-only kernel
(a Gluon kernel for Hopper) without running it."""
from __future__ import annotations


class RecordedLaunch:
    """Stands for ``kernel``: ``kernel[grid](*args, **kwargs)`` records ``(grid, arguments by name)`` in
    :attr:`calls` instead of running it, positional arguments named by the kernel's own ``arg_names``."""

    def __init__(self, kernel):
        self.arg_names, self.calls = kernel.arg_names, []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((grid, dict(zip(self.arg_names, args)) | kwargs))
