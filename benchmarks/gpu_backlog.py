"""What no GPU has run yet, in a few device calls of at most 600 s each.

Sessions 46 to 48 were lent no GPU. Their changes to the Hopper kernels were compiled for sm_90a
(``benchmarks/sass_counts.py`` with Triton 3.6) and their Triton parts tested in the interpreter, but nothing
ran on a GPU: not the Gluon FP8 forward, not dropout's 1 / (1 - p) out of the Gluon backward (a default route),
not the operands held in registers, not the forward-mode (JVP) kernel. This script is what the next session lent
an ``nvidia-h200`` runs first, one stage per call, from the repository root:

    PYTHONPATH=.:benchmarks:tests python3 benchmarks/gpu_backlog.py tests   --out $OUT
    PYTHONPATH=.:benchmarks:tests python3 benchmarks/gpu_backlog.py timings --out $OUT
    python3 benchmarks/gpu_backlog.py summary --out DIR   (here, on the fetched logs: what they decide)
    PYTHONPATH=.:benchmarks:tests python3 benchmarks/gpu_backlog.py grid    --out $OUT
    PYTHONPATH=.:benchmarks:tests python3 benchmarks/gpu_backlog.py extras  --out $OUT   (issue 13's open rows)

A machine left idle for 30 s is given back and the next call pays a new start (about 95 s), so each stage fills
one call. Each step runs in its own process under its own time limit; one that overruns is stopped (the rows it
printed stay in its log: the A/B scripts print each row as a JSON line when measured) and the next starts. Each
step writes one log under ``--out``, headed by the GPU, the versions, the date and the command, which is what
``benchmarks/results/`` stores. A call brings back at most 8 files, so a stage has at most 8 steps.

Session 49 ran the tests stage on an H200 (benchmarks/results/gpu_backlog_tests_2026-12-05_session49_nvidia_h200.log:
no test failed; 25 of the changed kernels' 194 GPU tests were cut by the time limit), then lending paused. The next
session lent a GPU runs ``timings``, ``grid`` and ``extras``, and ``tests`` again if a call is left
(``--steps gpu_tests``: the unreached 25 are not named in that log). ``--steps`` runs part of a stage when less
device time is left than the whole needs.

Session 52 was lent an H100 at last: the ``timings`` stage's checks all passed, and a second call on the warm
machine timed the FP8, dQ and dK/dV A/Bs (benchmarks/results/gluon_*_session52_*.log; TUNING.md forty-first finding:
FP8_HEAD_DIMS = (128,), nothing else changes). The next session runs ``timings_rest`` (dropout's backward and the
16-bit forward's Q in registers, with limits a cold machine needs), then ``grid``, ``extras`` and ``tests``.

Session 53 (an H100) ran ``timings_rest``, ``grid``, ``extras`` and ``tests --steps gpu_tests`` (187 of 194 passed,
none failed; TUNING.md forty-second finding: Q_IN_REGISTERS_HEAD_DIMS = (64,)). The next session runs ``recheck``:
the grid's slow N = 1024 points at D = 128 again in a fresh process, the forward autotuner's picks there, and the
rest of the GPU suite.

Session 54 was lent no GPU. It made flashlib's Transformers attention compile to one graph with padding (decoding
steps included) and added ``hf``: Transformers' ``generate`` on flashlib against sdpa, eager and with the static
cache's CUDA-graph steps (benchmarks/hf_generate.py). The next session runs ``recheck``, then ``hf``.

Session 55 (an H100) ran ``recheck`` (TUNING.md forty-third finding: session 53's slow N = 1024 points did not come
back; two Transformers GPU tests failed on torch 2.11's Dynamo, fixed, and the suite's rest passed) and ``hf``
(forty-fourth finding: a static cache's CUDA-graph steps 1.06x sdpa's tokens/s; eager steps with a dynamic cache
0.49x, which the session then changed, unmeasured, to take the split-KV kernel with no host read). The next session
runs ``hf`` again (now with the Transformers GPU tests as its second step).

Session 56 made the layers of an eager forward share what they derive from the padding mask (``flashlib.hf``'s
padding plan: the lengths, the tokens' order, the block table, a sliding window's padding check); ``hf`` now also
times the eager steps with a plan made in every layer (``hf_generate.py --plan-per-layer``). Measured (TUNING.md
forty-fifth finding): 0.81x sdpa's eager tokens/s on an H200, 0.76x on an H100; ``hf_host`` then timed a layer's
parts and one split's GPU cost (1.16x sdpa on a slower host: the eager ratio is the host's).

Session 57 (an H100) changed how the Gluon kernels draw and apply dropout and ran ``dropout_words`` (correct; the
tree before against after in one call), ``dropout_routes``, ``dropout_routes_rest`` and ``dropout_routed`` (the
Gluon routes with dropout widened to head_dim 64 and to the causal forward; TUNING.md forty-sixth finding), then
``causal_short`` (64-key blocks do not help the plain causal forward at N = 1024; forty-seventh). Then an eager
decoding layer went straight to the split-KV entry (forty-eighth, measured on the CPU only).

Session 58 (an H100) ran ``hf_fast`` (eager generate 0.78x sdpa; fifty-first finding) and ``bwd_split`` (the dK/dV
kernel runs its products 13-16% slower than the dQ kernel; fiftieth), after an atomic-dQ backward (forty-ninth) and
a reordered dK/dV step (fiftieth) lost and were reverted. Queued: ``hf_order`` (the eager layer's routes timed in
rotated orders) and ``bwd_counters`` (Nsight Compute's sections of the two backward kernels).

Session 59 (an H100) ran ``bwd_counters`` (the dK/dV kernel's tensor pipe 69% busy against the dQ kernel's 85%,
twice its long-scoreboard stalls: its per-step loads of L and D) and two dK/dV experiments: its consumers taking
turns (0.98-1.02x, reverted with its stage) and L and D staged in shared memory by the loading warp (2-13% faster,
kept; TUNING.md fifty-second finding). Queued: ``bwd_gpu_tests`` (the backward's GPU tests on the kept path),
``dkdv_d64_route`` (whether the Gluon dK/dV kernel now wins at D = 64), ``dkdv_stages`` (a third Q/dO slot), then
``hf_order``.

Session 66 (four H100s) ran the whole GPU suite in one call (385 of 388 passed, 2 out of memory beside 15 workers,
which pass alone), ``dq_routes`` (the Gluon dQ routes hold), ``dropout_split`` and a 20-point grid whose N = 1024
lows at D = 128 a probe traced to the eager backward's host time (TUNING.md fifty-ninth finding). Queued:
``gluon_launch`` (the Gluon kernels from the compiled-binary cache: bitwise test, then host time with and without),
then the GPU suite again with the allocator released after each test.

Session 67 (one H100) ran ``gluon_launch`` (tests passed; an eager backward's host time 0.75-0.84x from the cache,
so ``launch.GLUON_DESCRIPTORS`` is on), ``causal64_capped`` (the capped forward config in causal grids: no gain in
the grid, reverted), the GPU suite (388 passed, no out-of-memory) and the grid again (TUNING.md sixtieth finding).
Queued: ``draws_ahead`` (the dK/dV and dQ kernels' dropout draws a step ahead: bitwise test, then timed),
``backward_host`` (where an eager backward's host time goes), and ``suite`` on the next tree that changes a kernel.

Session 68 (one H100, after eight calls found no machine) ran ``three_consumers`` (the Gluon forward with three
consumer warpgroups: correct, 1.05-1.09x at 16k without a mask, 0.95x at 1k, causal 0.55x at 1k and 0.93x at 4k:
off) and
``draws_ahead`` (bitwise equal, no faster: off; the call's limit cut its timings after five points; TUNING.md
sixty-second and sixty-third findings). Queued: ``relative_mask`` (the Gluon forward's masked blocks with one
compare a score, on branch session68-relative-mask: merge it, put the tree before in .old, carry it), then
``backward_host`` and ``suite``.

Session 69 (one H100) ran ``relative_mask`` (tests passed; causal 1.03x at D = 128, N = 1k and 1.08x at D = 64, N =
1k, the rest within noise (0.98-1.01x): kept on main; the call's limit stopped the tree before after 8 of 12
points), ``backward_host`` (no one function: 500-800 Python calls a backward), ``suite`` (408 GPU tests passed; 6
CPU-only modules could not be collected without nbformat and pyflakes) and the three consumers at 2k-16k (TUNING.md
sixty-fifth to sixty-seventh findings): head_dim 64's unmasked forward from 8k rows now takes three consumers
without turns, and its causal forward from 4k rows the two-consumer Gluon forward (sixty-eighth). Queued:
``three_consumers_route`` (both routes' GPU tests through the front door, then the D = 64 grid).

The grid measures the forward and backward with the settings the timings decide. A machine is given back 30 s
after a call, too soon to edit those settings by hand between the two calls, so the timings call also copies its
logs to ``build/backlog`` (ignored by git, so kept on the machine between calls) and the grid call first writes
their settings into its own copy of the tree:

    ... gpu_backlog.py timings --out $OUT && mkdir -p build/backlog && cp $OUT/*.log build/backlog/
    python3 benchmarks/gpu_backlog.py apply --out build/backlog; ... gpu_backlog.py grid --out $OUT

and here ``apply --out DIR`` on the fetched logs writes the same values (their comments are a person's job).

``--dry-run`` runs nothing: it checks that every step's files exist and that its script's parser takes its
arguments (tests/test_gpu_backlog.py does so on the CPU), so that a renamed option cannot cost a GPU call.
"""
from __future__ import annotations

import argparse
import ast
import datetime
import importlib
import inspect
import json
import re
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: A call's limit (600 s) less the process starts, the headers and the copy of --out.
STAGE_BUDGET_S = 570

#: Where the GPU tests of the kernels changed since the last GPU run live (session 45 ran them at 3e88d66;
#: the JVP kernel is new in session 48).
CHANGED_KERNEL_TESTS = ("tests/test_fp8.py", "tests/kernels/test_attention_fwd_hopper.py",
                        "tests/kernels/test_attention_bwd_hopper.py", "tests/kernels/test_attention_jvp.py",
                        "tests/kernels/test_score_modifiers.py", "tests/test_ops.py")

FA2_N = "1024,4096,16384"

#: A test marked for the GPU: the decorator at the start of a line.
GPU_MARK = re.compile(r"^\s*@pytest\.mark\.gpu\b", re.MULTILINE)


def other_gpu_tests() -> tuple:
    """Every other test file with GPU tests (as ``make test-gpu`` finds them), so that a tests stage runs them all."""
    found = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").rglob("test_*.py")
                   if GPU_MARK.search(path.read_text()))
    return tuple(path for path in found if path not in CHANGED_KERNEL_TESTS)


@dataclass(frozen=True)
class Step:
    """One process of a stage: ``argv`` after ``python3``, run under ``limit_s``; ``decides`` says what its
    numbers settle, so the session that reads them knows what to change."""
    name: str
    limit_s: int
    argv: tuple
    decides: str
    #: The step's PYTHONPATH: the tree's own flashlib unless a step times another copy, a folder of the tree holding
    #: ``flashlib/`` of an earlier commit (``.old``, ignored by git: ``mkdir -p .old && git archive COMMIT flashlib |
    #: tar -x -C .old`` here, and ``carry`` it to the device). :func:`run_step` refuses to run without it, since the
    #: tree's own flashlib would then be timed under the other's name.
    pythonpath: str = ".:benchmarks:tests"


def gpu_pytest(*args: str, workers: int | None = 8, verbose: bool = False, worksteal: bool = False) -> tuple:
    """A step's argv for pytest over the GPU-marked tests of ``args`` (files and options such as ``-k``), with
    ``workers`` pytest-xdist workers (None: one process; ``worksteal``: idle workers take queued tests), quiet or
    ``verbose`` (each outcome named as it ends, so a step cut short still says what passed), no cache, skips reported
    with their reasons."""
    return (("-m", "pytest", "-v" if verbose else "-q", "-m", "gpu") + (("-n", str(workers)) if workers else ())
            + (("--dist", "worksteal") if worksteal else ()) + ("-p", "no:cacheprovider", "-rs") + args)


#: The PYTHONPATH entries that are the tree itself; any other must hold a copy of flashlib (:attr:`Step.pythonpath`).
TREE_PATHS = (".", "benchmarks", "tests")


def missing_copies(step: Step) -> list:
    """The entries of the step's PYTHONPATH that should hold another commit's flashlib and do not."""
    return [entry for entry in step.pythonpath.split(":")
            if entry not in TREE_PATHS and not (ROOT / entry / "flashlib" / "__init__.py").exists()]


STAGES = {
    "tests": (
        # Session 49 (H200, cold caches): the first step ran 169 of its 194 tests in 260 s, the second all of its
        # 174 in 210 s; hence 310 / 250, and -v, so that a step cut short still names each test that passed.
        Step("gpu_tests", 310,
             gpu_pytest(*CHANGED_KERNEL_TESTS, workers=12, verbose=True),
             "whether sessions 46-48's kernels are correct on the GPU: the Gluon FP8 forward with P through shared "
             "memory and Q in registers, the register operands of the Gluon backward, dropout's 1 / (1 - p) in the "
             "epilogues, the forward-mode (JVP) kernel. A failure here comes before any timing."),
        Step("gpu_tests_rest", 250,
             gpu_pytest(*other_gpu_tests(), workers=16, worksteal=True),
             "the rest of the GPU suite (decoding, front door, model, bench, distributed): nothing there changed "
             "since session 45, so a failure here is the GPU machine's or an older bug's"),
    ),
    "timings": (
        Step("gluon_fp8_ab", 150,
             ("benchmarks/gluon_fp8_ab.py", "--d", "128,64", "--N", FA2_N),
             "attention_fwd_hopper.FP8_HEAD_DIMS (route FP8 through Gluon where it beats the Triton FP8 forward; "
             "expected (128,)), FP8_WEIGHTS_SHARED and FP8_Q_IN_REGISTERS (keep the faster placement), and issue "
             "14's FP8 >= 1.4x the 16-bit forward at N >= 4k, D = 128 (thirty-eighth and fortieth findings)"),
        Step("gluon_dq_ab", 110,
             ("benchmarks/gluon_dq_ab.py", "--dtype", "fp16", "--d", "128,64", "--N", FA2_N),
             "attention_bwd_hopper.DQ_REGISTER_OPERANDS: a head dim goes in where 'dq regs/shared' > 1 at every N "
             "(thirty-ninth finding)"),
        Step("gluon_bwd_ab", 70,
             ("benchmarks/gluon_bwd_ab.py", "--dtype", "fp16", "--d", "64", "--N", FA2_N),
             "attention_bwd_hopper.DKDV_REGISTER_OPERANDS at D = 64, and whether the Gluon dK/dV kernel, with its "
             "operands in registers, should take D = 64 from the Triton one (thirty-ninth finding)"),
        Step("gluon_dropout_ab", 140,
             ("benchmarks/gluon_dropout_ab.py", "--dtype", "fp16", "--d", "128,64", "--N", FA2_N,
              "--parts", "bwd", "--routes", "plain,gluon,triton"),
             "issue 13's dropout cost after the thirty-seventh finding (1.17-1.27x the plain backward before it; the "
             "target is <= 1.15x)"),
        Step("gluon_fwd_ab", 90,
             ("benchmarks/gluon_fwd_ab.py", "--dtype", "fp16", "--d", "128,64", "--N", FA2_N, "--no-checks"),
             "attention_fwd_hopper.Q_IN_REGISTERS_HEAD_DIMS for 16-bit inputs: a head dim goes in where "
             "'qregs/qshared' > 1 at every N (fortieth finding)"),
    ),
    "extras": (
        Step("gluon_dropout_m32", 200,
             ("benchmarks/gluon_dropout_ab.py", "--dtype", "fp16,bf16", "--d", "128", "--N", FA2_N, "--parts", "bwd",
              "--routes", "plain,gluon", "--bwd-configs", "m32=128:32,64,2"),
             "whether the Gluon dK/dV kernel with dropout wants 32 query rows a step at D = 128 (no spills there, 136 "
             "spill instructions with 64; thirty-fifth finding): a dropout config of its own where 'bwd_gluon_m32' "
             "beats 'bwd_gluon' at every point"),
        Step("front_door_dropout", 300,
             ("benchmarks/front_door.py", "--sections", "train,modifiers", "--train-dropout", "0.1"),
             "issue 13 through the front door: the eager training step at N = 512 with dropout 0.1 against SDPA "
             "flash with the same dropout, and each score modifier's cost (dropout, softcap, ALiBi) over the plain "
             "call, after the thirty-fifth and thirty-seventh findings"),
    ),
    "grid": (
        Step("hopper_grid", 560,
             ("-m", "flashlib.bench", "--mode", "fwd,bwd", "--dtype", "fp16,bf16", "--d", "128,64", "--N", FA2_N,
              "--causal", "both", "--impl", "flashlib,sdpa_cudnn", "--no-ceilings", "--time-budget", "500",
              "--out", "{out}/hopper_grid"),
             "issue 14's closing ratios against cuDNN, forward and backward, after the tuples above are set"),
    ),
}

# Session 52 (a cold H100): the timings stage's steps ran their checks (all passed) and ran out of their limits
# compiling; a second call on the warm machine timed gluon_fp8_ab, gluon_dq_ab and gluon_bwd_ab (forty-first
# finding). What is left, with the limits a cold machine needs (compiling took 100-150 s a script):
_REST_LIMITS = {"gluon_dropout_ab": 320, "gluon_fwd_ab": 240}
STAGES["timings_rest"] = tuple(replace(step, limit_s=_REST_LIMITS[step.name]) for step in STAGES["timings"]
                               if step.name in _REST_LIMITS)

# Session 53 (an H100) ran timings_rest, grid, extras and tests' first step (forty-second finding). Left: three N = 1024
# points of the grid at D = 128 ran 0.30-0.69x cuDNN where the same kernels' A/B run (CUDA graphs), minutes earlier,
# was level with it: most likely that host's time per eager call; and the rest of the GPU suite. Whether a fresh
# process repeats them, and whether the forward's autotuner picks differ from run to run there (each pick scored by
# every config's time in a CUDA graph):
STAGES["recheck"] = (
    Step("grid_n1024", 150,
         ("-m", "flashlib.bench", "--mode", "fwd,bwd", "--dtype", "fp16,bf16", "--d", "128", "--N", "1024",
          "--causal", "both", "--impl", "flashlib,sdpa_cudnn", "--no-ceilings", "--out", "{out}/grid_n1024"),
         "whether session 53's slow N = 1024 points at D = 128 (fwd fp16 causal 0.30x cuDNN, bf16 causal 0.54x, bf16 "
         "0.69x) come back in a fresh process: an outlier of that run, or a pick of the autotuner"),
    Step("autotune_spread_n1024", 170,
         ("benchmarks/autotune_spread.py", "--kernels", "fwd", "--d", "128", "--N", "1024", "--causal", "both",
          "--repeats", "3", "--time-budget", "150", "--out", "{out}"),
         "how far the forward autotuner's picks at D = 128, N = 1024 land from the best config, run to run: a fixed "
         "config or another benchmarker for short sequences if the picks scatter"),
    replace(STAGES["tests"][1], limit_s=250),
)

# Session 54 (no GPU lent) made flashlib's Transformers attention compile to one graph with padding, decoding steps
# included, a static cache's steps with sdpa's mask of one shape. What that buys in generation, on the H100:
STAGES["hf"] = (
    Step("hf_generate", 420, ("benchmarks/hf_generate.py", "--plan-per-layer", "--out", "{out}/hf_generate.json"),
         "whether flashlib's Transformers attention keeps up with sdpa's in generation: tokens/s of a Llama (8 layers, "
         "head_dim 128, GQA 4, bf16, 8 left-padded prompts of 256-512 tokens, 128 new) with eager steps (dynamic "
         "cache) and with the CUDA-graph steps that generate compiles for a static cache; a static cache far below "
         "sdpa's would say the compiled step still breaks or recompiles"),
    # Session 55 (an H100): eager steps ran at 0.49x sdpa's tokens/s; then every decoding step took the split-KV
    # kernel with no host read, unmeasured, and a GPU test of that (CUDA's sync debug mode) has not run yet
    Step("hf_gpu_tests", 150,
         gpu_pytest("tests/test_hf.py", workers=None, verbose=True),
         "whether Transformers models on flashlib pass on the GPU's torch (2.11 there, 2.13 on the CPU: Dynamo "
         "differs), the new test_gpu_eager_decoding_step_reads_nothing_on_the_host among them"),
)

# Session 56 (an H200, then an H100): eager steps 0.76-0.81x sdpa's tokens/s with one padding plan a forward; a layer
# costs 198 us of host time against sdpa's 74, 70 of them the split-KV launcher's two launches. Then the one-query
# step's masked_fill went into the lengths; what one split (no merge launch) would cost the GPU. Ran in session 56
STAGES["hf_host"] = (
    Step("launch_host_time_hf", 150, ("benchmarks/launch_host_time.py", "--hf"),
         "where an eager decoding layer's host time goes now (flashlib's layer against sdpa's, and its parts), and the "
         "GPU time of the split-KV call with one split against the kernel's own split count: whether an eager step "
         "that the host bounds should take one split"),
    Step("hf_generate_dynamic", 150, ("benchmarks/hf_generate.py", "--caches", "dynamic", "--out",
                                      "{out}/hf_generate_dynamic.json"),
         "eager generate's tokens/s against sdpa's after the masked_fill went into the lengths (0.76x on the H100)"),
)

# Session 57 (no GPU yet): dropout's draws compared four to a word, and the weights P V and dV take zeroed as they are
# packed to 16 bits (a byte permute and an AND a pair) instead of a select the compiler moved past the packing; the
# dK/dV kernel keeps 8 words a block across its products instead of 32 flags. Compiled (Triton 3.6, sm_90a), the
# unmasked block loop at head_dim 128 with dropout: forward 962 -> 805 instructions (503 without dropout), dK/dV
# 653 -> 579 (366). Correct, and what it buys, against the tree before it (``.old``: ``mkdir -p .old && git archive
# 25ba015 flashlib | tar -x -C .old`` here, then the call carries ``.old``):
DROPOUT_AB = ("benchmarks/gluon_dropout_ab.py", "--dtype", "fp16", "--d", "128", "--N", FA2_N, "--parts", "fwd,bwd",
              "--routes", "plain,gluon")
STAGES["dropout_words"] = (
    Step("dropout_gpu_tests", 200,
         gpu_pytest("-k", "dropout", "tests/kernels/test_attention_fwd_hopper.py",
                    "tests/kernels/test_attention_bwd_hopper.py", "tests/kernels/test_score_modifiers.py",
                    verbose=True),
         "whether the Gluon kernels' new dropout path drops exactly the Triton kernels' weights (forward against "
         "float64 with dropout_mask's mask and against the Triton forward; gradients against float64)"),
    Step("gluon_dropout_words", 170, DROPOUT_AB,
         "issue 13's dropout cost with the word compare and the packed zeroing: fwd_gluon/plain and bwd_gluon/plain "
         "(1.18-1.24x the plain backward at D = 128 before, session 53; target <= 1.15x)"),
    Step("gluon_dropout_before", 170, DROPOUT_AB,
         "the same ratios from the commit before the change, in the same call", pythonpath=".old:benchmarks:tests"),
)

# Ran (H100, session 57): the dropout GPU tests pass (26), and the Gluon forward with dropout takes 1.16-1.19x the plain
# one without a mask (was 1.24-1.28), the backward 1.15-1.19x (was 1.18-1.25). Where the routes should go now: the
# causal forward with dropout (Triton's kernel, DROPOUT_CAUSAL), head_dim 64 (Triton's kernels, DROPOUT_HEAD_DIMS):
STAGES["dropout_routes"] = (
    Step("gluon_dropout_routes", 330,
         ("benchmarks/gluon_dropout_ab.py", "--dtype", "fp16", "--d", "128,64", "--N", FA2_N, "--parts", "fwd,bwd",
          "--routes", "plain,gluon,triton"),
         "attention_fwd_hopper.DROPOUT_CAUSAL (the causal forward with dropout through Gluon where fwd_gluon beats "
         "fwd_triton at every N) and attention_bwd_hopper.DROPOUT_HEAD_DIMS (64 joins where bwd_gluon beats "
         "bwd_triton at every point)"),
    Step("gluon_dropout_bf16", 150,
         ("benchmarks/gluon_dropout_ab.py", "--dtype", "bf16", "--d", "128", "--N", FA2_N, "--parts", "fwd,bwd",
          "--routes", "plain,gluon"),
         "issue 13's dropout cost in bfloat16 at head_dim 128"),
)

# Ran (H100, session 57): at head_dim 128 the causal forward with dropout stays Triton's (Gluon 0.288 / 0.713 / 2.607 ms
# against 0.245 / 0.736 / 2.520 at N = 1k / 4k / 16k); head_dim 64 reached N = 1024 only (Gluon faster: forward 0.442
# against 0.488 ms, backward 1.450 against 1.480). The rest of head_dim 64, and the causal forward in 64-key blocks
# (the thirty-fifth finding's config for it, before the word compare):
STAGES["dropout_routes_rest"] = (
    Step("gluon_dropout_d64", 230,
         ("benchmarks/gluon_dropout_ab.py", "--dtype", "fp16", "--d", "64", "--N", "4096,16384", "--parts", "fwd,bwd",
          "--routes", "plain,gluon,triton"),
         "attention_bwd_hopper.DROPOUT_HEAD_DIMS: 64 joins where bwd_gluon beats bwd_triton at every N (with N = 1024 "
         "from gluon_dropout_routes); the forward with dropout at 64 likewise"),
    Step("gluon_dropout_causal_bn64", 170,
         ("benchmarks/gluon_dropout_ab.py", "--dtype", "fp16", "--d", "128", "--N", FA2_N, "--parts", "fwd",
          "--routes", "plain,gluon,triton", "--fwd-configs", "bn64s3=128:64,64,3;bn64s2=128:64,64,2"),
         "attention_fwd_hopper.DROPOUT_CAUSAL with a dropout config of 64-key blocks: where fwd_gluon_bn64* beats "
         "fwd_triton under the causal mask at every N"),
)

# Ran (H100, session 57): the Gluon kernels with dropout beat the Triton ones at head_dim 64 at every point measured
# (forward 0.86-0.91x their time, backward 0.95-0.98x) and, in 64-key blocks, the causal forward at 128 (0.91-0.98x);
# routed. The routes' GPU tests, and the one point left unmeasured (head_dim 64, causal, N = 1024; ran: the Gluon
# kernels lost there, so head_dim 64 takes them from 4096 rows, DROPOUT_MIN_ROWS):
STAGES["dropout_routed"] = (
    replace(STAGES["dropout_words"][0], name="dropout_routed_gpu_tests", limit_s=220,
            argv=STAGES["dropout_words"][0].argv + ("tests/test_ops.py",),
            decides="whether the Gluon dropout routes (head_dim 64, the causal forward's 64-key blocks at 128) are "
                    "correct on the GPU"),
    Step("gluon_dropout_d64_n1024", 150,
         ("benchmarks/gluon_dropout_ab.py", "--dtype", "fp16", "--d", "64", "--N", "1024", "--parts", "fwd,bwd",
          "--routes", "plain,gluon,triton"),
         "whether head_dim 64's causal calls with dropout at N = 1024 keep the Gluon route (fwd_gluon and bwd_gluon "
         "at most fwd_triton and bwd_triton)"),
)

# Issue 14's last forward miss: the causal forward at D = 128, N = 1024 runs 0.81x cuDNN (forty-third finding), in the
# Triton kernel (the Gluon one takes causal calls from 2048 rows: at 1024 it ran 0.96-0.98x the Triton one in 128-key
# blocks). With dropout the causal Gluon forward went from 1.30-1.36x to 1.10-1.30x its plain time in 64-key blocks
# (forty-sixth finding): a shorter diagonal block may help the plain causal forward at short N too.
STAGES["causal_short"] = (
    Step("gluon_fwd_causal_short", 200,
         ("benchmarks/gluon_fwd_ab.py", "--dtype", "fp16,bf16", "--d", "128", "--N", "1024,2048", "--no-checks",
          "--variants", "bn64s3=128:64,64,3;bn64s2=128:64,64,2"),
         "whether the causal Gluon forward in 64-key blocks beats the Triton forward (and how near cuDNN) at D = 128, "
         "N = 1024 and 2048: a causal config of its own and MIN_ROWS[128]'s causal rows 1024 where bn64*_tflops beats "
         "triton_tflops at both dtypes, its output within rounding of the Triton forward's (o_bn64*_vs_triton)"),
)

# Session 57, after its device time was spent: an eager decoding layer calls the split-KV entry straight, skipping
# flash_attention_with_kvcache's checks (a fifth less Python a layer on the CPU; TUNING.md forty-eighth finding).
# Ran (H100, session 58): eager generate 0.78x sdpa, the change's 2% not resolved (fifty-first finding).
STAGES["hf_fast"] = (
    replace(STAGES["hf_host"][0], limit_s=150,
            decides="the host time of an eager decoding layer's attention on the GPU after the direct split-KV call "
                    "(198 us against sdpa's 74 before it, forty-fifth finding)"),
    replace(STAGES["hf_host"][1], limit_s=200,
            decides="eager generate's tokens/s against sdpa's after the direct split-KV call (0.76x on an H100, "
                    "0.81x on an H200 before it)"),
)


# Session 58, after the atomic-dQ backward lost (TUNING.md forty-ninth finding): which of the two backward kernels is
# further from the tensor cores' rate on its own products. Ran (H100, session 58): the dK/dV kernel, 57-61% of the
# backward at D = 128, runs its products 13-16% slower than the dQ kernel (fiftieth finding).
STAGES["bwd_split"] = (
    Step("bwd_kernel_split", 150,
         ("benchmarks/bwd_kernel_split.py", "--dtype", "fp16,bf16", "--N", FA2_N,
          "--out", "{out}/bwd_kernel_split.json"),
         "where issue 14's backward (0.88x cuDNN) should go next: each kernel's share of the backward and the rate it "
         "reaches on its own products (dkdv_product_tflops against dq_product_tflops)"),
)

# Then: in two runs of three, splitkv_attention (the entry an eager decoding layer now calls) timed slower than
# flash_attention_with_kvcache, which calls it (fifty-first finding); the routes ran once each, in a fixed order.
STAGES["hf_order"] = (
    Step("launch_host_time_hf_interleaved", 200,
         ("benchmarks/launch_host_time.py", "--hf", "--interleave", "--rounds", "7"),
         "whether splitkv_attention really costs the host more than flash_attention_with_kvcache (medians of rounds "
         "in rotated orders); if it does, the eager layer should go back to the front door, or its cause be found"),
)

# Then: what keeps the dK/dV kernel 13-16% below the dQ kernel's rate on its products (fiftieth finding), from the
# GPU's own counters: Nsight Compute's sections on one forward + backward (the Gluon kernels at D = 128).
STAGES["bwd_counters"] = (
    Step("bwd_kernel_sections", 230,
         ("benchmarks/dram_bytes.py", "--head-dims", "128", "--seqlens", "4096", "--causal", "false",
          "--ncu-args", "--section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats "
                        "--section MemoryWorkloadAnalysis --section InstructionStats",
          "--time-budget", "60", "--point-timeout", "200", "--out", "{out}/bwd_kernel_sections.json"),
         "why the dK/dV kernel runs its products slower than the dQ kernel: tensor pipe utilization, shared-memory "
         "wavefronts and the warps' stall reasons of attention_bwd_dkdv_hopper_kernel against "
         "attention_bwd_dq_hopper_kernel"),
    Step("bwd_kernel_stalls", 200,
         ("benchmarks/dram_bytes.py", "--head-dims", "128", "--seqlens", "4096", "--causal", "false",
          "--metrics", "dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,gpu__time_duration.sum,"
                       r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,"
                       r"regex:sm__pipe_tensor.*cycles_active\.avg\.pct_of_peak_sustained_active,"
                       "smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active",
          "--time-budget", "60", "--point-timeout", "170", "--out", "{out}/bwd_kernel_stalls.json"),
         "the same two kernels' stall reasons an issued instruction and tensor pipes' busy share, by name (a "
         "section's CSV gives only its summary rows)"),
)

# Session 59's dkdv_pingpong stage (the dK/dV kernel's consumers taking turns: 0.98-1.02x) was removed with the
# experiment; TUNING.md fifty-second finding and results/gluon_bwd_pingpong_* keep it.


# Session 59: Nsight Compute counted twice the dQ kernel's long-scoreboard stalls on the dK/dV kernel (bwd_counters):
# each step loaded 16 of L and 16 of D a thread from global memory; they now come staged beside Q through the copy
# engine (TUNING.md fifty-second finding). Session 60 ran this stage on 25dc7d4: an illegal instruction at N_q = 77
# (blocks of L and D not 16-byte aligned), fixed in dee28b2, then 76 passed on the H100 (fifty-third finding). Next
# session: once more first, for the variant added after that run (L and D read in place from padded heads holding
# NaN past N_q).
STAGES["bwd_gpu_tests"] = (
    Step("bwd_hopper_gpu_tests", 300,
         gpu_pytest("tests/kernels/test_attention_bwd_hopper.py"),
         "whether the Gluon backward with L and D from shared memory passes every GPU test (fp16 and bf16, odd "
         "lengths, GQA, dropout, register operands, the front door's bitwise repeats)"),
)

# Then: at D = 64 the Gluon dK/dV kernel ran 0.91-1.01x the Triton one (thirty-second finding) and so is not routed
# there (ROUTED_HEAD_DIMS); L and D from shared memory gained it 2-13% at D = 128. Session 60's run (H100, 2f6e446)
# passed every check at D = 64 (fp16 and bf16, register operands bitwise) and timed 3 of 12 points before its limit:
# 1.13 / 1.07 at 1k (no mask / causal), 1.02 at 4k without a mask. Each dtype now times without the checks.
STAGES["dkdv_d64_route"] = tuple(
    Step(f"gluon_bwd_d64_{dtype}", 270,
         ("benchmarks/gluon_bwd_ab.py", "--dtype", dtype, "--d", "64", "--N", FA2_N, "--no-checks"),
         "attention_bwd_hopper.ROUTED_HEAD_DIMS: 64 joins where gluon/triton is above 1 at every point of both "
         "dtypes (the checks at D = 64 passed in results/gluon_bwd_d64_partial_session60_h100.log)")
    for dtype in ("fp16", "bf16"))

# And: with L and D out of the registers and the Q/dO slots of two steps, whether a third slot now pays at D = 128
# (it did not on the H200 of the thirty-third finding, before L and D were staged). Compiled for sm_90a: 166 KB of
# shared memory, no spill in the loops.
STAGES["dkdv_stages"] = (
    Step("gluon_bwd_three_slots", 150,
         ("benchmarks/gluon_bwd_ab.py", "--dtype", "fp16", "--d", "128", "--N", FA2_N, "--no-checks",
          "--variants", "s3=128:64,64,3"),
         "attention_bwd_hopper.CONFIGS[128]: three Q/dO slots where s3_tflops is above gluon_tflops at every point"),
)


# Session 61 (H100, 564247a): dkdv_d64_route timed the Gluon dK/dV kernel at D = 64 above Triton's at every point of
# both dtypes (1.02-1.14x; with K and V in registers 1.04-1.17x), so head_dim 64 is routed from 1024 rows with
# register operands (TUNING.md fifty-fourth finding). Then: the GPU tests on that route (the front door at D = 64
# takes it), and the backward at D = 64 beside cuDNN through the front door. Session 61 ran it in part on 7ed34bd
# (the GPU lent little): the test file's front-door, register-operand and any-address tests (36 passed) and both
# benches (results/bwd_d64_route_gpu_tests_session61_h100.log, hopper_session61_bwd_d64_*). Session 62 ran the rest
# of the test file on that route (84 passed, results/bwd_gpu_tests_d64_regs_session62_h100.log). Session 63 ran this
# stage again after ``git revert b0c27b5`` (128 query rows a step at 64, dkdv_d64_rows128 below): 84 passed; 0.90-1.04x
# cuDNN (results/bwd_gpu_tests_d64_rows128_session63_h100.log, hopper_session63_bwd_d64_*; TUNING fifty-sixth).
STAGES["dkdv_d64_routed"] = (
    replace(STAGES["bwd_gpu_tests"][0], limit_s=240,
            decides="whether the backward's GPU tests pass with head_dim 64 routed to the Gluon dK/dV kernel (after "
                    "git revert b0c27b5: 128 query rows a step, K and V in shared memory; the front door at D = 64 "
                    "included)"),
    *(Step(f"bench_bwd_d64_{dtype}", 150,
           ("-m", "flashlib.bench", "--mode", "bwd", "--dtype", dtype, "--d", "64", "--N", FA2_N, "--causal", "both",
            "--impl", "flashlib,sdpa_cudnn", "--no-ceilings", "--out", f"{{out}}/bench_bwd_d64_{dtype}"),
           "issue 14: the backward at D = 64 against cuDNN's (target: median >= 0.95x) with the new route")
      for dtype in ("fp16", "bf16")),
)

# And: what is left at D = 64 is the unmasked long calls (0.89-0.90x cuDNN). 128 query rows a step with K and V in
# shared memory compile for sm_90a without a spill in the loops (539 instructions and 24 products a step, against
# 302 and 16 for 64 rows: about 10% fewer instructions a query row, products twice as wide); with K and V in
# registers they spill (62 STL a step). Timed beside the default (gluon_bwd_ab's variants run with K and V in shared
# memory at D = 64); checks before adopting it. Session 62 (H100, a1ec418): 1.00-1.03x the default with K and V in
# registers at every point (results/gluon_bwd_d64_rows128_session62_h100.log; TUNING.md fifty-fifth finding). The
# change (CONFIGS[64] = (128, 64, 2), K and V in shared memory; dropout keeps 64 rows, where 128 spill) was written
# in 1791e6e and taken back out in b0c27b5 when no GPU came to run its checks; session 63 reverted b0c27b5, ran
# dkdv_d64_routed on it (84 passed) and adopted it (TUNING.md fifty-sixth finding).
STAGES["dkdv_d64_rows128"] = (
    Step("gluon_bwd_d64_rows128", 200,
         ("benchmarks/gluon_bwd_ab.py", "--dtype", "fp16", "--d", "64", "--N", FA2_N, "--no-checks",
          "--variants", "m128=64:128,64,2"),
         "attention_bwd_hopper.CONFIGS[64]: 128 query rows a step (K and V in shared memory) where m128_tflops is "
         "above gluon_regs_tflops at every point; then its checks"),
)

# And the dQ kernel at D = 64 (routed from 4096 rows; 64 query rows a consumer, 128 keys a step, two K/V slots):
# compiled for sm_90a with Triton 3.6, three slots, or 64 keys a step with three or four, keep its loops free of
# stack stores too (session 62, untimed). Each variant is timed in the whole backward against the default.
STAGES["dq_d64_configs"] = (
    Step("gluon_dq_d64_configs", 180,
         ("benchmarks/gluon_dq_ab.py", "--dtype", "fp16", "--d", "64", "--N", FA2_N, "--no-checks",
          "--variants", "n128s3=64:64,128,3;n64s3=64:64,64,3;n64s4=64:64,64,4"),
         "attention_bwd_hopper.DQ_CONFIGS[64]: a variant whose bwd_NAME_tflops is above bwd_gluon_tflops at every "
         "point; then its checks"),
)

# Ran (H100, session 63): no dQ config beats the default at every point (0.98-1.02x). The plain backward at D = 64
# now takes 128 query rows a step; a call with dropout keeps 64 (DROPOUT_CONFIGS: 128 rows spill 12-33 STL a step
# with dropout). Dropout's cost over the faster plain call, and 128 rows with dropout despite the spill, checked:
STAGES["dropout_d64_rows128"] = (
    Step("gluon_dropout_d64_rows128", 330,
         ("benchmarks/gluon_dropout_ab.py", "--dtype", "fp16,bf16", "--d", "64", "--N", FA2_N, "--parts", "bwd",
          "--routes", "plain,gluon", "--bwd-configs", "m128=64:128,64,2"),
         "issue 13's dropout cost at D = 64 (bwd_gluon/plain) over the 128-row plain backward; "
         "attention_bwd_hopper.DROPOUT_CONFIGS[64] takes 128 rows where bwd_gluon_m128 beats bwd_gluon at every "
         "point and its gradients match the Triton kernels'"),
)

# Ran (H100, session 63, results/gluon_dropout_d64_rows128_session63_h100.log): dropout's backward at D = 64 is
# 1.23-1.29x the plain one; 128 rows with dropout lose under the causal mask (0.89-0.99x): not adopted. That run
# read K and V from shared memory with dropout (DKDV_REGISTER_OPERANDS had emptied for the 128-row plain step);
# DKDV_DROPOUT_REGISTER_OPERANDS = (64,) since gives dropout calls session 61's registers back, untimed with dropout.
# Ran (H100, session 64, results/gluon_dropout_d64_kv_registers_session64_h100.log): registers 1.013-1.025x shared
# memory, gradients bitwise equal: kept (TUNING fifty-seventh finding).
STAGES["dropout_d64_kv_registers"] = (
    Step("gluon_dropout_d64_kv_registers", 200,
         ("benchmarks/gluon_dropout_ab.py", "--dtype", "fp16", "--d", "64", "--N", FA2_N, "--parts", "bwd",
          "--routes", "plain", "--kv-placements"),
         "attention_bwd_hopper.DKDV_DROPOUT_REGISTER_OPERANDS keeps 64 where bwd_gluon_regs beats bwd_gluon_shared "
         "at every point (kv regs/shared > 1) with kv_placements_equal true"),
)

# Issue 14's backward is furthest from cuDNN at D = 128 (0.90-0.92x without a mask from 4k, 0.91x causal at 16k). Its
# dQ kernel takes 64 keys a step (DQ_CONFIGS[128] = (64, 64, 3)). Compiled for sm_90a with Triton 3.6 (session 63,
# untimed), 128 keys a step with two slots keep its loops free of stack stores (395 instructions and 24 products a
# step against 244 and 20 for 64 keys: about a fifth fewer instructions a key; 197 KB of shared memory), and so do
# 64 keys with four slots. Ran (H100, session 64, results/gluon_dq_d128_configs_session64_h100.log): 0.984-1.018x and
# 0.999-1.011x the default, no win at every point: not adopted (TUNING fifty-seventh finding).
STAGES["dq_d128_configs"] = (
    Step("gluon_dq_d128_configs", 150,
         ("benchmarks/gluon_dq_ab.py", "--dtype", "fp16", "--d", "128", "--N", FA2_N, "--no-checks",
          "--variants", "n128s2=128:64,128,2;n64s4=128:64,64,4"),
         "attention_bwd_hopper.DQ_CONFIGS[128]: a variant whose bwd_NAME_tflops is above bwd_gluon_tflops at every "
         "point; then its checks (gluon_dq_ab.py without --no-checks, and the backward's GPU test file)"),
)


# The dQ routes (DQ_MIN_ROWS: Gluon from 1024 rows at D = 128, from 4096 at 64) rest on session 43's H200 numbers;
# until session 64 gluon_dq_ab.py's "triton" columns ran the routed Gluon kernel, so on the H100 the two dQ kernels
# were never compared where the route applies.
STAGES["dq_routes"] = (
    Step("gluon_dq_routes", 150,
         ("benchmarks/gluon_dq_ab.py", "--dtype", "fp16", "--d", "128,64", "--N", FA2_N, "--no-checks"),
         "attention_bwd_hopper.DQ_MIN_ROWS: a head dim keeps its Gluon dQ route where 'dq gluon/triton' >= 1 at the "
         "routed points (1k up at D = 128, 4k up at D = 64); where it is below 1, the route's threshold moves up"),
)

# Issue 13's dropout costs the backward 1.21-1.26x at D = 64 and 1.12-1.18x at D = 128 (session 64); both Gluon
# kernels recompute the mask. Which kernel carries the extra time says where a cheaper draw or another config pays.
# From 4096 rows: where the backward with dropout takes both Gluon kernels at either head dim (DROPOUT_MIN_ROWS).
DROPOUT_SPLIT = ("benchmarks/bwd_kernel_split.py", "--dtype", "fp16", "--d", "64,128", "--N", "4096,16384",
                 "--dropout", "0.1")
STAGES["dropout_split"] = (
    Step("bwd_kernel_split_dropout", 240, DROPOUT_SPLIT + ("--out", "{out}/bwd_kernel_split_dropout.json"),
         "where issue 13's dropout cost sits: dkdv_dropout_extra_share against dq_dropout_extra_share, and each "
         "kernel's own dropout cost (dkdv_dropout_cost, dq_dropout_cost), at D = 64 and 128"),
)

# Session 65 zeroes dP's dropped weights with a byte permute and an AND (dropout_hopper.zero_dropped) where a byte
# test and a select were: compiled for sm_90a, the dQ kernel's key-block loop at D = 64 went 779 -> 713 instructions,
# the dK/dV kernel's 521 -> 505 (D = 128: dQ the same, dK/dV 561 -> 541, fewer spills among the causal products).
# The result is bitwise the select's; the GPU tests with dropout check it against float64 first. The tree before is
# the session's start (mkdir -p .old && git archive e382364 flashlib | tar -x -C .old, carried). Ran (H100, session
# 65, results/*_session65_h100.log): tests passed; the dQ kernel 1.03-1.06x faster at D = 64, 0.97-1.00x at 128; the
# dK/dV kernel 0.98-0.99x at 64, 0.99-1.05x at 128; so only the dQ kernel at D = 64 keeps it (DQ_ZERO_DROPPED_HEAD_DIM).
STAGES["dropout_zero"] = (
    Step("dropout_gpu_tests", 150,
         gpu_pytest("tests/kernels/test_attention_bwd_hopper.py", "-k", "dropout or register_operands"),
         "whether zero_dropped drops exactly the forward's weights: the Gluon backward with dropout against float64 "
         "through the kernels' own mask and against the Triton kernels, and the register placements bitwise"),
    Step("bwd_kernel_split_dropout_before", 170, DROPOUT_SPLIT + ("--out", "{out}/bwd_kernel_split_before.json"),
         "the dropout costs of the tree before zero_dropped, in the same call", pythonpath=".old:benchmarks:tests"),
    Step("bwd_kernel_split_dropout", 170, DROPOUT_SPLIT + ("--out", "{out}/bwd_kernel_split_dropout.json"),
         "zero_dropped stays where the tests passed and the backward with dropout is not slower than the tree "
         "before's: 'faster than the tree before' (its ratio above 1 at every point) at D = 64 at least, where the dQ "
         "loop lost the most instructions; issue 13's 1.15x is backward_dropout_cost"),
)


# Session 66 found the eager backward at head_dim 128, N = 1024 bound by the host on one H100: 0.8-1.2 ms of host
# time a call against 0.55-0.88 ms of GPU work, 250-460 µs more than at one head of 128 rows, where the Triton
# kernels run (TUNING.md, fifty-ninth finding). Its two Gluon kernels launch through JITFunction.run, which encodes
# their 13 host descriptors again on every call, the likely difference; launch.GLUON_DESCRIPTORS sends them through
# the compiled-binary cache instead. Session 67 ran this stage (tests passed; 0.75-0.84x the backward's host time):
# the cache is on since.
STAGES["gluon_launch"] = (
    Step("gluon_launch_gpu_tests", 200,
         gpu_pytest("tests/kernels/test_launch.py", workers=None),
         "whether the Gluon forward, dK/dV and dQ kernels launched from the cache give bitwise the results of "
         "Triton's own path (test_gpu_gluon_kernels_from_the_cache_give_triton_paths_bits)"),
    Step("gluon_launch_host", 300,
         ("benchmarks/short_rows_probe.py", "--dtype", "fp16,bf16", "--N", "1024", "--rounds", "1",
          "--gluon-launch-cache"),
         "launch.GLUON_DESCRIPTORS stays True (session 67: 0.75-0.84 for the backward, 0.78-0.81 for the Gluon "
         "forward) while the tests pass and 'gluon cached/run' is below 1 for the backward (both Gluon kernels) "
         "and not above 1 for the forward"),
)

# The whole GPU suite in one call (session 67, H100: 388 passed, 1 skipped in about 418 s with each worker's allocator
# cache emptied after a GPU test; a 420 s timeout cut pytest's summary). -v names each outcome as it ends.
STAGES["suite"] = (
    Step("gpu_suite", 540, gpu_pytest("tests/", workers=16, verbose=True, worksteal=True),
         "whether every GPU test passes on the tree as it is; a failure names what to fix before any timing"),
)

# With the Gluon launches from the cache an eager backward at head_dim 128, N = 1024 still takes 380-630 µs of host
# time a call (session 67), where a no-op Triton launch takes 11-26: which Python it is, profiled on the GPU's host.
STAGES["backward_host"] = (
    Step("backward_host_profile", 150, ("benchmarks/backward_host_profile.py", "--dtype", "fp16", "--calls", "200"),
         "where an eager backward's host time goes (the functions with the most own time and cumulative time) at "
         "the Gluon and Triton routes; what to make cheaper next, if anything"),
)

# Session 67 moved the backward kernels' dropout draws a step ahead, into the wait for the step before's last product
# (attention_bwd_hopper.DKDV_DRAWS_AHEAD and DQ_DRAWS_AHEAD, off): compiled for sm_90a the draws sit there (at D = 64
# 91-235 instructions beside each loop's last products, 3-7 before; at 128 84-119 beside the unmasked loops'), with no
# new spill (TUNING.md sixty-first finding). apply does not write these settings: a person adds the head dims the
# summary says yes to. Ran in session 68 (H100; the 595 s call ended after the first D = 128 point): tests passed,
# gradients bitwise equal; dK/dV 0.990-1.010x, dQ 0.955-0.989x at 64, so both stay off (sixty-third finding).
STAGES["draws_ahead"] = (
    Step("draws_ahead_gpu_tests", 150,
         gpu_pytest("tests/kernels/test_attention_bwd_hopper.py", "-k", "draws_ahead or dropout"),
         "whether the draws drawn ahead give dQ, dK and dV bitwise equal to the default's (and the dropout tests "
         "still pass); a failure keeps DKDV_DRAWS_AHEAD and DQ_DRAWS_AHEAD empty"),
    Step("bwd_kernel_split_draws_ahead", 240,
         DROPOUT_SPLIT + ("--draws-ahead", "--out", "{out}/bwd_kernel_split_draws_ahead.json"),
         "attention_bwd_hopper.DKDV_DRAWS_AHEAD (DQ_DRAWS_AHEAD) takes a head dim where 'dkdv ahead/now' ('dq "
         "ahead/now') > 1 at every point and ahead_bitwise is True; issue 13's 1.15x is backward_dropout_ahead_cost"),
)

# The causal forward at head_dim 64 ran 0.87-0.96x cuDNN (session 66's grid) against 0.93-1.04x without a mask, where
# 128 x 128 tiles capped at 128 registers put two programs on an SM (twenty-seventh finding). Causal grids were kept
# from that config because it spilled 8 registers there (session 27); compiled offline by Triton 3.6 it took 128
# registers without a spill (sass_counts.py --kernel fwd --d 64 --causal yes --configs 128x128/2/8 --maxnreg 128).
# Each config alone in a CUDA graph against the forward as routed, the same process. Ran in session 67: the machine's
# ptxas spilled 8 registers; 1.01-1.05x from 4k, 0.90x at 1k; offered to the autotuner the grid did not move, so
# causal grids still go without it (TUNING.md sixtieth finding).
STAGES["causal64_capped"] = (
    Step("fwd_causal64_capped", 150,
         ("benchmarks/fwd_two_per_sm.py", "--d", "64", "--causal", "yes", "--N", "1024,2048,4096,8192,16384",
          "--dtype", "fp16", "--budget", "110", "--out", "{out}/fwd_causal64_capped.json"),
         "attention_fwd._prune_configs lets the capped config into causal grids at head_dim <= 64 where '128x128/2/8 "
         "maxnreg 128' beats 'flashlib as routed' at most points and loses at none by more than 2% (session 67: "
         "offered to the autotuner it left the grid where it was, so it stays out)"),
)

# The Gluon forward at head_dim 64 runs 0.77-1.04x the Triton forward with two consumer warpgroups, and the causal
# grid's forward at 64 (Triton) stays at 0.87-0.93x cuDNN. FlashAttention-3 runs three consumers of 64 rows there
# (192-row tiles): a key block's products at 64 take half their time at 128 against the same exponentials.
# Session 68 built consumers=3 (round-robin turns, Q from shared memory; compiled for sm_90a with no spill in the
# loops over whole blocks, TUNING.md sixty-second finding). Each variant's output is checked against the Triton
# forward's as it is timed; a wrong one marks its row. Ran in session 68 (H100): tests passed (12); 1.05-1.09x the
# two consumers at 16k without a mask, 0.95x at 1k, 0.55x causal at 1k: no head dim took them (the setting was then
# THREE_CONSUMER_HEAD_DIMS; session 69's own run at 2k-16k gave THREE_CONSUMER_MIN_ROWS = {64: 8192}).
STAGES["three_consumers"] = (
    Step("three_consumers_gpu_tests", 150,
         gpu_pytest("tests/kernels/test_attention_fwd_hopper.py", "-k", "three_consumers"),
         "whether three consumers match float64, write every output and equal two consumers bitwise without a "
         "mask (persistent or not, ping-pong or not); a failure empties THREE_CONSUMER_MIN_ROWS"),
    Step("gluon_fwd_three_consumers", 300,
         ("benchmarks/gluon_fwd_ab.py", "--no-checks", "--d", "64", "--dtype", "fp16,bf16", "--N", FA2_N,
          "--variants", "three=64:64,128,3:three;three_nopp=64:64,128,3:three:nopp;three_s2=64:64,128,2:three",
          "--out", "{out}/gluon_fwd_three_consumers.json"),
         "attention_fwd_hopper.THREE_CONSUMER_MIN_ROWS takes 64 from the rows where a three-consumer variant "
         "beats the two consumers and the Triton forward ('three over triton') at every point after; issue 14's "
         "bar is the least 'three over cudnn' >= 0.90"),
)

# Session 68 rewrote the Gluon forward's mask test of a masked block as one compare a score (each row's last visible
# key, counted from the block's first, against the block's key index): compiled for sm_90a (Triton 3.6) its masked
# loops are 57-136 instructions a block shorter at head_dim 128 and 64 with two consumers, no loop spilling (TUNING.md
# sixty-fourth finding). Not run on a GPU: it waits on branch session68-relative-mask. To run: merge the branch, put
# the tree before it in .old (mkdir -p .old && git archive <main before the merge> flashlib | tar -x -C .old) and
# carry .old; the GPU tests run first, then the same timings on either tree, the same call. Ran in session 69 (H100):
# 92 tests passed; causal 1.002-1.033x at D = 128 and 1.08x at D = 64, N = 1k (the tree before's other D = 64 points
# cut by the step's limit); merged to main (TUNING.md sixty-fifth finding).
FWD_MASK_TIMES = ("benchmarks/gluon_fwd_ab.py", "--no-checks", "--d", "128,64", "--dtype", "fp16", "--N", FA2_N)
STAGES["relative_mask"] = (
    Step("fwd_hopper_gpu_tests", 200, gpu_pytest("tests/kernels/test_attention_fwd_hopper.py"),
         "whether the Gluon forward with the relative mask test still matches float64, writes every output and "
         "agrees with the Triton forward (every mask, both head dims, dropout, FP8); a failure reverts the merge"),
    Step("fwd_masks_before", 160, FWD_MASK_TIMES + ("--out", "{out}/fwd_masks_before.json"),
         "the Gluon forward's times on the tree before, in the same call", pythonpath=".old:benchmarks:tests"),
    Step("fwd_masks_after", 160, FWD_MASK_TIMES + ("--out", "{out}/fwd_masks_after.json"),
         "the relative mask test stays where the tests passed and the Gluon forward is not slower than the tree "
         "before at any point ('the Gluon forward faster than the tree before', causal points first)"),
)


# Session 69 routed head_dim 64's unmasked forward from 8192 rows and 2^32 scores to three consumers without turns
# (attention_fwd_hopper.THREE_CONSUMER_MIN_ROWS, three_consumers_preferred): timed at 2k-16k in fp16 and bf16 (1.07-
# 1.08x the two consumers, 1.06-1.07x Triton, 1.03-1.06x cuDNN at 8k and 16k; TUNING.md sixty-sixth finding), and its
# causal forward from 4096 rows to the two-consumer Gluon forward (MIN_ROWS[64]; 1.02-1.06x Triton in four calls,
# sixty-eighth finding). Neither route had run through the front door, where the backward follows and the launcher
# picks the consumers by itself. Ran in session 70 (H100, with the half-width last block's first form in the tree):
# 20 tests passed; through the front door three consumers read 1.06-1.10x cuDNN at 8k and 16k unmasked, the causal
# route 0.95-1.03x from 4k (TUNING.md sixty-ninth finding).
STAGES["three_consumers_route"] = (
    Step("three_consumers_route_gpu_tests", 200,
         gpu_pytest("tests/kernels/test_attention_fwd_hopper.py", "-k", "three_consumers or front_door"),
         "whether the front door takes three consumers at head_dim 64's long unmasked rows, and two under the causal "
         "mask from 4096 rows, with O and the gradients matching float64; a failure empties THREE_CONSUMER_MIN_ROWS "
         "(or sets MIN_ROWS[64] to (None, None))"),
    Step("d64_grid", 330,
         ("-m", "flashlib.bench", "--mode", "fwd", "--dtype", "fp16,bf16", "--d", "64", "--N",
          "2048,4096,8192,16384", "--causal", "both", "--impl", "flashlib,sdpa_cudnn", "--no-ceilings",
          "--time-budget", "280", "--out", "{out}/d64_grid"),
         "issue 14's forward ratios at head_dim 64 through the front door with both routes: 'flashlib / cuDNN' "
         "should read about 1.03-1.06 at 8k and 16k unmasked and 0.95-0.99 causal from 4k (the A/Bs'); a route "
         "that reads below the Triton forward's ratios there in session 67's grid goes back"),
)


# Session 70 gave the Gluon forward's first consumer a half-width last key block on the causal diagonal
# (attention_fwd_hopper.HALF_LAST_BLOCK): its first form passed the Gluon forward's 96 GPU tests and ran 1.05x at
# 1024 causal rows, but its run-time gate put the half block's 16-bit layout into the FP8 kernels, which failed to
# compile (16 FP8 tests). 27dae5c gates it at compile time; compiled for sm_90a its FP8, dropout and three-consumer
# kernels keep main's instruction counts; the review then moved its release of Q's slot after the half block's S
# (the first form released it before, a race at head_dim 128). Ran in session 71 (H100) as the whole GPU suite
# (412 passed, FP8 among them) and then this stage's timings: causal Gluon / Triton 1.05 (fp16) and 1.06 (bf16) at
# head_dim 128, 1024 rows, 1.04 at 64, 2048 rows; the routes stand (TUNING.md seventieth finding).
STAGES["half_last_block"] = (
    Step("half_last_block_gpu_tests", 250,
         gpu_pytest("tests/kernels/test_attention_fwd_hopper.py", "tests/test_fp8.py", workers=12),
         "whether the committed forward (0e03a5e's half block) passes the Gluon forward's and FP8's GPU tests "
         "(every mask, dropout, three consumers, FP8 through Gluon at 64 and 128); a failure sets HALF_LAST_BLOCK to "
         "False and MIN_ROWS back to {128: (1024, 2048), 64: (None, 4096)}"),
    Step("half_last_block_times", 320,
         ("benchmarks/gluon_fwd_ab.py", "--no-checks", "--d", "128,64", "--dtype", "fp16,bf16", "--N",
          "1024,2048,4096", "--out", "{out}/half_last_block_times.json"),
         "issue 14's causal forward at short rows with the half block in its committed form: 'gluon/triton' above 1 "
         "causal at head_dim 128 from 1024 rows and 64 from 2048 (the routes of MIN_ROWS), bf16 too"),
)

# Issue 14's first bar is the forward at or above Triton's tutorial 06 at every point, in one process. The README's
# tutorial column is the tutorial's run of 2026-11-27 (session 36), compared since with later flashlib rows; session
# 71's grid reads 1.04-1.32x beside it, lowest at head_dim 64 causal, 1024 rows. The tutorial's file is git-ignored:
# put its TMA forward and launcher in benchmarks/anchors/tutorial06.py (benchmarks/README.md says how) and carry
# benchmarks/anchors, or its rows say "not found". Its autotuner compiles about 28 configs a (N, head_dim), hence
# three lengths.
STAGES["tutorial_one_process"] = (
    Step("tutorial_fwd_grid", 420,
         ("-m", "flashlib.bench", "--mode", "fwd", "--dtype", "fp16", "--d", "64,128", "--N", "1024,4096,16384",
          "--causal", "both", "--impl", "flashlib,sdpa_cudnn,tutorial", "--no-ceilings", "--time-budget", "380",
          "--out", "{out}/hopper_tutorial_fwd"),
         "issue 14's first bar in one process: 'flashlib / tutorial' at or above 1 at each of the 12 points (fp16; the "
         "tutorial does not compile in bf16); a point below names where the forward still trails Triton's own"),
)


def command(step: Step, out: Path) -> list:
    """The step's command line, ``{out}`` filled in."""
    return [sys.executable] + [arg.replace("{out}", str(out)) for arg in step.argv]


def header(step: Step, cmd: list) -> str:
    """What a stored result says of itself: the GPU, the versions, the date, the command."""
    import torch
    import triton
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"# {step.name}: {gpu}, torch {torch.__version__}, triton {triton.__version__}, {date}\n"
            f"# command: PYTHONPATH={step.pythonpath} {shlex.join(['python3'] + cmd[1:])}\n"
            f"# decides: {step.decides}\n")


def run_step(step: Step, out: Path) -> int:
    """Run one step with its log in ``out``; its exit status (124 where its limit stopped it)."""
    cmd = command(step, out)
    log = out / f"{step.name}.log"
    start = time.monotonic()
    with open(log, "w") as f:
        f.write(header(step, cmd))
        missing = missing_copies(step)
        if missing:
            f.write(f"# not run: no flashlib/ in {', '.join(missing)} (see Step.pythonpath)\n")
            print(f"{step.name}: not run, no flashlib/ in {', '.join(missing)} -> {log}", flush=True)
            return 2
        f.flush()
        # Its own process group, so that a stop also ends what it started (pytest-xdist's workers hold the GPU).
        child = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                 env={**os.environ, "PYTHONPATH": step.pythonpath})
        try:
            rc = child.wait(timeout=step.limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            rc = 124
        f.write(f"# exit {rc} after {time.monotonic() - start:.0f} s (limit {step.limit_s} s)\n")
    print(f"{step.name}: exit {rc} after {time.monotonic() - start:.0f} s -> {log}", flush=True)
    return rc


class _Parsed(Exception):
    """Raised in place of running a script once its parser has taken the arguments."""


def check_step(step: Step) -> None:
    """Raise if the step's files are missing or its script's parser refuses its arguments; runs nothing."""
    argv = [arg.replace("{out}", "/tmp") for arg in step.argv]
    if argv[:2] == ["-m", "pytest"]:
        missing = [a for a in argv if a.startswith("tests/") and not (ROOT / a).exists()]
        if missing:
            raise FileNotFoundError(f"step {step.name}: no such test file {missing}")
        return
    if argv[0] == "-m":
        module, args = importlib.import_module(argv[1]), argv[2:]
    else:
        script = ROOT / argv[0]
        if not script.exists():
            raise FileNotFoundError(f"step {step.name}: no such script {argv[0]}")
        module, args = importlib.import_module(script.stem), argv[1:]
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(parser, args=None, namespace=None):
        raise _Parsed(original(parser, args, namespace))
    argparse.ArgumentParser.parse_args = parse_then_stop
    saved_argv = sys.argv
    try:
        if inspect.signature(module.main).parameters:
            module.main(args)
        else:  # a main that reads sys.argv
            sys.argv = [argv[0]] + args
            module.main()
    except _Parsed:
        return
    except SystemExit as exit_:
        raise ValueError(f"step {step.name}: {argv[0]} refused {shlex.join(args)} (exit {exit_.code})") from None
    finally:
        argparse.ArgumentParser.parse_args = original
        sys.argv = saved_argv
    raise RuntimeError(f"step {step.name}: {argv[0]}'s main returned without parsing its arguments")


def log_rows(log: Path) -> list:
    """The JSON rows a step printed (one a line; the A/B scripts print each row when measured)."""
    if not log.exists():
        return []
    rows = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a row cut by the step's limit
    return rows


def _wins(rows, d, ratio) -> str:
    """"yes" where ``ratio(row)`` > 1 at every timed point of head dim ``d``, else "no", with the range seen."""
    values = [ratio(row) for row in rows if row.get("d") == d and "N" in row]
    values = [v for v in values if v is not None]
    if not values:
        return "not measured"
    verdict = "yes" if min(values) > 1 else "no"
    return f"{verdict} ({min(values):.3f}-{max(values):.3f} over {len(values)} points)"


def _cached_over_run(row):
    """A probe row's host time with the Gluon launches from the cache over through ``JITFunction.run``, or None;
    session 67's log names it "gluon cached/host" (the default was through run then)."""
    return row.get("gluon cached/run", row.get("gluon cached/host"))


def _dropout_split_rows(log: Path) -> list:
    """The rows of a ``bwd_kernel_split.py --dropout`` log that timed every part with dropout."""
    return [row for row in log_rows(log) if all(f"{part}_dropout_ms" in row for part in ("backward", "dkdv", "dq"))]


def _point(row) -> tuple:
    """The timed point a row is of: (dtype, head dim, N, causal)."""
    return row.get("dtype"), row.get("d"), row.get("N"), row.get("causal")


def _failed_checks(rows) -> list:
    """The check rows (those naming a case) whose status is neither ok nor "not supported", by case and point."""
    return [", ".join(f"{key}={row[key]}" for key in ("case", "d", "causal", "per_head") if key in row)
            for row in rows if "case" in row and row.get("status") not in ("ok", "not supported")]


def _paired_with_tree_before(before_rows, after_rows) -> list:
    """(the tree before's row, the tree after's row) of every point (:func:`_point`) both trees timed, in the
    order of ``after_rows``: a point timed on one tree only decides nothing."""
    before = {_point(row): row for row in before_rows}
    return [(before[_point(row)], row) for row in after_rows if _point(row) in before]


def _ratio(row, num, den):
    return row[num] / row[den] if num in row and den in row else None


def _variants_over(step: str, timed: list, bases: tuple, not_variants: set) -> list:
    """(step, question, answer) lines: each TFLOP/s column of the ``timed`` rows other than the default's
    (``bases[0]``) and ``not_variants`` (a ``--variants`` entry, or another base) over each other of ``bases`` that
    the rows carry, per head dim."""
    lines = []
    for d in sorted({row["d"] for row in timed}):
        columns = {key for row in timed for key in row if key.endswith("_tflops")}
        present = [base for base in bases if base in columns]
        for key in sorted(columns - {bases[0]} - not_variants):
            for base in [base for base in present if base != key]:
                lines.append((step, f"D = {d}: {key.removesuffix('_tflops')} over {base.removesuffix('_tflops')}",
                              _wins(timed, d, lambda r, key=key, base=base: _ratio(r, key, base))))
    return lines


def decisions(out: Path) -> list:
    """What the stage logs under ``out`` decide, as (step, question, answer) lines: each rule is the one its
    step's ``decides`` states."""
    lines = []
    for name in ("gpu_tests", "gpu_tests_rest", "dropout_gpu_tests", "gluon_launch_gpu_tests", "gpu_suite",
                 "draws_ahead_gpu_tests", "three_consumers_gpu_tests"):
        if (out / f"{name}.log").exists():
            text = (out / f"{name}.log").read_text().splitlines()
            summary = [line for line in text if " passed" in line or " failed" in line]
            lines.append((name, "pytest's summary", summary[-1] if summary else "no summary (cut short?)"))
    fp8 = log_rows(out / "gluon_fp8_ab.log")
    if fp8:
        lines.append(("gluon_fp8_ab", "failed checks", _failed_checks(fp8) or "none"))
        for d in (128, 64):
            lines.append(("gluon_fp8_ab", f"FP8_HEAD_DIMS gets {d} (Gluon over Triton FP8)",
                          _wins(fp8, d, lambda r: _ratio(r, "fp8_triton_ms", "fp8_gluon_ms"))))
            for label, what in (("registers", "P in registers"), ("q_shared", "Q in shared memory")):
                lines.append(("gluon_fp8_ab", f"D = {d}: {what} beats the default",
                              _wins(fp8, d, lambda r, k=f"fp8_gluon_{label}_ms": _ratio(r, "fp8_gluon_ms", k))))
        speedups = [max(r.get("fp8_gluon/fp16", 0), r.get("fp8_triton/fp16", 0))
                    for r in fp8 if r.get("d") == 128 and r.get("N", 0) >= 4096]
        if speedups:
            lines.append(("gluon_fp8_ab", "issue 14: FP8 >= 1.4x fp16 at N >= 4k, D = 128",
                          f"{'yes' if min(speedups) >= 1.4 else 'no'} (least {min(speedups):.3f})"))
    dq = log_rows(out / "gluon_dq_ab.log")
    if dq:
        lines.append(("gluon_dq_ab", "failed checks", _failed_checks(dq) or "none"))
        for d in (128, 64):
            lines.append(("gluon_dq_ab", f"DQ_REGISTER_OPERANDS gets {d}",
                          _wins(dq, d, lambda r: r.get("dq regs/shared"))))
    bwd = log_rows(out / "gluon_bwd_ab.log")
    if bwd:
        lines.append(("gluon_bwd_ab", "failed checks", _failed_checks(bwd) or "none"))
        lines.append(("gluon_bwd_ab", "DKDV_REGISTER_OPERANDS gets 64",
                      _wins(bwd, 64, lambda r: _ratio(r, "gluon_regs_tflops", "gluon_tflops"))))
        lines.append(("gluon_bwd_ab", "the Gluon dK/dV kernel (registers) takes D = 64 from Triton",
                      _wins(bwd, 64, lambda r: _ratio(r, "gluon_regs_tflops", "triton_tflops"))))
    for log in sorted(out.glob("gluon_bwd_*.log")):  # the steps that time the Gluon dK/dV kernel under own names
        if log.name != "gluon_bwd_ab.log":  # answered above
            timed = [row for row in log_rows(log) if "N" in row]
            for d in sorted({row["d"] for row in timed}):
                lines.append((log.stem, f"D = {d}: the Gluon dK/dV kernel over the Triton one",
                              _wins(timed, d, lambda r: _ratio(r, "gluon_tflops", "triton_tflops"))))
            # each variant over either operand placement of the default blocks
            lines += _variants_over(log.stem, timed, ("gluon_tflops", "gluon_regs_tflops"), {"triton_tflops"})
    routes = log_rows(out / "gluon_dq_routes.log")
    if routes:
        min_rows = source_setting("DQ_MIN_ROWS")
        for d in (128, 64):  # the Gluon dQ kernel against the Triton one where DQ_MIN_ROWS routes it
            routed = [row for row in routes if row.get("N", 0) >= min_rows[d]]
            lines.append(("gluon_dq_routes", f"D = {d}: the Gluon dQ kernel beats Triton's where routed "
                          f"(from {min_rows[d]} rows)", _wins(routed, d, lambda r: r.get("dq gluon/triton"))))
    split = _dropout_split_rows(out / "bwd_kernel_split_dropout.log")
    for d in sorted({row["d"] for row in split}):
        at_d = [row for row in split if row["d"] == d]
        for what in ("backward_dropout_cost", "dkdv_dropout_cost", "dq_dropout_cost", "dkdv_dropout_extra_share",
                     "dq_dropout_extra_share"):
            values = [row[what] for row in at_d if row.get(what) is not None]
            if values:
                lines.append(("bwd_kernel_split_dropout", f"D = {d}: {what}", f"{min(values):.3f}-{max(values):.3f}"))
    pairs = _paired_with_tree_before(_dropout_split_rows(out / "bwd_kernel_split_dropout_before.log"), split)
    for d in sorted({after["d"] for _, after in pairs}):  # the tree before a change against the tree after
        for part in ("backward", "dkdv", "dq"):
            lines.append(("bwd_kernel_split_dropout", f"D = {d}: {part} with dropout faster than the tree before",
                          _wins([dict(after, ratio=old[f"{part}_dropout_ms"] / after[f"{part}_dropout_ms"])
                                 for old, after in pairs], d, lambda r: r["ratio"])))
    ahead = _dropout_split_rows(out / "bwd_kernel_split_draws_ahead.log")
    if ahead:
        unequal = [f"D={r['d']} N={r['N']} causal={r['causal']}" for r in ahead if r.get("ahead_bitwise") is False]
        lines.append(("bwd_kernel_split_draws_ahead", "dQ, dK, dV with the draws ahead differ from the default's",
                      unequal or "none"))
        for d in sorted({row["d"] for row in ahead}):
            for part in ("dkdv", "dq"):
                lines.append(("bwd_kernel_split_draws_ahead", f"{part.upper()}_DRAWS_AHEAD gets {d}",
                              "no: unequal gradients" if unequal
                              else _wins(ahead, d, lambda r, part=part: r.get(f"{part} ahead/now"))))
            costs = [r["backward_dropout_ahead_cost"] for r in ahead
                     if r["d"] == d and "backward_dropout_ahead_cost" in r]
            if costs:
                lines.append(("bwd_kernel_split_draws_ahead", f"D = {d}: backward_dropout_ahead_cost (issue 13: 1.15)",
                              f"{min(costs):.3f}-{max(costs):.3f}"))
    for log in sorted(out.glob("gluon_dq_*.log")):  # the steps that time other dQ configs under own names
        if log.name not in ("gluon_dq_ab.log", "gluon_dq_routes.log"):  # answered above
            timed = [row for row in log_rows(log) if "N" in row]
            lines += _variants_over(log.stem, timed, ("bwd_gluon_tflops",),
                                    {"bwd_triton_tflops", "bwd_gluon_regs_tflops"})
    for log in sorted(out.glob("gluon_dropout*.log")):  # every step that times dropout against the plain call
        dropout = log_rows(log)
        for d in (128, 64):
            costs = [r[key] for r in dropout if r.get("d") == d for key in ("bwd_gluon/plain", "bwd_triton/plain")
                     if key in r]
            if costs:
                lines.append((log.stem, f"issue 13: dropout's backward <= 1.15x at D = {d}",
                              f"{'yes' if max(costs) <= 1.15 else 'no'} ({min(costs):.3f}-{max(costs):.3f})"))
        configs = sorted({key.split("_")[1] for row in dropout for key in row
                          if key.startswith("dk_") and key.endswith("_vs_triton") and key != "dk_gluon_vs_triton"})
        for label in configs:  # --bwd-configs: each DROPOUT_CONFIGS candidate against the default blocks
            for d in sorted({r["d"] for r in dropout if f"bwd_gluon_{label}_ms" in r}):
                lines.append((log.stem, f"D = {d}: DROPOUT_CONFIGS takes {label}",
                              _wins(dropout, d, lambda r, k=f"bwd_gluon_{label}_ms": _ratio(r, "bwd_gluon_ms", k))))
    placements = log_rows(out / "gluon_dropout_d64_kv_registers.log")
    if placements:
        unequal = [f"N={r['N']}, causal={r['causal']}" for r in placements if r.get("kv_placements_equal") is False]
        verdict = _wins(placements, 64, lambda r: r.get("kv regs/shared"))
        lines.append(("gluon_dropout_d64_kv_registers", "K and V placements give unequal gradients", unequal or "none"))
        lines.append(("gluon_dropout_d64_kv_registers", "DKDV_DROPOUT_REGISTER_OPERANDS keeps 64",
                      f"no: unequal gradients; {verdict}" if unequal else verdict))
    m32 = log_rows(out / "gluon_dropout_m32.log")
    if m32:
        lines.append(("gluon_dropout_m32", "the dK/dV kernel with dropout takes 32 query rows a step at D = 128",
                      _wins(m32, 128, lambda r: _ratio(r, "bwd_gluon_ms", "bwd_gluon_m32_ms"))))
    host = [row for row in log_rows(out / "gluon_launch_host.log") if _cached_over_run(row) is not None]
    for mode in ("fwd", "bwd"):
        ratios = [_cached_over_run(row) for row in host if row["mode"] == mode]
        if ratios:
            lines.append(("gluon_launch_host", f"{mode}: host time a call, Gluon kernels from the cache / through run",
                          f"{min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} points"))
    for log in sorted(out.glob("gluon_fwd_*.log")):  # the steps that time other forward variants under own names
        if log.name != "gluon_fwd_ab.log":  # answered below
            timed = [row for row in log_rows(log) if "N" in row]
            wrong = sorted({f"{name} at D={r['d']} N={r['N']} causal={r['causal']}"
                            for r in timed for name in r.get("wrong_variants", [])})
            lines.append((log.stem, "variants whose output differs from the Triton forward's", wrong or "none"))
            # a variant wrong at any point wins nowhere: its times leave every row
            dropped = {f"{name}_tflops" for r in timed for name in r.get("wrong_variants", [])}
            timed = [{key: value for key, value in r.items() if key not in dropped} for r in timed]
            bases = ("gluon_tflops", "triton_tflops", "cudnn_tflops")
            lines += _variants_over(log.stem, timed, bases, {"gluon_qshared_tflops", "gluon_qregs_tflops", *bases})
            lines += [(log.stem, f"D = {d}: {key.removesuffix('_tflops')} over {base.removesuffix('_tflops')}",
                       "no: its output differs") for d in sorted({r["d"] for r in timed}) for key in sorted(dropped)
                      for base in bases]
    timed_before, timed_after = ([row for row in log_rows(out / f"fwd_masks_{tree}.log") if "N" in row]
                                 for tree in ("before", "after"))
    pairs = [dict(after, ratio=after["gluon_tflops"] / before["gluon_tflops"])
             for before, after in _paired_with_tree_before(timed_before, timed_after)]
    for d in sorted({row["d"] for row in pairs}):  # the tree before a change of the forward against the tree after
        for causal in (False, True):
            lines.append(("fwd_masks_after", f"D = {d}, causal={causal}: the Gluon forward faster than the tree before",
                          _wins([r for r in pairs if r["causal"] == causal], d, lambda r: r["ratio"])))
    fwd = log_rows(out / "gluon_fwd_ab.log")
    for d in (128, 64):
        if fwd:
            lines.append(("gluon_fwd_ab", f"Q_IN_REGISTERS_HEAD_DIMS gets {d} (16-bit)",
                          _wins(fwd, d, q_registers_over_shared)))
    return lines


#: Where each setting that a timings log decides lives.
SETTING_FILES = {"FP8_HEAD_DIMS": "flashlib/kernels/attention_fwd_hopper.py",
                 "FP8_WEIGHTS_SHARED": "flashlib/kernels/attention_fwd_hopper.py",
                 "FP8_Q_IN_REGISTERS": "flashlib/kernels/attention_fwd_hopper.py",
                 "Q_IN_REGISTERS_HEAD_DIMS": "flashlib/kernels/attention_fwd_hopper.py",
                 "DQ_REGISTER_OPERANDS": "flashlib/kernels/attention_bwd_hopper.py",
                 "DKDV_REGISTER_OPERANDS": "flashlib/kernels/attention_bwd_hopper.py",
                 "DQ_MIN_ROWS": "flashlib/kernels/attention_bwd_hopper.py"}


def q_registers_over_shared(row):
    """gluon_fwd_ab's Q from registers over Q from shared memory at one timed point (> 1: registers faster); None
    for rows before session 64, whose 'qregs/gluon' set registers against the default, itself registers at head_dim 64
    from session 53: one kernel timed twice, which decides nothing."""
    return row.get("qregs/qshared")


def _every_point_wins(rows, d, ratio) -> bool:
    values = [ratio(row) for row in rows if row.get("d") == d and "N" in row]
    values = [v for v in values if v is not None]
    return bool(values) and min(values) > 1


def settings(out: Path) -> dict:
    """The values the timings logs under ``out`` decide, by the rules :func:`decisions` states: a head dim joins a
    tuple where its route is faster at every timed point and none of the step's checks failed; a placement flag
    flips where the other placement is faster at every point of every head dim FP8 is routed at. A setting whose
    log is missing or whose checks failed is left out (it keeps its value)."""
    chosen = {}
    fp8 = log_rows(out / "gluon_fp8_ab.log")
    if fp8 and not _failed_checks(fp8):
        dims = tuple(d for d in (128, 64)
                     if _every_point_wins(fp8, d, lambda r: _ratio(r, "fp8_triton_ms", "fp8_gluon_ms")))
        chosen["FP8_HEAD_DIMS"] = dims
        if dims:
            chosen["FP8_WEIGHTS_SHARED"] = not all(
                _every_point_wins(fp8, d, lambda r: _ratio(r, "fp8_gluon_ms", "fp8_gluon_registers_ms")) for d in dims)
            chosen["FP8_Q_IN_REGISTERS"] = not all(
                _every_point_wins(fp8, d, lambda r: _ratio(r, "fp8_gluon_ms", "fp8_gluon_q_shared_ms")) for d in dims)
    for log, name, dims, ratio in (
            ("gluon_dq_ab", "DQ_REGISTER_OPERANDS", (128, 64), lambda r: r.get("dq regs/shared")),
            ("gluon_bwd_ab", "DKDV_REGISTER_OPERANDS", (64,), lambda r: _ratio(r, "gluon_regs_tflops", "gluon_tflops")),
            ("gluon_fwd_ab", "Q_IN_REGISTERS_HEAD_DIMS", (128, 64), q_registers_over_shared)):
        rows = log_rows(out / f"{log}.log")
        # a log without the ratio (an older script's) leaves the setting alone
        if rows and not _failed_checks(rows) and any(ratio(row) is not None for row in rows):
            chosen[name] = tuple(d for d in dims if _every_point_wins(rows, d, ratio))
    return chosen


def setting_assignment(name: str) -> re.Pattern:
    """The one line of a kernel's source that assigns the setting ``name`` (an annotation allowed): group 2 is the
    value. :func:`source_setting` reads it, :func:`apply_settings` rewrites it."""
    return re.compile(rf"^{name}(: [^=]+)? = (.*)$", flags=re.MULTILINE)


def source_setting(name: str, root: Path = ROOT):
    """The value a kernel's source assigns to the setting ``name`` (a literal on one line, in the file
    :data:`SETTING_FILES` names), read without importing flashlib: the summary runs where torch may be missing."""
    text = (root / SETTING_FILES[name]).read_text()
    match = setting_assignment(name).search(text)
    if match is None:
        raise SystemExit(f"no assignment of {name} in {SETTING_FILES[name]}")
    return ast.literal_eval(match.group(2))


def apply_settings(chosen: dict, root: Path = ROOT) -> list:
    """Write ``chosen`` into the kernels' sources under ``root`` (each setting's one assignment line; its comment
    is left for a person to update) and return the lines changed. The device call that runs the grid applies the
    timings' settings to its own copy of the tree first, so that the grid measures what they decided."""
    changed = []
    for name, value in chosen.items():
        path = root / SETTING_FILES[name]
        text = path.read_text()
        annotation = ": tuple[int, ...]" if isinstance(value, tuple) else ""
        line = f"{name}{annotation} = {value!r}"
        new, count = setting_assignment(name).subn(line, text, count=1)
        if count != 1:
            raise SystemExit(f"no assignment of {name} in {path}")
        if new != text:
            path.write_text(new)
            changed.append(f"{SETTING_FILES[name]}: {line}")
    return changed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=sorted(STAGES) + ["summary", "apply"],
                        help="a stage to run; 'summary': what the logs under --out decide (no GPU needed); "
                             "'apply': write what they decide into the kernels' settings")
    parser.add_argument("--out", type=Path, default=Path("backlog"))
    parser.add_argument("--dry-run", action="store_true", help="check every step's arguments; run nothing")
    parser.add_argument("--steps", default="",
                        help="comma-separated step names of the stage to run, in the stage's order (default: all), "
                             "for a call with less device time left than the stage needs")
    args = parser.parse_args(argv)
    if args.stage == "summary":
        for step, question, answer in decisions(args.out):
            print(f"{step}: {question}: {answer}")
        return 0
    if args.stage == "apply":
        print("\n".join(apply_settings(settings(args.out))) or "no setting changed")
        return 0
    steps = STAGES[args.stage]
    if args.steps:
        wanted = args.steps.split(",")
        unknown = sorted(set(wanted) - {step.name for step in steps})
        if unknown:
            parser.error(f"--steps: {', '.join(unknown)} not in stage {args.stage!r}; its steps are "
                         f"{', '.join(step.name for step in steps)}")
        steps = tuple(step for step in steps if step.name in wanted)
    if args.dry_run:
        for step in steps:
            check_step(step)
            print(f"{step.name}: {shlex.join(command(step, args.out))}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    return max(run_step(step, args.out) for step in steps)


if __name__ == "__main__":
    sys.exit(main())
