"""Stored benchmark results: the rows' fields and statuses, where the files live, writing and reading them.

``python -m flashlib.bench`` writes PREFIX.json (``{"meta": ..., "rows": [...]}``) and
PREFIX.csv, one row per (impl, mode, dtype, causal, N, D) with the fields of
:data:`ROW_FIELDS`; ``status`` is "ok", "out of memory", "unsupported: <why>",
"error: <what>", or another reason an implementation did not run (:class:`Unavailable`).
``flashlib.report`` reads these files through this module, never through the command line.
"""
from __future__ import annotations

import csv
import datetime
import json
import math
import platform
import re
import tempfile
from pathlib import Path
from typing import Iterable

import torch

from . import runtime
from .gpu import detect_gpu
from .validation import tolerance

#: The dtypes a row names, and the torch dtype of each.
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
ROW_FIELDS = ("impl", "mode", "dtype", "causal", "N", "D", "batch", "heads",
              "ms", "tflops", "peak_mem_bytes", "rel_err", "status")
OK = "ok"
OUT_OF_MEMORY = "out of memory"
#: The status of a row whose output failed the float64 check (see wrong_output_status).
WRONG = "wrong"
#: Where measured GPU results live: benchmarks/results of the repository.
RESULTS_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


class Unavailable(RuntimeError):
    """An implementation that cannot run here (not installed, not found, ...); the message is the row's status."""


def _short(text: str, width: int = 100) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[:width - 3] + "..."


def failure_status(exc: BaseException, warned: Iterable[str] = ()) -> str:
    """A row's status for an exception: "out of memory", "unsupported: <why>", "error: <what>",
    or an :class:`Unavailable`'s message.

    A backend refuses a shape or dtype with ValueError/TypeError (flashlib) or SDPA's
    "No available kernel" (the reason is in the warnings SDPA emitted just before).
    """
    if isinstance(exc, Unavailable):
        return str(exc)
    text = str(exc).strip()
    if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in text.lower() \
            or "can't allocate memory" in text:
        return OUT_OF_MEMORY
    if "No available kernel" in text or "No viable backend" in text:  # SDPA (torch <= 2.11 / later)
        reasons = [w for w in warned if not w.rstrip().endswith("because:") and "runtime disabled" not in w]
        return f"unsupported: {_short(reasons[0] if reasons else text)}"
    if isinstance(exc, (ValueError, TypeError, NotImplementedError)):
        return f"unsupported: {_short(text or type(exc).__name__)}"
    return f"error: {type(exc).__name__}: {_short(text)}"


def gpu_slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia_h100_80gb_hbm3' (for file names)."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def default_prefix(dtypes) -> Path:
    """benchmarks/results/attention_<gpu> (attention_<dtypes>_<gpu> for a subset of dtypes) on a GPU;
    a temporary file in the interpreter, whose timings are not results."""
    if runtime.INTERPRET:
        return Path(tempfile.gettempdir()) / "flashlib_attention_interpreter"
    tag = "" if set(dtypes) == set(DTYPES) else "_".join(dtypes) + "_"
    return RESULTS_DIR / f"attention_{tag}{gpu_slug(detect_gpu().name)}"


def results_meta(*, method: str, command: str, **extra) -> dict:
    """What was measured where, how and when: the "meta" of a results file (``extra``: more fields,
    such as the measured ceilings)."""
    import triton

    import flashlib

    return dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                gpu=detect_gpu().as_dict(), torch=torch.__version__, triton=triton.__version__,
                flashlib=flashlib.__version__, python=platform.python_version(),
                interpreter=runtime.INTERPRET, method=method, command=command, **extra)


def _finite_or_none(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


def write_results(prefix, meta: dict, rows: list[dict]) -> tuple[Path, Path]:
    """Write PREFIX.json ({"meta", "rows"}) and PREFIX.csv (one line per row, with GPU/versions/date)."""
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    clean = [{f: _finite_or_none(r.get(f)) for f in ROW_FIELDS} for r in rows]
    json_path, csv_path = Path(f"{prefix}.json"), Path(f"{prefix}.csv")
    tmp = json_path.with_name(json_path.name + ".tmp")
    tmp.write_text(json.dumps({"meta": meta, "rows": clean}, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    tmp.replace(json_path)  # a run killed mid-write leaves the previous file whole
    extra = dict(gpu=meta["gpu"]["name"], torch=meta["torch"], triton=meta["triton"], date=meta["date"],
                 interpreter=meta["interpreter"])
    with csv_path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*ROW_FIELDS, *extra])
        writer.writeheader()
        for r in clean:
            writer.writerow({**r, **extra})
    return json_path, csv_path


def wrong_output_status(rel_err: float | None, dtype: str, interpreter: bool) -> str | None:
    """"wrong: relative error X > TOL" when an output is off the float64 reference by more than
    :func:`flashlib.validation.tolerance` allows for ``dtype`` where it ran; else None.
    A fast wrong answer is no anchor: such a row gets no time and no place in a ratio."""
    limit = tolerance(DTYPES[dtype], interpreter)
    if rel_err is not None and rel_err > limit:
        return f"{WRONG}: relative error {rel_err:.2g} > {limit:.0e}"
    return None


def load_results(path) -> tuple[dict, list[dict]]:
    """(meta, rows) of a results file written by :func:`write_results`; absent row fields are None.

    Rows stored as ok whose output failed the float64 check (files written before the benchmark
    checked it) come back with :func:`wrong_output_status`, and without their time."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("meta"), dict) or not isinstance(data.get("rows"), list):
        got = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path}: expected flashlib.bench results, a JSON object with 'meta' (object) and "
                         f"'rows' (list); got {got}")
    rows = [{**{f: None for f in ROW_FIELDS}, **r} for r in data["rows"]]
    interpreter = bool(data["meta"].get("interpreter", False))
    for row in (r for r in rows if r["status"] == OK and r["dtype"] in DTYPES):
        wrong = wrong_output_status(row["rel_err"], row["dtype"], interpreter)
        if wrong:
            row.update(status=wrong, ms=None, tflops=None)
    return data["meta"], rows


def _date_of(path: Path) -> str:
    try:
        return str(json.loads(path.read_text(encoding="utf-8"))["meta"]["date"])
    except (OSError, ValueError, KeyError, TypeError):
        mtime = datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc)
        return mtime.isoformat(timespec="seconds")


def stored_results(pattern: str = "attention_*.json", directory=None) -> list[Path]:
    """Results files in benchmarks/results of the repository (or ``directory``), newest first
    (by the date inside, else the file's modification time)."""
    folder = Path(directory) if directory is not None else RESULTS_DIR
    return sorted(folder.glob(pattern), key=_date_of, reverse=True)
