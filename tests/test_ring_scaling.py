"""benchmarks/ring_scaling.py and flashlib.ring_results: the ring measured across GPUs, and what is shown of it.

The script runs here as a dry run on 2 CPU processes (gloo, Triton's interpreter, tiny sizes), so that its
correctness check, its timings and its profile keep working where no GPU is; on a machine of two GPUs a
GPU-marked test runs its correctness check on NCCL. The stored run's tables and the README's section are
computed from the stored times, and the README holds exactly what the module generates.
"""
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flashlib import ring_results

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "ring_scaling.py"
sys.path.insert(0, str(SCRIPT.parent))
import ring_scaling  # noqa: E402


def run_script(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


# ---------------------------------------------------------------- the script
def test_dry_run_on_two_cpu_processes_checks_times_and_profiles(tmp_path):
    out = tmp_path / "ring.json"
    done = run_script("--cpu", "--out", str(out), "--n", "64", "--n-late", "", "--overlap-n", "64",
                      "--heads", "2", "--head-dim", "16", "--check-shape", "1,2,1,32,16", "--target-s", "0.01",
                      "--sections", "check,scaling,overlap", "--budget", "300")
    assert done.returncode == 0, done.stderr[-3000:]
    result = ring_results.load_ring_results(out)
    assert result["meta"]["world_size"] == 2 and result["meta"]["backend"] == "gloo"
    # both dtypes x (full, causal) x (contiguous, zigzag), each within its tolerance against both references
    assert len(result["check"]) == 8
    assert all(row["passed"] for row in result["check"]), result["check"]
    assert {(r["dtype"], r["mask"], r["scheme"]) for r in result["check"]} == {
        (d, m, s) for d in ("float16", "bfloat16") for m in ("full", "causal") for s in ("contiguous", "zigzag")}
    assert [(r["N"], r["mask"]) for r in result["scaling"]] == [(64, "full"), (64, "causal")]
    for row in result["scaling"]:
        for side in ("single", "ring"):
            assert len(row[side]["fwd_s"]) == 2 and min(row[side]["fwd_s"] + row[side]["fwd_bwd_s"]) > 0
    assert [r["note"] for r in result["overlap"]] == ["no GPU: nothing to profile"] * 4  # two masks, two ranks


def test_a_wrong_ring_fails_the_check(tmp_path):
    """The check must catch a ring that returns wrong gradients: dK 10% off on one rank."""
    out = tmp_path / "ring.json"
    patch = tmp_path / "sitecustomize.py"
    patch.write_text(
        "import flashlib.distributed as d\n"
        "_backward = d.RingAttentionFunction.backward\n"
        "def backward(ctx, *grads):\n"
        "    dq, dk, dv, *rest = _backward(ctx, *grads)\n"
        "    return (dq, dk * 1.1 if d.dist.get_rank() == 1 else dk, dv, *rest)\n"
        "d.RingAttentionFunction.backward = staticmethod(backward)\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    done = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--out", str(out), "--sections", "check",
                           "--check-shape", "1,2,1,32,16"], capture_output=True, text=True, env=env, timeout=600,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["check"]
    assert rows and not any(row["passed"] for row in rows)
    assert all(row["ring_vs_flash_attention"]["dK"] > row["tolerance"] for row in rows)
    assert all(row["ring_vs_flash_attention"]["dQ"] <= row["tolerance"] for row in rows)


def test_needs_two_ranks_and_well_formed_arguments():
    assert "needs at least 2 ranks" in run_script("--cpu", "--out", "/dev/null", "--world-size", "1").stderr
    assert "--configs" in run_script("--out", "/dev/null", "--configs", "fwd=128x64").stderr
    assert "unknown" in run_script("--out", "/dev/null", "--sections", "check,speed").stderr
    with pytest.raises(SystemExit, match="must name fwd, dkdv and dq"):
        ring_scaling.parse_configs("fwd=128x64/3/8")
    assert ring_scaling.parse_configs(ring_scaling.DEFAULT_CONFIGS)["dq"] == [(128, 64, 3, 8, False)]
    several = ring_scaling.parse_configs("fwd=128x128/3/8|128x64/3/8,dkdv=64x64/2/4:dp_after_dv|32x64/3/4,"
                                         "dq=128x64/3/8")
    assert several["fwd"] == [(128, 128, 3, 8, False), (128, 64, 3, 8, False)]
    assert several["dkdv"] == [(64, 64, 2, 4, True), (32, 64, 3, 4, False)]
    with pytest.raises(SystemExit, match="expected kernel=MxN"):  # the dP-after-dV order is the dK/dV kernel's
        ring_scaling.parse_configs("fwd=128x128/3/8:dp_after_dv,dkdv=32x64/3/4,dq=128x64/3/8")
    assert ring_scaling.parse_configs("autotuned") == ring_scaling.AUTOTUNED


def test_an_autotuned_run_leaves_every_autotuner_its_configs_and_says_so(monkeypatch):
    """``--configs autotuned`` pins nothing, the default pins one config per kernel, and the stored run's
    description says which of the two it was."""
    from flashlib.kernels import attention_bwd, attention_fwd
    tuned = (attention_fwd.attention_fwd_kernel_autotuned, attention_bwd.attention_bwd_dkdv_kernel_autotuned,
             attention_bwd.attention_bwd_dq_kernel_autotuned)
    for autotuner in tuned:
        monkeypatch.setattr(autotuner, "configs", list(autotuner.configs))
    counts = [len(t.configs) for t in tuned]
    ring_scaling.apply_configs(ring_scaling.parse_configs("autotuned"))
    assert [len(t.configs) for t in tuned] == counts and min(counts) > 1
    ring_scaling.apply_configs(ring_scaling.parse_configs(ring_scaling.DEFAULT_CONFIGS))
    assert [len(t.configs) for t in tuned] == [1, 1, 1]
    stored = ring_results.load_ring_results(ring_results.RESULTS_DIR / "ring_scaling_2x_nvidia_h200.json")
    assert "pinned (BLOCK_M x BLOCK_N / stages / warps): fwd 128x64/3/8" in ring_results.describe(stored)
    tuned_run = copy.deepcopy(stored)
    tuned_run["meta"]["configs"] = "autotuned"
    assert "autotuned on every rank" in ring_results.describe(tuned_run)


def test_pinned_configs_are_the_autotuners_own(monkeypatch):
    from flashlib.kernels import attention_bwd, attention_fwd
    tuned = (attention_fwd.attention_fwd_kernel_autotuned, attention_bwd.attention_bwd_dkdv_kernel_autotuned,
             attention_bwd.attention_bwd_dq_kernel_autotuned)
    for autotuner in tuned:
        monkeypatch.setattr(autotuner, "configs", list(autotuner.configs))
    ring_scaling.pin_configs(ring_scaling.parse_configs(ring_scaling.DEFAULT_CONFIGS))
    assert [len(t.configs) for t in tuned] == [1, 1, 1]
    assert (tuned[1].configs[0].kwargs["BLOCK_M"], tuned[1].configs[0].num_warps) == (32, 4)
    assert not tuned[1].configs[0].kwargs.get("DP_AFTER_DV")
    with pytest.raises(SystemExit, match="not one of the autotuner's configs"):
        ring_scaling.pin_configs(ring_scaling.parse_configs("fwd=96x64/3/8,dkdv=32x64/3/4,dq=128x64/3/8"))


def test_several_pinned_configs_leave_the_autotuner_those_alone(monkeypatch):
    from flashlib.kernels import attention_bwd, attention_fwd
    tuned = (attention_fwd.attention_fwd_kernel_autotuned, attention_bwd.attention_bwd_dkdv_kernel_autotuned,
             attention_bwd.attention_bwd_dq_kernel_autotuned)
    for autotuner in tuned:
        monkeypatch.setattr(autotuner, "configs", list(autotuner.configs))
    ring_scaling.pin_configs(ring_scaling.parse_configs(
        "fwd=128x128/3/8|128x64/3/8,dkdv=64x64/2/4:dp_after_dv|64x64/2/4,dq=128x64/3/8"))
    fwd, dkdv, dq = (t.configs for t in tuned)
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_stages) for c in fwd] == [(128, 128, 3), (128, 64, 3)]
    assert all(c.maxnreg is None for c in fwd)
    # the same tiles in both orders of the products: two configs, told apart by DP_AFTER_DV
    assert [bool(c.kwargs.get("DP_AFTER_DV")) for c in dkdv] == [True, False]
    assert len(dq) == 1


def test_communication_under_compute_is_measured_on_merged_intervals():
    assert ring_scaling.merged([(5, 7), (0, 2), (1, 3), (7, 8)]) == [[0, 3], [5, 8]]
    compute = ring_scaling.merged([(0, 10), (20, 30)])
    # NCCL from 5 to 25: 5 under the first kernel, 5 under the second, 10 exposed between them
    assert ring_scaling.covered([[5, 25]], compute) == 10
    assert ring_scaling.covered([[10, 20]], compute) == 0  # touching is not overlapping
    assert ring_scaling.covered([[0, 30]], compute) == 20
    assert ring_scaling.covered([[1, 2], [3, 4], [21, 29]], compute) == 10


def kernel(name, start, end):
    return {"cat": "kernel", "name": name, "ts": start, "dur": end - start}


def test_communication_is_counted_within_the_measured_step_only():
    """The warm-up step's kernels (a rank's first NCCL kernel waiting for its peer) are left out."""
    events = [kernel("ncclDevKernel_SendRecv", 0, 500),  # warm-up: waits for the other rank
              kernel("attention_fwd_kernel", 100, 400),
              {"name": ring_scaling.MEASURED_STEP, "ph": "X", "ts": 1000, "dur": 200},
              kernel("attention_fwd_kernel", 1000, 1100),
              kernel("ncclDevKernel_SendRecv", 1050, 1120),  # 50 hidden, 20 exposed
              kernel("attention_bwd_dkdv_kernel", 1120, 1190),
              kernel("ncclDevKernel_SendRecv", 1190, 1200)]  # 10 exposed: the last hop home
    summary = ring_scaling.communication_summary(events)
    assert summary["nccl_kernels"] == 2 and summary["kernels"] == 4
    assert summary["nccl_us"] == 80 and summary["hidden_us"] == 50 and summary["exposed_us"] == 30
    assert summary["step_us"] == 200 and summary["exposed_fraction_of_step"] == pytest.approx(0.15)
    assert summary["gpu_busy_fraction"] == 1.0
    # without a measured step the whole trace counts, the warm-up's wait included
    whole = ring_scaling.communication_summary([e for e in events if e.get("cat") == "kernel"])
    assert whole["nccl_us"] == 580
    assert ring_scaling.communication_summary([kernel("attention_fwd_kernel", 0, 10)]) == \
        dict(kernels=1, nccl_kernels=0)


@pytest.mark.gpu
def test_gpu_ring_on_nccl_matches_one_gpu(tmp_path):
    """Every rank's O and gradients on NCCL against one GPU's flash_attention and float64 (needs 2 GPUs)."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs two GPUs; this machine has {torch.cuda.device_count()}")
    out = tmp_path / "ring.json"
    done = run_script("--out", str(out), "--sections", "check", "--world-size", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["check"]
    assert len(rows) == 8 and all(row["passed"] for row in rows), rows


# ---------------------------------------------------------------- the stored run
@pytest.fixture(scope="module", params=ring_results.README_FILES)
def stored(request):
    paths = ring_results.stored_ring_results()
    assert ring_results.RESULTS_DIR / request.param in paths, f"benchmarks/results lacks {request.param}"
    return ring_results.load_ring_results(ring_results.RESULTS_DIR / request.param)


def test_the_readme_shows_two_and_four_gpus():
    worlds = [ring_results.load_ring_results(ring_results.RESULTS_DIR / name)["meta"]["world_size"]
              for name in ring_results.README_FILES]
    assert worlds == [2, 4]


def test_stored_run_passed_its_checks_on_nccl(stored):
    assert stored["meta"]["backend"] == "nccl" and stored["meta"]["world_size"] in (2, 4)
    summary = ring_results.check_summary(stored)
    assert set(summary) == {"float16", "bfloat16"}
    assert all(c["passed"] == c["cases"] == 4 for c in summary.values())


def test_scaling_rows_are_computed_from_the_stored_times(stored):
    rows = ring_results.scaling_rows(stored)
    assert len(rows) == len(stored["scaling"])
    for raw in stored["scaling"]:
        row = next(r for r in rows if (r["N"], r["mask"]) == (raw["N"], raw["mask"]))
        single, ring = raw["single"]["fwd_bwd_s"][0], max(raw["ring"]["fwd_bwd_s"])
        assert row["fwd_bwd"]["speedup"] == pytest.approx(single / ring)
        assert row["fwd_bwd"]["efficiency"] == pytest.approx(single / ring / stored["meta"]["world_size"])
        assert row["ring_tokens_per_s"] == pytest.approx(raw["B"] * raw["N"] / ring)


def test_the_slowest_rank_sets_the_rings_time(stored):
    result = copy.deepcopy(stored)
    raw = result["scaling"][0]
    raw["ring"]["fwd_bwd_s"] = [raw["ring"]["fwd_bwd_s"][0], 10 * raw["ring"]["fwd_bwd_s"][0]]
    row = next(r for r in ring_results.scaling_rows(result) if (r["N"], r["mask"]) == (raw["N"], raw["mask"]))
    assert row["fwd_bwd"]["ring_s"] == raw["ring"]["fwd_bwd_s"][1]


def test_context_parallel_rows_pair_each_point_with_the_ring(stored):
    rows = ring_results.context_parallel_rows(stored)
    assert rows and {r["backend"] for r in rows} == {"FLASH_ATTENTION", "CUDNN_ATTENTION"}
    ring = {(r["N"], r["mask"]): r["fwd_bwd"]["ring_s"] for r in ring_results.scaling_rows(stored)}
    for row in rows:
        assert row["ring_speedup"] == pytest.approx(row["context_parallel_s"] / ring[(row["N"], row["mask"])])
    # points that failed (an "error" instead of times) are left out, not counted as zeros
    failed = copy.deepcopy(stored)
    failed["context_parallel"].append(dict(N=32768, mask="full", backend="EFFICIENT_ATTENTION", error="boom"))
    assert ring_results.context_parallel_rows(failed) == rows


def test_readme_section_is_generated_from_the_stored_run(stored):
    text = (ROOT / "README.md").read_text()
    start, end = text.index(ring_results.README_START), text.index(ring_results.README_END)
    assert text[start + len(ring_results.README_START):end].strip("\n") == ring_results.readme_section().strip("\n")
    assert ring_results.headline(stored) in text


def test_headline_and_tables_follow_the_numbers(stored):
    result = copy.deepcopy(stored)
    world = result["meta"]["world_size"]
    for raw in result["scaling"]:
        raw["ring"]["fwd_bwd_s"] = [raw["single"]["fwd_bwd_s"][0] / 1.5] * world
    efficiency = round(150 / world)
    assert f"1.50x as fast as one GPU (scaling efficiency {efficiency}% or more)" in ring_results.headline(result)
    assert f" / 1.50x | {efficiency}% |" in ring_results.markdown_scaling(result)


def test_a_file_without_the_sections_is_refused(tmp_path):
    path = tmp_path / "ring_scaling_bad.json"
    path.write_text(json.dumps({"meta": {}, "scaling": []}))
    with pytest.raises(ValueError, match="ring_scaling_bad.json.*lacks.*check"):
        ring_results.load_ring_results(path)


def test_plot_has_the_speedup_and_the_context_parallel_panels(stored):
    fig = ring_results.plot_ring_scaling(stored)
    left, right = fig.axes
    assert len(left.get_lines()) == 2 * 2 + 1  # fwd and fwd+bwd per mask, and the ideal line
    assert len(right.get_lines()) == 2 * 2 + 1  # per mask and backend, and the level line
