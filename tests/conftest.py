"""Shared pytest set-up: GPU-only tests are skipped (with the reason) on the interpreter."""
import pytest
import torch

from flashlib import runtime


def pytest_collection_modifyitems(config, items):
    if not runtime.INTERPRET:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU; kernels run in Triton's interpreter here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture
def nan_empty(monkeypatch):
    """torch.empty returns NaN-filled float tensors: an output or gradient element never
    written stays NaN (the kernels' outputs are made with torch.empty)."""
    real_empty, calls = torch.empty, []

    def empty(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        calls.append(t)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", empty)
    return calls
