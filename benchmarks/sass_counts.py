"""What the compiler makes of flashlib's attention kernels for Hopper, read on a machine without a GPU.

    python benchmarks/sass_counts.py --kernel fwd --d 64 --dropout 0,0.1
    python benchmarks/sass_counts.py --kernel dkdv --d 64,128 --configs 32x64/3/4,64x64/3/4,64x64/3/8
    python benchmarks/sass_counts.py --kernel gluon_fwd --d 128 --causal no,yes

Triton compiles for a target it is told, not only for the GPU it runs on, and its wheel carries
``ptxas`` and ``cuobjdump``. This script compiles the forward, dK/dV or dQ kernel for sm_90a
(H100) with the arguments flashlib's own launcher would pass (fixed blocks, host tensor
descriptors as on Hopper unless ``--tma none``), disassembles the binary, and prints per
variant: registers, the stack (spilled registers live there: ``STL``/``LDL``), shared memory, the instruction count,
the opcodes, the warpgroup products with their types, and each loop over key blocks (its length, products and
spills, :func:`key_block_loops`). With two values of one option (``--dropout 0,0.1``) it also prints the opcodes
that differ. Static counts cover every copy of a loop the compiler emits and say nothing of
latency or of the tensor cores' overlap: they predict issue-slot costs, to be measured on the GPU.
The local Triton may differ from the GPU machine's (this script prints its version); to compile with the GPU
machine's own (3.6), install it apart and put it first on the path::

    python -m pip install --no-deps --target /tmp/t36 triton==3.6.0
    PYTHONPATH=/tmp/t36 python benchmarks/sass_counts.py --kernel gluon_fwd --d 128 --dtype fp8

Used in benchmarks/TUNING.md (seventeenth finding) to test a dropout rewrite before spending GPU time on it, and
(thirty-sixth, thirty-eighth) to write the Gluon forward's FP8 path without a GPU: ``--fp8-weights shared,registers``
compiles it with P entering P V from shared memory (the default) and from registers.
"""
from __future__ import annotations

import argparse
import collections
import itertools
import os
import re
import subprocess
import tempfile
from unittest import mock

os.environ.setdefault("TRITON_INTERPRET", "0")  # flashlib respects a choice made before it is imported

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from config_text import parse_config  # noqa: E402
from flashlib import runtime  # noqa: E402
from flashlib.kernels import (attention_bwd, attention_bwd_hopper, attention_fwd, attention_fwd_hopper,  # noqa: E402
                              attention_jvp)
from flashlib.kernels import launch as launch_module  # noqa: E402
from flashlib.fp8 import keys_innermost  # noqa: E402
from flashlib.kernels.dropout import effective_dropout_p  # noqa: E402
from flashlib.spec import AttentionSpec  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
TYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.int32: "i32",
              torch.int64: "i64", torch.int8: "i8"}
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def captured_launches(kernel: str, d: int, n: int, dtype, spec: AttentionSpec, block_m: int, block_n: int,
                      tma: bool) -> list[tuple]:
    """(kernel function, positional args, keyword args) of each launch flashlib's launcher makes, captured
    instead of run, on CPU tensors of the FlashAttention-2 benchmark's shape (H = 2048 / D, B = 4)."""
    calls = []
    attention_jvp.launch = lambda fn, grid, *args, **kwargs: calls.append((fn, args, kwargs))
    for module in (attention_fwd, attention_bwd):  # record the launches; answer as an H100 would
        module.launch = lambda fn, grid, *args, **kwargs: calls.append((fn, args, kwargs))
        module.descriptors_supported = lambda device: tma
        module.descriptor_ready = lambda t: tma
    heads = 2048 // d
    q, k, v, o, do = (torch.randn(4, heads, n, d, dtype=dtype) for _ in range(5))
    lse = torch.randn(4, heads, n)
    seed = torch.zeros(1, dtype=torch.int64)
    if kernel == "fwd":
        attention_fwd.launch_attention_forward(q, k, v, o, lse, spec, block_m=block_m, block_n=block_n,
                                               dropout_seed=seed)
    elif kernel == "jvp":  # its launcher's own blocks (attention_jvp.jvp_blocks); q, k, v stand in for tangents
        attention_jvp.launch_attention_jvp(q, k, v, o, lse, q, k, v, torch.empty_like(q), spec, dropout_seed=seed)
    else:
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        attention_bwd.launch_attention_backward(q, k, v, o, lse, do, dq, dk, dv, spec, block_m=block_m,
                                                block_n=block_n, dropout_seed=seed)
    wanted = {"fwd": attention_fwd.attention_fwd_kernel, "dkdv": attention_bwd.attention_bwd_dkdv_kernel,
              "dq": attention_bwd.attention_bwd_dq_kernel, "jvp": attention_jvp.attention_jvp_kernel}[kernel]
    return [call for call in calls if call[0] is wanted]


def captured_gluon_launch(module, kernel_name: str, launcher) -> tuple:
    """(kernel, positional args, keyword args) of the one launch of ``module.<kernel_name>`` that ``launcher()``
    makes, captured instead of run (on CPU tensors). Block sizes, stages and warps are the launcher's own."""
    calls = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((args, kwargs))

    real = getattr(module, kernel_name)
    # straight to the recorder: the compiled-binary cache would ask a driver for a stream
    with mock.patch.object(module, kernel_name, Recorder()), mock.patch.object(launch_module, "COMPILED_CACHE", False):
        launcher()
    args, kwargs = calls[0]
    return real, args, kwargs


def gluon_launch(kernel: str, d: int, n: int, dtype, causal: bool, dropout_p: float = 0.0,
                 fp8_weights_shared: bool = True, register_operands: bool | None = None,
                 draws_ahead: bool | None = None, consumers: int | None = None) -> tuple:
    """The launch of the Gluon forward (``gluon_fwd``), dK/dV (``gluon_dkdv``) or dQ kernel (``gluon_dq``) for the
    FlashAttention-2 benchmark's shape (H = 2048 / D, B = 4), captured (``--configs`` does not apply). ``dtype``
    float8_e4m3fn (the forward only): q, k, v in FP8, V stored keys innermost, O in bfloat16, per-tensor factors,
    P entering P V from shared memory (``fp8_weights_shared``) or from registers. ``register_operands``: the kernels'
    loop-invariant first operands read from registers (the forward's Q; the backward's K, V or Q, dO); None: the
    launcher's default. ``draws_ahead``: the backward kernels' dropout draws drawn a step ahead (None: the default).
    ``consumers``: the forward's consumer warpgroups a program, 2 or 3 (None: the launcher's default)."""
    q, k, v, o = (torch.randn(4, 2048 // d, n, d).to(dtype) for _ in range(4))
    rows = torch.empty(4, 2048 // d, n)
    if dtype == torch.float8_e4m3fn:
        if kernel != "gluon_fwd":
            raise ValueError(f"FP8 is a forward's type; {kernel} takes fp16 or bf16")
        o, v = o.to(torch.bfloat16), keys_innermost(v)
        descale = torch.ones(3, 4, q.shape[1])
        return captured_gluon_launch(attention_fwd_hopper, "attention_fwd_hopper_kernel", lambda: (
            attention_fwd_hopper.launch_attention_forward_hopper(q, k, v, o, rows, scale=d ** -0.5, causal=causal,
                                                                 persistent=False, descale=descale,
                                                                 fp8_weights_shared=fp8_weights_shared,
                                                                 q_in_registers=register_operands)))
    drop = dict(dropout_p=effective_dropout_p(dropout_p), dropout_seed=torch.zeros(1, dtype=torch.int64))
    if kernel == "gluon_fwd":
        return captured_gluon_launch(attention_fwd_hopper, "attention_fwd_hopper_kernel", lambda: (
            attention_fwd_hopper.launch_attention_forward_hopper(q, k, v, o, rows, scale=d ** -0.5, causal=causal,
                                                                 persistent=False, q_in_registers=register_operands,
                                                                 consumers=consumers, **drop)))  # the grid asks no GPU
    drop.update(register_operands=register_operands, draws_ahead=draws_ahead)
    if kernel == "gluon_dq":
        return captured_gluon_launch(attention_bwd_hopper, "attention_bwd_dq_hopper_kernel", lambda: (
            attention_bwd_hopper.launch_attention_dq_hopper(q, k, v, o, rows, rows, torch.empty_like(q),
                                                            scale=d ** -0.5, causal=causal, **drop)))
    return captured_gluon_launch(attention_bwd_hopper, "attention_bwd_dkdv_hopper_kernel", lambda: (
        attention_bwd_hopper.launch_attention_dkdv_hopper(q, k, v, o, rows, rows, torch.empty_like(k),
                                                          torch.empty_like(v), scale=d ** -0.5, causal=causal,
                                                          **drop)))


def compile_gluon_for_hopper(fn, args, kwargs):
    """A Gluon kernel compiled for sm_90a with these arguments (the types Triton's launcher would give them)."""
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import mangle_type

    kwargs = dict(kwargs)
    options = dict(num_warps=kwargs.pop("num_warps"), maxnreg=kwargs.pop("maxnreg", None))
    signature = {name: mangle_type(a) for name, a in zip(fn.arg_names, args)}
    constexprs = {}
    for name in fn.arg_names[len(args):]:
        signature[name] = "constexpr"
        constexprs[(fn.arg_names.index(name),)] = options["num_warps"] if name == "num_warps" else kwargs[name]
    source = GluonASTSource(fn, signature, constexprs, {})
    return triton.compile(source, target=HOPPER, options={k: v for k, v in options.items() if v is not None})


def compile_for_hopper(fn, args, kwargs, warps: int | None, stages: int | None, maxnreg: int | None = None,
                       specialize: bool = True):
    """The kernel compiled for sm_90a with these arguments' types, its registers capped at ``maxnreg`` if given.

    ``specialize``: as Triton's launcher does, an integer equal to 1 becomes the constant 1, and tensors
    (16-byte aligned: CPU tensors from torch are) and integers divisible by 16 are marked so; without it
    (``False``, what this script did before session 38) no load through pointers can be vectorized."""
    kwargs = dict(kwargs)
    launcher_warps, launcher_stages = kwargs.pop("num_warps"), kwargs.pop("num_stages")
    num_warps, num_stages = warps or launcher_warps, stages or launcher_stages
    signature, constexprs, attrs = {}, {}, {}
    divisible = [["tt.divisibility", 16]]
    for index, (name, a) in enumerate(zip(fn.arg_names, args)):
        if isinstance(a, TensorDescriptor):
            signature[name] = f"tensordesc<{TYPE_NAMES[a.base.dtype]}[{','.join(map(str, a.block_shape))}]>"
        elif isinstance(a, torch.Tensor):
            signature[name] = "*" + TYPE_NAMES[a.dtype]
            if specialize and a.data_ptr() % 16 == 0:
                attrs[(index,)] = divisible
        elif a is None:
            signature[name], constexprs[name] = "constexpr", None
        elif isinstance(a, bool):
            signature[name] = "i1"
        elif isinstance(a, int):
            if specialize and a == 1:
                signature[name], constexprs[name] = "constexpr", 1
            else:
                signature[name] = "i32" if -2**31 <= a < 2**31 else "i64"
                if specialize and a % 16 == 0:
                    attrs[(index,)] = divisible
        elif isinstance(a, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"argument {name}: no Triton type for {type(a).__name__}")
    for name in fn.arg_names[len(args):]:
        if name in kwargs:
            signature[name], constexprs[name] = "constexpr", kwargs[name]
    source = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    options = dict(num_warps=num_warps, num_stages=num_stages)
    if maxnreg:
        options["maxnreg"] = maxnreg
    return triton.compile(source, target=HOPPER, options=options)


def sass_of(compiled) -> tuple[str, dict]:
    """(SASS listing, resource usage: REG, STACK, SHARED, LOCAL) of a compiled kernel, from the bundled cuobjdump."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", cubin.name], capture_output=True,
                              text=True, check=True).stdout
        usage = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", cubin.name], capture_output=True,
                               text=True, check=True).stdout
    return sass, {key: int(value) for key, value in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", usage)}


def opcode_of(line: str) -> str | None:
    """The opcode of one SASS instruction line (after its address and any predicate), else None."""
    match = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*)", line)
    return match.group(1) if match else None


#: The warpgroup products' opcodes: ``HGMMA`` multiplies 16-bit (and tf32) operands, ``QGMMA`` FP8 ones.
PRODUCT_OPCODES = ("HGMMA", "QGMMA")
PRODUCT = "(?:" + "|".join(PRODUCT_OPCODES) + ")"


def disassemble(compiled) -> tuple[collections.Counter, dict, int, collections.Counter, list, collections.Counter,
                                   list]:
    """(opcode counts, resource usage, :func:`spills_among_products`, the warpgroup products' instructions with
    their shape and types, e.g. ``QGMMA.64x128x32.F32.E4M3.E4M3``, :func:`key_block_loops`,
    :func:`product_first_operands`, :func:`last_product_windows`) of a compiled kernel."""
    sass, resources = sass_of(compiled)
    opcodes = collections.Counter(op for op in map(opcode_of, sass.splitlines()) if op)
    products = collections.Counter(re.findall(rf"\b{PRODUCT}\.[0-9A-Za-z_.]+", sass))
    return (opcodes, resources, spills_among_products(sass), products, key_block_loops(sass),
            product_first_operands(sass), last_product_windows(sass))


def product_first_operands(sass: str) -> collections.Counter:
    """How many warpgroup products read their first operand (A) from ``registers`` and how many from ``shared``
    memory: ``HGMMA.64x64x16.F32 R24, gdesc[UR8], ...`` reads both operands through shared-memory descriptors,
    ``HGMMA.64x64x16.F32 R24, R120, gdesc[UR8], ...`` its A from registers."""
    return collections.Counter("shared" if a.startswith("gdesc") else "registers"
                               for a in re.findall(rf"\b{PRODUCT}\.\S+\s+R\d+,\s*(\S+),", sass))


def spills_among_products(sass: str) -> int:
    """Spill instructions (STL, LDL) between the first and the last warpgroup product (:data:`PRODUCT_OPCODES`) of
    each register region, the code between two ``setmaxnreg`` (USETMAXREG): in a warp-specialized kernel, the
    spills of a consumer's loops. ptxas hands a few scalars computed before the partitions split to them through
    the stack (stored at the kernel's entry, loaded at a partition's): those lie outside, as do the loading warp's
    (it has no product), and cost once per program, not per key block. :func:`key_block_loops` counts per loop."""
    count, region = 0, []
    for line in sass.splitlines() + ["USETMAXREG"]:
        if "USETMAXREG" in line:
            ops = [opcode_of(x) for x in region]
            products = [i for i, op in enumerate(ops) if op in PRODUCT_OPCODES]
            if products:
                count += sum(op in ("STL", "LDL") for op in ops[products[0]:products[-1]])
            region = []
        region.append(line)
    return count


def _instructions(sass: str) -> list[tuple[int, str]]:
    """(address, instruction text without its predicate) of every instruction of the listing."""
    found = []
    for line in sass.splitlines():
        match = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T\d]+\s+)?(.*)", line)
        if match:
            found.append((int(match.group(1), 16), match.group(2)))
    return found


def _opcode(address: int, text: str) -> str | None:
    """:func:`opcode_of` an instruction of :func:`_instructions`."""
    return opcode_of(f"        /*{address:04x}*/ {text}")


def _product_loops(instructions: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """(first, last) indexes into ``instructions`` (:func:`_instructions`) of each innermost loop that issues
    warpgroup products. A loop is a backward branch's span, innermost when no other backward branch lies in it."""
    loops = []
    for end, (address, text) in enumerate(instructions):
        branch = re.match(r"BRA\b[^;]*?(0x[0-9a-f]+)", text)
        if branch and int(branch.group(1), 16) < address:
            start = next(i for i, (a, _) in enumerate(instructions) if a >= int(branch.group(1), 16))
            loops.append((start, end))
    innermost = [(s, e) for s, e in loops if not any(s <= s2 and e2 <= e and (s2, e2) != (s, e) for s2, e2 in loops)]
    return [(s, e) for s, e in innermost if any(_opcode(*ins) in PRODUCT_OPCODES for ins in instructions[s:e + 1])]


def key_block_loops(sass: str) -> list[tuple[int, int, int, int]]:
    """(instructions, products, STL, LDL) of each innermost loop that issues warpgroup products: a consumer's loop
    over key (or query) blocks, one copy per mask stage and partition (:func:`_product_loops`). A value that changes
    every block (a tile, a running max) can only be spilled with an ``STL`` inside the loop; a value the loop does
    not change, spilled before it, is reloaded with ``LDL`` alone: so STL counts what costs every block, LDL what
    ptxas chose to reload."""
    instructions = _instructions(sass)
    found = []
    for start, end in _product_loops(instructions):
        ops = [_opcode(*ins) for ins in instructions[start:end + 1]]
        found.append((end - start + 1, sum(op in PRODUCT_OPCODES for op in ops), ops.count("STL"), ops.count("LDL")))
    return found


def last_product_windows(sass: str) -> list[int]:
    """For each innermost loop that issues warpgroup products (:func:`key_block_loops`' loops, in their order), the
    instructions between the issue of its last group of products (its last ``WARPGROUP.ARRIVE``) and the wait for
    them (the next ``WARPGROUP.DEPBAR``), products left out: the work a consumer does while that group runs. A loop
    with no ``WARPGROUP.ARRIVE`` counts 0."""
    instructions = _instructions(sass)
    windows = []
    for start, end in _product_loops(instructions):
        body = instructions[start:end + 1]
        arrive = max((i for i, (_, text) in enumerate(body) if text.startswith("WARPGROUP.ARRIVE")), default=None)
        if arrive is None:
            windows.append(0)
            continue
        wait = next((i for i in range(arrive, len(body)) if body[i][1].startswith("WARPGROUP.DEPBAR")), len(body))
        windows.append(sum(_opcode(*body[i]) not in PRODUCT_OPCODES for i in range(arrive + 1, wait)))
    return windows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="fwd",
                        help="comma list of fwd, dkdv, dq, jvp (forward-mode AD, its launcher's own blocks), "
                        "gluon_fwd, gluon_dkdv, gluon_dq (the Gluon kernels; default fwd)")
    parser.add_argument("--d", default="64", help="comma list of head dims (default 64)")
    parser.add_argument("--dropout", default="0", help="comma list of dropout_p (default 0)")
    parser.add_argument("--causal", default="no", help="comma list of no, yes (default no)")
    parser.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp8"),
                        help="fp8 (float8 e4m3, O in bfloat16) for gluon_fwd only (default fp16)")
    parser.add_argument("--fp8-weights", default="shared",
                        help="comma list of shared, registers: where FP8 weights enter P V from (--dtype fp8; "
                        "default shared, the kernel's default)")
    parser.add_argument("--register-operands", default="default",
                        help="comma list of default, no, yes: the Gluon kernels' loop-invariant first operands (the "
                        "forward's Q; the backward's K and V, or Q and dO) read from shared memory or from registers "
                        "(default: the launcher's choice)")
    parser.add_argument("--draws-ahead", default="default",
                        help="comma list of default, no, yes: the Gluon dK/dV and dQ kernels' dropout draws drawn a "
                        "step ahead, during the step before's last product (default: the launcher's choice)")
    parser.add_argument("--consumers", default="default",
                        help="comma list of default, 2, 3: the Gluon forward's consumer warpgroups a program "
                        "(default: the launcher's choice)")
    parser.add_argument("--configs", default="128x64",
                        help="comma list of BLOCK_MxBLOCK_N[/stages[/warps]], e.g. 64x64/3/8 (default 128x64; "
                        "stages and warps default to the launcher's choice)")
    parser.add_argument("--tma", default="host", choices=("host", "none"),
                        help="host tensor descriptors, as on Hopper (default), or pointers")
    parser.add_argument("--maxnreg", type=int, default=None,
                        help="cap registers per thread (ptxas), as a launch's maxnreg")
    parser.add_argument("--top", type=int, default=14, help="opcodes listed per variant")
    args = parser.parse_args()
    if runtime.INTERPRET:
        parser.error("TRITON_INTERPRET=1 is set: this script compiles for the GPU; unset it")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}[args.dtype]
    if args.dtype == "fp8" and args.kernel != "gluon_fwd":
        parser.error("--dtype fp8 compiles the Gluon forward only: pass --kernel gluon_fwd")
    try:
        configs = [parse_config(text) for text in args.configs.split(",")]
    except ValueError as error:
        parser.error(f"--configs: {error}")
    try:
        heads_dims, dropouts = [int(d) for d in args.d.split(",")], [float(p) for p in args.dropout.split(",")]
    except ValueError:
        parser.error(f"--d takes integers and --dropout numbers, comma separated; got {args.d!r} and {args.dropout!r}")
    operand_places, draws = args.register_operands.split(","), args.draws_ahead.split(",")
    if any(p not in ("default", "no", "yes") for p in operand_places):
        parser.error(f"--register-operands takes default, no and yes; got {args.register_operands!r}")
    if any(p not in ("default", "no", "yes") for p in draws):
        parser.error(f"--draws-ahead takes default, no and yes; got {args.draws_ahead!r}")
    consumer_counts = args.consumers.split(",")
    if any(c not in ("default", "2", "3") for c in consumer_counts):
        parser.error(f"--consumers takes default, 2 and 3; got {args.consumers!r}")
    if consumer_counts != ["default"] and set(args.kernel.split(",")) != {"gluon_fwd"}:
        parser.error("--consumers is an option of the Gluon forward: --kernel gluon_fwd only")
    if draws != ["default"] and not set(args.kernel.split(",")) <= {"gluon_dkdv", "gluon_dq"}:
        parser.error("--draws-ahead is an option of the Gluon backward kernels: --kernel gluon_dkdv and gluon_dq only")
    weights = args.fp8_weights.split(",")
    if any(w not in ("shared", "registers") for w in weights) or (args.dtype != "fp8" and weights != ["shared"]):
        parser.error(f"--fp8-weights takes shared and registers, with --dtype fp8; got {args.fp8_weights!r}")
    print(f"triton {triton.__version__}, target sm_90a; {args.dtype}, N = 4096, tma {args.tma}")
    grid = itertools.product(args.kernel.split(","), heads_dims, args.causal.split(","), dropouts, configs, weights,
                             operand_places, draws, consumer_counts)
    choice = {"default": None, "yes": True, "no": False}
    counted = {}
    for kernel, d, causal, p, (block_m, block_n, stages, warps), weight_place, in_registers, ahead, crew in grid:
        if causal not in ("no", "yes"):
            parser.error(f"--causal takes no and yes; got {causal!r}")
        if kernel not in ("fwd", "dkdv", "dq", "jvp", "gluon_fwd", "gluon_dkdv", "gluon_dq"):
            parser.error(f"--kernel takes fwd, dkdv, dq, jvp, gluon_fwd, gluon_dkdv and gluon_dq; got {kernel!r}")
        spec = AttentionSpec(causal=causal == "yes", dropout_p=p)
        if kernel.startswith("gluon"):
            launches = [gluon_launch(kernel, d, 4096, dtype, causal == "yes", p, weight_place == "shared",
                                     choice[in_registers], choice[ahead], None if crew == "default" else int(crew))]
        else:
            launches = captured_launches(kernel, d, 4096, dtype, spec, block_m, block_n, args.tma == "host")
        for fn, call_args, call_kwargs in launches:
            if kernel.startswith("gluon"):
                compiled = compile_gluon_for_hopper(fn, call_args, call_kwargs)
            else:
                compiled = compile_for_hopper(fn, call_args, call_kwargs, warps, stages, args.maxnreg)
            opcodes, resources, among_products, products, loops, first_operands, windows = disassemble(compiled)
            key = (kernel, d, causal, p, (block_m, block_n, stages, warps), weight_place, in_registers, ahead, crew)
            counted[key] = opcodes
            spills = opcodes["STL"] + opcodes["LDL"]
            place = f" P from {weight_place}" if args.dtype == "fp8" else ""
            if kernel.startswith("gluon"):  # the Gluon launchers' own blocks and slots
                tile = f"{call_kwargs['BLOCK_M']}x{call_kwargs['BLOCK_N']} s{call_kwargs['STAGES']}"
                place += f" register operands {in_registers}" + (f" draws ahead {ahead}" if len(draws) > 1 else "")
                place += f" consumers {call_kwargs['CONSUMERS']}" if "CONSUMERS" in call_kwargs else ""
            elif kernel == "jvp":  # its launcher's own blocks
                tile = f"{call_kwargs['BLOCK_M']}x{call_kwargs['BLOCK_N']} s{compiled.metadata.num_stages}"
            else:
                tile = f"{block_m}x{block_n} s{compiled.metadata.num_stages}"
            print(f"{kernel} D={d} causal={causal} dropout={p}{place} {tile} w{compiled.metadata.num_warps}: "
                  f"{sum(opcodes.values())} instructions, "
                  f"registers {resources.get('REG')}, stack {resources.get('STACK')} B ({spills} STL/LDL, "
                  f"{among_products} among the products), "
                  f"shared {compiled.metadata.shared} B")
            print("    " + ", ".join(f"{op} {n}" for op, n in opcodes.most_common(args.top)))
            print("    products: " + ", ".join(f"{op} {n}" for op, n in sorted(products.items())))
            print(f"    first operand: {first_operands.get('registers', 0)} from registers, "
                  f"{first_operands.get('shared', 0)} from shared memory")
            print("    block loops: " + "; ".join(f"{n} instructions, {p} products, {st} STL, {ld} LDL"
                                                 for n, p, st, ld in loops))
            print("    beside each loop's last products: " + ", ".join(map(str, windows)) + " instructions")
    for (a_key, a), (b_key, b) in itertools.combinations(counted.items(), 2):
        if a_key[0] == b_key[0] and sum(x != y for x, y in zip(a_key, b_key)) == 1:  # one kernel, one option
            changed = sorted(set(a) | set(b), key=lambda op: -abs(b[op] - a[op]))
            diff = ", ".join(f"{op} {b[op] - a[op]:+d}" for op in changed if b[op] != a[op])
            print(f"{b_key} against {a_key}: {sum(b.values()) - sum(a.values()):+d} ({diff})")


if __name__ == "__main__":
    main()
