"""make demo runs every finished kernel and reports agreement with the reference."""
from flashlib.demo import run_demo


def test_demo_runs_and_every_kernel_agrees(capsys):
    assert run_demo()
    out = capsys.readouterr().out
    assert out.count("[ok ]") >= 7 and "FAIL" not in out
    assert "flash_attention causal" in out
    assert "All kernels agree" in out
