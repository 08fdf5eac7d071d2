"""HBM traffic of attention, counted: naive, FlashAttention-1 order and FlashAttention-2 order.

Attention at long sequence lengths is limited by memory traffic, not by arithmetic,
so the FlashAttention paper (Dao et al., 2022, Theorem 2) counts bytes moved between
HBM (the GPU's main memory) and SRAM (the on-chip shared memory, M bytes per SM):

* **naive** (the paper's Algorithm 0): S = Q K^T and P = softmax(S) are written to
  HBM and read back: Theta(N d + N^2) bytes.
* **FlashAttention**: Theta(N^2 d^2 / M) bytes. The tile that stays in SRAM while the
  other operand streams past can hold about M / (4 d) rows, so the streamed operand
  is read N / (M / 4d) times: N^2 d^2 / M in total, up to constants.

The functions here make those counts concrete, per (batch, head) and multiplied by
``batch * heads``, in bytes: inputs and outputs of ``dtype_bytes`` each, the running
statistics (m, l, L) in float32. Block sizes are given, or derived from the SRAM size
as in the paper (:func:`paper_block_sizes`). :func:`kernel_traffic` counts what
flashlib's kernel actually loads and stores, from the tiles it recorded as visited.

For benchmarks: the backward's bytes (:func:`naive_backward_traffic`,
:func:`flash2_backward_traffic`, kernel by kernel :func:`flash2_backward_kernels`),
:func:`attention_hbm_bytes` per implementation and mode, :func:`attention_flops`, and the
measured side: :func:`implied_bytes` (what a measured time moves at the measured bandwidth),
:func:`arithmetic_intensity`, :func:`roofline_ms`, :func:`io_analysis` for one row of
``flashlib.bench`` results.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .integer_math import ceil_div

#: Bytes of one float32 statistic (m, l or the logsumexp L).
STATS_BYTES = 4

#: Shared memory per streaming multiprocessor (bytes): the "M" of the paper.
SRAM_PER_SM = {"A100": 164 * 1024, "H100": 228 * 1024}


@dataclasses.dataclass(frozen=True)
class Traffic:
    """Bytes read from and written to HBM."""

    reads: int
    writes: int

    @property
    def total(self) -> int:
        return self.reads + self.writes


def _times(t: Traffic, count: int) -> Traffic:
    return Traffic(t.reads * count, t.writes * count)


_MAY_BE_ZERO = ("n_q", "n_k", "batch", "heads")


def _check_sizes(**values) -> None:
    """Ints: > 0, or >= 0 for the counts that may be empty (N, batch, heads)."""
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
        least = 0 if name in _MAY_BE_ZERO else 1
        if value < least:
            raise ValueError(f"{name} must be >= {least}, got {name}={value}")


def paper_block_sizes(sram_bytes: int, head_dim: int, dtype_bytes: int = 2) -> tuple[int, int]:
    """(resident block, streamed block) for SRAM of ``sram_bytes``: the paper's Algorithm 1, line 1.

    The resident tile (K/V in FlashAttention-1, Q in FlashAttention-2's order) gets
    ``floor(M / (4 d s))`` rows, with ``s = dtype_bytes``: a quarter of SRAM for each of
    its tiles. The streamed block gets ``min(that, d)`` rows, so that a score tile also
    fits in M/4.
    """
    _check_sizes(sram_bytes=sram_bytes, head_dim=head_dim, dtype_bytes=dtype_bytes)
    resident = sram_bytes // (4 * head_dim * dtype_bytes)
    if resident < 1:
        raise ValueError(f"sram_bytes={sram_bytes} cannot hold one row of four tiles of head_dim={head_dim} "
                         f"({4 * head_dim * dtype_bytes} bytes)")
    return resident, min(resident, head_dim)


def naive_traffic(n_q: int, head_dim: int, *, n_k: int | None = None, batch: int = 1, heads: int = 1,
                  dtype_bytes: int = 2) -> Traffic:
    """Standard attention in three kernels: S = Q K^T, P = softmax(S), O = P V; S and P in HBM.

    reads Q, K (for S), S (for the softmax), P and V (for O); writes S, P and O.
    """
    n_k = n_q if n_k is None else n_k
    _check_sizes(n_q=n_q, n_k=n_k, head_dim=head_dim, batch=batch, heads=heads, dtype_bytes=dtype_bytes)
    qo, kv, scores = n_q * head_dim, n_k * head_dim, n_q * n_k
    reads = qo + kv + scores + scores + kv
    writes = scores + scores + qo
    per_head = Traffic(reads * dtype_bytes, writes * dtype_bytes)
    return _times(per_head, batch * heads)


def _keys_read(n_q: int, n_k: int, block_m: int, block_n: int, causal: bool) -> int:
    """Key rows loaded by all query-block programs together (each program: its key band).

    With ``causal`` (bottom-right aligned), a program visits key blocks up to the one
    holding its last row's diagonal, and loads keys up to the end of that block (or N_k).
    """
    keys_read = 0
    for m0 in range(0, n_q, block_m):
        if causal:
            last_row = min(m0 + block_m, n_q) - 1
            hi = min(last_row + 1 + n_k - n_q, n_k)  # keys the last row sees
            keys_read += min(n_k, ceil_div(hi, block_n) * block_n) if hi > 0 else 0
        else:
            keys_read += n_k
    return keys_read


def _queries_read(n_q: int, n_k: int, block_m: int, block_n: int, causal: bool) -> int:
    """Query rows loaded by all key-block programs of the dK/dV kernel together.

    With ``causal``, the program of key block n0 starts at the query block holding the
    first row that sees key n0 (row n0 - (N_k - N_q)) and runs to N_q.
    """
    rows = 0
    for n0 in range(0, n_k, block_n):
        first = max(n0 - (n_k - n_q), 0) if causal else 0
        if first < n_q:
            rows += n_q - (first // block_m) * block_m
    return rows


def flash2_traffic(n_q: int, head_dim: int, *, n_k: int | None = None, block_m: int | None = None,
                   block_n: int | None = None, sram_bytes: int | None = None, causal: bool = False,
                   batch: int = 1, heads: int = 1, dtype_bytes: int = 2) -> Traffic:
    """FlashAttention-2 order (Q outer), as flashlib's kernel runs it.

    One program per block of ``block_m`` query rows: it reads its Q block once, reads
    every K and V block it visits, and writes its O block and L once. With ``causal``
    (bottom-right aligned), a program visits key blocks up to the one holding its last
    row's diagonal, and loads keys up to the end of that block (or N_k). Without block
    sizes, they come from ``sram_bytes`` (:func:`paper_block_sizes`, Q resident).
    """
    n_k = n_q if n_k is None else n_k
    _check_sizes(n_q=n_q, n_k=n_k, head_dim=head_dim, batch=batch, heads=heads, dtype_bytes=dtype_bytes)
    if block_m is None or block_n is None:
        if sram_bytes is None:
            raise ValueError("give block_m and block_n, or sram_bytes to derive them from")
        resident, streamed = paper_block_sizes(sram_bytes, head_dim, dtype_bytes)
        block_m = resident if block_m is None else block_m
        block_n = streamed if block_n is None else block_n
    _check_sizes(block_m=block_m, block_n=block_n)
    keys_read = _keys_read(n_q, n_k, block_m, block_n, causal)
    reads = (n_q + 2 * keys_read) * head_dim * dtype_bytes
    writes = n_q * head_dim * dtype_bytes + n_q * STATS_BYTES
    return _times(Traffic(reads, writes), batch * heads)


def flash1_traffic(n_q: int, head_dim: int, *, n_k: int | None = None, block_n: int | None = None,
                   sram_bytes: int | None = None, batch: int = 1, heads: int = 1,
                   dtype_bytes: int = 2) -> Traffic:
    """FlashAttention-1 order (K/V outer, the paper's Algorithm 1), no mask.

    O, l, m are initialised in HBM; for each of the cdiv(N_k, block_n) blocks of K and V
    (read once), every block of Q, O, l, m is read and O, l, m written back. The
    query block size does not change the bytes; without ``block_n`` it comes from
    ``sram_bytes`` (:func:`paper_block_sizes`, K/V resident).
    """
    n_k = n_q if n_k is None else n_k
    _check_sizes(n_q=n_q, n_k=n_k, head_dim=head_dim, batch=batch, heads=heads, dtype_bytes=dtype_bytes)
    if block_n is None:
        if sram_bytes is None:
            raise ValueError("give block_n, or sram_bytes to derive it from")
        block_n = paper_block_sizes(sram_bytes, head_dim, dtype_bytes)[0]
    _check_sizes(block_n=block_n)
    outer = ceil_div(n_k, block_n)
    rows = n_q * head_dim * dtype_bytes
    stats = 2 * n_q * STATS_BYTES  # m and l
    reads = 2 * n_k * head_dim * dtype_bytes + outer * (2 * rows + stats)  # K, V once; Q, O, m, l per block
    writes = (rows + stats) + outer * (rows + stats)  # the initial O = 0, l = 0, m = -inf, then per block
    return _times(Traffic(reads, writes), batch * heads)


def programs(loop_order: str, n_q: int, *, block_m: int, batch: int = 1, heads: int = 1) -> int:
    """Programs (thread blocks) launched: FA2 order, one per (query block, batch, head); FA1, one per (batch, head)."""
    _check_sizes(n_q=n_q, block_m=block_m, batch=batch, heads=heads)
    if loop_order == "fa2":
        return ceil_div(n_q, block_m) * batch * heads
    if loop_order == "fa1":
        return batch * heads
    raise ValueError(f"loop_order must be 'fa1' or 'fa2', got {loop_order!r}")


def kernel_traffic(tiles, n_q: int, n_k: int, head_dim: int, block_m: int, block_n: int, *,
                   dtype_bytes: int = 2, seq_lens=None) -> Traffic:
    """Bytes flashlib's forward kernel moves, from its record of visited tiles.

    ``tiles`` (B*H, cdiv(N_q, block_m), cdiv(N_k, block_n)), nonzero where a program
    visited a key block (see ``launch_attention_forward(tiles=...)``). Every program
    loads its Q rows (< N_q) and stores O and L for them; each visited key block loads
    the K and V rows that exist (< N_k, or < the sample's length with ``seq_lens``:
    masked lanes move nothing).
    """
    record = np.asarray(tiles.cpu() if hasattr(tiles, "cpu") else tiles)
    if record.ndim != 3 or record.shape[1:] != (ceil_div(n_q, block_m), ceil_div(n_k, block_n)):
        raise ValueError(f"tiles must have shape (B*H, cdiv(n_q, block_m), cdiv(n_k, block_n)) = "
                         f"(B*H, {ceil_div(n_q, block_m)}, {ceil_div(n_k, block_n)}); got {record.shape}")
    slices = record.shape[0]
    lens = None if seq_lens is None else [int(x) for x in (seq_lens.tolist() if hasattr(seq_lens, "tolist")
                                                            else seq_lens)]
    if lens is not None and (not lens or slices % len(lens)):
        raise ValueError(f"seq_lens must have one length per sample (B*H = {slices} "
                         f"must be a multiple of it); got {len(lens) if lens else 0} lengths")
    heads = 1 if lens is None else slices // len(lens)
    starts = np.arange(record.shape[2]) * block_n
    keys_read = 0
    for bh in range(slices):
        k_len = n_k if lens is None else min(lens[bh // heads], n_k)
        per_block = np.clip(k_len - starts, 0, block_n)  # keys that exist in each key block
        keys_read += int((record[bh] != 0).sum(axis=0) @ per_block)
    rows = slices * n_q
    reads = (rows + 2 * keys_read) * head_dim * dtype_bytes
    writes = rows * head_dim * dtype_bytes + rows * STATS_BYTES
    return Traffic(reads, writes)


# ---------------------------------------------------------------- backward, and measured time against the model

def naive_backward_traffic(n_q: int, head_dim: int, *, n_k: int | None = None, batch: int = 1, heads: int = 1,
                           dtype_bytes: int = 2) -> Traffic:
    """Standard attention backward (the FlashAttention paper's Algorithm 3), one kernel per step.

    dV = P^T dO (reads P, dO; writes dV); dP = dO V^T (reads dO, V; writes dP);
    dS = P * (dP - rowsum(dP * P)) (reads P, dP; writes dS); dQ = dS K (reads dS, K;
    writes dQ); dK = dS^T Q (reads dS, Q; writes dK).
    """
    n_k = n_q if n_k is None else n_k
    _check_sizes(n_q=n_q, n_k=n_k, head_dim=head_dim, batch=batch, heads=heads, dtype_bytes=dtype_bytes)
    q, kv, scores = n_q * head_dim, n_k * head_dim, n_q * n_k
    reads = (scores + q) + (q + kv) + 2 * scores + (scores + kv) + (scores + q)
    writes = kv + scores + scores + q + kv
    return _times(Traffic(reads * dtype_bytes, writes * dtype_bytes), batch * heads)


#: The kernels of flashlib's backward, in launch order (keys of :func:`flash2_backward_kernels`).
BACKWARD_KERNELS = ("preprocess", "dkdv", "dq")


def flash2_backward_kernels(n_q: int, head_dim: int, *, n_k: int | None = None,
                            dkdv_blocks: tuple[int, int] = (128, 64), dq_blocks: tuple[int, int] = (128, 64),
                            causal: bool = False, batch: int = 1, heads: int = 1,
                            dtype_bytes: int = 2) -> dict[str, Traffic]:
    """flashlib's backward kernel by kernel: ``{"preprocess", "dkdv", "dq"}`` -> :class:`Traffic`.

    * preprocess: reads O and dO, writes D = rowsum(dO * O) (float32);
    * dK/dV (one program per key block): reads its K and V once, and Q, dO, L, D of every
      query row it visits; writes dK, dV;
    * dQ (one program per query block): reads its Q, dO, L, D once, and K, V of every key
      row it visits; writes dQ.

    Each kernel has its own ``(block_m, block_n)`` (the autotuner picks them separately:
    ``attention_bwd_dkdv_kernel_autotuned.best_config``, ``attention_bwd_dq_kernel_autotuned``).
    Blocks as long as the sequences, ``(n_q, n_k)``, give the compulsory traffic: every
    operand read once, the floor of what a kernel can move however well a cache serves re-reads.
    """
    n_k = n_q if n_k is None else n_k
    _check_sizes(n_q=n_q, n_k=n_k, head_dim=head_dim, batch=batch, heads=heads, dtype_bytes=dtype_bytes)
    (dkdv_m, dkdv_n), (dq_m, dq_n) = dkdv_blocks, dq_blocks
    _check_sizes(block_m=dkdv_m, block_n=dkdv_n)
    _check_sizes(block_m=dq_m, block_n=dq_n)
    row = head_dim * dtype_bytes
    q_rows = _queries_read(n_q, n_k, dkdv_m, dkdv_n, causal)
    k_rows = _keys_read(n_q, n_k, dq_m, dq_n, causal)
    per_head = {
        "preprocess": Traffic(2 * n_q * row, n_q * STATS_BYTES),
        "dkdv": Traffic(2 * n_k * row + q_rows * (2 * row + 2 * STATS_BYTES), 2 * n_k * row),
        "dq": Traffic(2 * n_q * row + 2 * n_q * STATS_BYTES + 2 * k_rows * row, n_q * row),
    }
    return {name: _times(t, batch * heads) for name, t in per_head.items()}


def flash2_backward_traffic(n_q: int, head_dim: int, *, n_k: int | None = None, block_m: int = 128,
                            block_n: int = 64, causal: bool = False, batch: int = 1, heads: int = 1,
                            dtype_bytes: int = 2) -> Traffic:
    """flashlib's backward: preprocess D = rowsum(dO * O), a dK/dV kernel and a dQ kernel, summed.

    Both kernels use ``block_m`` x ``block_n`` here (the autotuner may pick others, and
    different ones for each: :func:`flash2_backward_kernels` takes them per kernel and
    says what each kernel moves).
    """
    kernels = flash2_backward_kernels(n_q, head_dim, n_k=n_k, dkdv_blocks=(block_m, block_n),
                                      dq_blocks=(block_m, block_n), causal=causal, batch=batch, heads=heads,
                                      dtype_bytes=dtype_bytes)
    return Traffic(sum(t.reads for t in kernels.values()), sum(t.writes for t in kernels.values()))


MODES = ("fwd", "bwd", "train")
#: FLOPs of a mode relative to the forward's (FlashAttention-2 benchmarks' convention): the backward
#: has five N x N x D matmuls (S recomputed, dV, dP, dQ, dK) against the forward's two: 2.5x;
#: forward + backward 3.5x.
MODE_FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "train": 3.5}


def _check_mode(mode: str) -> None:
    if mode not in MODE_FLOP_FACTOR:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")


def attention_flops(batch: int, heads: int, n: int, d: int, causal: bool = False, mode: str = "fwd") -> float:
    """FLOPs by the FlashAttention-2 benchmarks' convention: 4·B·H·N²·D forward, halved when causal.

    Every implementation is charged the same count (naive attention computes the masked
    half too), so TFLOP/s compare as inverse times.
    """
    _check_sizes(batch=batch, heads=heads, n_q=n, head_dim=d)
    _check_mode(mode)
    return 4.0 * batch * heads * n * n * d * (0.5 if causal else 1.0) * MODE_FLOP_FACTOR[mode]


def attention_hbm_bytes(impl: str, batch: int, heads: int, n: int, d: int, dtype_bytes: int = 2,
                        causal: bool = False, mode: str = "fwd", block_m: int = 128, block_n: int = 64) -> int:
    """Predicted HBM bytes of one attention call: ``impl`` "naive" or "flash", ``mode`` fwd/bwd/train.

    naive: :func:`naive_traffic` (forward) and :func:`naive_backward_traffic`; S, P, dP, dS
    are N x N in HBM whether causal or not (the mask is applied to the full matrix).
    flash: :func:`flash2_traffic` and :func:`flash2_backward_traffic` with the given blocks.
    train = forward + backward.
    """
    _check_mode(mode)
    common = dict(batch=batch, heads=heads, dtype_bytes=dtype_bytes)
    if impl == "naive":
        fwd = naive_traffic(n, d, **common)
        bwd = naive_backward_traffic(n, d, **common)
    elif impl == "flash":
        blocks = dict(block_m=block_m, block_n=block_n, causal=causal)
        fwd = flash2_traffic(n, d, **blocks, **common)
        bwd = flash2_backward_traffic(n, d, **blocks, **common)
    else:
        raise ValueError(f"impl must be 'naive' or 'flash', got {impl!r}")
    return {"fwd": fwd.total, "bwd": bwd.total, "train": fwd.total + bwd.total}[mode]


def implied_bytes(ms: float, hbm_gb_per_s: float) -> float:
    """Bytes that ``ms`` milliseconds would move at ``hbm_gb_per_s`` (10^9 bytes/s): the most
    a kernel that took that long could have moved, to compare with a predicted count."""
    if ms < 0 or hbm_gb_per_s <= 0:
        raise ValueError(f"need ms >= 0 and hbm_gb_per_s > 0, got ms={ms}, hbm_gb_per_s={hbm_gb_per_s}")
    return ms * 1e-3 * hbm_gb_per_s * 1e9


def arithmetic_intensity(flops: float, nbytes: float) -> float:
    """FLOPs per byte of HBM traffic: above the ridge point (peak FLOP/s / bandwidth), compute bound."""
    if nbytes <= 0:
        raise ValueError(f"nbytes must be > 0, got {nbytes}")
    return flops / nbytes


def roofline_ms(flops: float, nbytes: float, peak_tflops: float, hbm_gb_per_s: float) -> float:
    """The roofline's lower bound on time: max(flops / peak, bytes / bandwidth), in milliseconds."""
    if peak_tflops <= 0 or hbm_gb_per_s <= 0:
        raise ValueError(f"need peak_tflops > 0 and hbm_gb_per_s > 0, got {peak_tflops}, {hbm_gb_per_s}")
    return max(flops / (peak_tflops * 1e12), nbytes / (hbm_gb_per_s * 1e9)) * 1e3


def io_analysis(row: dict, hbm_gb_per_s: float, peak_tflops: float | None = None) -> dict:
    """Model against measurement for one benchmark row (``flashlib.bench`` format).

    predicted_bytes (naive model for "naive", flash model otherwise), implied_bytes (what
    the measured time moves at ``hbm_gb_per_s``), their ratio ``predicted_fraction`` (near 1:
    the time is the traffic), arithmetic intensity, and with ``peak_tflops`` the roofline
    bound and which roof it hits.
    """
    dtype_bytes = {"fp16": 2, "bf16": 2, "fp32": 4}[row["dtype"]]
    impl = "naive" if row["impl"] == "naive" else "flash"
    shape = (row["batch"], row["heads"], row["N"], row["D"])
    predicted = attention_hbm_bytes(impl, *shape, dtype_bytes=dtype_bytes, causal=row["causal"], mode=row["mode"])
    flops = attention_flops(*shape, causal=row["causal"], mode=row["mode"])
    out = dict(predicted_bytes=predicted, implied_bytes=None, predicted_fraction=None,
               intensity=arithmetic_intensity(flops, predicted), bound_ms=None, bound=None)
    if row.get("ms"):
        out["implied_bytes"] = implied_bytes(row["ms"], hbm_gb_per_s)
        out["predicted_fraction"] = predicted / out["implied_bytes"]
    if peak_tflops:
        out["bound_ms"] = roofline_ms(flops, predicted, peak_tflops, hbm_gb_per_s)
        ridge = peak_tflops * 1e12 / (hbm_gb_per_s * 1e9)
        out["bound"] = "compute" if out["intensity"] >= ridge else "memory"
    return out


__all__ = ["Traffic", "STATS_BYTES", "SRAM_PER_SM", "paper_block_sizes", "naive_traffic", "flash2_traffic",
           "flash1_traffic", "programs", "kernel_traffic", "naive_backward_traffic", "flash2_backward_traffic",
           "BACKWARD_KERNELS", "flash2_backward_kernels",
           "MODES", "MODE_FLOP_FACTOR", "attention_flops", "attention_hbm_bytes", "implied_bytes",
           "arithmetic_intensity", "roofline_ms", "io_analysis"]
