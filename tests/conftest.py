"""Shared pytest set-up: GPU-only tests are skipped (with the reason) on the interpreter, and run
longest first on a GPU."""
import os
from pathlib import Path

import pytest
import torch

from flashlib import runtime

#: Seconds each GPU test took in the last full run on the H100 (the FLASHLIB_TEST_TIMES log of
#: ``make test-gpu``, copied here): the order the GPU suite starts its tests in.
GPU_DURATIONS = Path(__file__).with_name("gpu_durations.txt")


def read_durations(path: Path) -> dict[str, float]:
    """{test id: seconds} from a FLASHLIB_TEST_TIMES log ("seconds outcome id" per line; the last line
    of an id wins). A missing file gives {}."""
    durations = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            fields = line.split(maxsplit=2)
            if len(fields) == 3:
                durations[fields[2]] = float(fields[0])
    return durations


def longest_first(items, durations: dict[str, float]):
    """The items, longest known duration first; tests with no record (new ones) come before all.

    With ``--dist load`` pytest-xdist deals the first tests round robin, so each worker starts on
    one of the long ones and the short ones fill in behind: the suite ends near its total time
    divided by the workers instead of waiting on a long test that started last."""
    return sorted(items, key=lambda item: -durations.get(item.nodeid, float("inf")))


def pytest_collection_modifyitems(config, items):
    if not runtime.INTERPRET:
        items[:] = longest_first(items, read_durations(GPU_DURATIONS))
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; kernels run in Triton's interpreter here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def nan_empty(monkeypatch):
    """torch.empty and torch.empty_like return NaN-filled float tensors: an output or gradient
    element never written stays NaN (the kernels' outputs are made with them)."""
    calls = []

    def nan_filled(real):
        def empty(*args, **kwargs):
            t = real(*args, **kwargs)
            calls.append(t)
            return t.fill_(float("nan")) if t.is_floating_point() else t
        return empty

    monkeypatch.setattr(torch, "empty", nan_filled(torch.empty))
    monkeypatch.setattr(torch, "empty_like", nan_filled(torch.empty_like))
    return calls


def pytest_runtest_logreport(report):
    """With FLASHLIB_TEST_TIMES=FILE, append each test's duration as it ends (a log that survives a kill)."""
    path = os.environ.get("FLASHLIB_TEST_TIMES")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the controller writes the line once, for every worker
        return
    if path and (report.when == "call" or report.outcome != "passed"):
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(f"{report.duration:8.2f} {report.outcome:7} {report.nodeid}\n")
