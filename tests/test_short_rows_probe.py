"""benchmarks/short_rows_probe.py on the CPU: it refuses the interpreter with the reason, and its measurement with
the Gluon kernels launched from the compiled-binary cache switches the cache on only while it measures."""
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


def test_the_cached_measurement_switches_the_gluon_cache_on_only_while_it_measures(monkeypatch):
    seen = []
    monkeypatch.setattr(short_rows_probe, "host_us_per_call",
                        lambda call, calls: seen.append((launch_module.GLUON_DESCRIPTORS, calls)) or 12.5)
    assert launch_module.GLUON_DESCRIPTORS is False
    assert short_rows_probe.host_us_gluon_cached(lambda: None, 7) == 12.5
    assert seen == [(True, 7)] and launch_module.GLUON_DESCRIPTORS is False

    def fails(call, calls):
        raise RuntimeError("a launch failed")
    monkeypatch.setattr(short_rows_probe, "host_us_per_call", fails)
    with pytest.raises(RuntimeError):
        short_rows_probe.host_us_gluon_cached(lambda: None, 7)
    assert launch_module.GLUON_DESCRIPTORS is False, "put back after a failure too"
