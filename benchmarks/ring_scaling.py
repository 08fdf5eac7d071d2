"""Ring attention on several GPUs: correctness on NCCL, scaling against one GPU, hidden communication,
and PyTorch's context parallel on the same shapes (issue 17).

One command, W processes (one GPU each, NCCL), sections in this order, each written to the JSON as
soon as it ends so that a run cut short keeps what it measured:

1. ``check``: every rank's shard of O, dQ, dK, dV against one-GPU ``flash_attention`` on the gathered
   input (the whole sequence, on every rank) and against the float64 reference, causal and not,
   contiguous and zigzag, float16 and bfloat16, with GQA (relative error, ``flashlib.validation``).
2. ``scaling``: forward and forward+backward time of one GPU's ``flash_attention`` on the whole
   sequence against ``ring_attention`` over W GPUs, for N from ``--n`` (fixed B, H, D), not causal
   (contiguous shards) and causal (zigzag shards). Tokens/s, speed-up and scaling efficiency
   (speed-up / W). The ring's time is the slowest rank's.
3. ``overlap``: one ring forward+backward under ``torch.profiler`` on every rank: the time of the
   NCCL kernels, how much of it ran while a compute kernel ran on the same GPU (hidden), and the
   exposed rest as a share of the step.
4. ``context_parallel``: PyTorch's ``context_parallel`` (ring attention inside SDPA on DTensors) on the
   same shapes, forward+backward, with the SDPA backend named, when it runs here.
5. the longer sequences of ``--n-late`` (scaling only), while the time budget lasts.

Kernel configs are pinned (``--configs``: by default one config per kernel, the autotuner's usual pick at
D = 128 on the H100) for the single GPU and the ring alike, so that no sequence length autotunes:
the comparison is of the same kernels. A kernel given several configs (``fwd=128x128/3/8|128x64/3/8``)
autotunes among those alone, once per shape, in the warm-up call. ``--configs autotuned`` pins nothing: each rank's autotuners
pick for its own shapes during the warm-up call, the kernels a user gets (and what the comparison
with context_parallel, whose SDPA backends choose their own kernels, should see). NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and friends,
set here for every process this starts).

    PYTHONPATH=. python3 benchmarks/ring_scaling.py --out $OUT/ring.json          # on a 2-GPU machine
    PYTHONPATH=. python3 benchmarks/ring_scaling.py --cpu --out /tmp/ring.json     # a dry run: gloo, interpreter
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
import traceback

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
os.environ.update(MULTICAST_OFF)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from config_text import parse_config  # noqa: E402

# flashlib is imported inside the functions: a worker decides GPU or interpreter (--cpu) before flashlib loads.

#: (BLOCK_M, BLOCK_N, stages, warps) per kernel at D = 128 (benchmarks/TUNING.md: 8-warp 128-row forward
#: tiles on Hopper; dK/dV 32 x 64 / 4 warps; dQ 128 x 64 / 3 stages / 8 warps).
DEFAULT_CONFIGS = "fwd=128x64/3/8,dkdv=32x64/3/4,dq=128x64/3/8"
#: ``--configs autotuned``: nothing pinned; every rank's autotuners pick for their own shapes (the single GPU's
#: whole sequence, the ring's shards and diagonal steps), as a user's first calls would, in the warm-up call.
#: Every config of every list compiles for each mask and step kind, which takes minutes on the GPU host.
AUTOTUNED = "autotuned"
#: The name the profiled step is recorded under (overlap() counts the kernels that start within it).
MEASURED_STEP = "ring_scaling.measured_step"
#: (label, causal, scheme) of the scaling runs.
MODES = (("full", False, "contiguous"), ("causal", True, "zigzag"))
#: The suffix of a dK/dV config that issues dP^T after dV's product (``DP_AFTER_DV``, TUNING nineteenth finding).
DP_AFTER_DV_SUFFIX = ":dp_after_dv"


def parse_configs(text: str) -> dict | str:
    """``kernel=CONFIG[|CONFIG...]`` items, one for each of fwd, dkdv and dq, each CONFIG ``MxN/stages/warps``
    (:mod:`config_text`'s form; a dK/dV one may end in :data:`DP_AFTER_DV_SUFFIX`): kernel -> list of
    (BLOCK_M, BLOCK_N, stages, warps, dp_after_dv). Several configs of one kernel are left to its autotuner.
    Or :data:`AUTOTUNED`."""
    if text == AUTOTUNED:
        return AUTOTUNED
    configs = {}
    for item in text.split(","):
        kernel, _, listed = item.partition("=")
        choices = []
        for config in listed.split("|"):
            dp_after_dv = kernel == "dkdv" and config.endswith(DP_AFTER_DV_SUFFIX)
            try:
                parsed = parse_config(config.removesuffix(DP_AFTER_DV_SUFFIX) if dp_after_dv else config)
            except ValueError:
                parsed = (None,)
            if None in parsed:
                raise SystemExit(f"--configs: expected kernel=MxN/stages/warps[|MxN/stages/warps...] items, "
                                 f"got {item!r}")
            choices.append((*parsed, dp_after_dv))
        configs[kernel] = choices
    if set(configs) != {"fwd", "dkdv", "dq"}:
        raise SystemExit(f"--configs must name fwd, dkdv and dq; got {sorted(configs)}")
    return configs


def pin_configs(configs: dict) -> None:
    """Leave each autotuner only the listed configs: one config never benchmarks, so the same kernels run at
    every N; a few are benchmarked once per shape in the warm-up call."""
    from flashlib.kernels import attention_bwd, attention_fwd
    tuned = {"fwd": attention_fwd.attention_fwd_kernel_autotuned,
             "dkdv": attention_bwd.attention_bwd_dkdv_kernel_autotuned,
             "dq": attention_bwd.attention_bwd_dq_kernel_autotuned}
    for name, autotuner in tuned.items():
        keep = []
        for wanted in configs[name]:
            found = [c for c in autotuner.configs
                     if (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_stages, c.num_warps,
                         bool(c.kwargs.get("DP_AFTER_DV"))) == wanted and c.maxnreg is None]
            if len(found) != 1:
                raise SystemExit(f"--configs: {name}={wanted} is not one of the autotuner's configs")
            keep += found
        autotuner.configs = keep


def apply_configs(configs: dict | str) -> None:
    """Pin ``configs`` (:func:`pin_configs`), or, for :data:`AUTOTUNED`, leave every autotuner its list."""
    if configs != AUTOTUNED:
        pin_configs(configs)


# ---------------------------------------------------------------- helpers run on every rank
class Budget:
    """The run's deadline, decided by rank 0 and shared, so that every rank skips the same work."""

    def __init__(self, seconds: float, device):
        self.end = time.monotonic() + seconds
        self.device = device

    def allows(self, estimate_s: float) -> bool:
        flag = torch.tensor([float(time.monotonic() + estimate_s < self.end)], device=self.device)
        dist.broadcast(flag, 0)
        return bool(flag.item())


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def every_rank(value: float, device) -> list[float]:
    """Every rank's value, in rank order."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [o.item() for o in out]


def time_s(fn, device, reps: int) -> float:
    """Wall seconds per call of ``fn`` on this rank (after every rank is ready; one call to warm up)."""
    fn()
    sync(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    return (time.perf_counter() - start) / reps


def reps_for(estimate_s: float, target_s: float) -> int:
    return max(1, min(5, int(target_s / max(estimate_s, 1e-6))))


# ---------------------------------------------------------------- 1. correctness on the group's backend
def check(rank, world, device, args) -> list[dict]:
    from flashlib import flash_attention
    from flashlib.distributed import ring_attention, shard_sequence
    from flashlib.reference import naive_attention
    from flashlib.validation import relative_error, tolerance

    batch, heads, kv_heads, n, d = args.check_shape
    rows = []
    for dtype in (torch.float16, torch.bfloat16):
        for label, causal, scheme in (("full", False, "contiguous"), ("full", False, "zigzag"),
                                      ("causal", True, "contiguous"), ("causal", True, "zigzag")):
            gen = torch.Generator().manual_seed(len(rows))  # the same full inputs on every rank
            full = [torch.randn(batch, h, n, d, generator=gen, dtype=torch.float64).to(device, dtype)
                    for h in (heads, kv_heads, kv_heads, heads)]
            q, k, v, do = full
            single = [t.clone().requires_grad_() for t in (q, k, v)]
            o_single = flash_attention(*single, causal=causal)
            o_single.backward(do)
            exact = [t.double().requires_grad_() for t in (q, k, v)]
            o_exact = naive_attention(*exact, causal=causal)
            o_exact.backward(do.double())
            mine = [shard_sequence(t, rank, world, scheme).contiguous().requires_grad_() for t in (q, k, v)]
            o_ring = ring_attention(*mine, causal=causal, scheme=scheme)
            o_ring.backward(shard_sequence(do, rank, world, scheme))
            got = dict(zip(("O", "dQ", "dK", "dV"), (o_ring, *(t.grad for t in mine))))
            against = {}
            for what, reference in (("flash_attention", (o_single, *(t.grad for t in single))),
                                    ("float64", (o_exact, *(t.grad for t in exact)))):
                errors = {key: relative_error(got[key], shard_sequence(ref, rank, world, scheme))
                          for key, ref in zip(got, reference)}
                against[what] = {key: max(every_rank(e, device)) for key, e in errors.items()}
            # one-GPU flash_attention against float64, for scale
            single_err = {key: relative_error(t, ref) for key, t, ref in
                          zip(got, (o_single, *(t.grad for t in single)), (o_exact, *(t.grad for t in exact)))}
            row = dict(dtype=str(dtype).replace("torch.", ""), mask=label, scheme=scheme,
                       shape=dict(B=batch, H=heads, H_kv=kv_heads, N=n, D=d), tolerance=tolerance(dtype),
                       ring_vs_flash_attention=against["flash_attention"], ring_vs_float64=against["float64"],
                       flash_attention_vs_float64=single_err)
            row["passed"] = all(e <= tolerance(dtype) for e in against["flash_attention"].values()) and \
                all(e <= tolerance(dtype) for e in against["float64"].values())
            rows.append(row)
            if rank == 0:
                worst = max(against["flash_attention"].values())
                print(f"check {row['dtype']:8s} {label:6s} {scheme:10s} ring vs flash_attention {worst:.2e} "
                      f"vs float64 {max(against['float64'].values()):.2e} (tol {tolerance(dtype):.0e}) "
                      f"{'ok' if row['passed'] else 'FAILED'}", flush=True)
            del full, single, exact, mine, o_single, o_exact, o_ring
    return rows


# ---------------------------------------------------------------- 2. scaling
def scaling_point(rank, world, device, args, n, label, causal, scheme, budget, estimate) -> dict | None:
    """One (N, mask) point: one GPU's flash_attention on the whole sequence against the ring."""
    from flashlib import flash_attention
    from flashlib.distributed import ring_attention
    from flashlib.io_model import attention_flops

    if not budget.allows(estimate):
        return None
    batch, heads, d = args.batch, args.heads, args.head_dim
    dtype = torch.float16
    flops = {what: attention_flops(batch, heads, n, d, causal, mode)
             for what, mode in (("fwd", "fwd"), ("fwd_bwd", "train"))}
    row = dict(N=n, mask=label, scheme=scheme, B=batch, H=heads, D=d, dtype="float16", world_size=world)
    torch.manual_seed(rank)

    def leaves(length):
        return [torch.randn(batch, heads, length, d, device=device, dtype=dtype).requires_grad_()
                for _ in range(3)]

    reps = reps_for(flops["fwd_bwd"] / 350e12 if device.type == "cuda" else 3.5, args.target_s)

    def measure(attend, length) -> dict:
        """Forward and forward+backward seconds per call of ``attend(q, k, v)`` on every rank, and this
        rank's peak memory."""
        q, k, v = leaves(length)
        do = torch.randn_like(q)

        def fwd():
            with torch.no_grad():
                attend(q, k, v)

        def train():
            for t in (q, k, v):
                t.grad = None
            attend(q, k, v).backward(do)

        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        times = {"fwd_s": every_rank(time_s(fwd, device, reps), device),
                 "fwd_bwd_s": every_rank(time_s(train, device, reps), device)}
        if device.type == "cuda":
            times["peak_bytes"] = torch.cuda.max_memory_allocated(device)
        return times

    # one GPU on the whole sequence (every rank at once, each on its own GPU), then the ring on shards
    single = measure(lambda q, k, v: flash_attention(q, k, v, causal=causal), n)
    ring = measure(lambda q, k, v: ring_attention(q, k, v, causal=causal, scheme=scheme), n // world)
    row.update(reps=reps, single=single, ring=ring)
    for what in ("fwd", "fwd_bwd"):
        t1, tw = single[f"{what}_s"][0], max(ring[f"{what}_s"])
        row[what] = dict(single_s=t1, ring_s=tw, speedup=t1 / tw, efficiency=t1 / tw / world,
                         single_tokens_per_s=batch * n / t1, ring_tokens_per_s=batch * n / tw,
                         single_tflops=flops[what] / t1 / 1e12, ring_tflops=flops[what] / tw / 1e12)
    if rank == 0:
        print(f"scaling N={n:7d} {label:6s} fwd {row['fwd']['single_s'] * 1e3:8.1f} -> {row['fwd']['ring_s'] * 1e3:8.1f} ms "
              f"({row['fwd']['speedup']:.2f}x)  fwd+bwd {row['fwd_bwd']['single_s'] * 1e3:8.1f} -> "
              f"{row['fwd_bwd']['ring_s'] * 1e3:8.1f} ms ({row['fwd_bwd']['speedup']:.2f}x, "
              f"{row['fwd_bwd']['ring_tflops']:.0f} TFLOP/s over {world} GPUs)", flush=True)
    return row


def scaling(rank, world, device, args, lengths, budget, rows) -> None:
    last = {}
    for n in lengths:
        for label, causal, scheme in MODES:
            previous = last.get(label)
            # a doubled N costs four times the previous point (single and ring, warm-up and reps)
            estimate = 4 * previous if previous else 5.0
            started = time.monotonic()
            row = scaling_point(rank, world, device, args, n, label, causal, scheme, budget, estimate)
            if row is None:
                if rank == 0:
                    print(f"scaling N={n} {label}: skipped, the time budget would not last", flush=True)
                return
            last[label] = time.monotonic() - started
            rows.append(row)


# ---------------------------------------------------------------- 3. hidden communication, from a profile
def merged(intervals):
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def covered(intervals, cover) -> float:
    """Length of ``intervals`` (merged) that lies inside ``cover`` (merged)."""
    total, j = 0.0, 0
    for start, end in intervals:
        while j < len(cover) and cover[j][1] <= start:
            j += 1
        i = j
        while i < len(cover) and cover[i][0] < end:
            total += max(0.0, min(end, cover[i][1]) - max(start, cover[i][0]))
            i += 1
    return total


def overlap(rank, world, device, args, n, label, causal, scheme) -> dict:
    """One profiled ring forward+backward: NCCL kernel time, the share of it under compute kernels."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from flashlib.distributed import ring_attention

    if device.type != "cuda":
        # No GPU kernels to profile; and torch's profiler in gloo processes on the CPU aborted their exit in 3 of 14
        # dry runs ("terminate called without an active exception"), after the results were written.
        return dict(N=n, mask=label, scheme=scheme, rank=rank, note="no GPU: nothing to profile")
    torch.manual_seed(rank)
    q, k, v = [torch.randn(args.batch, args.heads, n // world, args.head_dim, device=device,
                           dtype=torch.float16).requires_grad_() for _ in range(3)]
    do = torch.randn_like(q)

    def step():
        for t in (q, k, v):
            t.grad = None
        ring_attention(q, k, v, causal=causal, scheme=scheme).backward(do)

    step()
    sync(device)
    # The profiler starts at different moments on different ranks (CUPTI starts up), and a rank's first NCCL
    # kernel then waits for its peer: that wait is not the transfer. So a first profiled step warms up, the
    # ranks meet at a barrier, and only the kernels that start within the second step are counted.
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        sync(device)
        dist.barrier()
        sync(device)
        with record_function(MEASURED_STEP):
            step()
            sync(device)
    with tempfile.NamedTemporaryFile(suffix=".json") as trace_file:
        prof.export_chrome_trace(trace_file.name)
        with open(trace_file.name) as f:
            events = json.load(f)["traceEvents"]
    return dict(N=n, mask=label, scheme=scheme, rank=rank, **communication_summary(events))


def communication_summary(events: list[dict]) -> dict:
    """From a Chrome trace's events: the GPU kernels that start within the :data:`MEASURED_STEP` range, the time
    of the NCCL ones (merged), how much of it lies under compute kernels (hidden), the exposed rest, and the step
    (first kernel start to last kernel end). Without NCCL or compute kernels (gloo on CPU), only the counts."""
    measured = [e for e in events if e.get("name") == MEASURED_STEP and "dur" in e]
    start = min(e["ts"] for e in measured) if measured else float("-inf")
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e and e["ts"] >= start]
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" in e["name"].lower()]
    compute = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" not in e["name"].lower()]
    if not comm or not compute:
        return dict(kernels=len(kernels), nccl_kernels=len(comm))
    comm_m, compute_m = merged(comm), merged(compute)
    comm_us = sum(e - s for s, e in comm_m)
    hidden_us = covered(comm_m, compute_m)
    first = min(s for s, _ in comm_m + compute_m)
    last = max(e for _, e in comm_m + compute_m)
    busy_us = sum(e - s for s, e in merged(comm + compute))
    return dict(kernels=len(kernels), nccl_kernels=len(comm), nccl_us=comm_us, hidden_us=hidden_us,
                hidden_fraction=hidden_us / comm_us, exposed_us=comm_us - hidden_us, step_us=last - first,
                compute_us=sum(e - s for s, e in compute_m), gpu_busy_fraction=busy_us / (last - first),
                exposed_fraction_of_step=(comm_us - hidden_us) / (last - first))


# ---------------------------------------------------------------- 4. PyTorch's context parallel
def context_parallel_point(rank, world, device, args, n, label, causal, backend_name) -> dict:
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from torch.distributed.tensor.experimental import _attention as cp_attention

    from flashlib.io_model import attention_flops

    backend = getattr(SDPBackend, backend_name)
    # its head-tail load balance (the zigzag) is for causal masks only, and refuses the others
    cp_attention._cp_options.enable_load_balance = causal
    mesh = init_device_mesh(device.type, (world,))
    torch.manual_seed(0)
    full = [torch.randn(args.batch, args.heads, n, args.head_dim, device=device, dtype=torch.float16)
            for _ in range(4)]
    with context_parallel(mesh, buffers=full, buffer_seq_dims=[2, 2, 2, 2], no_restore_buffers=set(full)):
        q, k, v = [t.detach().requires_grad_() for t in full[:3]]
        do = full[3]
        reps = reps_for(attention_flops(args.batch, args.heads, n, args.head_dim, causal, "train") / 300e12,
                        args.target_s)

        def fwd():
            with torch.no_grad(), sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        def train():
            for t in (q, k, v):
                t.grad = None
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            o.backward(do)

        local = dict(shard=list(q.shape))
        fwd_s = max(every_rank(time_s(fwd, device, reps), device))
        train_s = max(every_rank(time_s(train, device, reps), device))
    return dict(N=n, mask=label, backend=backend_name, reps=reps, local=local, fwd_s=fwd_s, fwd_bwd_s=train_s,
                tokens_per_s=args.batch * n / train_s)


def context_parallel_section(rank, world, device, args, lengths, budget, rows, scaling_rows) -> None:
    failed = set()  # a (backend, mask) that raised is not tried again
    for n in lengths:
        for label, causal, _ in MODES:
            ours = next((r for r in scaling_rows if r["N"] == n and r["mask"] == label), None)
            estimate = 3 * ours["fwd_bwd"]["ring_s"] * 4 if ours else 10.0
            if not budget.allows(estimate):
                return
            for backend_name in [b for b in args.cp_backends if (b, label) not in failed]:
                try:
                    row = context_parallel_point(rank, world, device, args, n, label, causal, backend_name)
                except Exception as error:  # noqa: BLE001 - recorded: "if it runs there"
                    row = dict(N=n, mask=label, backend=backend_name,
                               error=f"{type(error).__name__}: {error}"[:500],
                               traceback=traceback.format_exc()[-1500:])
                if ours and "fwd_bwd_s" in row:
                    row["flashlib_ring_fwd_bwd_s"] = ours["fwd_bwd"]["ring_s"]
                    row["flashlib_over_context_parallel"] = row["fwd_bwd_s"] / ours["fwd_bwd"]["ring_s"]
                rows.append(row)
                if rank == 0:
                    if "error" in row:
                        print(f"context_parallel N={n} {label} {backend_name}: {row['error'][:200]}", flush=True)
                    else:
                        ratio = row.get("flashlib_over_context_parallel")
                        against = (f"flashlib ring {ratio:.2f}x as fast" if ratio is not None
                                   else "no ring time at this point in this run")
                        print(f"context_parallel N={n} {label} {backend_name}: fwd+bwd {row['fwd_bwd_s'] * 1e3:.1f} ms; "
                              f"{against}", flush=True)
                dist.barrier()
                if "error" in row:
                    failed.add((backend_name, label))


# ---------------------------------------------------------------- the worker and the launcher
def worker(rank, world, args, store_dir):
    os.environ.update(MULTICAST_OFF)
    if args.cpu:
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        torch.set_num_threads(1)
        device = torch.device("cpu")
        backend = "gloo"
    else:
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        backend = "nccl"
    store = dist.FileStore(os.path.join(store_dir, "store"), world)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.group_timeout),
                            device_id=device if device.type == "cuda" else None)
    from flashlib import runtime
    from flashlib.gpu import detect_gpu
    if not runtime.INTERPRET:
        apply_configs(args.configs)
    budget = Budget(args.budget, device)
    info = detect_gpu()
    result = dict(
        meta=dict(gpu=info.name if hasattr(info, "name") else str(info), world_size=world, backend=backend,
                  torch=torch.__version__, triton=__import__("triton").__version__, python=sys.version.split()[0],
                  date=datetime.date.today().isoformat(), command=" ".join(sys.argv),
                  configs=args.configs_text if not runtime.INTERPRET else "interpreter blocks",
                  multicast_off=MULTICAST_OFF, timing="wall clock per call after a warm-up call and a barrier, "
                  "synchronized; the ring's time is the slowest rank's; float16"),
        check=[], scaling=[], overlap=[], context_parallel=[])
    if device.type == "cuda":
        result["meta"]["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]

    def save():
        if rank == 0:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    sections = set(args.sections)
    try:
        if "check" in sections:
            result["check"] = check(rank, world, device, args)
            save()
        if "scaling" in sections:
            scaling(rank, world, device, args, args.n, budget, result["scaling"])
            save()
        if "overlap" in sections and budget.allows(10.0 if not args.cpu else 1.0):
            for label, causal, scheme in MODES:
                n = args.overlap_n
                per_rank = overlap(rank, world, device, args, n, label, causal, scheme)
                gathered = [None] * world
                dist.all_gather_object(gathered, per_rank)
                result["overlap"].extend(gathered)
                if rank == 0:
                    for r in (r for r in gathered if "nccl_us" in r):
                        print(f"overlap N={n} {label} rank {r['rank']}: NCCL {r['nccl_us'] / 1e3:.1f} ms, "
                              f"{100 * (r['hidden_fraction'] or 0):.0f}% under compute; exposed "
                              f"{100 * r['exposed_fraction_of_step']:.1f}% of the {r['step_us'] / 1e3:.1f} ms step",
                              flush=True)
            save()
        if "context_parallel" in sections and not args.cpu:
            context_parallel_section(rank, world, device, args, args.n, budget, result["context_parallel"],
                                     result["scaling"])
            save()
        if "scaling" in sections and args.n_late:
            scaling(rank, world, device, args, args.n_late, budget, result["scaling"])
            save()
    except Exception:
        result["error"] = traceback.format_exc()[-3000:]
        save()
        raise
    finally:
        save()
        dist.destroy_process_group()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="the JSON file rank 0 writes after every section")
    parser.add_argument("--world-size", type=int, default=None, help="processes (default: every visible GPU)")
    parser.add_argument("--n", default="32768,65536,131072", help="sequence lengths of the scaling runs")
    parser.add_argument("--n-late", default="262144", help="longer lengths run last, while the budget lasts")
    parser.add_argument("--overlap-n", type=int, default=131072, help="the profiled sequence length")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--check-shape", default="2,4,2,4096,128", help="B,H,H_kv,N,D of the correctness check")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS,
                        help=f"configs per kernel: kernel=MxN/stages/warps[|...] (several: autotuned among them; "
                        f"dkdv ones may end in {DP_AFTER_DV_SUFFIX}), or {AUTOTUNED} (nothing pinned)")
    parser.add_argument("--cp-backends", default="FLASH_ATTENTION,CUDNN_ATTENTION",
                        help="SDPA backends tried under context_parallel")
    parser.add_argument("--sections", default="check,scaling,overlap,context_parallel")
    parser.add_argument("--budget", type=float, default=110.0, help="seconds of work after start-up")
    parser.add_argument("--target-s", type=float, default=1.0, help="seconds of timed calls per measurement")
    parser.add_argument("--group-timeout", type=float, default=120.0)
    parser.add_argument("--cpu", action="store_true", help="a dry run on CPU processes (gloo, Triton's interpreter)")
    args = parser.parse_args(argv)

    def lengths(text):
        try:
            return [int(x) for x in text.split(",") if x]
        except ValueError:
            raise SystemExit(f"expected comma-separated integers, got {text!r}") from None

    args.n, args.n_late = lengths(args.n), lengths(args.n_late)
    args.check_shape = lengths(args.check_shape)
    if len(args.check_shape) != 5:
        raise SystemExit(f"--check-shape needs B,H,H_kv,N,D; got {args.check_shape}")
    args.configs_text, args.configs = args.configs, parse_configs(args.configs)
    args.cp_backends = [b for b in args.cp_backends.split(",") if b]
    args.sections = [s for s in args.sections.split(",") if s]
    unknown = set(args.sections) - {"check", "scaling", "overlap", "context_parallel"}
    if unknown:
        raise SystemExit(f"--sections: unknown {sorted(unknown)}")
    world = args.world_size or (2 if args.cpu else torch.cuda.device_count())
    if world < 2:
        raise SystemExit(f"ring attention across devices needs at least 2 ranks; this machine has {world} GPU(s)")
    with tempfile.TemporaryDirectory() as store_dir:
        mp.start_processes(worker, args=(world, args, store_dir), nprocs=world, start_method="spawn")


if __name__ == "__main__":
    main()
