"""The course's exercises and their points, as data: read by the checks, the grader and the generator.

This module imports nothing but the standard library (no torch), so that the
grader can know what a notebook should contain, and what each exercise is worth,
before anything heavy or anything a learner wrote is loaded.

Each :class:`Exercise` also says what the learner's answer is (``answer``: the
name the notebook defines around the answer region, ``kind``: a Python function,
a ``@triton.jit`` kernel or a class) and what the answer may not use
(``forbidden``): the names of finished implementations that would do the
exercise for the learner. ``uses_flashlib`` names the flashlib objects that the
exercise is *about* using (notebook 08 swaps flashlib into a model); every other
name a given cell binds to flashlib is refused inside an answer. The rules are
applied by :mod:`flashlib.course.policy`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math

FUNCTION, KERNEL, CLASS = "function", "kernel", "class"

#: Names no answer may use: ways out of the answer region (imports are refused separately).
ALWAYS_FORBIDDEN = (
    "eval", "exec", "compile", "open", "getattr", "setattr", "delattr", "globals", "locals",
    "vars", "breakpoint", "super", "type", "os", "sys", "subprocess", "importlib", "builtins",
    "inspect", "ctypes", "signal", "shutil", "pathlib", "pickle", "socket", "threading",
    "multiprocessing", "flashlib", "solutions", "exercises", "checks", "np", "numpy",
    "scaled_dot_product_attention", "flash_attn_func", "sdpa",
)

#: Attributes no answer may use: attention done by someone else.
ALWAYS_FORBIDDEN_ATTRIBUTES = ("scaled_dot_product_attention", "flash_attn_func",
                               "multi_head_attention_forward")

#: Attributes that lead out of the answer as the names of ALWAYS_FORBIDDEN do, through a module that
#: imported them: ``torch.sys.modules`` holds every loaded module (flashlib's finished code among them),
#: ``torch.serialization.os`` the machine. Refused as attributes wherever they appear in a chain. So are a
#: running frame's (``(i for i in []).gi_frame.f_builtins["__import__"]``: the notebook's globals and builtins,
#: looked up by string, from any generator the answer makes).
ESCAPE_ATTRIBUTES = ("sys", "os", "builtins", "importlib", "import_module", "subprocess", "ctypes", "inspect",
                     "pickle", "shutil", "pathlib", "socket", "signal", "threading", "multiprocessing",
                     "flashlib", "solutions", "exercises", "checks", "np", "numpy",
                     "gi_frame", "cr_frame", "ag_frame", "tb_frame", "f_back", "f_globals", "f_locals", "f_builtins")

#: Functions that find an object, or run code, from a string or a native library: what an answer reaches must be
#: spelled out in its source, where the rules above can read it. ``operator.attrgetter("sys.modules")(torch)``
#: walks a dotted string, ``pkgutil.resolve_name``, ``importlib.import_module`` and ``torch.package``'s
#: ``PackageImporter`` import one, ``pydoc.locate`` and ``runpy.run_module`` both, ``builtins.exec`` runs one,
#: ``gc.get_referrers`` and ``gc.get_objects`` hand back any live object (flashlib's functions among them),
#: ``torch.utils.cpp_extension.load_inline`` and ``torch.ops.load_library`` load native code, ``tl.str_to_ty``
#: evaluates part of its string, ``torch.fx``'s ``call_method`` looks a method up by name, and
#: ``torch.overrides.get_overridable_functions`` hands back every torch function (SDPA too). Refused as names
#: and as attributes, wherever they appear (``eval`` only as a name, in ALWAYS_FORBIDDEN: ``model.eval()`` is a
#: module's evaluation mode, and the builtin reached under any name is refused by identity in the policy).
STRING_ACCESS = ("attrgetter", "methodcaller", "exec", "setattr", "str_to_ty", "call_method", "call_function",
                 "call_module", "get_overridable_functions", "get_testing_overrides", "get_ignored_functions",
                 "getattr", "delattr", "globals", "locals", "vars", "import_module", "load_inline", "load_library",
                 "PackageImporter", "resolve_name", "get_referrers", "get_referents", "get_objects", "locate",
                 "run_module", "run_path")

#: The modules an answer may reach through an attribute chain (``torch.nn.functional``, ``tl.math``): these
#: families and their public submodules, as the notebook imported them (``copy`` is notebook 08's). Any other
#: module reached from them (``torch.functional.operator``, ``tl.core.typing``) is refused; see
#: :mod:`flashlib.course.policy`.
ANSWER_MODULES = ("torch", "triton", "math", "copy")

#: Public parts of ANSWER_MODULES that lead out of the answer all the same: they load code or files
#: (``torch.load`` unpickles; ``torch.hub``, ``torch.package``, ``torch.jit``, ``torch.export`` and
#: ``torch.compiler`` load saved programs; ``torch.utils.cpp_extension``, ``torch.ops.load_library`` and Triton's
#: compiler, builder and driver build and load native code; ``torch.utils.benchmark`` runs statements given as
#: strings), start processes (``torch.utils.collect_env`` runs shell commands) or hold the machine's settings.
#: Refused as modules, and for the functions, classes and objects they define (``torch.load``).
ESCAPE_MODULES = ("torch.hub", "torch.package", "torch.serialization", "torch.jit", "torch.export", "torch.compiler",
                  "torch.fx", "torch.overrides", "torch.library", "torch.utils", "torch.nn.attention", "torch.onnx",
                  "torch.masked", "torch.testing", "torch.profiler", "torch.multiprocessing", "torch.distributed",
                  "torch.ops", "torch.classes", "triton.runtime.build", "triton.runtime.cache", "triton.runtime.driver",
                  "triton.backends", "triton.compiler", "triton.tools", "triton.testing", "triton.knobs")

#: Attention written by hand: refused where the exercise is to *call* flashlib's attention.
HAND_ATTENTION = ("matmul", "bmm", "einsum", "softmax", "log_softmax", "softmin", "exp", "mm", "baddbmm",
                  "naive_attention", "multi_head_attention_forward", "MultiheadAttention")


@dataclasses.dataclass(frozen=True)
class Exercise:
    """One exercise: its notebook, name, points and the rules for the learner's answer."""

    notebook: str
    name: str
    points: float
    title: str
    answer: str
    kind: str = FUNCTION
    forbidden: tuple[str, ...] = ()
    uses_flashlib: tuple[str, ...] = ()
    required_calls: tuple[str, ...] = ()
    no_matmul_operator: bool = False

    @property
    def key(self) -> str:
        """The exercise id used everywhere: 'notebook.name'."""
        return f"{self.notebook}.{self.name}"


#: softmin(x) is softmax(-x), and ``torch.distributions.Categorical(logits=x).probs`` is softmax(x);
#: ``Softmax2d`` is softmax over channels, ``gumbel_softmax`` a softmax of shifted scores (at a huge
#: temperature, the plain one), and the last of ``logcumsumexp`` is ``logsumexp``; ``cross_entropy`` is
#: -log_softmax at the target (exp(-cross_entropy) of every target is the softmax), and attention itself
#: (``MultiheadAttention`` and the transformer layers built on it; SDPA is refused everywhere) is a softmax with
#: V = I. Forbidden names also refuse their class, whatever its case and underscores (``Softmax``,
#: ``LogSoftmax``, ``Softmin``): see :func:`flashlib.course.policy.same_name`.
_ATTENTION_BY_HAND = ("softmax", "log_softmax", "softmin", "softmax2d", "gumbel_softmax", "logsumexp", "logcumsumexp",
                      "distributions", "cross_entropy", "CrossEntropyLoss", "multi_head_attention_forward",
                      "MultiheadAttention", "Transformer", "TransformerEncoder", "TransformerDecoder",
                      "TransformerEncoderLayer", "TransformerDecoderLayer")

EXERCISES: tuple[Exercise, ...] = (
    Exercise("01_naive_attention", "naive_attention", 2,
             "Naive attention: softmax(Q K^T / sqrt(d)) V for (B, H, N, D) tensors", "naive_attention",
             forbidden=("multi_head_attention_forward", "MultiheadAttention")),
    Exercise("01_naive_attention", "stable_softmax", 2,
             "Stable softmax over the last dim: subtract the row max before exp", "stable_softmax",
             forbidden=_ATTENTION_BY_HAND),
    Exercise("02_triton_tiled_matmul", "matmul_kernel", 3,
             "The k-loop of a tiled matmul kernel: masked loads, tl.dot into acc, advance",
             "matmul_kernel", kind=KERNEL, forbidden=("torch", "triton_matmul")),
    Exercise("03_online_softmax", "online_update", 2,
             "The (m, l, acc) update for one key block: running max, rescale, -inf safe",
             "online_update", forbidden=_ATTENTION_BY_HAND),
    Exercise("03_online_softmax", "merge_partials", 2,
             "Merge two partial softmaxes (m, l, o) over disjoint keys, exactly", "merge_partials",
             forbidden=_ATTENTION_BY_HAND),
    Exercise("04_flash_forward", "inner_loop", 4,
             "The inner loop of the FlashAttention forward kernel, then O = acc / l and L = m + log l",
             "flash_forward_kernel", kind=KERNEL, forbidden=("torch", *_ATTENTION_BY_HAND)),
    Exercise("05_flash_backward", "ds", 2,
             "dS = P * (dP - D) from P, dP and D = rowsum(dO * O)", "ds"),
    Exercise("05_flash_backward", "dkdv_loop", 4,
             "The loop of the dK/dV kernel: recompute P from L, dV += P^T dO, dK += scale * dS^T Q", "flash_dkdv_kernel",
             kind=KERNEL, forbidden=("torch", "grad", "backward", *_ATTENTION_BY_HAND)),
    Exercise("06_masking", "causal_block_range", 2,
             "The key blocks a causal query block visits: bottom-right aligned, nothing skipped that is needed, nothing visited that is not", "causal_block_range"),
    Exercise("06_masking", "padding_mask", 2,
             "The padding mask of a batch with seq_lens: keys and queries past each sample's length", "padding_mask",
             forbidden=("padding_mask_reference",)),
    Exercise("07_performance", "attention_flops", 2,
             "FLOPs of attention: 4·B·H·N²·D forward, halved when causal, bwd 2.5x, train 3.5x", "attention_flops"),
    Exercise("07_performance", "achieved_tflops", 1,
             "TFLOP/s achieved: FLOPs over milliseconds, in units of 10^12 per second", "achieved_tflops"),
    Exercise("07_performance", "roofline_time_ms", 2,
             "The roofline: the least time set by the slower of arithmetic and memory traffic", "roofline_time_ms"),
    Exercise("08_in_practice", "attend", 2,
             "Swap flashlib into the block: causal attention on (B, N, H, D) tensors, no copy",
             "attend", forbidden=HAND_ATTENTION, uses_flashlib=("flash_attention",),
             required_calls=("flash_attention",), no_matmul_operator=True),
    Exercise("08_in_practice", "gqa_attention", 2,
             "The attention module's forward with GQA: H query heads, H_kv shared k/v heads",
             "GQAttention", kind=CLASS, forbidden=HAND_ATTENTION + ("forward_reference", "set_attention", "attend"),
             uses_flashlib=("flash_attention",), required_calls=("flash_attention",),
             no_matmul_operator=True),
    Exercise("09_decoding", "merge_splits", 2,
             "Merge the partials (O_s, L_s) of S key chunks into O and L: weights exp(L_s - max), -inf safe",
             "merge_splits", forbidden=_ATTENTION_BY_HAND),
    Exercise("09_decoding", "paged_gather_index", 2,
             "Where a cached token sits in a paged KV cache: its page through the block table, its row in the page",
             "paged_gather_index", forbidden=("cached_keys",)),
    Exercise("10_across_devices", "ring_step_merge", 2,
             "Fold an incoming block's partial (O_blk, L_blk) into the running (O, L) at one ring step, -inf safe",
             "ring_step_merge", forbidden=("merge_partial", "merge_partials", "merge_splits", "ring_attention",
                                           "ring_attention_of_full", "RingAttentionFunction")),
)

BY_KEY: dict[str, Exercise] = {exercise.key: exercise for exercise in EXERCISES}


def notebooks() -> list[str]:
    """The notebook keys that hold exercises, in course order."""
    return list(dict.fromkeys(exercise.notebook for exercise in EXERCISES))


def exercises_of(notebook: str) -> list[Exercise]:
    """The exercises of one notebook, in notebook order (empty for an unknown key)."""
    return [exercise for exercise in EXERCISES if exercise.notebook == notebook]


def exercise(key: str) -> Exercise:
    """The exercise with id 'notebook.name'; KeyError naming the known ids otherwise."""
    try:
        return BY_KEY[key]
    except KeyError:
        raise KeyError(f"exercise {key!r} is not in the registry; known: {sorted(BY_KEY)}") from None


def max_points(notebook: str) -> float:
    """What a notebook is worth: the sum of its exercises' points."""
    return float(sum(exercise.points for exercise in exercises_of(notebook)))


def clamp_points(points, maximum: float) -> float:
    """``points`` as a float in [0, maximum]; NaN, inf and non-numbers count 0."""
    try:
        value = float(points)
    except (TypeError, ValueError):
        return 0.0
    if not math.isfinite(value):
        return 0.0
    return min(max(value, 0.0), float(maximum))


def seed_of(key: str) -> int:
    """The seed of an exercise's random cases: the same in the notebook and in the grader."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:7], "big")
