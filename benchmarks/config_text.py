"""Kernel configs as the benchmark scripts' command lines write them: ``BLOCK_MxBLOCK_N[/stages[/warps]]``
(``sass_counts.py --configs``, ``autotune_spread.py --extra-configs``)."""
from __future__ import annotations

import re

FORM = "BLOCK_MxBLOCK_N[/stages[/warps]] such as 64x64/3/8"


def parse_config(text: str) -> tuple:
    """(BLOCK_M, BLOCK_N, stages or None, warps or None) of ``text``; ValueError naming the form otherwise."""
    match = re.fullmatch(r"(\d+)x(\d+)(?:/(\d+)(?:/(\d+))?)?", text.strip())
    if not match:
        raise ValueError(f"expected {FORM}; got {text!r}")
    return tuple(None if g is None else int(g) for g in match.groups())
