"""Which torch build ``make install`` fetches, and from where; runs before torch exists, so no imports of it.

    python tools/torch_choice.py TORCH TORCH_INDEX   ->  prints the pip arguments, one per line

``TORCH`` is what pip installs (``torch``, ``torch==2.13.0``, a wheel file). ``TORCH_INDEX``:

* ``auto`` (the default): a machine without an NVIDIA driver gets PyTorch's CPU-only wheel
  index (about 200 MB instead of several GB of CUDA libraries); one with a driver gets pip's
  default (the CUDA build);
* ``default``: pip's own configuration (its index, or a local wheel it was set up with);
* a URL: that index.
"""
from __future__ import annotations

import os
import shutil
import sys

CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def has_nvidia_gpu() -> bool:
    """An NVIDIA driver is loaded (or its tool is installed): the default CUDA build is the right one."""
    return os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is not None


def index_for(torch_index: str, nvidia: bool) -> str | None:
    """The index URL to use, or None for pip's own configuration."""
    if torch_index == "auto":
        return None if nvidia else CPU_INDEX
    if torch_index == "default":
        return None
    if not torch_index.startswith(("http://", "https://", "file://")):
        raise ValueError(f"TORCH_INDEX: expected auto, default or an index URL, got {torch_index!r}")
    return torch_index


def pip_args(torch: str, torch_index: str, nvidia: bool, constraints: str = "constraints.txt") -> list[str]:
    """The arguments after ``pip install`` for torch."""
    args = [torch, "-c", constraints]
    url = index_for(torch_index, nvidia)
    if url is not None:
        args += ["--index-url", url]
    return args


def describe(torch: str, torch_index: str, nvidia: bool) -> str:
    url = index_for(torch_index, nvidia)
    if url == CPU_INDEX:
        return f"installing {torch}: CPU-only build from {CPU_INDEX} (about 200 MB; no NVIDIA GPU found)"
    if url is None and torch_index == "auto":
        return f"installing {torch}: default build with CUDA (several GB; NVIDIA GPU found)"
    return f"installing {torch} from {url or 'pip configuration'}"


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python tools/torch_choice.py TORCH TORCH_INDEX")
    torch_spec, index = sys.argv[1], sys.argv[2]
    try:
        nvidia = has_nvidia_gpu()
        print(describe(torch_spec, index, nvidia), file=sys.stderr)
        print("\n".join(pip_args(torch_spec, index, nvidia)))
    except ValueError as error:
        sys.exit(f"error: {error}")
