"""benchmarks/launch_host_time.py's interleaved timing, on the CPU with the clock replaced: what it reports needs a
GPU, but the order it visits the routes in and the medians it prints do not."""
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import launch_host_time  # noqa: E402


def test_each_round_visits_every_route_once_in_a_rotated_order_and_medians_are_printed(monkeypatch, capsys):
    visits = []
    costs = {"a": iter([5.0, 1.0, 3.0]), "b": iter([10.0, 30.0, 20.0]), "c": iter([7.0, 7.0, 9.0])}

    def fake_host_us(fn, calls):
        name = fn()
        visits.append(name)
        return next(costs[name])
    monkeypatch.setattr(launch_host_time, "host_us", fake_host_us)
    launch_host_time.interleaved({name: (lambda name=name: name) for name in "abc"}, rounds=3)
    assert visits == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines["a"][1:] == ["3.0", "(1.0-5.0)"]
    assert lines["b"][1:] == ["20.0", "(10.0-30.0)"]
    assert lines["c"][1:] == ["7.0", "(7.0-9.0)"]
