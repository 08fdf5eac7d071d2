"""Checks for notebook 08 (in practice): flashlib inside a model.

Exercise signatures (stated in the notebook):

* ``attend(q, k, v) -> o``: the attention function of :class:`flashlib.model.CausalSelfAttention`.
  q (B, N, H, D), k and v (B, N, H_kv, D), as the projections produce them
  (layout "bnhd"); returns causal attention (B, N, H, D) with the scale 1/sqrt(D),
  computed by :func:`flashlib.flash_attention` (the check looks for its autograd node).
* ``GQAttention``: a subclass of :class:`flashlib.model.CausalSelfAttention` whose
  ``forward(x)`` (x (B, N, d_model)) projects to q (H heads) and k, v (H_kv heads),
  runs causal attention with flashlib (GQA: no repeat needed) and projects back
  with ``out_proj``. The check builds it as ``GQAttention(d_model, n_heads, n_kv_heads)``
  and loads random weights.

Each check's first case is fixed (the same values whatever the seed): GQA with
three query heads per k/v head (H = 6, H_kv = 2), where ``repeat`` and
``repeat_interleave`` disagree; for ``attend`` its q, k and v are also
non-contiguous views of one fused projection (B, N, H + 2 H_kv, D), as a model
that projects q, k and v with one matmul produces them. Seeded random cases follow.
The grader's checks (:data:`ATTEND_CHECK`, :data:`GQA_ATTENTION_CHECK`, in
``checks.CHECKS``) judge the values (and, for ``attend``, the copies the call found in
the output's autograd graph: the exercise asks for none): the replies cross a process
boundary as plain tensors, without their autograd graph, and that the answer calls
flashlib is checked statically from its source (the registry's ``required_calls``). Every wrong
answer below gives other values than the right one on the fixed case. In the
notebook, ``check_attend`` and ``check_gqa_attention`` also look for flashlib's
autograd node in the output (``_inspect_flashlib``), where the graph is still there.

Wrong answers named, for both: causal forgotten, the (B, N, H, D) tensors passed
as (B, H, N, D) (no ``layout="bnhd"``), ``reshape`` where a ``transpose`` is needed,
the output left in (B, H, N, D), a wrong scale, k/v heads repeated in the wrong
order (``repeat`` instead of ``repeat_interleave``); for the module also the
output projection forgotten. Mixing up H and H_kv makes the shapes disagree: the
verdict then quotes the error and the learner's line.

Case args and contexts are plain data (tensors, ints, tuples, dicts, strings), so
that they load with ``torch.load(weights_only=True)``.
"""
from __future__ import annotations

import dataclasses
import inspect
import math

import torch

from ... import reference, runtime
from ...validation import tolerance
from .framework import Case, Check, Mistake, fixed_generator, register, run_check

NOTEBOOK = "08_in_practice"
ATTEND = register(NOTEBOOK, "attend", 2,
                  "Swap flashlib into the block: causal attention on (B, N, H, D) tensors, no copy")
GQA_ATTENTION = register(NOTEBOOK, "gqa_attention", 2,
                         "The attention module's forward with GQA: H query heads, H_kv shared k/v heads")


def autograd_nodes(out):
    """Every node of ``out``'s autograd graph, once each (none for a tensor without one)."""
    seen, stack = set(), [getattr(out, "grad_fn", None)]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        yield node
        stack.extend(next_node for next_node, _ in node.next_functions)


def _flashlib_used(out) -> bool:
    """Whether ``out`` was computed through an autograd node of flashlib's attention (padded or varlen)."""
    # padded and varlen share the op
    return any(type(node).__name__.startswith("FlashAttentionFunction") for node in autograd_nodes(out))


def _inspect_flashlib(case: Case, out) -> str | None:
    if not _flashlib_used(out):
        return ("right values, but not computed by flashlib: call flashlib.flash_attention "
                "(the check found no FlashAttentionFunction node in the output's autograd graph)")
    return None


#: Autograd nodes of operations that copy a tensor's data: ``contiguous()`` and ``reshape`` of a view (Clone),
#: ``to``/``float``/``half`` that change the dtype (ToCopy), ``copy_``, ``cat``/``stack``, ``repeat``,
#: ``repeat_interleave`` and ``index_select`` (IndexSelect, or Clone of an expanded view), ``gather``.
COPYING_NODES = ("CloneBackward0", "ToCopyBackward0", "CopyBackwards", "CopySlices", "CatBackward0",
                 "StackBackward0", "RepeatBackward0", "IndexSelectBackward0", "GatherBackward0")


def copies_in_graph(out) -> list[str]:
    """The copying autograd nodes (:data:`COPYING_NODES`) between ``out`` and the leaves, by name."""
    return sorted({type(node).__name__ for node in autograd_nodes(out)} & set(COPYING_NODES))


def reaches_every_leaf(out, leaves) -> bool:
    """Whether the gradient of ``out`` flows back to every tensor of ``leaves`` (its autograd graph holds their
    AccumulateGrad nodes): a detached output, or a detached input, trains nothing through it."""
    variables = [getattr(node, "variable", None) for node in autograd_nodes(out)]
    return all(any(variable is leaf for variable in variables) for leaf in leaves)


def _inspect_no_copy(case: Case, out) -> str | None:
    """The exercise asks for attention without copying q, k, v or o, that gradients flow through: the call
    noted the graph's copies, and whether the output's gradient reaches the inputs."""
    copies, reached = case.context.get("copies"), case.context.get("gradient reaches q, k, v")
    if not isinstance(copies, list) or not all(isinstance(name, str) for name in copies) \
            or not isinstance(reached, bool):  # noted by the call
        return (f"what the check noted about the output's autograd graph did not come back (copies: "
                f"{type(copies).__name__}, gradient reach: {type(reached).__name__})")
    if not reached:
        return ("right values, but no gradient flows from the output back to q, k and v (a detach(), or a "
                "computation outside autograd): the model could not learn through this attention")
    if copies:
        return ("right values, but your code copies the tensors (" + ", ".join(copies) + " in the output's "
                "autograd graph): flash_attention reads q, k and v where they are, through their strides, with "
                "layout=\"bnhd\" (or transpose(1, 2) views), and shares the H_kv k/v heads itself; no "
                "contiguous(), clone(), repeat_interleave, cat or dtype change is needed")
    return None


def _inspect_flashlib_no_copy(case: Case, out) -> str | None:
    return _inspect_flashlib(case, out) or _inspect_no_copy(case, out)


# ------------------------------------------------------------------ attention in float64

def _attention_bnhd(q, k, v, *, causal=True, scale=None, layout="transpose", expand="interleave"):
    """Causal attention of (B, N, H, D) tensors in float64, with one step done as a typical bug does it.

    layout: "transpose" (right), "as_bhnd" (the tensors read as (B, H, N, D) as they are),
    "reshape" (reshaped to (B, H, N, D) and back instead of transposed), "stay_bhnd" (the
    output left in (B, H, N, D)). expand: how k/v heads are shared: "interleave" (right:
    query head h reads k/v head h // G) or "repeat" (h % H_kv).
    """
    q, k, v = (t.detach().double() for t in (q, k, v))
    batch, n, heads, head_dim = q.shape
    if expand == "repeat" and k.shape[2] != heads:
        group = heads // k.shape[2]
        k, v = k.repeat(1, 1, group, 1), v.repeat(1, 1, group, 1)
    if layout == "as_bhnd":
        return reference.naive_attention(q, k, v, causal=causal, softmax_scale=scale)
    if layout == "reshape":
        q4, k4, v4 = (t.reshape(batch, t.shape[2], n, head_dim) for t in (q, k, v))
        return reference.naive_attention(q4, k4, v4, causal=causal, softmax_scale=scale).reshape(q.shape)
    o = reference.naive_attention(*(t.transpose(1, 2) for t in (q, k, v)), causal=causal, softmax_scale=scale)
    return o if layout == "stay_bhnd" else o.transpose(1, 2)


def _scales(head_dim: int, heads: int) -> list[float]:
    return [1.0, 1.0 / head_dim, math.sqrt(head_dim), 1.0 / math.sqrt(heads * head_dim)]


_LAYOUT_MESSAGE = (
    "the (B, N, H, D) tensors were passed as if they were (B, H, N, D): the kernel then takes the "
    "sequence for the heads and the heads for the sequence. Pass layout=\"bnhd\" to flash_attention "
    "(no copy), or transpose(1, 2) before and after")
_RESHAPE_MESSAGE = (
    "reshape (or view) to (B, H, N, D) scrambles the tokens and heads: it keeps the memory order. "
    "Going from (B, N, H, D) to (B, H, N, D) swaps two axes: transpose(1, 2), or better, "
    "layout=\"bnhd\" and no reordering at all")
_CAUSAL_MESSAGE = ("causal=True is missing: a language model's token i must not see tokens after it; "
                   "without the mask every token sees the whole sequence")
_SCALE_MESSAGE = ("the scale is wrong: scores are q . k / sqrt(D) with D the head_dim "
                  "(flash_attention's default when softmax_scale is None), not 1, 1/D, sqrt(D) or "
                  "1/sqrt(d_model)")
_STAY_MESSAGE = ("the output is still (B, H, N, D): the caller (the block) expects (B, N, H, D), "
                 "the layout of its inputs; transpose(1, 2) it back, or use layout=\"bnhd\" and "
                 "get (B, N, H, D) directly")
_REPEAT_MESSAGE = ("k/v heads shared in the wrong order: query head h reads k/v head h // (H // H_kv) "
                   "(heads 0 and 1 share k/v head 0, ...), which is repeat_interleave; repeat (or expand "
                   "then reshape along the wrong axis) gives head h the k/v head h % H_kv. "
                   "flash_attention shares the heads itself: pass the H_kv-head k and v as they are")


ATTEND_MISTAKES = (
    Mistake("not causal", _CAUSAL_MESSAGE, lambda q, k, v: _attention_bnhd(q, k, v, causal=False)),
    Mistake("layout", _LAYOUT_MESSAGE, lambda q, k, v: [_attention_bnhd(q, k, v, layout="as_bhnd"),
                                                        _attention_bnhd(q, k, v, layout="as_bhnd", causal=False)]),
    Mistake("reshape", _RESHAPE_MESSAGE, lambda q, k, v: [_attention_bnhd(q, k, v, layout="reshape"),
                                                          _attention_bnhd(q, k, v, layout="reshape", causal=False)]),
    Mistake("left in bhnd", _STAY_MESSAGE, lambda q, k, v: _attention_bnhd(q, k, v, layout="stay_bhnd")),
    Mistake("scale", _SCALE_MESSAGE,
            lambda q, k, v: [_attention_bnhd(q, k, v, scale=s) for s in _scales(q.shape[3], q.shape[2])]),
    Mistake("repeat", _REPEAT_MESSAGE, lambda q, k, v: (_attention_bnhd(q, k, v, expand="repeat")
                                                        if k.shape[2] not in (1, q.shape[2]) else None)),
)


def _randn(gen, *shape):
    return torch.randn(shape, generator=gen, dtype=torch.float64)


#: The seed of the fixed cases: the same values in every run, whatever the exercise's seed
#: (the grader's hidden draw mixes it with its own: :func:`~.framework.fixed_generator`).
FIXED_SEED = 20240808

#: ``case.context["inputs"]`` of a case whose q, k, v reach the learner as views of one fused tensor.
FUSED = "fused qkv"


def _fixed_generator() -> torch.Generator:
    return fixed_generator(FIXED_SEED)


def _attend_case(gen, batch, n, heads, kv_heads, head_dim, note="", fused=False) -> Case:
    q = _randn(gen, batch, n, heads, head_dim)
    k, v = (_randn(gen, batch, n, kv_heads, head_dim) for _ in range(2))
    expected = _attention_bnhd(q, k, v)
    args = tuple(t.float().to(runtime.DEVICE) for t in (q, k, v))
    description = (f"q ({batch}, {n}, {heads}, {head_dim}), k and v ({batch}, {n}, {kv_heads}, {head_dim}) "
                   f"= (B, N, H, D), float32{note}")
    return Case(description, args, expected, tolerance(torch.float32), shape_words="(B, N, H, D)",
                out_dtype=torch.float32, context={"inputs": FUSED if fused else "separate"})


def _attend_cases(gen):
    return [
        _attend_case(_fixed_generator(), 1, 12, 6, 2, 16,
                     ", GQA: 3 query heads per k/v head; q, k and v are non-contiguous views of one fused "
                     "projection (B, N, H + 2 H_kv, D) = (1, 12, 10, 16), split along the heads, as a model "
                     "with one qkv matmul produces them", fused=True),
        _attend_case(gen, 1, 24, 2, 2, 16),
        _attend_case(gen, 2, 20, 4, 4, 32),
        _attend_case(gen, 2, 30, 4, 2, 16, ", GQA: 2 query heads per k/v head"),
        _attend_case(gen, 1, 40, 3, 1, 64, ", MQA: one k/v head for all"),
    ]


def _call_with_grad(learner, case: Case):
    """Call on tensors that require grad, so that the output's autograd graph shows who computed it and
    whether the answer copied the tensors on the way (noted in the case's context for the judge).

    The framework has already copied the case's args; a FUSED case hands the learner q, k and v as
    views of one (B, N, H + 2 H_kv, D) tensor (strides of a fused projection, not contiguous).
    """
    q, k, v = case.args
    if case.context.get("inputs") == FUSED:
        fused = torch.cat([q, k, v], dim=2).detach().requires_grad_()
        leaves = (fused,)
        q, k, v = fused.split([q.shape[2], k.shape[2], v.shape[2]], dim=2)
    else:
        q, k, v = leaves = tuple(t.detach().requires_grad_() for t in (q, k, v))
    out = learner(q, k, v)
    # judged by _inspect_no_copy, on the grader's side too
    case.context["copies"] = copies_in_graph(out)
    case.context["gradient reaches q, k, v"] = reaches_every_leaf(out, leaves)
    return out


#: What the grader judges: the values, and the copies the call found in the output's autograd graph (its
#: replies carry no graph).
ATTEND_CHECK = Check(ATTEND, _attend_cases, ATTEND_MISTAKES, call=_call_with_grad, time_limit=20.0,
                     inspect=_inspect_no_copy)
#: What the notebook's check cell runs: the same, and the output must come from flashlib's autograd node.
ATTEND_NOTEBOOK_CHECK = dataclasses.replace(ATTEND_CHECK, inspect=_inspect_flashlib_no_copy)


def check_attend(fn, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check ``fn(q, k, v) -> o``: causal flashlib attention of (B, N, H, D) tensors, GQA allowed."""
    return run_check(ATTEND_NOTEBOOK_CHECK, fn, seed=seed, time_limit_s=time_limit_s)


# ----------------------------------------------------------------- the GQA module

def _module_output(x, sizes, weights, *, project_out=True, **attention_bug):
    """The module's forward in float64 from its weights, with an optional bug in the attention."""
    d_model, heads, kv_heads = sizes
    head_dim = d_model // heads
    x = x.detach().double()
    batch, n, _ = x.shape
    w = {name: t.detach().double().cpu() for name, t in weights.items()}
    x = x.cpu()
    q = (x @ w["q_proj.weight"].T).view(batch, n, heads, head_dim)
    k = (x @ w["k_proj.weight"].T).view(batch, n, kv_heads, head_dim)
    v = (x @ w["v_proj.weight"].T).view(batch, n, kv_heads, head_dim)
    o = _attention_bnhd(q, k, v, **attention_bug)
    o = o.reshape(batch, n, heads * head_dim)   # also the scrambled reshape of an output left in bhnd
    return o @ w["out_proj.weight"].T if project_out else o


GQA_MISTAKES = (
    Mistake("repeat", _REPEAT_MESSAGE, lambda x, s, w: _module_output(x, s, w, expand="repeat")),
    Mistake("not causal", _CAUSAL_MESSAGE, lambda x, s, w: _module_output(x, s, w, causal=False)),
    Mistake("layout", _LAYOUT_MESSAGE, lambda x, s, w: _module_output(x, s, w, layout="as_bhnd")),
    Mistake("reshape", _RESHAPE_MESSAGE, lambda x, s, w: _module_output(x, s, w, layout="reshape")),
    Mistake("left in bhnd",
            "the attention output was reshaped to (B, N, H * D) while still (B, H, N, D): that mixes "
            "tokens and heads. Bring it back to (B, N, H, D) first (transpose(1, 2)), or use "
            "layout=\"bnhd\" throughout",
            lambda x, s, w: _module_output(x, s, w, layout="stay_bhnd")),
    Mistake("scale", _SCALE_MESSAGE,
            lambda x, s, w: [_module_output(x, s, w, scale=c) for c in _scales(s[0] // s[1], s[1])]),
    Mistake("out_proj missing",
            "the output projection is missing: after attention, return self.out_proj(o.reshape(B, N, H * D))",
            lambda x, s, w: _module_output(x, s, w, project_out=False)),
)


def _gqa_case(gen, batch, n, d_model, heads, kv_heads, note="") -> Case:
    head_dim = d_model // heads
    x = _randn(gen, batch, n, d_model)
    weights = {  # unit-scale projections: scores of order 1, so that a wrong scale shows
        "q_proj.weight": _randn(gen, heads * head_dim, d_model) / math.sqrt(d_model),
        "k_proj.weight": _randn(gen, kv_heads * head_dim, d_model) / math.sqrt(d_model),
        "v_proj.weight": _randn(gen, kv_heads * head_dim, d_model) / math.sqrt(d_model),
        "out_proj.weight": _randn(gen, d_model, heads * head_dim) / math.sqrt(heads * head_dim),
    }
    sizes = (d_model, heads, kv_heads)
    expected = _module_output(x, sizes, weights)
    weights = {name: t.float().to(runtime.DEVICE) for name, t in weights.items()}
    description = (f"GQAttention(d_model={d_model}, n_heads={heads}, n_kv_heads={kv_heads}) "
                   f"(head_dim {head_dim}), x ({batch}, {n}, {d_model}), float32{note}")
    return Case(description, (x.float().to(runtime.DEVICE), sizes, weights), expected,
                tolerance(torch.float32), shape_words="(B, N, d_model)", out_dtype=torch.float32)


def _gqa_cases(gen):
    return [
        _gqa_case(_fixed_generator(), 1, 12, 96, 6, 2, ", GQA: 3 query heads per k/v head"),
        _gqa_case(gen, 1, 24, 32, 2, 2, ", no GQA (as many k/v heads as query heads)"),
        _gqa_case(gen, 2, 20, 64, 4, 2, ", GQA: 2 query heads per k/v head"),
        _gqa_case(gen, 1, 30, 64, 4, 1, ", MQA: one k/v head"),
        _gqa_case(gen, 1, 40, 96, 6, 3, ", GQA: 3 k/v heads"),
    ]


def _accept_module_class(learner) -> str | None:
    from ...model import CausalSelfAttention

    if not inspect.isclass(learner) or not issubclass(learner, torch.nn.Module):
        return (f"expected a class (a subclass of flashlib.model.CausalSelfAttention), "
                f"got {type(learner).__name__} {learner!r:.60}")
    if not issubclass(learner, CausalSelfAttention):
        return f"expected a subclass of flashlib.model.CausalSelfAttention, got {learner.__name__}"
    return None


def _call_module(learner, case: Case):
    """Build the learner's module, load the case's weights and run it on x (already a copy)."""
    x, (d_model, heads, kv_heads), weights = case.args
    module = learner(d_model, heads, kv_heads).to(runtime.DEVICE)
    with torch.no_grad():
        for name, value in weights.items():
            module.get_parameter(name).copy_(value)
    return module(x)


#: What the grader judges: the values (its replies carry no autograd graph).
GQA_ATTENTION_CHECK = Check(GQA_ATTENTION, _gqa_cases, GQA_MISTAKES, call=_call_module,
                            accept=_accept_module_class, time_limit=20.0)
#: What the notebook's check cell runs: the same, and the output must come from flashlib's autograd node.
GQA_ATTENTION_NOTEBOOK_CHECK = dataclasses.replace(GQA_ATTENTION_CHECK, inspect=_inspect_flashlib)


def check_gqa_attention(cls, *, seed: int | None = None, time_limit_s: float | None = None):
    """Check a CausalSelfAttention subclass whose forward runs flashlib with GQA."""
    return run_check(GQA_ATTENTION_NOTEBOOK_CHECK, cls, seed=seed, time_limit_s=time_limit_s)
