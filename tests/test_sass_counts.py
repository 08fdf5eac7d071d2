"""benchmarks/sass_counts.py on the CPU machine: flashlib's forward compiled for the H100 (sm_90a) without a GPU.

Besides keeping the script working, this holds what the Hopper forward must compile to: tensor-core
``wgmma`` (``HGMMA``), tiles through the copy engine with host descriptors (``UTMALDG``), no spilled
registers in the 128 x 64 config at D = 64, and dropout's draws as extra integer work. The script runs in
a subprocess: it compiles real kernels, while this process has them in Triton's interpreter.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "sass_counts.py"
LINE = re.compile(r"^fwd D=64 causal=no dropout=(?P<p>[\d.]+) 128x64 s\d+ w\d+: (?P<total>\d+) instructions, "
                  r"registers (?P<regs>\d+), stack \d+ B \((?P<spills>\d+) STL/LDL, \d+ among the products\)")


def run_script(*args: str) -> subprocess.CompletedProcess:
    """The script in a process that compiles for the GPU (TRITON_INTERPRET=0), from the repository's root."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=600, cwd=SCRIPT.parents[1])


def test_the_hopper_forward_compiles_to_wgmma_and_tma_without_spills_and_dropout_adds_integer_work():
    done = run_script("--kernel", "fwd", "--d", "64", "--dropout", "0,0.1", "--top", "200")
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    lines = out.splitlines()
    found = {}
    for i, line in enumerate(lines):
        match = LINE.match(line)
        if match:
            opcodes = dict((op, int(n)) for op, n in re.findall(r"([A-Z][A-Z0-9_]*) (\d+)", lines[i + 1]))
            found[float(match["p"])] = (int(match["total"]), int(match["regs"]), int(match["spills"]), opcodes)
    assert set(found) == {0.0, 0.1}, out
    plain, dropout = found[0.0], found[0.1]
    for total, regs, spills, opcodes in (plain, dropout):
        assert opcodes.get("HGMMA", 0) > 0, "the dots must run on Hopper's wgmma tensor cores"
        assert opcodes.get("UTMALDG", 0) > 0, "K and V tiles must come through host tensor descriptors (TMA)"
        assert 0 < regs <= 255 and total == sum(opcodes.values())
    assert plain[2] == 0, "the plain forward at D = 64, 128 x 64 blocks, spills no register"
    assert dropout[0] > plain[0] and dropout[3].get("LOP3", 0) > plain[3].get("LOP3", 0)
    assert "('fwd', 64, 'no', 0.1," in out, "the two variants are compared"


def test_a_malformed_config_is_refused_with_its_text():
    done = run_script("--configs", "64by64")
    assert done.returncode == 2 and "64by64" in done.stderr and "BLOCK_MxBLOCK_N" in done.stderr


def _sass(*ops: str) -> str:
    return "\n".join(f"        /*{16 * i:04x}*/                   {op} ;" for i, op in enumerate(ops))


def test_spills_among_products_counts_only_those_between_a_regions_first_and_last_product():
    sys.path.insert(0, str(SCRIPT.parent))
    from sass_counts import spills_among_products

    entry = ["STL [R1], R3", "USETMAXREG.DEALLOC.CTAPOOL 0xf0", "LDL R6, [R1]"]  # handed to a partition: not counted
    consumer = ["HGMMA.64x128x16.F32", "FADD R1, R2, R3", "STL [R1+0x4], R9", "LDL R9, [R1+0x4]",
                "HGMMA.64x128x16.F32", "LDL R2, [R1]"]
    loader = ["USETMAXREG.DEALLOC.CTAPOOL 0x18", "LDL R2, [R1+0x8]", "UTMALDG.4D [UR8], [UR4]"]
    assert spills_among_products(_sass(*entry, *consumer, *loader)) == 2
    assert spills_among_products(_sass(*entry, "HGMMA.64x128x16.F32", "HGMMA.64x128x16.F32", *loader)) == 0
    # a spill between two products of different regions is no loop's: each region is counted on its own
    assert spills_among_products(_sass("HGMMA.64x128x16.F32", "USETMAXREG.TRY_ALLOC.CTAPOOL UP1, 0xf0",
                                       "STL [R1], R2", "HGMMA.64x128x16.F32")) == 0
    # FP8 products are QGMMA: a consumer's spills between them count too
    fp8_consumer = [line.replace("HGMMA.64x128x16.F32", "QGMMA.64x128x32.F32.E4M3.E4M3") for line in consumer]
    assert spills_among_products(_sass(*entry, *fp8_consumer, *loader)) == 2
