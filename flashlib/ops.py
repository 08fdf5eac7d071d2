"""The attention op: one forward and one backward, seen by eager autograd, torch.compile and torch.func.

:func:`flashlib.flash_attention` and :func:`flashlib.flash_attention_varlen` check their
arguments and come here. Everything after the checks lives in this module, once:

* ``forward_impl`` / ``backward_impl``: allocate the outputs in the caller's layout,
  view them as (B, H, N, D) (or keep them packed), upcast bfloat16 in the interpreter,
  launch the kernels of :mod:`flashlib.kernels` and copy back;
* ``flashlib::attention_forward`` / ``flashlib::attention_backward``: the same two
  functions registered with ``torch.library.custom_op``, with fake (meta) versions, so
  that ``torch.compile(fullgraph=True)`` traces a model through them without a graph
  break and never looks inside Triton (nor inside its interpreter on CPU);
* ``FlashAttentionFunction``: the same two functions as a ``torch.autograd.Function``
  for eager calls. A custom op costs 20-60 us of Python dispatch per call on a CPU
  (measured: a do-nothing ``custom_op`` with ``register_autograd`` against a plain
  function), more than a small attention kernel takes on a GPU; eager calls skip it, and
  calls that autograd need not see (inference) skip the Function too (``run``;
  ``benchmarks/front_door.py`` measures the host time of each route).

Both routes share ``setup_context``, ``backward`` and ``vmap``, so they cannot drift:

* backward recomputes P from the saved logsumexp (and the dropout mask from the saved
  seed). When autograd records it (``create_graph=True``, ``torch.autograd.grad`` of a
  gradient, ``hessian``) it runs as ``flashlib::attention_backward``, whose own backward
  raises :data:`DOUBLE_BACKWARD_MESSAGE`: the gradients stay connected to q, k, v, so every
  path to a second derivative fails loudly instead of treating them as constants;
* vmap folds the mapped dimension into the batch (one launch, no loop);
* forward-mode AD (jvp, ``torch.func.jvp``, ``jacfwd``, ``torch.autograd.forward_ad``) runs the JVP
  kernel of :mod:`flashlib.kernels.attention_jvp` (``jvp_impl``), from the saved O and L; its result
  cannot be differentiated again (:data:`JVP_BACKWARD_MESSAGE`).

Dropout draws its seed with torch's generator of q's device (``torch.manual_seed`` makes it
reproducible), on that device, inside the forward, and returns it as a third output; the kernels
and the backward read it there, and the mask is never stored. The seed never visits the host, so
a CUDA graph (``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``) captures the draw
too: torch's CUDA generator is graph-safe, and each replay draws a new seed, hence a new mask.
"""
from __future__ import annotations

import functools

import torch

from . import runtime
from .arguments import forward_mode_active, transform_or_forward_mode_active
from .kernels.attention_bwd import launch_attention_backward
from .kernels.attention_fwd import launch_attention_forward
from .kernels.attention_jvp import launch_attention_jvp
from .spec import AttentionSpec

#: Layouts the op accepts: (B, H, N, D), (B, N, H, D), (B*H, N, D) as "bhnd" with 3 dims, packed (total, H, D).
OP_LAYOUTS = ("bhnd", "bnhd", "packed")

DOUBLE_BACKWARD_MESSAGE = (
    "flash_attention has no double backward (its backward kernels are not differentiable): "
    "gradients of gradients through it are not supported; use flashlib.reference.naive_attention "
    "for higher-order derivatives")

JVP_BACKWARD_MESSAGE = (
    "flash_attention's forward-mode derivative (its JVP kernel) is not differentiable: reverse or forward mode "
    "over forward mode (a gradient or a jvp of a jvp's tangent, torch.func.hessian, jacrev or jacfwd of jacfwd) is "
    "not supported; use flashlib.reference.naive_attention for those derivatives")

COMPILED_FORWARD_AD_MESSAGE = (
    "flash_attention has no forward-mode AD inside torch.compile (torch.func.jvp, jacfwd or forward_ad in a "
    "compiled function): the compiled call is the custom op flashlib::attention_forward, and torch's custom ops "
    "drop tangents, which would give a tangent of zeros. Take the jvp outside the compiled function, or of an eager "
    "one")


# ---------------------------------------------------------------- the two computations
def as_bhnd(t: torch.Tensor, layout: str) -> torch.Tensor:
    """A (B, H, N, D) view of a 3D (B*H, N, D) or 4D tensor in ``layout``: no copy."""
    if t.dim() == 3:
        return t.unsqueeze(1)
    return t if layout == "bhnd" else t.transpose(1, 2)


def lse_shape(q: torch.Tensor, layout: str) -> tuple[int, ...]:
    """Shape of the logsumexp: (B, H, N_q); (B*H, N_q) for 3D inputs; (H, total_q) packed."""
    if layout == "packed":
        return (q.shape[1], q.shape[0])
    if q.dim() == 3:
        return tuple(q.shape[:2])
    return tuple(q.shape[:3]) if layout == "bhnd" else (q.shape[0], q.shape[2], q.shape[1])


def draw_dropout_seed(device: torch.device) -> torch.Tensor:
    """A dropout seed, int64 (1,) on ``device``, from torch's generator there: reproducible under
    ``torch.manual_seed``, and redrawn by every replay of a CUDA graph that captured the call."""
    return torch.randint(0, 2**62, (1,), dtype=torch.int64, device=device)


@functools.lru_cache(maxsize=1024)
def _spec(causal, window_left, window_right, softmax_scale, softcap, has_alibi, dropout_p) -> AttentionSpec:
    """The spec of the op's settings, built once per settings (a dataclass costs microseconds per call)."""
    return AttentionSpec(causal=causal, window=(window_left, window_right), softmax_scale=softmax_scale,
                         softcap=softcap, has_alibi=has_alibi, dropout_p=dropout_p)


def _kernel_views(layout, *tensors):
    """The tensors as the launchers read them: (B, H, N, D) views, or packed as they are."""
    return tuple(t if t is None or layout == "packed" else as_bhnd(t, layout) for t in tensors)


def _rows(t: torch.Tensor, layout: str) -> int:
    """N of a checked tensor: its rows per (batch, head), or all rows when packed."""
    if layout == "packed":
        return t.shape[0]
    return t.shape[-2] if layout == "bhnd" or t.dim() == 3 else t.shape[1]


def forward_impl(q, k, v, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, max_seqlen_q, max_seqlen_k,
                 layout, causal, window_left, window_right, softmax_scale, softcap, dropout_p):
    """O in q's shape, dtype and layout (contiguous), L float32 (see ``lse_shape``), and the dropout seed
    (int64 (1,) on q's device; a shared 0 without dropout)."""
    o, lse, seed = _forward(q, k, v, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, max_seqlen_q,
                            max_seqlen_k, layout, causal, window_left, window_right, softmax_scale, softcap, dropout_p)
    return o, lse, no_seed(q.device) if seed is None else seed


#: The seed output, by device, of eager calls without dropout (shared: nothing reads or writes it).
_NO_SEED: dict = {}


def no_seed(device: torch.device) -> torch.Tensor:
    """The seed output of an eager call without dropout: one zero per device, made once (a new tensor
    on a GPU costs a launch of host time per call)."""
    seed = _NO_SEED.get(device)
    if seed is None:
        seed = _NO_SEED[device] = torch.zeros(1, dtype=torch.int64, device=device)
    return seed


def _forward(q, k, v, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, max_seqlen_q, max_seqlen_k,
             layout, causal, window_left, window_right, softmax_scale, softcap, dropout_p):
    """``forward_impl`` with None for the seed of a call without dropout. Written for host time: it runs
    on every call."""
    seed = draw_dropout_seed(q.device) if dropout_p > 0 else None
    spec = _spec(causal, window_left, window_right, softmax_scale, softcap, alibi_slopes is not None, dropout_p)
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(lse_shape(q, layout), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse, seed
    if _rows(k, layout) == 0:  # no key at all: every row is fully masked
        return o.zero_(), lse.fill_(float("-inf")), seed
    q_run, k_run, v_run = runtime.upcast_for_interpreter(q, k, v)  # bf16 → fp32 in the interpreter
    o_run = o if q_run.dtype == o.dtype else torch.empty(q.shape, dtype=q_run.dtype, device=q.device)
    views = _kernel_views(layout, q_run, k_run, v_run, o_run)
    launch_attention_forward(*views, lse, spec=spec, seq_lens=seq_lens, alibi_slopes=alibi_slopes,
                             cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                             max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, dropout_seed=seed)
    if o_run is not o:
        o.copy_(o_run)
    return o, lse, seed


def backward_impl(grad_o, q, k, v, o, lse, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng,
                  max_seqlen_q, max_seqlen_k, layout, causal, window_left, window_right, softmax_scale, softcap,
                  dropout_p, need_dq, need_dkdv):
    """(dq, dk, dv) in the inputs' shapes, dtypes and layouts; an empty tensor for each one not needed."""
    spec = _spec(causal, window_left, window_right, softmax_scale, softcap, alibi_slopes is not None, dropout_p)
    contiguous = torch.contiguous_format
    nothing = q.new_empty(0) if not (need_dq and need_dkdv) else None
    dq = torch.empty_like(q, memory_format=contiguous) if need_dq else nothing
    dk, dv = ((torch.empty_like(k, memory_format=contiguous), torch.empty_like(v, memory_format=contiguous))
              if need_dkdv else (nothing, nothing))
    wanted = [g for g, need in ((dq, need_dq), (dk, need_dkdv), (dv, need_dkdv)) if need]
    if all(g.numel() == 0 for g in wanted):  # nothing wanted, or only empty tensors
        return dq, dk, dv
    if _rows(q, layout) == 0 or _rows(k, layout) == 0:  # no query or no key: no gradient flows
        for g in wanted:
            g.zero_()
        return dq, dk, dv
    run = runtime.upcast_for_interpreter(q, k, v, o, grad_o)  # bf16 → fp32 in the interpreter
    outs = [None if not need else g if g.dtype == run[0].dtype else torch.empty(g.shape, dtype=run[0].dtype,
                                                                                 device=g.device)
            for g, need in ((dq, need_dq), (dk, need_dkdv), (dv, need_dkdv))]
    q_v, k_v, v_v, o_v, do_v = _kernel_views(layout, *run)
    launch_attention_backward(q_v, k_v, v_v, o_v, lse, do_v, *_kernel_views(layout, *outs), spec=spec,
                              seq_lens=seq_lens, alibi_slopes=alibi_slopes,
                              cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                              max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, dropout_seed=rng)
    for g, out in zip((dq, dk, dv), outs):
        if out is not None and out is not g:
            g.copy_(out)
    return dq, dk, dv


def jvp_impl(q, k, v, o, lse, q_t, k_t, v_t, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng,
             max_seqlen_q, max_seqlen_k, layout, causal, window_left, window_right, softmax_scale, softcap, dropout_p):
    """O's tangent in q's shape, dtype and layout (contiguous), for tangents q_t, k_t, v_t of q, k, v (None: zero),
    from the forward's O and L (and its dropout seed ``rng``)."""
    spec = _spec(causal, window_left, window_right, softmax_scale, softcap, alibi_slopes is not None, dropout_p)
    o_t = torch.empty_like(q, memory_format=torch.contiguous_format)
    if o_t.numel() == 0:
        return o_t
    if _rows(k, layout) == 0:  # no key at all: O is 0 whatever the inputs
        return o_t.zero_()
    # Forward-mode AD lets a tangent's dtype differ from its primal's (a float32 tangent of a float16 q); the kernel's
    # products need one dtype, so each tangent is taken in its primal's dtype, that of O and of O's tangent.
    tangents = [torch.zeros_like(p) if t is None else t.to(p.dtype) for p, t in ((q, q_t), (k, k_t), (v, v_t))]
    lse = lse.contiguous()  # the kernel's layout; a vmap fold may hand it expanded (batch stride 0)
    run = runtime.upcast_for_interpreter(q, k, v, o, *tangents)  # bf16 → fp32 in the interpreter
    o_t_run = o_t if run[0].dtype == o_t.dtype else torch.empty(q.shape, dtype=run[0].dtype, device=q.device)
    views = _kernel_views(layout, *run, o_t_run)
    launch_attention_jvp(*views[:4], lse, *views[4:], spec=spec, seq_lens=seq_lens, alibi_slopes=alibi_slopes,
                         cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                         max_seqlen_k=max_seqlen_k, dropout_seed=rng if dropout_p > 0 else None)
    if o_t_run is not o_t:
        o_t.copy_(o_t_run)
    return o_t


# ---------------------------------------------------------------- torch.library registration
@torch.library.custom_op("flashlib::attention_forward", mutates_args=(),
                         tags=(torch.Tag.nondeterministic_seeded,))
def attention_forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor | None,
                         cu_seqlens_q: torch.Tensor | None, cu_seqlens_k: torch.Tensor | None,
                         alibi_slopes: torch.Tensor | None, max_seqlen_q: int, max_seqlen_k: int, layout: str,
                         causal: bool, window_left: int, window_right: int, softmax_scale: float, softcap: float,
                         dropout_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """flash_attention's forward as an op: (O, logsumexp, dropout seed), the seed an int64 (1,) on q's device
    (a fresh zero without dropout: an op's outputs are its own)."""
    o, lse, seed = _forward(q, k, v, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, max_seqlen_q, max_seqlen_k,
                            layout, causal, window_left, window_right, softmax_scale, softcap, dropout_p)
    return o, lse, torch.zeros(1, dtype=torch.int64, device=q.device) if seed is None else seed


@attention_forward_op.register_fake
def _forward_fake(q, k, v, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, max_seqlen_q, max_seqlen_k,
                  layout, causal, window_left, window_right, softmax_scale, softcap, dropout_p):
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            q.new_empty(lse_shape(q, layout), dtype=torch.float32),
            torch.empty(1, dtype=torch.int64, device=q.device))


@torch.library.custom_op("flashlib::attention_backward", mutates_args=())
def attention_backward_op(grad_o: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                          lse: torch.Tensor, seq_lens: torch.Tensor | None, cu_seqlens_q: torch.Tensor | None,
                          cu_seqlens_k: torch.Tensor | None, alibi_slopes: torch.Tensor | None, rng: torch.Tensor,
                          max_seqlen_q: int, max_seqlen_k: int, layout: str, causal: bool, window_left: int,
                          window_right: int, softmax_scale: float, softcap: float, dropout_p: float,
                          need_dq: bool, need_dkdv: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """flash_attention's backward as an op: (dq, dk, dv), empty where not needed."""
    return backward_impl(grad_o, q, k, v, o, lse, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng,
                         max_seqlen_q, max_seqlen_k, layout, causal, window_left, window_right, softmax_scale,
                         softcap, dropout_p, need_dq, need_dkdv)


@attention_backward_op.register_fake
def _backward_fake(grad_o, q, k, v, o, lse, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng,
                   max_seqlen_q, max_seqlen_k, layout, causal, window_left, window_right, softmax_scale, softcap,
                   dropout_p, need_dq, need_dkdv):
    nothing = q.new_empty(0)
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device) if need_dq else nothing,
            torch.empty(k.shape, dtype=k.dtype, device=k.device) if need_dkdv else nothing,
            torch.empty(v.shape, dtype=v.dtype, device=v.device) if need_dkdv else nothing)


def _refuse_double_backward(ctx, *grads):
    raise RuntimeError(DOUBLE_BACKWARD_MESSAGE)


def _nothing_to_save(ctx, inputs, output):
    """The backward op's backward only raises: nothing to save (a setup_context lets torch.func use the op)."""


attention_backward_op.register_autograd(_refuse_double_backward, setup_context=_nothing_to_save)

#: Positions of the op's arguments after the tensors (what backward and vmap pass on).
_N_TENSOR_ARGS = 7  # q, k, v, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes


def setup_context(ctx, inputs, output):
    """Save what the backward needs: q, k, v, O, L, the masks' tensors and the dropout seed (never P)."""
    q, k, v, seq_lens, cu_q, cu_k, alibi = inputs[:_N_TENSOR_ARGS]
    o, lse, rng = output
    ctx.save_for_backward(q, k, v, o, lse, seq_lens, cu_q, cu_k, alibi, rng)
    if transform_or_forward_mode_active():
        ctx.save_for_forward(q, k, v, o, lse, seq_lens, cu_q, cu_k, alibi, rng)  # for ``jvp``
    ctx.settings = inputs[_N_TENSOR_ARGS:]
    if hasattr(ctx, "mark_non_differentiable"):
        ctx.mark_non_differentiable(lse, rng)


class AttentionBackwardFunction(torch.autograd.Function):
    """``backward_impl`` as a node of its own, for a backward that autograd records (``create_graph=True``,
    ``torch.autograd.grad`` of a gradient, ``torch.func.grad``): its gradients stay connected to q, k,
    v and dO, and differentiating them again raises :data:`DOUBLE_BACKWARD_MESSAGE`, in reverse mode (``backward``)
    and in forward mode (``jvp``: forward over reverse, ``torch.func.jvp`` of ``torch.func.grad`` or a dual tensor's
    gradient, where torch's own error names no op and no way out)."""

    @staticmethod
    def forward(*args):
        return backward_impl(*args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(DOUBLE_BACKWARD_MESSAGE)

    @staticmethod
    def jvp(ctx, *tangents):
        raise RuntimeError(DOUBLE_BACKWARD_MESSAGE)

    @staticmethod
    def vmap(info, in_dims, *args):
        raise NotImplementedError("vmap of flash_attention's backward (per-sample gradients through "
                                  "torch.func.vmap(torch.func.grad(...))) is not supported: " + DOUBLE_BACKWARD_MESSAGE)


def backward(ctx, grad_o, grad_lse=None, grad_rng=None):
    """dq, dk, dv from the saved tensors; None for the other inputs. L and the seed carry no gradient.

    Plain eager backward runs the kernels directly; under torch.compile it is the op
    ``flashlib::attention_backward``; when autograd records it, ``AttentionBackwardFunction``.
    """
    q, k, v, o, lse, seq_lens, cu_q, cu_k, alibi, rng = ctx.saved_tensors
    need_q, need_k, need_v = ctx.needs_input_grad[:3]
    if grad_o is None:
        grad_o = torch.zeros_like(o)
    args = (grad_o, q, k, v, o, lse, seq_lens, cu_q, cu_k, alibi, rng, *ctx.settings, need_q, need_k or need_v)
    if torch.compiler.is_compiling() or any(type(t) is not torch.Tensor for t in (grad_o, q, k, v)):
        dq, dk, dv = attention_backward_op(*args)
    elif torch.is_grad_enabled():
        dq, dk, dv = AttentionBackwardFunction.apply(*args)
    else:
        dq, dk, dv = backward_impl(*args)
    return (dq if need_q else None, dk if need_k else None, dv if need_v else None,
            *([None] * (_N_TENSOR_ARGS - 3 + len(ctx.settings))))


def _fold(t, dim, size):
    """``t`` with its vmapped ``dim`` (None: not mapped, expanded) moved to the front, ``size`` long."""
    if dim is None:
        return t.unsqueeze(0).expand(size, *t.shape)
    return t.movedim(dim, 0)


def _fold_slopes(alibi_slopes, dim, size, batch):
    """ALiBi slopes for a batch of ``size * batch`` samples folded by vmap: (H,) slopes stay shared; mapped or
    (B, H) ones become (size * batch, H)."""
    if alibi_slopes is None or (dim is None and alibi_slopes.dim() == 1):
        return alibi_slopes  # (H,) slopes, the same for every sample
    slopes = _fold(alibi_slopes, dim, size)
    if slopes.dim() == 2:  # a mapped (H,): (size, H) → (size, B, H)
        slopes = slopes.unsqueeze(1).expand(size, batch, slopes.shape[-1])
    return slopes.reshape(size * batch, slopes.shape[-1]).contiguous()  # read as (B, H) rows, never by stride


def _fold_batch(size, tensors, dims, seq_lens, seq_lens_dim, alibi_slopes, slopes_dim):
    """A vmapped call's per-sample inputs with the mapped dimension (``size`` long) folded into the batch:
    ``(B, tensors, seq_lens, alibi_slopes)`` for B the batch of the first tensor before folding, every tensor
    (None stays None) now ``size * B`` long along its first dimension. Both vmap rules (the forward's, the
    JVP's) fold this way."""
    folded = [None if t is None else _fold(t, d, size) for t, d in zip(tensors, dims)]
    batch = folded[0].shape[1]
    folded = tuple(None if t is None else t.reshape(size * batch, *t.shape[2:]) for t in folded)
    # The kernels read the lengths at SEQ_LENS + b: contiguous, since unmapped lengths of B = 1 fold to stride 0.
    if seq_lens is not None:
        seq_lens = _fold(seq_lens, seq_lens_dim, size).reshape(size * batch).contiguous()
    return batch, folded, seq_lens, _fold_slopes(alibi_slopes, slopes_dim, size, batch)


def _check_vmap_randomness(info, dropout_p) -> None:
    """vmap's ``randomness`` setting, as torch's own dropout keeps it: the default "error" refuses a random draw,
    "different" is what folding the slices into one launch gives (each sample its own mask); "same" (one mask for
    every slice) the folded launch cannot give, so it is refused rather than ignored."""
    if not dropout_p or info.randomness == "different":
        return
    if info.randomness == "error":
        raise RuntimeError("vmap: called random operation while in randomness error mode (flash_attention with "
                           "dropout_p > 0). Pass randomness='different' to torch.func.vmap, or take dropout "
                           "out of the vmapped function")
    raise NotImplementedError("flash_attention's dropout under torch.func.vmap(randomness='same') is not supported: "
                              "the mapped slices are one launch, and each draws its own mask; use "
                              "randomness='different'")


def vmap(info, in_dims, q, k, v, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, *settings):
    """vmap over the batch: the mapped dimension is folded into B (or into B*H for 3D inputs), one launch."""
    layout = settings[2]
    if layout == "packed" or any(d is not None for d in in_dims[4:6]):
        raise NotImplementedError("vmap over flash_attention_varlen is not supported: pack the mapped "
                                  "sequences into one call (cu_seqlens) instead")
    _check_vmap_randomness(info, settings[-1])
    size = info.batch_size
    batch, (q, k, v), seq_lens, alibi_slopes = _fold_batch(size, (q, k, v), in_dims[:3], seq_lens, in_dims[3],
                                                           alibi_slopes, in_dims[6])
    o, lse, rng = _apply_eagerly(q, k, v, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, *settings)
    o = o.reshape(size, batch, *o.shape[1:])
    lse = lse.reshape(size, batch, *lse.shape[1:])
    return (o, lse, rng), (0, 0, None)


attention_forward_op.register_autograd(backward, setup_context=setup_context)
attention_forward_op.register_vmap(vmap)


class AttentionJvpFunction(torch.autograd.Function):
    """``jvp_impl`` as a node of its own, where a transform or autograd sees it: vmap folds the mapped dimension
    into the batch (``torch.func.jacfwd`` maps the jvp over its basis of tangents), and differentiating its result
    raises :data:`JVP_BACKWARD_MESSAGE` instead of treating the tangent as a constant, in reverse mode (``backward``)
    and in forward mode (``jvp``: without it torch's own error names no op and no way out)."""

    @staticmethod
    def forward(*args):
        return jvp_impl(*args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError(JVP_BACKWARD_MESSAGE)

    @staticmethod
    def jvp(ctx, *tangents):
        raise RuntimeError(JVP_BACKWARD_MESSAGE)

    @staticmethod
    def vmap(info, in_dims, q, k, v, o, lse, q_t, k_t, v_t, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
             rng, *settings):
        layout, dropout_p = settings[2], settings[-1]
        if layout == "packed" or any(d is not None for d in in_dims[9:11]):
            raise NotImplementedError("vmap (or jacfwd) over flash_attention_varlen's jvp is not supported")
        if dropout_p > 0:
            raise NotImplementedError("vmap (or jacfwd) over flash_attention's jvp with dropout is not supported: "
                                      "folding the mapped dimension into the batch would change the dropout mask")
        size = info.batch_size
        batch, (q, k, v, o, lse, q_t, k_t, v_t), seq_lens, alibi_slopes = _fold_batch(
            size, (q, k, v, o, lse, q_t, k_t, v_t), in_dims[:8], seq_lens, in_dims[8], alibi_slopes, in_dims[11])
        o_t = _jvp_as_seen(q, k, v, o, lse, q_t, k_t, v_t, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, rng,
                           *settings)
        return o_t.reshape(size, batch, *o_t.shape[1:]), 0


def _jvp_as_seen(*args):
    """``jvp_impl``, through :class:`AttentionJvpFunction` where a torch.func transform or autograd would see it
    (an outer transform's wrappers are then taken off by the Function's rules, never by a kernel)."""
    q, k, v, q_t, k_t, v_t = args[:3] + args[5:8]
    watched = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, q_t, k_t, v_t))
    if watched or torch._C._are_functorch_transforms_active():
        return AttentionJvpFunction.apply(*args)
    return jvp_impl(*args)


def jvp(ctx, q_t, k_t, v_t, *other_tangents):
    """Forward-mode AD: (O's tangent, None, None) from the tangents of q, k and v (None where one has none), by the
    JVP kernel (:mod:`flashlib.kernels.attention_jvp`) from the saved O and L. L and the seed carry no tangent, as
    they carry no gradient. The other inputs' tangents are not read: the front door refuses ALiBi slopes that are
    being differentiated (:func:`flashlib.arguments.differentiated`), and torch.func hands the others zeros."""
    q, k, v, o, lse, seq_lens, cu_q, cu_k, alibi, rng = ctx.saved_tensors
    o_t = _jvp_as_seen(q, k, v, o, lse, q_t, k_t, v_t, seq_lens, cu_q, cu_k, alibi, rng, *ctx.settings)
    return o_t, None, None


class FlashAttentionFunction(torch.autograd.Function):
    """The op for eager calls: ``forward_impl``, and the op's own setup_context and backward.

    Written for host time: in the older style (``forward(ctx, ...)``), so ``apply`` skips
    binding the arguments to a signature, and with the op's settings as one tuple, so it
    unwraps eight arguments instead of sixteen (each costs host time on every call). Its
    backward returns the op's sixteen gradients: autograd drops the trailing Nones.
    Under torch.func transforms :class:`FlashAttentionFunctionForTorchFunc` runs instead.
    """

    @staticmethod
    def forward(ctx, q, k, v, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, settings):
        inputs = (q, k, v, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, *settings)
        output = forward_impl(*inputs)
        setup_context(ctx, inputs, output)
        return output

    backward = staticmethod(backward)
    jvp = staticmethod(jvp)


class FlashAttentionFunctionForTorchFunc(torch.autograd.Function):
    """The same op in the style torch.func needs (a separate ``setup_context``), with its vmap rule."""

    @staticmethod
    def forward(*args):
        return forward_impl(*args)

    setup_context = staticmethod(setup_context)
    backward = staticmethod(backward)
    vmap = staticmethod(vmap)
    jvp = staticmethod(jvp)


def _apply_eagerly(*args):
    """The autograd.Function for eager calls: the torch.func one while a transform (vmap, grad, jvp) is active."""
    if torch._C._are_functorch_transforms_active():
        return FlashAttentionFunctionForTorchFunc.apply(*args)
    return FlashAttentionFunction.apply(*args[:_N_TENSOR_ARGS], args[_N_TENSOR_ARGS:])


def op_settings(spec: AttentionSpec, layout: str, head_dim: int, max_seqlen_q: int = 0,
                max_seqlen_k: int = 0) -> tuple:
    """The op's arguments after its seven tensors, for a checked ``spec``: what ``attention_forward_op``,
    ``setup_context`` and ``backward`` pass on. The front door may keep it per call signature."""
    left, right = spec.bounds()
    return (max_seqlen_q, max_seqlen_k, layout, spec.causal, -1 if left is None else left,
            -1 if right is None else right, spec.scale(head_dim), float(spec.softcap), float(spec.dropout_p))


def needs_autograd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether a call must go through autograd: a gradient is wanted, or a torch.func transform or
    forward-mode AD is active (whose rules live on the autograd.Function: a jvp must raise, not be dropped)."""
    return ((torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
            or transform_or_forward_mode_active())


def run(q, k, v, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, settings: tuple):
    """(O, L, dropout seed) of checked arguments and their ``op_settings``: the custom op while
    torch.compile traces; the autograd.Function when autograd must see the call; else the forward
    itself (inference skips the Function's bookkeeping, tens of microseconds of host time)."""
    if torch.compiler.is_compiling():
        if forward_mode_active():  # a constant while dynamo traces: torch.func.jvp or a dual level
            raise NotImplementedError(COMPILED_FORWARD_AD_MESSAGE)
        return attention_forward_op(q, k, v, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, *settings)
    if needs_autograd(q, k, v):
        return _apply_eagerly(q, k, v, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, *settings)
    return forward_impl(q, k, v, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, *settings)


def attention(q, k, v, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, max_seqlen_q, max_seqlen_k, layout,
              spec: AttentionSpec):
    """(O, L, dropout seed) of checked arguments (see ``run``)."""
    settings = op_settings(spec, layout, q.shape[-1], max_seqlen_q, max_seqlen_k)
    return run(q, k, v, seq_lens, cu_seqlens_q, cu_seqlens_k, alibi_slopes, settings)
