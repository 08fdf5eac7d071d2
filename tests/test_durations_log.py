"""The GPU suite's durations log (FLASHLIB_TEST_TIMES, written by tests/conftest.py): one line per
test as it ends, and a failure's reason under its line, so that a run cut by its time limit still
says what failed and why."""
import os
import shutil
import subprocess
import sys
from pathlib import Path


def test_the_log_holds_each_test_and_the_reason_of_a_failure(tmp_path):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_sample.py").write_text(
        "def test_passes():\n    assert True\n\n\n"
        "def test_fails():\n    assert 1 + 1 == 3, 'arithmetic is off by one'\n", encoding="utf-8")
    log = tmp_path / "times"
    env = {**os.environ, "FLASHLIB_TEST_TIMES": str(log)}
    env.pop("PYTEST_XDIST_WORKER", None)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
                             str(tmp_path), "-c", os.devnull, str(tmp_path)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = log.read_text(encoding="utf-8").splitlines()
    assert [line.split()[1:] for line in lines if not line.startswith("    |")] == [
        ["passed", "test_sample.py::test_passes"], ["failed", "test_sample.py::test_fails"]]
    reason = [line for line in lines if line.startswith("    |")]
    assert 0 < len(reason) <= 20 and any("arithmetic is off by one" in line for line in reason)
    assert lines.index(reason[0]) > [i for i, line in enumerate(lines) if "test_fails" in line][0]


def test_xdist_workers_share_the_cores_for_torch_threads(tmp_path):
    """Under pytest-xdist each worker gets cores // workers torch threads (at least 1), not every core."""
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    expected = max(1, (os.cpu_count() or 1) // 2)
    (tmp_path / "test_threads.py").write_text(
        "import torch\n\n\n"
        f"def test_threads():\n    assert torch.get_num_threads() == {expected}, torch.get_num_threads()\n",
        encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.pop("FLASHLIB_TEST_TIMES", None)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
                             "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_worker_threads_is_an_even_share_and_never_zero():
    from conftest import worker_threads
    assert worker_threads(16, 16) == 1
    assert worker_threads(64, 16) == 4
    assert worker_threads(2, 16) == 1
    assert worker_threads(None, 4) == 1


def test_a_gpu_test_hands_its_cached_blocks_back(monkeypatch):
    """After a GPU test, and only then, the worker's caching allocator is emptied (sixteen workers share a card)."""
    import torch
    from conftest import release_gpu_cache

    emptied = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    assert release_gpu_cache({"gpu": True, "test_x": True}) and emptied == [True]
    assert not release_gpu_cache({"test_y": True}) and emptied == [True]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not release_gpu_cache({"gpu": True}) and emptied == [True]
