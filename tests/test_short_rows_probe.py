"""benchmarks/short_rows_probe.py on the CPU: it refuses the interpreter with the reason, and its measurement with
the Gluon kernels launched through JITFunction.run and from the compiled-binary cache sets the switch only while it
measures."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import short_rows_probe  # noqa: E402

from flashlib import runtime  # noqa: E402
from flashlib.kernels import launch as launch_module  # noqa: E402


@pytest.mark.skipif(not runtime.INTERPRET, reason="the refusal is the interpreter's")
def test_the_probe_refuses_the_interpreter(capsys):
    with pytest.raises(SystemExit):
        short_rows_probe.main(["--dtype", "fp16"])
    assert "needs a CUDA GPU" in capsys.readouterr().err


@pytest.mark.parametrize("cached", [True, False])
def test_the_gluon_measurements_set_the_switch_only_while_they_measure(monkeypatch, cached):
    """Each of the two measurements runs with the Gluon launches as it names them, whatever the default, and puts
    the switch back, after a failure too."""
    seen = []
    monkeypatch.setattr(short_rows_probe, "host_us_per_call",
                        lambda call, calls: seen.append((launch_module.GLUON_DESCRIPTORS, calls)) or 12.5)
    for start in (True, False):
        monkeypatch.setattr(launch_module, "GLUON_DESCRIPTORS", start)
        assert short_rows_probe.host_us_gluon(lambda: None, 7, cached=cached) == 12.5
        assert seen.pop() == (cached, 7) and launch_module.GLUON_DESCRIPTORS is start

    def fails(call, calls):
        raise RuntimeError("a launch failed")
    monkeypatch.setattr(short_rows_probe, "host_us_per_call", fails)
    monkeypatch.setattr(launch_module, "GLUON_DESCRIPTORS", not cached)
    with pytest.raises(RuntimeError):
        short_rows_probe.host_us_gluon(lambda: None, 7, cached=cached)
    assert launch_module.GLUON_DESCRIPTORS is (not cached), "put back after a failure too"
