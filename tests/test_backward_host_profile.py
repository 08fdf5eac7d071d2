"""benchmarks/backward_host_profile.py on the CPU: it refuses the interpreter with the reason, and prints a
profile's functions in the order asked for."""
import cProfile
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import backward_host_profile  # noqa: E402

from flashlib import runtime  # noqa: E402


@pytest.mark.skipif(not runtime.INTERPRET, reason="the refusal is the interpreter's")
def test_the_profile_refuses_the_interpreter(capsys):
    with pytest.raises(SystemExit):
        backward_host_profile.main(["--dtype", "fp16"])
    assert "needs a CUDA GPU" in capsys.readouterr().err


def _slow():
    return sum(i * i for i in range(20000))


def _fast():
    return 1


def test_the_stats_name_the_functions_by_their_own_time():
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(5):
        _slow()
        _fast()
    profile.disable()
    text = backward_host_profile.stats_text(profile, "tottime", 3)
    assert "_slow" in text and "Ordered by: internal time" in text
    assert "Ordered by: cumulative time" in backward_host_profile.stats_text(profile, "cumulative", 3)
