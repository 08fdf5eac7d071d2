"""detect_gpu describes the device, or the interpreter, and prints it."""
import pytest
import torch

from flashlib import gpu, runtime


@pytest.mark.parametrize("capability, family", [
    ((7, 0), "Volta"), ((7, 5), "Turing"), ((8, 0), "Ampere"), ((8, 6), "Ampere"),
    ((8, 9), "Ada"), ((9, 0), "Hopper"), ((10, 0), "Blackwell"), ((12, 0), "Blackwell"),
])
def test_architecture_family(capability, family):
    assert gpu.architecture_family(capability) == family


def test_pre_volta_is_named_unsupported():
    assert "unsupported" in gpu.architecture_family((6, 1))


def test_detect_gpu_matches_the_mode():
    info = gpu.detect_gpu()
    assert info.is_gpu == (not runtime.INTERPRET)
    assert info.torch_version == torch.__version__
    assert info.triton_version
    if runtime.INTERPRET:
        assert info.mode == "interpreter" and "interpreter" in info.name
        assert not info.supports_tma


def test_print_gpu_info(capsys):
    gpu.print_gpu_info()
    out = capsys.readouterr().out
    assert "torch" in out and "triton" in out and "mode" in out


def test_print_gpu_info_for_a_hopper_description(capsys):
    hopper = gpu.GPUInfo(is_gpu=True, name="NVIDIA H100 80GB HBM3", mode="cuda", compute_capability=(9, 0),
                         architecture="Hopper", sm_count=132, memory_gb=79.1, supports_bf16=True,
                         supports_fp8=True, supports_tma=True, supports_wgmma=True, triton_version="3.6.0")
    gpu.print_gpu_info(hopper)
    out = capsys.readouterr().out
    assert "9.0 (Hopper)" in out and "132" in out and "TMA" in out


@pytest.mark.gpu
def test_detect_real_gpu():
    info = gpu.detect_gpu()
    assert info.is_gpu and info.sm_count > 0 and info.memory_gb > 0
    assert info.compute_capability == torch.cuda.get_device_capability()
