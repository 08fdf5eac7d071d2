"""The GPU suite's start order (conftest.longest_first) and the durations file it reads."""
import re
from pathlib import Path
from types import SimpleNamespace

from conftest import GPU_DURATIONS, longest_first, read_durations


def test_longest_first_puts_unrecorded_tests_first_then_the_longest(tmp_path):
    log = tmp_path / "times"
    log.write_text("   3.00 passed  t::short\n 100.00 passed  t::long\n  50.00 failed  t::mid\n"
                   "   1.00 passed  t::mid\n", encoding="utf-8")
    durations = read_durations(log)
    assert durations == {"t::short": 3.0, "t::long": 100.0, "t::mid": 1.0}  # the last line of an id wins
    items = [SimpleNamespace(nodeid=name) for name in ("t::mid", "t::short", "t::new", "t::long", "t::newer")]
    assert [i.nodeid for i in longest_first(items, durations)] == ["t::new", "t::newer", "t::long", "t::short",
                                                                   "t::mid"]
    assert read_durations(tmp_path / "missing") == {}


def test_the_stored_durations_name_gpu_tests_that_exist():
    """A renamed or removed test would leave a stale line: each id's file must define its function,
    marked for the GPU."""
    durations = read_durations(GPU_DURATIONS)
    assert len(durations) > 100
    root = GPU_DURATIONS.parent.parent
    for nodeid in durations:
        path, name = re.fullmatch(r"([^:]+)::(\w+)(\[.*\])?", nodeid).group(1, 2)
        source = (root / path).read_text(encoding="utf-8")
        assert f"def {name}(" in source, nodeid
        assert "mark.gpu" in source, nodeid
