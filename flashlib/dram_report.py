"""DRAM bytes of flashlib's kernels as Nsight Compute measured them, against :mod:`flashlib.io_model`.

``benchmarks/dram_bytes.py`` profiles one forward and one backward per point with ``ncu``
(metrics ``dram__bytes_read.sum``, ``dram__bytes_write.sum``, ``lts__t_bytes.sum``,
``gpu__time_duration.sum``) and stores a JSON file in ``benchmarks/results/``. This module
is the part that needs no GPU:

* :func:`parse_ncu_csv` reads what ``ncu --csv`` prints (``==PROF==`` lines, the
  application's own output and scaled units included) into one row per metric;
  :func:`launches` groups those rows by kernel launch;
* :func:`predicted_traffic` is the io_model count of one kernel at the block sizes the
  autotuner chose, :func:`floor_traffic` the same count with every operand read once;
  :func:`compare` puts a launch's measured bytes next to both;
* :func:`load_dram_report` flattens a stored file to one row per (point, kernel) and
  :func:`dram_table` formats those rows (for notebook 07, the README and PROFILING.md).

Units: ncu prefixes are decimal (``Kbyte`` = 1000 bytes, ``usecond`` = 1000 ns); the metrics
of :data:`METRICS` are kept in bytes or nanoseconds, any other (a ``--section``'s) in ncu's own
unit. Tables print MB = 10^6 bytes.
"""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from . import io_model

#: ncu's kernel names -> the short keys used in results (io_model's names for the backward's kernels).
KERNELS = {
    "attention_fwd_kernel": "fwd",
    "attention_bwd_preprocess_kernel": "preprocess",
    "attention_bwd_dkdv_kernel": "dkdv",
    "attention_bwd_dq_kernel": "dq",
}

#: The ncu metrics asked for -> the names they get in results.
METRICS = {
    "dram__bytes_read.sum": "dram_read",
    "dram__bytes_write.sum": "dram_write",
    "lts__t_bytes.sum": "l2",
    "gpu__time_duration.sum": "duration_ns",
}

#: Unit -> factor to bytes or nanoseconds (ncu's names, and the usual short ones).
UNITS = {
    "byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12,
    "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
    "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40,
    "nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9,
    "ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9,
    "cycle": 1, "": 1,
}


def _printed(value: str) -> str | None:
    """ncu's printed value without its thousands separators; None where it printed no number (``"n/a"``,
    empty, ``"-"``)."""
    text = str(value).strip().replace(",", "")
    return None if text.lower() in ("", "n/a", "na", "nan", "-") else text


def to_base_units(value: str, unit: str) -> float | None:
    """``"1,234.5", "Kbyte"`` -> 1234500.0 bytes; ``"n/a"`` or empty -> None. Unknown units raise."""
    text = _printed(value)
    if text is None:
        return None
    key = str(unit).strip().lower()
    if key not in UNITS:
        raise ValueError(f"unknown ncu unit {unit!r} (value {value!r}); known: {sorted(k for k in UNITS if k)}")
    return float(text) * UNITS[key]


def _number(value: str) -> float | None:
    """ncu's printed number (``"1,234.5"``) as a float in its own unit; None where it printed none, or a word."""
    text = _printed(value)
    try:
        return None if text is None else float(text)
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> list[dict]:
    """Metric rows of ``ncu --csv`` output: ``[{id, kernel, metric, unit, value, raw_value, grid, block}]``.

    ncu prints ``==PROF==`` (and ``==WARNING==``, ``==ERROR==``) lines, and the profiled
    program prints its own; the CSV starts at the header line (``"ID",...``) and its rows
    are the lines that start with a double quote. ``value`` is in bytes or nanoseconds
    (:func:`to_base_units`) for the metrics of :data:`METRICS`; any other metric (a ``--section``'s, in percent,
    cycles or instructions) keeps ncu's number in ncu's unit, or None where it printed none. ``raw_value`` and
    ``unit`` as ncu printed them. No header: [].
    """
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith('"ID"')), None)
    if start is None:
        return []
    body = [lines[start].strip()] + [line.strip() for line in lines[start + 1:] if line.strip().startswith('"')]
    rows = []
    for record in csv.DictReader(io.StringIO("\n".join(body))):
        if not record.get("Metric Name"):
            continue
        raw, unit = record.get("Metric Value", ""), record.get("Metric Unit", "")
        if record["Metric Name"] in METRICS:
            value = to_base_units(raw, unit)
        else:
            value = _number(raw)
        rows.append(dict(id=int(record["ID"]), kernel=record.get("Kernel Name", ""),
                         metric=record["Metric Name"], unit=unit, value=value, raw_value=raw,
                         grid=record.get("Grid Size"), block=record.get("Block Size")))
    return rows


def kernel_key(name: str) -> str | None:
    """The short key ("fwd", "preprocess", "dkdv", "dq") of an ncu kernel name, None for another kernel."""
    words = name.split("(")[0].split()  # a demangled C++ name would read "void name(args)"
    return KERNELS.get(words[-1]) if words else None


def launches(rows: list[dict]) -> list[dict]:
    """One entry per profiled launch, in launch order: ``{id, kernel, key, grid, block, metrics}``
    with ``metrics`` named as in :data:`METRICS` (other metrics keep ncu's names)."""
    by_id: dict[int, dict] = {}
    for row in rows:
        entry = by_id.setdefault(row["id"], dict(id=row["id"], kernel=row["kernel"], key=kernel_key(row["kernel"]),
                                                 grid=row["grid"], block=row["block"], metrics={}))
        entry["metrics"][METRICS.get(row["metric"], row["metric"])] = row["value"]
    return [by_id[i] for i in sorted(by_id)]


def predicted_traffic(kernel: str, *, n: int, d: int, causal: bool, batch: int, heads: int,
                      blocks: tuple[int, int] | None, dtype_bytes: int = 2) -> io_model.Traffic:
    """io_model's bytes for one launch of ``kernel`` (an ncu name or a short key) on (batch, heads, n, d).

    ``blocks`` (BLOCK_M, BLOCK_N) of that kernel's launch: :func:`io_model.flash2_traffic` for
    the forward, :func:`io_model.flash2_backward_kernels` for the backward's kernels (the
    preprocess does not depend on them).
    """
    key = KERNELS.get(kernel, kernel)
    common = dict(causal=causal, batch=batch, heads=heads, dtype_bytes=dtype_bytes)
    if key == "fwd":
        return io_model.flash2_traffic(n, d, block_m=blocks[0], block_n=blocks[1], **common)
    if key in io_model.BACKWARD_KERNELS:
        per_kernel = {}
        if key in ("dkdv", "dq"):
            per_kernel[f"{key}_blocks"] = tuple(blocks)
        return io_model.flash2_backward_kernels(n, d, **per_kernel, **common)[key]
    raise ValueError(f"no io_model count for kernel {kernel!r}; known: {sorted(KERNELS)}")


def floor_traffic(kernel: str, *, n: int, d: int, causal: bool, batch: int, heads: int,
                  dtype_bytes: int = 2) -> io_model.Traffic:
    """The compulsory bytes of ``kernel``: its io_model count with blocks as long as the sequence
    (every operand read once, every output written once), the least DRAM traffic possible."""
    return predicted_traffic(kernel, n=n, d=d, causal=causal, batch=batch, heads=heads, blocks=(n, n),
                             dtype_bytes=dtype_bytes)


def _ratio(a, b):
    return None if a is None or not b else a / b


def _traffic_dict(t: io_model.Traffic) -> dict:
    return dict(reads=t.reads, writes=t.writes, total=t.total)


def compare(measured: dict, predicted: io_model.Traffic, floor: io_model.Traffic) -> dict:
    """Measured bytes (``dram_read``, ``dram_write``, ``l2``, ``duration_ns``) against the model:
    ``{measured, predicted, floor, ratio}`` with ``ratio`` = measured / predicted (total, reads,
    writes), L2 bytes / predicted, DRAM total / floor and the achieved DRAM rate in GB/s."""
    read, write = measured.get("dram_read"), measured.get("dram_write")
    dram = None if read is None or write is None else read + write
    ns = measured.get("duration_ns")
    return dict(
        measured=dict(measured, dram=dram),
        predicted=_traffic_dict(predicted), floor=_traffic_dict(floor),
        ratio=dict(dram_over_predicted=_ratio(dram, predicted.total),
                   reads_over_predicted=_ratio(read, predicted.reads),
                   writes_over_predicted=_ratio(write, predicted.writes),
                   l2_over_predicted=_ratio(measured.get("l2"), predicted.total),
                   dram_over_floor=_ratio(dram, floor.total)),
        dram_gb_per_s=_ratio(dram, ns),  # bytes per ns = GB/s
    )


# ---------------------------------------------------------------- stored results

ROW_FIELDS = ("D", "N", "causal", "batch", "heads", "dtype", "kernel", "key", "blocks", "predicted", "floor",
              "dram_read", "dram_write", "dram", "l2", "duration_ns", "ratio", "l2_ratio", "floor_ratio", "error")


def rows_of(data: dict) -> list[dict]:
    """One row per (point, kernel launch) of a results dict (``{"meta", "points"}``); a point that
    failed gives one row with ``error`` set. Ratios are computed here from the stored bytes."""
    rows = []
    for point in data.get("points", []):
        base = {f: point.get(f) for f in ("D", "N", "causal", "batch", "heads", "dtype")}
        if point.get("status") != "ok":
            rows.append({**{f: None for f in ROW_FIELDS}, **base,
                         "error": point.get("error") or point.get("status") or "no result"})
            continue
        for k in point.get("kernels", []):
            measured, predicted = k.get("measured", {}), (k.get("predicted") or {}).get("total")
            floor = (k.get("floor") or {}).get("total")
            read, write = measured.get("dram_read"), measured.get("dram_write")
            dram = None if read is None or write is None else read + write
            block = (point.get("blocks") or {}).get(k.get("key")) or {}
            blocks = f"{block['BLOCK_M']}x{block['BLOCK_N']}" if "BLOCK_N" in block else \
                str(block.get("BLOCK_M", "")) or None
            rows.append(dict(base, kernel=k.get("kernel"), key=k.get("key"), blocks=blocks, predicted=predicted,
                             floor=floor, dram_read=read, dram_write=write, dram=dram, l2=measured.get("l2"),
                             duration_ns=measured.get("duration_ns"), ratio=_ratio(dram, predicted),
                             l2_ratio=_ratio(measured.get("l2"), predicted), floor_ratio=_ratio(dram, floor),
                             error=None))
    return rows


def load_dram_report(path) -> tuple[dict, list[dict]]:
    """(meta, rows) of a file written by ``benchmarks/dram_bytes.py``: rows as :func:`rows_of`."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("meta"), dict) or not isinstance(data.get("points"),
                                                                                               list):
        raise ValueError(f"{path}: expected a dram_bytes results file, a JSON object with 'meta' and 'points'")
    return data["meta"], rows_of(data)


def _mb(x) -> str:
    return "-" if x is None else f"{x / 1e6:,.1f}"


def _x(x) -> str:
    return "-" if x is None else f"{x:.2f}"


TABLE_HEADER = ("D", "N", "causal", "kernel", "blocks", "predicted MB", "floor MB", "DRAM read MB",
                "DRAM write MB", "DRAM/predicted", "L2 MB", "L2/predicted", "time us")


def dram_table(rows: list[dict], markdown: bool = True) -> str:
    """Measured against predicted, one line per (point, kernel): a Markdown table (or aligned text).

    MB = 10^6 bytes; ratios to two decimals; a failed point shows its error in the kernel column.
    """
    body = []
    for r in rows:
        if r.get("error"):
            error = " ".join(str(r["error"]).replace("|", "/").split())[:120]
            body.append((str(r["D"]), str(r["N"]), str(r["causal"]), f"error: {error}",
                         *["-"] * (len(TABLE_HEADER) - 4)))
            continue
        body.append((str(r["D"]), str(r["N"]), str(r["causal"]), r["key"] or r["kernel"], r["blocks"] or "-",
                     _mb(r["predicted"]), _mb(r["floor"]), _mb(r["dram_read"]), _mb(r["dram_write"]),
                     _x(r["ratio"]), _mb(r["l2"]), _x(r["l2_ratio"]),
                     "-" if r["duration_ns"] is None else f"{r['duration_ns'] / 1e3:,.1f}"))
    if markdown:
        lines = ["| " + " | ".join(TABLE_HEADER) + " |", "|" + "|".join("---" for _ in TABLE_HEADER) + "|"]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(c[i]) for c in body)) if body else len(h) for i, h in enumerate(TABLE_HEADER)]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(cells, widths)) for cells in [TABLE_HEADER, *body])


__all__ = ["KERNELS", "METRICS", "UNITS", "to_base_units", "parse_ncu_csv", "kernel_key", "launches",
           "predicted_traffic", "floor_traffic", "compare", "ROW_FIELDS", "rows_of", "load_dram_report",
           "TABLE_HEADER", "dram_table"]
