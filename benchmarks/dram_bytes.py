"""DRAM bytes of flashlib's forward and backward, measured with Nsight Compute (ncu), against io_model.

    PYTHONPATH=. python benchmarks/dram_bytes.py --out benchmarks/results/dram_bytes_<gpu>.json --time-budget 360 --point-timeout 200

For each point of the grid (default: head_dim 64 and 128; N 1024, 4096, 16384; causal off and
on; fp16; the FlashAttention-2 benchmark shapes batch = 16384 // N, heads = 2048 // D) this
driver starts ``ncu ... python benchmarks/dram_bytes.py --worker``. The worker builds the
inputs, runs the forward and the backward once each to autotune and compile (outside the
profiled range: ncu runs with ``--profile-from-start off``), then calls
``cudaProfilerStart``, launches one forward and one backward, and ``cudaProfilerStop``: ncu
profiles exactly those four launches (``attention_fwd_kernel``,
``attention_bwd_preprocess_kernel``, ``attention_bwd_dkdv_kernel``,
``attention_bwd_dq_kernel``) with only the metrics asked for (``--metrics``), each launch
replayed a few times with the caches flushed before each replay (``--cache-control all``).

The driver parses ncu's CSV (:func:`flashlib.dram_report.parse_ncu_csv`), puts each launch's
bytes next to :mod:`flashlib.io_model`'s count at the block sizes the autotuner chose
(:func:`flashlib.dram_report.compare`) and rewrites the JSON after every point, so a run cut
short keeps what it measured; ``--resume`` then measures only the points still missing.
``--time-budget`` stops starting new points after that many seconds and ``--point-timeout``
kills one point's run: their sum bounds the run (360 + 200 s fits a 10-minute limit). If ncu fails (for
example ERR_NVGPUCTRPERM: no permission to read the GPU's performance counters), the error
is printed and stored in the JSON.

Other modes: ``--dry-run`` runs the worker in this process without ncu (the CPU interpreter
included: use a tiny grid, e.g. ``--seqlens 64 --head-dims 16 --batch 1 --heads 2``) and
prints the blocks and predictions; ``--show FILE`` prints the stored table (Markdown).
See benchmarks/PROFILING.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # flashlib from this checkout, PYTHONPATH=. or not
DEFAULT_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum", "gpu__time_duration.sum")
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
#: ncu's options besides --metrics: CSV on stdout in base units (bytes, ns), profiling only between
#: cudaProfilerStart and Stop, caches flushed before every replay pass, clocks locked to base.
NCU_OPTIONS = ("--csv", "--print-units", "base", "--profile-from-start", "off", "--cache-control", "all",
               "--clock-control", "base")
PERMISSION_HINT = ("ncu may not read the GPU's performance counters (ERR_NVGPUCTRPERM): run as root (sudo), or "
                   "let users profile (modprobe option NVreg_RestrictProfilingToAdminUsers=0, then reload the "
                   "nvidia module); see https://developer.nvidia.com/ERR_NVGPUCTRPERM")


# ---------------------------------------------------------------- worker: one point, in the profiled process

def _config_of(autotuned, interpreter_blocks: dict) -> dict:
    """Block sizes, warps and stages the autotuner chose for its last tuned key (the interpreter's fixed blocks
    there; ``source`` says which)."""
    from flashlib import runtime

    if runtime.INTERPRET:
        return dict(interpreter_blocks, source="interpreter")
    config = getattr(autotuned, "best_config", None)
    if config is None:
        return dict(source="unknown")
    return dict(BLOCK_M=config.kwargs["BLOCK_M"], BLOCK_N=config.kwargs["BLOCK_N"], num_warps=config.num_warps,
                num_stages=config.num_stages, source="autotuned")


def run_worker(point: dict, profile: bool = True) -> dict:
    """Autotune and warm up the forward and backward of ``point``, then run one of each between
    cudaProfilerStart and cudaProfilerStop (with ``profile`` and a GPU). Returns the block sizes used."""
    import torch

    import flashlib
    from flashlib import runtime
    from flashlib.kernels import attention_bwd, attention_fwd
    from flashlib.spec import AttentionSpec

    started = time.perf_counter()
    torch.manual_seed(0)
    device, dtype = runtime.DEVICE, getattr(torch, DTYPES[point["dtype"]])
    shape = (point["batch"], point["heads"], point["N"], point["D"])
    q, k, v, do = (torch.randn(shape, device=device, dtype=dtype) for _ in range(4))
    o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
    lse = torch.empty(shape[:3], device=device, dtype=torch.float32)
    spec = AttentionSpec(causal=bool(point["causal"]))

    def forward():
        attention_fwd.launch_attention_forward(q, k, v, o, lse, spec)

    def backward():
        attention_bwd.launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    forward()  # autotunes the forward for this key
    blocks = {"fwd": _config_of(attention_fwd.attention_fwd_kernel_autotuned, attention_fwd.INTERPRETER_BLOCKS)}
    backward()  # autotunes the dK/dV and dQ kernels
    blocks["dkdv"] = _config_of(attention_bwd.attention_bwd_dkdv_kernel_autotuned, attention_bwd.INTERPRETER_BLOCKS)
    blocks["dq"] = _config_of(attention_bwd.attention_bwd_dq_kernel_autotuned, attention_bwd.INTERPRETER_BLOCKS)
    blocks["preprocess"] = dict(BLOCK_M=attention_bwd.PREPROCESS_BLOCK_M, source="fixed")
    forward()  # once more through the remembered config, as the measured calls will go
    backward()
    sync()
    profiled = profile and device.type == "cuda"
    if profiled:
        torch.cuda.profiler.start()
    forward()
    backward()
    sync()
    if profiled:
        torch.cuda.profiler.stop()
    import triton

    return dict(point=point, blocks=blocks, profiled=profiled, interpreter=runtime.INTERPRET,
                device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                torch=torch.__version__, triton=triton.__version__, flashlib=flashlib.__version__,
                worker_seconds=round(time.perf_counter() - started, 2))


# ---------------------------------------------------------------- driver

def grid(head_dims, seqlens, causals, dtype, batch=None, heads=None) -> list[dict]:
    """Points in measuring order: N outer, so that a run cut short has both head dims and masks."""
    points = []
    for n in seqlens:
        for d in head_dims:
            for causal in causals:
                points.append(dict(D=d, N=n, causal=causal, dtype=dtype, batch=batch or max(1, 16384 // n),
                                   heads=heads or max(1, 2048 // d)))
    return points


def same_point(a: dict, b: dict) -> bool:
    return all(a.get(f) == b.get(f) for f in ("D", "N", "causal", "dtype", "batch", "heads"))


def in_grid_order(records: list[dict], points: list[dict]) -> list[dict]:
    """``records`` sorted as ``points`` (kept records of points outside this grid last)."""
    def order(record):
        return next((i for i, p in enumerate(points) if same_point(p, record)), len(points))
    return sorted(records, key=order)


def ncu_command(ncu: str, metrics, point: dict, worker_out: str, extra=()) -> list[str]:
    return [ncu, *NCU_OPTIONS, "--metrics", ",".join(metrics), *extra,
            sys.executable, str(SCRIPT), "--worker", "--point", json.dumps(point, sort_keys=True),
            "--worker-out", worker_out]


def ncu_version(ncu: str) -> str:
    try:
        done = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unavailable: {type(exc).__name__}: {exc}"
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    return lines[-1].strip() if done.returncode == 0 and lines else f"unavailable: rc={done.returncode} " \
        f"{(done.stderr or done.stdout).strip()[-300:]}"


def _run(command: list[str], timeout: float, env: dict) -> tuple[int | None, str, str]:
    """(returncode, stdout, stderr); returncode None after ``timeout`` (the whole process group is killed)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=REPO, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # ncu and the worker it started
        out, err = proc.communicate()
        return None, out, err


def _error_text(returncode, out: str, err: str) -> str:
    marked = [line.strip() for line in (out + "\n" + err).splitlines()
              if line.startswith(("==ERROR==", "==WARNING==")) or "Error" in line or "error" in line]
    tail = (err.strip() or out.strip())[-1500:]
    head = "timed out" if returncode is None else f"ncu exited with {returncode}"
    return "\n".join([head, *marked[-20:], "--- last output ---", tail])


def kernel_entries(point: dict, blocks: dict, launch_list: list[dict]) -> list[dict]:
    """One entry per profiled launch: ncu's numbers with io_model's prediction at the chosen blocks."""
    from flashlib import dram_report

    dtype_bytes = 2 if point["dtype"] in ("fp16", "bf16") else 4
    shape = dict(n=point["N"], d=point["D"], causal=bool(point["causal"]), batch=point["batch"],
                 heads=point["heads"], dtype_bytes=dtype_bytes)
    entries = []
    for launch in launch_list:
        entry = dict(kernel=launch["kernel"], key=launch["key"], launch_id=launch["id"], grid=launch["grid"],
                     block=launch["block"])
        block = blocks.get(launch["key"]) or {}
        try:
            if launch["key"] is None:
                raise ValueError(f"not a flashlib attention kernel: {launch['kernel']!r}")
            pair = (block["BLOCK_M"], block["BLOCK_N"]) if "BLOCK_N" in block else None
            if pair is None and launch["key"] != "preprocess":
                raise ValueError(f"block sizes of {launch['key']} unknown: {block}")
            predicted = dram_report.predicted_traffic(launch["key"], blocks=pair, **shape)
            floor = dram_report.floor_traffic(launch["key"], **shape)
            entry.update(dram_report.compare(launch["metrics"], predicted, floor))
        except (KeyError, ValueError) as exc:
            entry.update(measured=launch["metrics"], predicted=None, floor=None, ratio=None,
                         note=f"no prediction: {exc}")
        entries.append(entry)
    return entries


def measure_point(point: dict, args, env: dict) -> dict:
    """Profile one point under ncu; the point's record for the JSON (status "ok" or the error)."""
    from flashlib import dram_report

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        worker_out = str(Path(tmp) / "worker.json")
        command = ncu_command(args.ncu, args.metrics, point, worker_out, shlex.split(args.ncu_args))
        try:
            returncode, out, err = _run(command, args.point_timeout, env)
        except OSError as exc:  # ncu not found, not executable
            returncode, out, err = -1, "", f"{type(exc).__name__}: {exc}"
        try:
            worker = json.loads(Path(worker_out).read_text())
        except (OSError, ValueError):  # the worker did not get that far
            worker = None
    record = dict(point, status="error", error=None, seconds=round(time.perf_counter() - started, 1),
                  ncu_returncode=returncode, command=shlex.join(command),
                  blocks=worker["blocks"] if worker else None, kernels=[], raw=[])
    try:
        rows = dram_report.parse_ncu_csv(out)
    except ValueError as exc:
        rows = []
        record["error"] = f"unparsable ncu CSV: {exc}"
    record["raw"] = [dict(id=r["id"], kernel=r["kernel"], metric=r["metric"], unit=r["unit"], value=r["raw_value"])
                     for r in rows]
    if "ERR_NVGPUCTRPERM" in out + err:
        record["error"] = f"ERR_NVGPUCTRPERM: {PERMISSION_HINT}\n" + _error_text(returncode, out, err)
    elif returncode != 0 or not rows or worker is None:
        why = "no metrics in ncu's output" if not rows else "the worker wrote no result"
        record["error"] = record["error"] or f"{why}; " + _error_text(returncode, out, err)
    else:
        record["kernels"] = kernel_entries(point, worker["blocks"], dram_report.launches(rows))
        seen = {k["key"] for k in record["kernels"]}
        missing = [key for key in dram_report.KERNELS.values() if key not in seen]
        record.update(status="ok", missing_kernels=missing or None, worker_seconds=worker.get("worker_seconds"))
    return record


def dry_run_point(point: dict) -> dict:
    """The worker in this process, without ncu: block sizes and predictions, nothing measured."""
    from flashlib.dram_report import KERNELS

    worker = run_worker(point, profile=False)
    launch_list = [dict(id=i, kernel=name, key=key, grid=None, block=None, metrics={})
                   for i, (name, key) in enumerate(KERNELS.items())]
    return dict(point, status="dry-run", error="dry run: nothing measured", blocks=worker["blocks"],
                kernels=kernel_entries(point, worker["blocks"], launch_list), raw=[])


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)  # a run killed mid-write leaves the previous file whole


def _list(kind):
    def parse(text: str):
        return [kind(x) for x in text.split(",") if x.strip()]
    return parse


def _causals(text: str) -> list[bool]:
    return {"both": [False, True], "false": [False], "true": [True]}[text.lower()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="results JSON (default benchmarks/results/dram_bytes_<gpu>.json)")
    p.add_argument("--head-dims", type=_list(int), default=[64, 128], help="comma-separated (default 64,128)")
    p.add_argument("--seqlens", type=_list(int), default=[1024, 4096, 16384], help="comma-separated N")
    p.add_argument("--causal", type=_causals, default=[False, True], help="both (default), true or false")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    p.add_argument("--batch", type=int, help="override batch (default 16384 // N)")
    p.add_argument("--heads", type=int, help="override heads (default 2048 // D)")
    p.add_argument("--metrics", type=_list(str), default=list(DEFAULT_METRICS), help="comma-separated ncu metrics")
    p.add_argument("--ncu", default="ncu", help="the ncu executable")
    p.add_argument("--ncu-args", default="", help="more ncu options, one string (e.g. '--clock-control none')")
    p.add_argument("--time-budget", type=float, help="start no new point after this many seconds")
    p.add_argument("--point-timeout", type=float, default=300, help="seconds before one point's ncu run is killed")
    p.add_argument("--resume", action="store_true", help="keep the points --out already measured, do the rest")
    p.add_argument("--dry-run", action="store_true", help="no ncu: run the worker here, print blocks and predictions")
    p.add_argument("--show", type=Path, metavar="FILE", help="print the table of a stored results file and exit")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--point", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", help=argparse.SUPPRESS)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        result = run_worker(json.loads(args.point))
        Path(args.worker_out).write_text(json.dumps(result))
        return 0
    from flashlib import dram_report
    from flashlib.bench_results import RESULTS_DIR, gpu_slug, results_meta
    from flashlib.gpu import detect_gpu

    if args.show:
        print(dram_report.dram_table(dram_report.load_dram_report(args.show)[1]))
        return 0
    points = grid(args.head_dims, args.seqlens, args.causal, args.dtype, args.batch, args.heads)
    given = sys.argv[1:] if argv is None else list(argv)
    command = "PYTHONPATH=. python " + shlex.join([os.path.relpath(SCRIPT, REPO), *given])
    if args.dry_run:
        records = [dry_run_point(p) for p in points]
        for r in records:
            print(f"D={r['D']} N={r['N']} causal={r['causal']} blocks={json.dumps(r['blocks'])}")
            for k in r["kernels"]:
                print(f"    {k['key']:>10}: predicted {k['predicted']}  floor {k['floor']}")
        if args.out:
            _write(args.out, dict(meta=results_meta(method="dry run (no ncu)", command=command), points=records))
        return 0

    out = args.out or RESULTS_DIR / f"dram_bytes_{gpu_slug(detect_gpu().name)}.json"
    kept = []
    if args.resume and out.exists():
        kept = [p for p in json.loads(out.read_text(encoding="utf-8")).get("points", []) if p.get("status") == "ok"]
    meta = results_meta(
        method="Nsight Compute, one profiled forward + backward per point after autotuning and a warm-up call; "
               "ncu " + " ".join(NCU_OPTIONS) + " --metrics " + ",".join(args.metrics),
        command=command, ncu_version=ncu_version(args.ncu), metrics=list(args.metrics),
        grid=dict(head_dims=args.head_dims, seqlens=args.seqlens, causal=args.causal, dtype=args.dtype,
                  batch=args.batch or "16384 // N", heads=args.heads or "2048 // D"),
        time_budget_s=args.time_budget, aborted=None)
    print(f"ncu: {meta['ncu_version']}\nresults: {out}", flush=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    records = list(kept)
    started = time.monotonic()
    for point in points:
        if any(same_point(point, r) for r in kept):
            continue
        elapsed = time.monotonic() - started
        if meta["aborted"] or (args.time_budget is not None and elapsed > args.time_budget):
            records.append(dict(point, status="skipped", error=meta["aborted"] and "not run: " + meta["aborted"]
                                or f"time budget: not started after {elapsed:.0f} s (rerun with --resume)"))
            continue
        print(f"D={point['D']} N={point['N']} causal={point['causal']} (B={point['batch']}, H={point['heads']}) ...",
              flush=True)
        record = measure_point(point, args, env)
        records.append(record)
        if record["status"] == "ok":
            for k in record["kernels"]:
                m, ratio = k["measured"], (k.get("ratio") or {}).get("dram_over_predicted")
                print(f"    {k['key'] or k['kernel']:>10}: DRAM read {m.get('dram_read')} write {m.get('dram_write')}"
                      f"  predicted {(k.get('predicted') or {}).get('total')}  ratio "
                      f"{'-' if ratio is None else f'{ratio:.3f}'}", flush=True)
        else:
            print(f"    ERROR ({record['seconds']} s):\n{record['error']}", file=sys.stderr, flush=True)
            if "ERR_NVGPUCTRPERM" in record["error"] or record["ncu_returncode"] == -1:
                meta["aborted"] = record["error"].splitlines()[0]  # every other point would fail alike
        _write(out, dict(meta=meta, points=in_grid_order(records, points)))
    records = in_grid_order(records, points)
    _write(out, dict(meta=meta, points=records))
    print(dram_report.dram_table(dram_report.rows_of(dict(meta=meta, points=records))))
    return 0 if all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
