"""Host integer arithmetic shared by the launchers, the mask and tile geometry, and the IO model.

Plain Python on ints, on purpose: ``triton.cdiv`` and ``triton.next_power_of_2`` compute the
same, but Triton 3.6 makes them constexpr functions that unwrap their arguments on every
host call, several microseconds a kernel launch on the H100 host (benchmarks/TUNING.md,
fourteenth finding).
"""
from __future__ import annotations


def ceil_div(a: int, b: int) -> int:
    """ceil(a / b) for integers, b > 0."""
    return -(-a // b)


def power_of_two_at_least(n: int) -> int:
    """The smallest power of two >= n (0 for n <= 0), as ``triton.next_power_of_2`` gives it."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
