"""Execute notebooks in place, as their stored outputs should be (the CPU interpreter run nbval compares).

    python tools/run_notebooks.py notebooks/*.ipynb solutions/*.ipynb

Each notebook runs top to bottom in a fresh kernel from its own folder; no timing
metadata is recorded, so a re-run changes only what the cells print.
"""
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def run(path: Path) -> float:
    nb = nbformat.read(path, as_version=4)
    started = time.monotonic()
    NotebookClient(nb, timeout=900, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)
    return time.monotonic() - started


if __name__ == "__main__":
    for name in sys.argv[1:]:
        print(f"{name}: {run(Path(name)):.0f} s", flush=True)
