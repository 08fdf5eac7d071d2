"""flashlib.dram_report: ncu's CSV parsed (noise and scaled units included), the prediction of each
kernel from io_model, and a stored results file turned into ratios and a table."""
import json

import pytest

from flashlib import dram_report, io_model

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def csv_row(launch, kernel, metric, unit, value, grid="(128, 512, 1)", block="(128, 1, 1)"):
    return (f'"{launch}","4242","python3.12","127.0.0.1","{kernel}","1","7","{block}","{grid}","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"')


#: What ``ncu --csv`` prints around a profiled forward + backward: its own ==PROF== lines, the
#: program's output, and units scaled to each value's magnitude (no --print-units base).
CAPTURED = "\n".join([
    "==PROF== Connected to process 4242 (/usr/bin/python3.12)",
    "autotuning done",
    "==PROF== Profiling \"attention_fwd_kernel\": 0%....50%....100% - 3 passes",
    "==PROF== Profiling \"attention_bwd_preprocess_kernel\": 0%....50%....100% - 3 passes",
    "==PROF== Disconnected from process 4242",
    HEADER,
    csv_row(0, "attention_fwd_kernel", "dram__bytes_read.sum", "Mbyte", "201.33"),
    csv_row(0, "attention_fwd_kernel", "dram__bytes_write.sum", "Mbyte", "67.11"),
    csv_row(0, "attention_fwd_kernel", "gpu__time_duration.sum", "usecond", "1,234.50"),
    csv_row(0, "attention_fwd_kernel", "lts__t_bytes.sum", "Gbyte", "1.61"),
    "==WARNING== a warning ncu printed between rows",
    csv_row(1, "attention_bwd_preprocess_kernel", "dram__bytes_read.sum", "byte", "134,217,728"),
    csv_row(1, "attention_bwd_preprocess_kernel", "dram__bytes_write.sum", "Kbyte", "512.00"),
    csv_row(1, "attention_bwd_preprocess_kernel", "gpu__time_duration.sum", "msecond", "0.05"),
    csv_row(1, "attention_bwd_preprocess_kernel", "lts__t_bytes.sum", "byte", "n/a"),
    "",
])


def test_to_base_units():
    assert dram_report.to_base_units("1,234.5", "Kbyte") == pytest.approx(1_234_500)
    assert dram_report.to_base_units("2", "Gbyte") == 2e9
    assert dram_report.to_base_units("3", "usecond") == 3000
    assert dram_report.to_base_units("1", "MiB") == 2 ** 20
    assert dram_report.to_base_units("n/a", "byte") is None
    with pytest.raises(ValueError, match="unknown ncu unit 'furlong'"):
        dram_report.to_base_units("1", "furlong")


def test_parse_ncu_csv_skips_noise_and_converts_units():
    rows = dram_report.parse_ncu_csv(CAPTURED)
    assert len(rows) == 8
    fwd = {r["metric"]: r["value"] for r in rows if r["id"] == 0}
    assert fwd == pytest.approx({"dram__bytes_read.sum": 201.33e6, "dram__bytes_write.sum": 67.11e6,
                                 "gpu__time_duration.sum": 1_234_500, "lts__t_bytes.sum": 1.61e9})
    first = rows[0]
    assert (first["kernel"], first["unit"], first["raw_value"], first["grid"]) == (
        "attention_fwd_kernel", "Mbyte", "201.33", "(128, 512, 1)")

    launches = dram_report.launches(rows)
    assert [(x["id"], x["key"]) for x in launches] == [(0, "fwd"), (1, "preprocess")]
    assert launches[1]["metrics"] == {"dram_read": 134_217_728, "dram_write": 512_000, "duration_ns": 50_000,
                                      "l2": None}
    assert dram_report.parse_ncu_csv("==PROF== Disconnected from process 1\n==ERROR== ERR_NVGPUCTRPERM\n") == []


def test_parse_ncu_csv_keeps_other_metrics_in_their_own_units():
    """Metrics outside METRICS (a ``--section``'s: percent, cycles, words) keep ncu's number in ncu's unit; only
    the DRAM metrics are converted, and those still refuse a unit they do not know."""
    text = "\n".join([
        HEADER,
        csv_row(3, "attention_bwd_dkdv_hopper_kernel", "Warp Cycles Per Issued Instruction", "cycle", "1,210.5"),
        csv_row(3, "attention_bwd_dkdv_hopper_kernel", "Issue Slots Busy", "%", "23.4"),
        csv_row(3, "attention_bwd_dkdv_hopper_kernel", "Scheduler Note", "", "n/a"),
        csv_row(3, "attention_bwd_dkdv_hopper_kernel", "dram__bytes_read.sum", "Kbyte", "2"),
    ])
    rows = dram_report.parse_ncu_csv(text)
    assert [(r["metric"], r["unit"], r["value"]) for r in rows] == [
        ("Warp Cycles Per Issued Instruction", "cycle", 1210.5), ("Issue Slots Busy", "%", 23.4),
        ("Scheduler Note", "", None), ("dram__bytes_read.sum", "Kbyte", 2000.0)]
    with pytest.raises(ValueError, match="unknown ncu unit 'furlong'"):
        dram_report.parse_ncu_csv("\n".join([HEADER, csv_row(0, "k", "dram__bytes_read.sum", "furlong", "1")]))


def test_kernel_key():
    assert dram_report.kernel_key("attention_bwd_dq_kernel") == "dq"
    assert dram_report.kernel_key("void attention_bwd_dkdv_kernel(int)") == "dkdv"
    assert dram_report.kernel_key("elementwise_kernel") is None


def test_predictions_are_io_models_count_at_each_kernels_blocks():
    shape = dict(n=4096, d=64, causal=True, batch=4, heads=32)
    fwd = dram_report.predicted_traffic("attention_fwd_kernel", blocks=(128, 64), **shape)
    assert fwd == io_model.flash2_traffic(4096, 64, block_m=128, block_n=64, causal=True, batch=4, heads=32)
    bwd = io_model.flash2_backward_kernels(4096, 64, dkdv_blocks=(64, 128), dq_blocks=(128, 32), causal=True,
                                           batch=4, heads=32)
    assert dram_report.predicted_traffic("dkdv", blocks=(64, 128), **shape) == bwd["dkdv"]
    assert dram_report.predicted_traffic("dq", blocks=(128, 32), **shape) == bwd["dq"]
    assert dram_report.predicted_traffic("preprocess", blocks=None, **shape) == bwd["preprocess"]
    # the floor: every operand once. Forward: Q, K, V read; O and L written.
    tensor = 4 * 32 * 4096 * 64 * 2
    floor = dram_report.floor_traffic("fwd", **shape)
    assert (floor.reads, floor.writes) == (3 * tensor, tensor + 4 * 32 * 4096 * 4)
    with pytest.raises(ValueError, match="no io_model count"):
        dram_report.predicted_traffic("softmax", blocks=(64, 64), **shape)


def test_compare():
    c = dram_report.compare(dict(dram_read=150e6, dram_write=50e6, l2=400e6, duration_ns=100e3),
                            io_model.Traffic(100_000_000, 100_000_000), io_model.Traffic(80_000_000, 20_000_000))
    assert c["measured"]["dram"] == 200e6
    assert c["ratio"] == pytest.approx(dict(dram_over_predicted=1.0, reads_over_predicted=1.5,
                                            writes_over_predicted=0.5, l2_over_predicted=2.0, dram_over_floor=2.0))
    assert c["dram_gb_per_s"] == pytest.approx(2000)  # 200 MB in 100 us
    assert c["predicted"] == dict(reads=100_000_000, writes=100_000_000, total=200_000_000)


SYNTHETIC = {
    "meta": {"gpu": {"name": "NVIDIA H100 80GB HBM3"}, "ncu_version": "Version 2025.1.0.0", "command": "x"},
    "points": [
        {"D": 64, "N": 1024, "causal": False, "batch": 16, "heads": 32, "dtype": "fp16", "status": "ok",
         "blocks": {"fwd": {"BLOCK_M": 128, "BLOCK_N": 64}, "preprocess": {"BLOCK_M": 64}},
         "kernels": [
             {"kernel": "attention_fwd_kernel", "key": "fwd",
              "measured": {"dram_read": 120e6, "dram_write": 30e6, "l2": 250e6, "duration_ns": 75_000},
              "predicted": {"reads": 80e6, "writes": 20e6, "total": 100e6},
              "floor": {"reads": 60e6, "writes": 15e6, "total": 75e6}},
             {"kernel": "attention_bwd_preprocess_kernel", "key": "preprocess",
              "measured": {"dram_read": 10e6, "dram_write": None, "l2": None, "duration_ns": None},
              "predicted": {"reads": 10e6, "writes": 1e6, "total": 11e6},
              "floor": {"reads": 10e6, "writes": 1e6, "total": 11e6}},
         ]},
        {"D": 128, "N": 1024, "causal": True, "batch": 16, "heads": 16, "dtype": "fp16", "status": "error",
         "error": "ERR_NVGPUCTRPERM: ncu may not | read the counters\nmore"},
    ],
}


def test_load_dram_report_rows_and_table(tmp_path):
    path = tmp_path / "dram_bytes_test.json"
    path.write_text(json.dumps(SYNTHETIC))
    meta, rows = dram_report.load_dram_report(path)
    assert meta["ncu_version"] == "Version 2025.1.0.0"
    assert len(rows) == 3
    fwd, pre, err = rows
    assert (fwd["kernel"], fwd["blocks"], fwd["dram"]) == ("attention_fwd_kernel", "128x64", 150e6)
    assert fwd["ratio"] == pytest.approx(1.5)
    assert fwd["l2_ratio"] == pytest.approx(2.5)
    assert fwd["floor_ratio"] == pytest.approx(2.0)
    assert (pre["blocks"], pre["dram"], pre["ratio"]) == ("64", None, None)  # a metric ncu did not give
    assert err["kernel"] is None and err["error"].startswith("ERR_NVGPUCTRPERM")

    table = dram_report.dram_table(rows).splitlines()
    assert table[0] == "| " + " | ".join(dram_report.TABLE_HEADER) + " |"
    assert table[2] == ("| 64 | 1024 | False | fwd | 128x64 | 100.0 | 75.0 | 120.0 | 30.0 | 1.50 | 250.0 | 2.50 "
                        "| 75.0 |")
    assert table[3] == "| 64 | 1024 | False | preprocess | 64 | 11.0 | 11.0 | 10.0 | - | - | - | - | - |"
    assert table[4].startswith("| 128 | 1024 | True | error: ERR_NVGPUCTRPERM: ncu may not / read the counters more |")
    text = dram_report.dram_table(rows, markdown=False).splitlines()
    assert text[0].split()[:3] == ["D", "N", "causal"] and "1.50" in text[1]


def test_load_dram_report_refuses_another_file(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"meta": {}, "rows": []}))
    with pytest.raises(ValueError, match="expected a dram_bytes results file"):
        dram_report.load_dram_report(path)
