"""Shared pytest set-up: GPU-only tests are skipped (with the reason) on the interpreter."""
import os

import pytest
import torch

from flashlib import runtime


def worker_threads(cpus: int | None, workers: int) -> int:
    """torch's CPU threads for one of ``workers`` pytest-xdist processes: an even share of the cores.

    Each worker would otherwise start one thread per core for its float64 CPU references, so 16
    workers on 16 cores ran 256 threads that fought each other and the Triton compilers
    (`make test-gpu` hit the device call's 575 s limit)."""
    return max(1, (cpus or 1) // max(1, workers))


if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(worker_threads(os.cpu_count(), int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))


def pytest_collection_modifyitems(config, items):
    if not runtime.INTERPRET:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; kernels run in Triton's interpreter here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def release_gpu_cache(keywords) -> bool:
    """After a test marked ``gpu``, hand the blocks torch's caching allocator keeps back to the driver; whether it did.

    `make test-gpu` runs 16 pytest-xdist workers on one card, and each worker's allocator kept its largest
    test's blocks for the rest of the run: together they filled the H100, and two tests beside them failed with
    "out of memory", which passed alone (benchmarks/TUNING.md, fifty-ninth finding)."""
    if "gpu" not in keywords or not torch.cuda.is_available():
        return False
    torch.cuda.empty_cache()
    return True


@pytest.fixture(autouse=True)
def release_cached_gpu_memory(request):
    """:func:`release_gpu_cache` after every test."""
    yield
    release_gpu_cache(request.keywords)


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
    """With FLASHLIB_TEST_TIMES=FILE, append each test's duration as it ends, and a failure's last 20
    lines of report under it (a log that survives a kill)."""
    path = os.environ.get("FLASHLIB_TEST_TIMES")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the controller writes the line once, for every worker
        return
    if path and (report.when == "call" or report.outcome != "passed"):
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(f"{report.duration:8.2f} {report.outcome:7} {report.nodeid}\n")
            if report.failed:  # the reason too: a run cut by its time limit never prints its summary
                reason = report.longreprtext.strip().splitlines()[-20:]
                handle.write("".join(f"    | {line}\n" for line in reason))
