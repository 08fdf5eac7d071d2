"""benchmarks/dram_bytes.py without a GPU: its arguments, its driver against a stand-in for ncu (which
prints a captured-style CSV, or the counters' permission error), and its worker in the interpreter."""
import importlib.util
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from flashlib import dram_report, io_model, runtime

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "dram_bytes.py"


def load_script():
    spec = importlib.util.spec_from_file_location("dram_bytes_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


dram_bytes = load_script()

#: A stand-in for ncu: writes the worker's result itself (blocks 128 x 64 everywhere) and prints
#: ncu-style output for the four kernels, or ncu's permission error with FAKE_NCU=perm.
FAKE_NCU = '''#!{python}
import json, os, sys
args = sys.argv[1:]
if args == ["--version"]:
    print("NVIDIA (R) Nsight Compute Command Line Profiler\\nCopyright (c) 2018-2025 NVIDIA Corporation\\n"
          "Version 2025.1.0.0 (build 35237052) (public-release)")
    sys.exit(0)
if os.environ.get("FAKE_NCU") == "perm":
    print("==PROF== Connected to process 7 (python)")
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
          "Counters on the target device 0.")
    sys.exit(1)
point = json.loads(args[args.index("--point") + 1])
blocks = {{"fwd": {{"BLOCK_M": 128, "BLOCK_N": 64}}, "dkdv": {{"BLOCK_M": 64, "BLOCK_N": 128}},
          "dq": {{"BLOCK_M": 128, "BLOCK_N": 64}}, "preprocess": {{"BLOCK_M": 64}}}}
with open(args[args.index("--worker-out") + 1], "w") as f:
    json.dump(dict(point=point, blocks=blocks, worker_seconds=1.0), f)
print("==PROF== Connected to process 7 (python)")
print('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
      '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')
names = ["attention_fwd_kernel", "attention_bwd_preprocess_kernel", "attention_bwd_dkdv_kernel",
         "attention_bwd_dq_kernel"]
for i, name in enumerate(names):
    for metric, unit, value in [("dram__bytes_read.sum", "byte", f"{{(i + 1) * 1000000:,}}"),
                                ("dram__bytes_write.sum", "Kbyte", "500.00"),
                                ("gpu__time_duration.sum", "nsecond", "2,000"),
                                ("lts__t_bytes.sum", "Mbyte", "3.00")]:
        print(f'"{{i}}","7","python","host","{{name}}","1","7","(128, 1, 1)","(8, 512, 1)","0","9.0",'
              f'"Command line profiler metrics","{{metric}}","{{unit}}","{{value}}"')
print("==PROF== Disconnected from process 7")
'''


@pytest.fixture
def fake_ncu(tmp_path):
    path = tmp_path / "ncu"
    path.write_text(FAKE_NCU.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_arguments():
    args = dram_bytes.build_parser().parse_args(["--head-dims", "64", "--seqlens", "1024,4096", "--causal", "true",
                                                 "--time-budget", "60"])
    assert (args.head_dims, args.seqlens, args.causal, args.time_budget) == ([64], [1024, 4096], [True], 60)
    defaults = dram_bytes.build_parser().parse_args([])
    points = dram_bytes.grid(defaults.head_dims, defaults.seqlens, defaults.causal, defaults.dtype)
    assert len(points) == 12
    assert points[0] == dict(D=64, N=1024, causal=False, dtype="fp16", batch=16, heads=32)
    assert points[-1] == dict(D=128, N=16384, causal=True, dtype="fp16", batch=1, heads=16)


def test_driver_with_a_stand_in_ncu(fake_ncu, tmp_path):
    out = tmp_path / "dram.json"
    argv = ["--ncu", fake_ncu, "--out", str(out), "--head-dims", "64", "--seqlens", "1024", "--causal", "both"]
    assert dram_bytes.main(argv) == 0
    data = json.loads(out.read_text())
    assert data["meta"]["ncu_version"] == "Version 2025.1.0.0 (build 35237052) (public-release)"
    assert data["meta"]["metrics"] == list(dram_bytes.DEFAULT_METRICS)
    first = data["points"][0]
    assert (first["status"], first["causal"], first["missing_kernels"]) == ("ok", False, None)
    assert "--profile-from-start off" in first["command"] and "--worker" in first["command"]
    assert len(first["raw"]) == 16 and first["raw"][1]["unit"] == "Kbyte"
    dq = first["kernels"][3]
    assert (dq["key"], dq["measured"]["dram_read"], dq["measured"]["dram_write"]) == ("dq", 4e6, 5e5)
    predicted = io_model.flash2_backward_kernels(1024, 64, dkdv_blocks=(64, 128), dq_blocks=(128, 64),
                                                 batch=16, heads=32)["dq"]
    assert dq["predicted"]["total"] == predicted.total
    assert dq["ratio"]["dram_over_predicted"] == pytest.approx(4.5e6 / predicted.total)
    rows = dram_report.load_dram_report(out)[1]
    assert [r["key"] for r in rows] == ["fwd", "preprocess", "dkdv", "dq"] * 2

    # --resume keeps measured points; a time budget of 0 starts no new one
    assert dram_bytes.main(argv + ["--resume", "--seqlens", "1024,2048", "--time-budget", "0"]) == 1
    data = json.loads(out.read_text())
    assert [(p["N"], p["status"]) for p in data["points"]] == [(1024, "ok"), (1024, "ok"), (2048, "skipped"),
                                                               (2048, "skipped")]
    assert "time budget" in data["points"][2]["error"]


def test_driver_records_the_permission_error(fake_ncu, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_NCU", "perm")
    out = tmp_path / "dram.json"
    assert dram_bytes.main(["--ncu", fake_ncu, "--out", str(out), "--head-dims", "64", "--seqlens", "1024"]) == 1
    points = json.loads(out.read_text())["points"]
    assert points[0]["status"] == "error" and "ERR_NVGPUCTRPERM" in points[0]["error"]
    assert "NVreg_RestrictProfilingToAdminUsers" in points[0]["error"]
    assert points[1]["status"] == "skipped" and "not run" in points[1]["error"]  # the run stops there
    assert "ERR_NVGPUCTRPERM" in capsys.readouterr().err


def test_driver_without_ncu(tmp_path):
    out = tmp_path / "dram.json"
    missing = str(tmp_path / "no-such-ncu")
    assert dram_bytes.main(["--ncu", missing, "--out", str(out), "--head-dims", "64", "--seqlens", "1024",
                            "--causal", "false"]) == 1
    point = json.loads(out.read_text())["points"][0]
    assert point["status"] == "error" and "No such file" in point["error"]


@pytest.mark.skipif(not runtime.INTERPRET, reason="on a GPU the worker autotunes every config (minutes)")
def test_worker_runs_a_tiny_point_in_the_interpreter():
    point = dict(D=16, N=64, causal=True, dtype="fp16", batch=1, heads=2)
    result = dram_bytes.run_worker(point)
    assert result["profiled"] is False and result["interpreter"] is True
    assert result["blocks"]["fwd"] == dict(BLOCK_M=32, BLOCK_N=32, source="interpreter")
    assert set(result["blocks"]) == {"fwd", "preprocess", "dkdv", "dq"}
    assert os.environ.get("TRITON_INTERPRET") == "1"
