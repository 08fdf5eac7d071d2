"""Ring attention: one attention over a sequence split across the ranks of a torch.distributed group.

When N outgrows one device, each of the W ranks of a process group keeps one shard of the
sequence: its N/W queries and the K/V of the same N/W positions. Attention still needs every
query to meet every key, so the K/V shards travel around a ring:

* **The ring.** At step t, rank r holds the K/V shard of rank (r - t) mod W. It attends its
  queries to that shard with flashlib's own kernel (``flash_attention(..., return_lse=True)``),
  then passes the shard on to rank r + 1 and receives the next one from rank r - 1. After W
  steps every query has met every key, and no rank ever held more than two K/V shards. The
  transfer for step t + 1 is posted (``torch.distributed.batch_isend_irecv``) *before* step t
  computes, so on GPUs the communication hides behind the compute when a shard's attention
  takes longer than its transfer.
* **The merge.** Each step yields a partial (O_t, LSE_t) over a disjoint set of keys, the same
  pieces notebook 03 merges: with ``LSE = logaddexp(LSE_a, LSE_b)``,
  ``O = exp(LSE_a - LSE) O_a + exp(LSE_b - LSE) O_b`` (:func:`merge_partial`). This is exact, so
  the ring's O and LSE equal those of a single ``flash_attention`` on the whole sequence.
* **The backward** recomputes, as the single-device kernel does: P of each block is rebuilt from
  the *global* LSE, and D = rowsum(dO * O) from the *global* O, which is exactly what
  :func:`flashlib.ops.backward_impl` computes for one K/V block. dQ stays home and accumulates.
  dK and dV of a block belong to the rank that owns that block: they travel around the ring
  *with* it, each rank adding its contribution, and one last hop brings them back to their
  owner. K/V travel a second time for the recompute (they are not stored W times).
* **Causal and the zigzag.** Cut contiguously, rank r's queries see shard s fully when s < r,
  with the causal diagonal when s == r, and not at all when s > r (the step is skipped; the data
  still passes on): the last rank does 2W - 1 times the work of the first (2W - 1 half-blocks
  against one), and every step waits for the slowest. ``scheme="zigzag"`` cuts the sequence into
  2W chunks and gives rank r the chunks r and 2W-1-r, an early one and a late one. Against the
  shard of rank s != r, exactly half of the pairs are visible, and always as a full rectangle:
  for s < r both of r's chunks see s's early chunk (and neither sees its late one); for s > r
  only r's late chunk sees, and it sees both of s's chunks. Every rank does the same work at
  every step (:func:`step_work`).

Errors: arguments are checked on each rank, then the ranks compare what they were given *once*
per call (one ``all_gather`` of a few int64 numbers); a rank whose arguments differ from the
others' (shapes, dtype, causal, scheme, scale, whether autograd records the call) or fail its
own checks makes *every* rank raise the same clear error, so that none waits forever for a
transfer that will not come. What cannot be compared that way: a ``group`` that is not a process
group, or another group object on some ranks, and a rank that never calls at all: the process
group's own timeout bounds every collective and transfer
(``torch.distributed.init_process_group(..., timeout=datetime.timedelta(seconds=60))``; gloo
raises when it expires, NCCL's watchdog aborts the communicator).

Runs on gloo (CPU tensors: flashlib's kernels run in Triton's interpreter there) and on NCCL
(one GPU per rank, ``torch.cuda.set_device(rank)`` before the first call).

To try it on one machine without GPUs, :func:`run_on_cpu_processes` starts W CPU processes in one
gloo group and runs a function on each (notebook 10 does, with :func:`ring_attention_of_full`).
"""
from __future__ import annotations

import datetime
import json
import math
import os
import struct
import tempfile
import time
import traceback
from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import ops
from .arguments import SUPPORTED_DTYPES, transform_or_forward_mode_active
from .attention import check_attention_args, flash_attention
from .online_softmax import safe_shift

#: The ways a sequence is cut into shards (see the module docstring).
SCHEMES = ("contiguous", "zigzag")


# ---------------------------------------------------------------- shards of a sequence
def _check_scheme(scheme) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"scheme must be one of {SCHEMES}; got {scheme!r}")


def _pieces(scheme: str, world_size: int) -> int:
    """How many equal chunks a scheme cuts the sequence into: W, or 2W for the zigzag."""
    return world_size if scheme == "contiguous" else 2 * world_size


def shard_sequence(x: torch.Tensor, rank: int, world_size: int, scheme: str = "contiguous",
                   dim: int = 2) -> torch.Tensor:
    """Rank ``rank``'s shard of the full sequence ``x`` (the sequence along ``dim``, 2 for (B, H, N, D)).

    ``"contiguous"``: positions ``[rank * N/W, (rank + 1) * N/W)``. ``"zigzag"``: chunks ``rank``
    and ``2W - 1 - rank`` of N/(2W) positions each, concatenated in that order (increasing
    positions, so a causal mask within the shard is the plain causal mask). Returns a new
    contiguous tensor, so that a shard does not keep the whole sequence alive.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor; got a {type(x).__name__}")
    _check_scheme(scheme)
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1; got {world_size!r}")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, world_size) = [0, {world_size}); got {rank!r}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"dim must index one of x's {x.dim()} dimensions; got dim={dim}")
    n, pieces = x.shape[dim], _pieces(scheme, world_size)
    if n % pieces:
        raise ValueError(f"scheme={scheme!r} cuts the sequence into {pieces} equal chunks "
                         f"({'W' if scheme == 'contiguous' else '2W'}, W={world_size}): the length along "
                         f"dim {dim} must be a multiple of {pieces}; got {n} (x.shape={tuple(x.shape)})")
    chunk = n // pieces
    if scheme == "contiguous":
        return x.narrow(dim, rank * chunk, chunk).contiguous()
    return torch.cat((x.narrow(dim, rank * chunk, chunk),
                      x.narrow(dim, (pieces - 1 - rank) * chunk, chunk)), dim=dim)


def unshard_sequence(shards, scheme: str = "contiguous", dim: int = 2) -> torch.Tensor:
    """The full sequence from every rank's shard, listed in rank order: ``shard_sequence``'s inverse."""
    _check_scheme(scheme)
    if not isinstance(shards, (list, tuple)) or not shards or \
            not all(isinstance(s, torch.Tensor) for s in shards):
        raise TypeError(f"shards must be a non-empty list of tensors, one per rank in rank order; "
                        f"got {type(shards).__name__}")
    shapes = {tuple(s.shape) for s in shards}
    if len(shapes) != 1:
        raise ValueError(f"every shard must have the same shape; got {[tuple(s.shape) for s in shards]}")
    if not -shards[0].dim() <= dim < shards[0].dim():
        raise ValueError(f"dim must index one of the shards' {shards[0].dim()} dimensions; got dim={dim}")
    if scheme == "contiguous":
        return torch.cat(list(shards), dim=dim)
    n = shards[0].shape[dim]
    if n % 2:
        raise ValueError(f"scheme='zigzag' shards hold two chunks of equal length: their length along dim "
                         f"{dim} must be even; got {n}")
    early = [s.narrow(dim, 0, n // 2) for s in shards]
    late = [s.narrow(dim, n // 2, n // 2) for s in reversed(shards)]
    return torch.cat(early + late, dim=dim)


# ---------------------------------------------------------------- one step of the ring
@dataclass(frozen=True)
class StepWork:
    """What rank r computes against the K/V shard of rank s: its queries ``q_rows`` against the keys
    ``kv_rows`` of that shard (slices along the sequence of the shards), with or without the causal
    diagonal."""

    q_rows: slice
    kv_rows: slice
    causal: bool


def step_work(rank: int, source: int, shard_len: int, causal: bool, scheme: str = "contiguous") -> StepWork | None:
    """The block of work of ``rank`` against the K/V shard of ``source``, or None when no query sees it.

    Not causal: everything. Causal, contiguous: all of it for source < rank, the causal diagonal
    for source == rank, nothing for source > rank. Causal, zigzag (shards of two chunks of
    shard_len / 2): the diagonal for source == rank; all queries against the source's early chunk
    for source < rank; the late query chunk against the whole source shard for source > rank.
    """
    every = slice(0, shard_len)
    if not causal:
        return StepWork(every, every, False)
    if source == rank:
        return StepWork(every, every, True)
    if scheme == "contiguous":
        return StepWork(every, every, False) if source < rank else None
    half = shard_len // 2
    if source < rank:
        return StepWork(every, slice(0, half), False)
    return StepWork(slice(half, shard_len), every, False)


def merge_partial(o: torch.Tensor, lse: torch.Tensor, o_blk: torch.Tensor, lse_blk: torch.Tensor):
    """The (O, LSE) of attention over two disjoint key sets, from each set's (O, LSE).

    O (..., N, D), LSE (..., N), natural log. ``LSE = logaddexp(lse, lse_blk)`` and each O is
    weighted by ``exp(its LSE - LSE)``, its share of the softmax's denominator. A row that saw no
    key on either side (both LSE -inf) stays O = 0, LSE = -inf instead of becoming NaN
    (``-inf - -inf``); a row that saw none on one side takes the other side's values.
    """
    lse_new = torch.logaddexp(lse, lse_blk)
    shift = safe_shift(lse_new)
    o_new = torch.exp(lse - shift).unsqueeze(-1) * o + torch.exp(lse_blk - shift).unsqueeze(-1) * o_blk
    return o_new, lse_new


class _Ring:
    """This rank's place in the group's ring, and the one transfer it makes: send to the next rank,
    receive from the previous one."""

    def __init__(self, group):
        self.group = dist.group.WORLD if group is None else group
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.next = dist.get_global_rank(self.group, (self.rank + 1) % self.world_size)
        self.prev = dist.get_global_rank(self.group, (self.rank - 1) % self.world_size)

    def pass_on(self, t: torch.Tensor):
        """Post: ``t`` to the next rank, a buffer like it from the previous one. Returns (buffer, requests);
        ``t`` must not change until the requests are waited on."""
        buffer = torch.empty_like(t)
        requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, self.next, self.group),
                                           dist.P2POp(dist.irecv, buffer, self.prev, self.group)])
        return buffer, requests


def _wait(requests) -> None:
    for request in requests:
        request.wait()


# ---------------------------------------------------------------- the autograd.Function
DOUBLE_BACKWARD_MESSAGE = (
    "ring_attention has no double backward (its backward is flash_attention's kernels and a ring of transfers, "
    "neither differentiable): gradients of gradients through it are not supported")


class _GradientsNotDifferentiable(torch.autograd.Function):
    """Hands dq, dk, dv on unchanged, connected to what they depend on (q, k, v, dO), so that differentiating them
    raises :data:`DOUBLE_BACKWARD_MESSAGE`. Left unconnected, autograd would take them for constants, and a
    second derivative (a gradient penalty, ``torch.autograd.grad(..., create_graph=True)``) would silently come
    out first-order."""

    @staticmethod
    def forward(ctx, dq, dk, dv, *depends_on):
        return dq, dk, dv

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(DOUBLE_BACKWARD_MESSAGE)


class RingAttentionFunction(torch.autograd.Function):
    """Ring attention's forward and backward on checked shards (see the module docstring).

    K and V travel stacked as one (2, B, H_kv, N/W, D) tensor: one message per step. dK and dV
    travel as one float32 tensor of that shape, so that the sum over W contributions is not
    rounded to 16 bits at every hop. Every rank runs the same transfers whatever its
    ``needs_input_grad`` (a rank skipping the dK/dV ring would leave the others waiting).
    """

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scheme: str, scale: float, group):
        ring = _Ring(group)
        kv = torch.stack((k, v))
        n = q.shape[2]
        o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
        for step in range(ring.world_size):
            if step + 1 < ring.world_size:  # the next shard travels while this one is computed
                incoming, requests = ring.pass_on(kv)
            work = step_work(ring.rank, (ring.rank - step) % ring.world_size, n, causal, scheme)
            if work is not None:
                rows, keys = work.q_rows, work.kv_rows
                o_blk, lse_blk = flash_attention(q[:, :, rows], kv[0][:, :, keys], kv[1][:, :, keys],
                                                 causal=work.causal, softmax_scale=scale, return_lse=True)
                o[:, :, rows], lse[:, :, rows] = merge_partial(o[:, :, rows], lse[:, :, rows], o_blk, lse_blk)
            if step + 1 < ring.world_size:
                _wait(requests)
                kv = incoming
        o = o.to(q.dtype)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.settings = (causal, scheme, scale, group)
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, grad_o, grad_lse=None):
        q, k, v, o, lse = ctx.saved_tensors
        causal, scheme, scale, group = ctx.settings
        ring = _Ring(group)
        grad_o = torch.zeros_like(o) if grad_o is None else grad_o
        n = q.shape[2]
        no_dropout_seed = torch.zeros(1, dtype=torch.int64)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = torch.stack((k, v))
        dkv_in = dkv_requests = None
        for step in range(ring.world_size):
            if step + 1 < ring.world_size:
                kv_incoming, kv_requests = ring.pass_on(kv)
            work = step_work(ring.rank, (ring.rank - step) % ring.world_size, n, causal, scheme)
            if work is not None:  # P from the global LSE, D = rowsum(dO * O) from the global O
                rows, keys = work.q_rows, work.kv_rows
                dq_blk, dk_blk, dv_blk = ops.backward_impl(
                    grad_o[:, :, rows], q[:, :, rows], kv[0][:, :, keys], kv[1][:, :, keys], o[:, :, rows],
                    lse[:, :, rows].contiguous(), None, None, None, None, no_dropout_seed, 0, 0, "bhnd",
                    work.causal, -1, -1, scale, 0.0, 0.0, True, True)
                dq[:, :, rows] += dq_blk
            # dK/dV of the shard in hand: what the ranks before this one added, plus this rank's part
            if step == 0:
                dkv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)
            else:
                _wait(dkv_requests)
                dkv = dkv_in
            if work is not None:
                dkv[0][:, :, keys] += dk_blk
                dkv[1][:, :, keys] += dv_blk
            if ring.world_size > 1:  # on to the next rank; after the last step, home to its owner
                dkv_in, dkv_requests = ring.pass_on(dkv)
            else:
                dkv_in = dkv
            if step + 1 < ring.world_size:
                _wait(kv_requests)
                kv = kv_incoming
        if ring.world_size > 1:
            _wait(dkv_requests)
        need_q, need_k, need_v = ctx.needs_input_grad[:3]
        grads = (dq.to(q.dtype) if need_q else None, dkv_in[0].to(k.dtype) if need_k else None,
                 dkv_in[1].to(v.dtype) if need_v else None)
        if torch.is_grad_enabled():  # create_graph=True: autograd records this backward
            grads = _GradientsNotDifferentiable.apply(*grads, q, k, v, grad_o)
        return (*grads, None, None, None, None)


# ---------------------------------------------------------------- argument checks
_AUTOGRAD_FIELD = "autograd recording (grad mode on and an input that requires grad: the backward is collective too)"
_FIELDS = ("batch size B", "query heads H", "k/v heads H_kv", "shard length N/W", "head_dim D", "dtype",
           "device type", "causal", "scheme", "softmax_scale", _AUTOGRAD_FIELD)
_DEVICE_TYPES = ("cpu", "cuda")


def _check_local(q, k, v, causal, scheme, softmax_scale) -> float:
    """This rank's arguments, alone: a ValueError/TypeError naming the wrong one; else the softmax scale."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"Expected 4D tensors: {name} is a {type(t).__name__}, not a torch.Tensor")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"Expected 4D tensors: ring_attention takes this rank's shards as q (B, H, N/W, D), "
                         f"k and v (B, H_kv, N/W, D); got q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}, "
                         f"v.shape={tuple(v.shape)}")
    if transform_or_forward_mode_active():
        raise ValueError("ring_attention supports neither torch.func transforms (grad, vmap, jvp, jacrev...) nor "
                         "forward-mode AD: its forward and backward are rings of transfers between processes. Use "
                         "reverse mode, loss.backward() or torch.autograd.grad, on every rank")
    if q.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"ring_attention takes float16, bfloat16 or float32 shards; got q.dtype={q.dtype}")
    spec, _ = check_attention_args(q, k, v, causal, softmax_scale=softmax_scale)
    _check_scheme(scheme)
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"ring_attention attends a sequence to itself: q and k/v shards must have the same "
                         f"length N/W; got q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)}")
    if scheme == "zigzag" and q.shape[2] % 2:
        raise ValueError(f"scheme='zigzag' needs an even shard length (each rank holds two chunks of N/(2W) "
                         f"positions); got q.shape[2]={q.shape[2]}")
    return spec.scale(q.shape[-1])


def _describe(q, k, v, causal, scheme, scale, device) -> torch.Tensor:
    """This rank's call as int64 numbers (first: 1, the arguments passed the local checks), in _FIELDS order."""
    scale_bits = struct.unpack("<q", struct.pack("<d", scale))[0]
    numbers = [1, *q.shape[:2], k.shape[1], *q.shape[2:], SUPPORTED_DTYPES.index(q.dtype),
               _DEVICE_TYPES.index(q.device.type) if q.device.type in _DEVICE_TYPES else len(_DEVICE_TYPES),
               int(causal), SCHEMES.index(scheme), scale_bits, int(_records_autograd(q, k, v))]
    return torch.tensor(numbers, dtype=torch.int64, device=device)


def _records_autograd(q, k, v) -> bool:
    """Whether autograd records this call: then every rank must run the backward, which is a ring too."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))


def _readable(field: int, value: int):
    name = _FIELDS[field]
    if name == "dtype":
        return SUPPORTED_DTYPES[value]
    if name == "device type":
        return _DEVICE_TYPES[value] if value < len(_DEVICE_TYPES) else "other"
    if name in ("causal", _AUTOGRAD_FIELD):
        return bool(value)
    if name == "scheme":
        return SCHEMES[value]
    if name == "softmax_scale":
        return struct.unpack("<d", struct.pack("<q", value))[0]
    return value


def _check_across_ranks(description: torch.Tensor, local_error: Exception | None, group) -> None:
    """One all_gather of every rank's description; the same error on every rank if any differs."""
    world_size = dist.get_world_size(group)
    gathered = [torch.empty_like(description) for _ in range(world_size)]
    dist.all_gather(gathered, description, group=group)
    rows = [g.tolist() for g in gathered]
    if local_error is not None:
        raise local_error
    rejected = [rank for rank, row in enumerate(rows) if row[0] != 1]
    if rejected:
        raise ValueError(f"ring_attention: the arguments of rank(s) {rejected} (of this group) were rejected "
                         f"there (see the error raised on those ranks); every rank raises so that none waits "
                         f"for the others")
    for field in range(len(_FIELDS)):
        values = [row[field + 1] for row in rows]
        if len(set(values)) > 1:
            error = TypeError if _FIELDS[field] == "dtype" else ValueError
            per_rank = ", ".join(f"rank {r}: {_readable(field, value)}" for r, value in enumerate(values))
            raise error(f"ring_attention needs the same {_FIELDS[field]} on every rank of the group; "
                        f"got {per_rank}")


def _collective_device(group) -> torch.device:
    """Where the group's collectives take tensors: the current GPU for NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ---------------------------------------------------------------- the entry point
def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   scheme: str = "contiguous", group=None, softmax_scale: float | None = None) -> torch.Tensor:
    """This rank's shard of ``softmax(q k^T * scale + mask) v`` over a sequence sharded across ``group``.

    Every rank of ``group`` (default: the world) calls it together, with its own shard as
    :func:`shard_sequence` cuts it: q (B, H, N/W, D), k and v (B, H_kv, N/W, D) ((B, H, N, D)
    layout; H a multiple of H_kv, GQA), float16, bfloat16 or float32, on the group's device
    (CPU for gloo, this rank's GPU for NCCL). Returns this rank's shard of O, (B, H, N/W, D) in
    q's dtype, equal to the matching rows of ``flash_attention`` on the whole sequence.
    ``causal`` masks by global position; ``scheme="zigzag"`` balances the causal work across ranks
    (the shards must then be cut with the same scheme). ``softmax_scale`` defaults to 1/sqrt(D).

    Differentiable in q, k and v, in reverse mode: the backward sends dK/dV around the ring back to
    their owners (see the module docstring); a second derivative through it raises
    (:data:`DOUBLE_BACKWARD_MESSAGE`), and so do torch.func transforms and forward-mode AD. Bad
    arguments raise a ValueError/TypeError naming the argument on every rank (arguments that differ
    between ranks included, and whether autograd records the call, checked once per call); the
    group's ``timeout`` (``init_process_group(timeout=...)``) bounds the wait for a rank that never
    calls.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("ring_attention needs torch.distributed initialised: call "
                           "torch.distributed.init_process_group(backend, ...) on every rank first "
                           "(on one device, use flashlib.flash_attention)")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup (or None for the default group), the same "
                        f"on every rank; got a {type(group).__name__}")
    group = dist.group.WORLD if group is None else group
    if dist.get_rank(group) < 0:
        raise ValueError(f"this process (global rank {dist.get_rank()}) is not a member of group: call "
                         f"ring_attention only on the group's ranks")
    local_error, scale = None, math.nan
    try:
        scale = _check_local(q, k, v, causal, scheme, softmax_scale)
    except Exception as error:  # noqa: BLE001 - any local failure, not only the checks' own errors, is
        local_error = error       # raised on this rank after the others learn of it, never before
    if dist.get_world_size(group) == 1:
        if local_error is not None:
            raise local_error
    else:
        device = _collective_device(group)
        description = (torch.zeros(len(_FIELDS) + 1, dtype=torch.int64, device=device) if local_error
                       else _describe(q, k, v, causal, scheme, scale, device))
        _check_across_ranks(description, local_error, group)
    o, _ = RingAttentionFunction.apply(q, k.contiguous(), v.contiguous(), causal, scheme, scale, group)
    return o


# ---------------------------------------------------------------- a small launcher: W processes on one CPU
def ring_attention_of_full(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                           scheme: str = "contiguous", softmax_scale: float | None = None) -> torch.Tensor:
    """This rank's shard of O, from the *whole* q, k, v: for launchers that hand every rank the same arguments.

    Each rank cuts its own shards (:func:`shard_sequence`, this rank and the group's size), calls
    :func:`ring_attention` on them and returns its shard of O, detached; :func:`unshard_sequence`
    over the ranks' results, in rank order, gives the whole O. A real job never holds the whole
    sequence on every rank: it loads or computes its own shard only.
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    shards = [shard_sequence(t, rank, world_size, scheme) for t in (q, k, v)]
    return ring_attention(*shards, causal=causal, scheme=scheme, softmax_scale=softmax_scale).detach()


def _not_importable(fn) -> str | None:
    """Why a spawned process could not import ``fn`` by name, or None."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module in (None, "__main__"):
        return (f"it is defined in {'__main__' if module else 'no module'} (a notebook or a script run directly), "
                "which a spawned process does not run")
    if "<lambda>" in qualname or "<locals>" in qualname:
        return f"{qualname!r} is a lambda or a function defined inside another one, which cannot be sent by name"
    return None


def _cpu_process(rank: int, world_size: int, store_path: str, out_dir: str, fn, args: tuple, kwargs: dict,
                 timeout_s: float) -> None:
    """One spawned rank: join the gloo group, run fn, save what it returned, leave the group."""
    torch.set_num_threads(1)  # the W processes share this machine's cores
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        result = fn(*args, **kwargs)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    except BaseException:  # noqa: BLE001 - noted for the launcher (which rank failed first), then raised
        with open(os.path.join(out_dir, f"rank{rank}.error.json"), "w", encoding="utf-8") as handle:
            json.dump({"time": time.time(), "traceback": traceback.format_exc()}, handle)
        raise
    finally:
        dist.destroy_process_group()


def _first_failure(folder: str, world_size: int, fn_name: str) -> str | None:
    """The traceback of the rank that raised first (the others often fail because it left), or None."""
    failures = []
    for rank in range(world_size):
        path = os.path.join(folder, f"rank{rank}.error.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as handle:
                failures.append((json.load(handle), rank))
    if not failures:
        return None
    failures.sort(key=lambda failure: failure[0]["time"])
    (first, rank), later = failures[0], failures[1:]
    text = f"rank {rank} of {world_size} raised in {fn_name}:\n{first['traceback']}"
    if later:
        text += "\nthen, probably because it left the group: " + "; ".join(
            f"rank {r}: {failure['traceback'].strip().splitlines()[-1][:200]}" for failure, r in later)
    return text


def run_on_cpu_processes(fn, world_size: int, *args, timeout_s: float = 120.0, **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` fresh CPU processes that form one gloo group; return
    what each rank's call returned, in rank order.

    For trying ring attention on one machine without GPUs (a notebook, a test): each process is
    started with ``torch.multiprocessing``'s spawn, joins the default group
    (``torch.distributed.init_process_group("gloo", ...)``, its ``timeout`` being ``timeout_s``),
    so ``fn`` finds its rank with ``torch.distributed.get_rank()``, and leaves it after ``fn``
    returns. The processes run Triton's interpreter on CPU tensors whatever the machine
    (``TRITON_INTERPRET=1`` and no visible GPU in their environment) and one thread each.

    ``fn`` must be importable by name, a function at the top level of a module: a spawned process
    imports it, and cannot see a function defined in a notebook, a lambda or a nested function
    (a ValueError says so); in a script, call this under ``if __name__ == "__main__":``, since spawned
    processes import the script's main module. Its arguments are sent to every process (tensors through shared
    memory) and what it returns comes back through ``torch.save``, so both must pickle.
    A rank that raises makes this raise a RuntimeError with that rank's traceback (the others are
    stopped); ranks still running after ``timeout_s`` seconds are killed and a TimeoutError is raised.

    >>> o_shards = run_on_cpu_processes(ring_attention_of_full, 2, q, k, v, causal=True)  # doctest: +SKIP
    """
    if not callable(fn):
        raise TypeError(f"fn must be a function; got a {type(fn).__name__}")
    reason = _not_importable(fn)
    if reason is not None:
        raise ValueError(f"fn must be importable by name, a function at the top level of a module, since spawned "
                         f"processes import it: {reason}. Put it in a .py file (next to the notebook will do) "
                         f"and import it from there")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1; got {world_size!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds; got {timeout_s!r}")
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="flashlib-processes-") as folder:
        child_env = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
        saved = {variable: os.environ.get(variable) for variable in child_env}
        os.environ.update(child_env)  # spawned processes copy this process's environment when they start
        try:
            context = mp.start_processes(
                _cpu_process, args=(world_size, os.path.join(folder, "store"), folder, fn, args, kwargs, timeout_s),
                nprocs=world_size, join=False, start_method="spawn")
        finally:
            for variable, value in saved.items():
                if value is None:
                    os.environ.pop(variable, None)
                else:
                    os.environ[variable] = value
        deadline = time.monotonic() + timeout_s
        name = f"{fn.__module__}.{fn.__qualname__}"
        try:
            while not context.join(timeout=max(0.05, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    raise TimeoutError(f"run_on_cpu_processes: {world_size} processes running {name} were still "
                                       f"running after {timeout_s:g} s; they were stopped")
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as error:
            for process in context.processes:
                process.join(timeout=5)  # the others are being stopped: let them finish writing what they raised
            first = _first_failure(folder, world_size, name)
            if first is None:
                first = (f"rank {error.error_index} of {world_size} exited with code {error.exit_code} while "
                         f"running {name}" if isinstance(error, mp.ProcessExitedException)
                         else f"rank {error.error_index} of {world_size} raised in {name}:\n{error}")
            raise RuntimeError(first) from None
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
                    process.join()
        return [torch.load(os.path.join(folder, f"rank{rank}.pt"), weights_only=False) for rank in range(world_size)]
