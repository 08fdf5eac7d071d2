"""benchmarks/sass_counts.py run from the tests: kernels compiled for the H100 (sm_90a) on a machine without a GPU.

The script compiles real kernels, which needs a process that is not in Triton's interpreter: it runs in a subprocess
with TRITON_INTERPRET=0, from the repository's root.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SASS_COUNTS = Path(__file__).resolve().parents[2] / "benchmarks" / "sass_counts.py"


def run_sass_counts(*args: str) -> subprocess.CompletedProcess:
    """The script with ``args``, in a process that compiles for the GPU."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    return subprocess.run([sys.executable, str(SASS_COUNTS), *args], capture_output=True, text=True, env=env,
                          timeout=600, cwd=SASS_COUNTS.parents[1])


def compiled_variants(stdout: str, kernel: str) -> list[tuple[str, int, dict[str, int]]]:
    """(header line, spill instructions among the products, {opcode: count}) of every variant of ``kernel`` the
    script printed (``sass_counts.spills_among_products``: the spills of the loops that issue the tensor cores'
    products, not the few scalars ptxas hands to a warp-specialized kernel's partitions through the stack)."""
    lines = stdout.splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.startswith(f"{kernel} D="):
            among_products = int(re.search(r"(\d+) among the products", line)[1])
            opcodes = dict((op, int(n)) for op, n in re.findall(r"([A-Z][A-Z0-9_]*) (\d+)", lines[i + 1]))
            found.append((line, among_products, opcodes))
    return found


def block_loops(stdout: str, kernel: str) -> list[list[tuple[int, int, int, int]]]:
    """For every variant of ``kernel`` the script printed, its ``sass_counts.key_block_loops``: (instructions,
    products, STL, LDL) of each innermost loop that issues products."""
    lines = stdout.splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.startswith(f"{kernel} D="):
            listing = next(text for text in lines[i + 1:] if text.strip().startswith("block loops:"))
            found.append([tuple(map(int, loop)) for loop in re.findall(
                r"(\d+) instructions, (\d+) products, (\d+) STL, (\d+) LDL", listing)])
    return found


def first_operands(stdout: str) -> list[tuple[int, int]]:
    """For every variant the script printed, how many warpgroup products read their first operand from registers
    and how many from shared memory (``sass_counts.product_first_operands``)."""
    return [tuple(map(int, re.findall(r"(\d+) from", line))) for line in stdout.splitlines()
            if line.strip().startswith("first operand:")]


def last_product_windows(stdout: str) -> list[list[int]]:
    """For every variant the script printed, the instructions beside each block loop's last products
    (``sass_counts.last_product_windows``: issued between those products and the wait for them)."""
    return [list(map(int, re.findall(r"\d+", line.split(":", 1)[1]))) for line in stdout.splitlines()
            if line.strip().startswith("beside each loop's last products:")]
