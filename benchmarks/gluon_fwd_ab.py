"""The Gluon Hopper forward (:mod:`flashlib.kernels.attention_fwd_hopper`) checked and timed beside flashlib's
Triton forward and SDPA's cuDNN backend, in one process on one GPU.

Checks first (each against float64 on the GPU, and every output element written: O and LSE start as NaN):
odd lengths, N_q != N_k both ways under a causal mask, GQA, the (B, N, H, D) layout, bf16. Then the
FlashAttention-2 benchmark shapes (B * N = 16384, H * D = 2048), each call replayed from a CUDA graph
(``flashlib.timing.graph_time_ms``: GPU time alone), TFLOP/s by ``flashlib.io_model.attention_flops``. The Gluon
forward also runs with Q held in registers and in shared memory, each asked by name (``q_in_registers=True`` or
``False``, TUNING.md fortieth finding): checked bitwise equal, and timed as ``gluon_qregs`` and ``gluon_qshared``
beside the default ``gluon``.

    python benchmarks/gluon_fwd_ab.py [--dtype fp16,bf16] [--d 64,128] [--N 1024,4096,16384] [--out FILE]
    python benchmarks/gluon_fwd_ab.py --no-checks --no-timings --eager "1,16,2048,128;2,16,4096,128"

``--eager`` times back-to-back eager calls by the wall clock (host and GPU together) at small batches, where a
launch's host time may exceed its kernel's.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys

import torch

import flashlib  # noqa: F401  (before triton: chooses the interpreter where there is no GPU)
from flashlib.bench import ATTENTION_IMPLS, fa2_shape
from flashlib.bench_results import DTYPES, results_meta
from flashlib.io_model import attention_flops
from flashlib.kernels import attention_fwd_hopper as hopper
from flashlib.kernels.attention_fwd import launch_attention_forward
from flashlib.reference import naive_attention
from flashlib.spec import AttentionSpec
from flashlib.timing import graph_time_ms
from flashlib.validation import relative_error

#: O's tolerance against float64 (2-byte inputs, fp32 accumulation), LSE's (float32 throughout).
O_TOL, LSE_TOL = {torch.float16: 4e-3, torch.bfloat16: 2e-2}, 1e-4


def make_inputs(batch, heads, heads_kv, n_q, n_k, d, dtype, bnhd=False, seed=0, grad_out=False):
    """q, k, v (and with ``grad_out`` an output gradient) on the GPU, (B, H, N, D), seeded; ``bnhd``: stored
    (B, N, H, D) and seen as (B, H, N, D)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def make(h, n):
        if bnhd:
            return torch.randn(batch, n, h, d, device="cuda", dtype=dtype, generator=gen).transpose(1, 2)
        return torch.randn(batch, h, n, d, device="cuda", dtype=dtype, generator=gen)
    tensors = (make(heads, n_q), make(heads_kv, n_k), make(heads_kv, n_k))
    return tensors + (make(heads, n_q),) if grad_out else tensors


def run_gluon(q, k, v, causal, **kwargs):
    """The Gluon forward, with two consumers taking turns unless ``kwargs`` say otherwise: the A/B's base columns
    (gluon, gluon_qshared, gluon_qregs) stay that kernel where the launcher's default runs three consumers
    (attention_fwd_hopper.three_consumers_preferred: head_dim 64 from 8192 unmasked rows)."""
    kwargs = {"consumers": 2, "pingpong": hopper.PINGPONG, **kwargs}
    o = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:3], float("nan"), device=q.device, dtype=torch.float32)
    hopper.launch_attention_forward_hopper(q, k, v, o, lse, scale=q.shape[-1] ** -0.5, causal=causal, **kwargs)
    return o, lse


def run_triton(q, k, v, causal):
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
    launch_attention_forward(q, k, v, o, lse, AttentionSpec(causal=causal), use_gluon=False)
    return o, lse


def check(case: str, q, k, v, causal) -> dict:
    """Relative errors of the Gluon forward's O and LSE against float64, and whether it passes."""
    if not hopper.can_run(q, k, v, q, scale=q.shape[-1] ** -0.5):
        return dict(case=case, status="not supported")
    o, lse = run_gluon(q, k, v, causal)
    # Q from shared memory and from registers, each asked by name: the default is one of the two (registers at the
    # head dims of Q_IN_REGISTERS_HEAD_DIMS), and comparing it with itself would prove nothing
    placements = [run_gluon(q, k, v, causal, q_in_registers=on) for on in (False, True)]
    registers_equal = all(torch.equal(a, b) for a, b in zip(*placements))
    group = q.shape[1] // k.shape[1]
    k64, v64 = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    ref_o, ref_lse = naive_attention(q.double(), k64, v64, causal=causal, return_lse=True)
    finite = torch.isfinite(ref_lse)  # rows that see no key: LSE = -inf, O = 0
    lse_err = relative_error(torch.where(finite, lse.double(), 0.0), torch.where(finite, ref_lse, 0.0))
    lse_ok = bool((lse[~finite] == float("-inf")).all())
    o_err = relative_error(o, ref_o)
    ok = o_err <= O_TOL[q.dtype] and lse_err <= LSE_TOL and lse_ok and registers_equal
    return dict(case=case, o_rel_err=o_err, lse_rel_err=lse_err, q_registers_equal=registers_equal,
                status="ok" if ok else "wrong")


#: The checked shapes: (name, (B, H, H_kv, N_q, N_k), stored as (B, N, H, D)).
CHECK_CASES = [("B=2 H=4 N=1000", (2, 4, 4, 1000, 1000), False), ("N_q=77 N_k=300", (1, 2, 2, 77, 300), False),
               ("N_q=300 N_k=77", (1, 2, 2, 300, 77), False), ("GQA 8/2 N=512", (2, 8, 2, 512, 512), False),
               ("BNHD N=384", (2, 4, 4, 384, 384), True)]


def check_grid(dtypes, check, grad_out=False, dims=(64, 128)) -> list[dict]:
    """``check(case, *tensors, causal)`` at every dtype, head_dim of ``dims``, mask and :data:`CHECK_CASES`. The
    scripts pass their ``--d``: with every compile cold, checking a head_dim the run does not time took most of a
    device call (benchmarks/TUNING.md, fiftieth finding)."""
    rows = []
    for name in dtypes:
        for d in dims:
            for causal in (False, True):
                for case, shape, bnhd in CHECK_CASES:
                    tensors = make_inputs(*shape, d, DTYPES[name], bnhd=bnhd, grad_out=grad_out)
                    rows.append(check(f"{name} d={d} causal={causal} {case}", *tensors, causal))
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def positive_ints(text: str, count: int | None = None) -> list[int]:
    """Comma-separated positive integers (exactly ``count`` of them if given), else argparse's error."""
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1 or (count is not None and len(values) != count):
        wanted = f"{count} positive integers" if count else "positive integers"
        raise argparse.ArgumentTypeError(f"expected {wanted}, comma separated; got {text!r}")
    return values


def dropout_probability(text: str) -> float:
    """A dropout probability in [0, 1), else argparse's error."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1); got {text!r}")
    return value


def dtype_names(text: str) -> list[str]:
    """Comma-separated names of :data:`DTYPES`, else argparse's error."""
    names = text.split(",")
    if not all(name in DTYPES for name in names):
        raise argparse.ArgumentTypeError(f"expected {' and '.join(DTYPES)}, comma separated; got {text!r}")
    return names


def head_dims(text: str) -> list[int]:
    """Comma-separated head dims the Gluon kernels have configs for, else argparse's error."""
    dims = positive_ints(text)
    if not all(d in hopper.CONFIGS for d in dims):
        raise argparse.ArgumentTypeError(f"expected head dims among {sorted(hopper.CONFIGS)}; got {text!r}")
    return dims


def config_variants(text: str, flags: tuple[str, ...] = ()) -> dict[str, tuple[int, tuple[int, int, int], set]]:
    """{name: (head_dim, (BLOCK_M, BLOCK_N, STAGES), flags given)} from 'NAME=D:BLOCK_M,BLOCK_N,STAGES[:FLAG]...;...',
    each FLAG among ``flags``, else argparse's error."""
    variants = {}
    form = "NAME=D:BLOCK_M,BLOCK_N,STAGES" + "".join(f"[:{flag}]" for flag in flags)
    for item in filter(None, text.split(";")):
        try:
            name, spec = item.split("=")
            d, config, *given = spec.split(":")
            if not set(given) <= set(flags):
                raise ValueError(given)
            variants[name] = (head_dims(d)[0], tuple(positive_ints(config, 3)), set(given))
        except (ValueError, argparse.ArgumentTypeError):
            raise argparse.ArgumentTypeError(f"expected {form}; got {item!r}") from None
    return variants


def parse_variants(text: str) -> dict[str, tuple[int, tuple[int, int, int], bool, bool, int]]:
    """{name: (head_dim, (BLOCK_M, BLOCK_N, STAGES), pingpong, persistent, consumers)} from
    'NAME=D:BLOCK_M,BLOCK_N,STAGES[:nopp][:nopersist][:three];...' (``three``: three consumer warpgroups, each of
    BLOCK_M rows, rather than two)."""
    return {name: (d, config, "nopp" not in given, "nopersist" not in given, 3 if "three" in given else 2)
            for name, (d, config, given) in config_variants(text, ("nopp", "nopersist", "three")).items()}


def eager_shapes(text: str) -> list[tuple[int, int, int, int]]:
    """'B,H,N,D;...' as (B, H, N, D) tuples, else argparse's error."""
    return [tuple(positive_ints(item, 4)) for item in filter(None, text.split(";"))]


@contextlib.contextmanager
def config_in_place(configs: dict, head_dim: int, config: tuple[int, int, int]):
    """A Gluon kernel's ``configs`` (its module's CONFIGS) with ``config`` at ``head_dim``, restored on leaving."""
    saved = configs[head_dim]
    configs[head_dim] = config
    try:
        yield
    finally:
        configs[head_dim] = saved


@contextlib.contextmanager
def register_operands_in_place(module, name: str, head_dim: int, on: bool = True):
    """``module.<name>`` (a tuple of head dims, e.g. the backward's ``DQ_REGISTER_OPERANDS``) with ``head_dim`` in it
    (``on``) or without it, restored on leaving: the launcher then asks the kernel for its register-operand variant
    at that head_dim, or for its shared-memory one. Either way, whatever the default: an A/B that timed "the
    default" against "registers" would time one kernel twice once registers became the default."""
    saved = getattr(module, name)
    setattr(module, name, tuple(d for d in saved if d != head_dim) + ((head_dim,) if on else ()))
    try:
        yield
    finally:
        setattr(module, name, saved)


def operand_placements(call, module, name: str, head_dim: int) -> tuple:
    """``call`` twice: with the first operands in shared memory, then in registers, at ``head_dim`` (each under
    :func:`register_operands_in_place`), for an A/B to time or check both by name."""

    def placed(on):
        def run():
            with register_operands_in_place(module, name, head_dim, on):
                return call()
        return run
    return placed(False), placed(True)


def run_variant(config, pingpong, persistent, q, k, v, causal, consumers=2):
    """The Gluon forward with ``config`` in place of its own for this head_dim, ping-pong and persistence on or
    off, with two or three ``consumers``."""
    with config_in_place(hopper.CONFIGS, q.shape[-1], config):
        return run_gluon(q, k, v, causal, pingpong=pingpong, persistent=persistent, consumers=consumers)


def print_row(row: dict, digits: int = 4) -> None:
    """One measured row as a JSON line, floats rounded, printed at once (a run cut short keeps what it printed)."""
    print(json.dumps({key: (round(value, digits) if isinstance(value, float) else value)
                      for key, value in row.items()}), flush=True)


def add_grid_options(parser: argparse.ArgumentParser) -> None:
    """--dtype, --d and --N: the grid both A/B scripts time, each checked as it is parsed."""
    parser.add_argument("--dtype", type=dtype_names, default="fp16,bf16")
    parser.add_argument("--d", type=head_dims, default="64,128")
    parser.add_argument("--N", type=positive_ints, default="1024,4096,16384")


def backward_ab_main(argv, doc: str, kernel: str, check, timings) -> int:
    """``main`` of a backward A/B script (gluon_bwd_ab.py, gluon_dq_ab.py): its checks unless --no-checks, then its
    timings, both written to --out; the exit status says whether every check passed."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    add_grid_options(parser)
    parser.add_argument("--variants", type=config_variants, default="",
                        help=f"other Gluon {kernel} configs timed beside its own: 'NAME=D:BLOCK_M,BLOCK_N,STAGES;...'")
    parser.add_argument("--no-checks", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    check_rows = [] if args.no_checks else check_grid(args.dtype, check, grad_out=True, dims=args.d)
    time_rows = timings(args.dtype, args.d, args.N, args.variants)
    return write_checks_and_timings(args.out, check_rows, time_rows)


def write_checks_and_timings(out: str | None, check_rows: list[dict], time_rows: list[dict]) -> int:
    """Write an A/B script's checks and CUDA-graph timings to ``out`` (if given) with the run's meta; return its exit
    status: 0 when every check passed."""
    if out:
        with open(out, "w") as f:
            meta = results_meta(method="each call replayed from a CUDA graph (graph_time_ms, rep=100 ms)",
                                command=" ".join(sys.argv))
            json.dump(dict(meta=meta, checks=check_rows, timings=time_rows), f, indent=1)
    return 0 if all(r["status"] == "ok" for r in check_rows) else 1


def fa2_points(dtypes, dims, lengths):
    """(dtype name, D, N, causal, batch, heads) of every timed point: the FlashAttention-2 benchmark's shapes."""
    for name in dtypes:
        for d in dims:
            for n in lengths:
                for causal in (False, True):
                    yield (name, d, n, causal, *fa2_shape(n, d))


def timings(dtypes, dims, lengths, variants=None) -> list[dict]:
    rows = []
    for name, d, n, causal, batch, heads in fa2_points(dtypes, dims, lengths):
        q, k, v = make_inputs(batch, heads, heads, n, n, d, DTYPES[name])
        o_gluon, lse_gluon = run_gluon(q, k, v, causal)
        o_triton, lse_triton = run_triton(q, k, v, causal)
        flops = attention_flops(batch, heads, n, d, causal)
        row = dict(dtype=name, d=d, N=n, causal=causal, batch=batch, heads=heads,
                   o_vs_triton=relative_error(o_gluon, o_triton),
                   lse_vs_triton=relative_error(lse_gluon, lse_triton))
        calls = {
            "gluon": lambda: run_gluon(q, k, v, causal),
            "gluon_qshared": lambda: run_gluon(q, k, v, causal, q_in_registers=False),
            "gluon_qregs": lambda: run_gluon(q, k, v, causal, q_in_registers=True),
            "triton": lambda: run_triton(q, k, v, causal),
            "cudnn": lambda: ATTENTION_IMPLS["sdpa_cudnn"](q, k, v, causal),
        }
        for name_, (vd, config, pingpong, persistent, consumers) in (variants or {}).items():
            if vd == d:
                calls[name_] = lambda config=config, pp=pingpong, ps=persistent, c=consumers: run_variant(
                    config, pp, ps, q, k, v, causal, c)
                # a variant's time counts only with its output right: a wrong one marks its row and fails the run
                o_variant, lse_variant = calls[name_]()
                row[f"o_{name_}_vs_triton"] = relative_error(o_variant, o_triton)
                row[f"lse_{name_}_vs_triton"] = relative_error(lse_variant, lse_triton)
                if row[f"o_{name_}_vs_triton"] > O_TOL[q.dtype] or row[f"lse_{name_}_vs_triton"] > LSE_TOL:
                    row.setdefault("wrong_variants", []).append(name_)
        for impl, fn in calls.items():
            ms = graph_time_ms(fn, rep=100)
            row[f"{impl}_tflops"] = flops / ms * 1e-9
        row["gluon/triton"] = row["gluon_tflops"] / row["triton_tflops"]
        row["gluon/cudnn"] = row["gluon_tflops"] / row["cudnn_tflops"]
        # > 1: Q from registers faster. Both placements by name (until session 64 this was registers over the
        # default, which at head_dim 64 has been registers since session 53: one kernel timed twice)
        row["qregs/qshared"] = row["gluon_qregs_tflops"] / row["gluon_qshared_tflops"]
        print_row(row)
        rows.append(row)
    return rows


def eager_times(shapes, causal=True, calls=200) -> list[dict]:
    """Wall-clock microseconds per eager call of the front door's forward launcher (host and GPU together: calls
    queued back to back, one synchronization at the end), the Gluon route against the Triton one, at small
    batches where the host's time per call may exceed the kernel's."""
    import time
    rows = []
    for batch, heads, n, d in shapes:
        q, k, v = make_inputs(batch, heads, heads, n, n, d, torch.float16)
        o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
        row = dict(batch=batch, heads=heads, N=n, d=d, causal=causal)
        for name, use_gluon in (("gluon", True), ("triton", False)):
            def call():
                launch_attention_forward(q, k, v, o, lse, AttentionSpec(causal=causal), use_gluon=use_gluon)
            best = float("inf")
            for _ in range(3):
                call()
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(calls):
                    call()
                torch.cuda.synchronize()
                best = min(best, (time.perf_counter() - start) / calls * 1e6)
            row[f"{name}_us"] = best
            row[f"{name}_gpu_us"] = graph_time_ms(call, rep=50) * 1e3
        print_row(row, digits=1)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_grid_options(parser)
    parser.add_argument("--no-checks", action="store_true")
    parser.add_argument("--variants", type=parse_variants, default="",
                        help="extra Gluon configs timed beside the others: "
                             "'NAME=D:BLOCK_M,BLOCK_N,STAGES[:nopp][:nopersist][:three];...'")
    parser.add_argument("--eager", type=eager_shapes, default="",
                        help="also time eager calls, wall clock per call, at 'B,H,N,D;...' (the Gluon route and the "
                             "Triton one)")
    parser.add_argument("--no-timings", action="store_true", help="skip the FA2-shape timings")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    check_rows = [] if args.no_checks else check_grid(args.dtype, check, dims=args.d)
    time_rows = [] if args.no_timings else timings(args.dtype, args.d, args.N, args.variants)
    eager_rows = eager_times(args.eager)
    if args.out:
        with open(args.out, "w") as f:
            method = "each call replayed from a CUDA graph (flashlib.timing.graph_time_ms, rep=100 ms)"
            meta = results_meta(method=method, command=" ".join(sys.argv))
            json.dump(dict(meta=meta, checks=check_rows, timings=time_rows, eager=eager_rows), f, indent=1)
    checks_pass = all(r["status"] in ("ok", "not supported") for r in check_rows)
    return 0 if checks_pass and not any("wrong_variants" in r for r in time_rows) else 1


if __name__ == "__main__":
    sys.exit(main())
