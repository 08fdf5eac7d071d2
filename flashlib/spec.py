"""``AttentionSpec``: what each query sees and how its scores are formed, in one frozen value.

Everything the attention kernels need beyond the tensors they read and write:

* which keys a query may see: ``causal`` and ``window`` (the band of
  :func:`flashlib.reference.attention_mask`);
* how a score is formed from ``q . k``: ``softmax_scale``, then ``softcap``
  (``softcap * tanh(s / softcap)``, as Gemma 2 and Grok), then the ALiBi bias
  ``-slope * |i + N_k - N_q - j|`` (flash-attn's definition; the slopes are a
  tensor, passed beside the spec);
* ``dropout_p``, and a ``dropout_seed`` for callers of the launchers (the op
  draws its seed on the device and hands the launchers that tensor instead).

The front door (:mod:`flashlib.attention`, :mod:`flashlib.varlen`) checks the
arguments and builds one spec; the launchers of :mod:`flashlib.kernels` take it
instead of a dozen loose keywords, so a new score modifier is one more field
here, not one more keyword threaded through every function.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass


def softmax_scale_for(head_dim: int, softmax_scale: float | None = None) -> float:
    """The default scale 1/sqrt(d), or the one given."""
    return 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)


#: The longest sequence flashlib can describe: its lengths (``seq_lens``, ``cu_seqlens``, ``cache_seqlens``) are
#: int32, and so are the kernels' key positions.
MAX_SEQLEN = 2**31 - 1


def window_bounds(causal: bool, window, longest: int = MAX_SEQLEN) -> tuple[int | None, int | None]:
    """(left, right) reach of the mask; None where unbounded. ``causal`` caps the right at 0.

    A bound of ``longest`` or more is unbounded too (as -1 is, flash-attn's convention): in a call whose query
    and key lengths are at most ``longest``, a query at key position ``i'`` sees keys from ``i' - left`` to
    ``i' + right``, which then takes in every key. Launchers pass their call's longest length, so the kernels
    never add a bound past the sequence to a position: in their int32 arithmetic the sum would wrap round and
    hide every key.
    """
    left = right = None
    if window is not None:
        w_left, w_right = window
        left = None if w_left is None or w_left < 0 or w_left >= longest else int(w_left)
        right = None if w_right is None or w_right < 0 or w_right >= longest else int(w_right)
    if causal:
        right = 0 if right is None else min(right, 0)
    return left, right


def check_window(window) -> None:
    """A ValueError/TypeError naming ``window`` unless it is None or a pair of ints >= -1 (or None).

    Any int from -1 up is taken, however large: a bound past every sequence means unbounded (``window_bounds``)."""
    if window is None:
        return
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window must be a pair (left, right) of ints (-1 or None: unbounded); got {window!r}")
    for side, value in zip(("left", "right"), window):
        if value is None:
            continue
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise TypeError(f"window {side} bound must be an int (-1 or None: unbounded); got {value!r}")
        if value < -1:
            raise ValueError(f"window {side} bound must be >= 0, or -1 for unbounded; got window={tuple(window)}")


def _finite(value) -> bool:
    """math.isfinite, in a form torch.compile traces when the float is dynamic (a SymFloat: an argument that
    changed between calls, or dynamic=True), where math.isfinite breaks a fullgraph compile."""
    return value == value and value not in (math.inf, -math.inf)


def _check_float(name: str, value, *, low: float, high: float | None = None, closed_high: bool = False,
                 meaning: str) -> None:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a float ({meaning}); got {value!r}")
    if not _finite(value) or value < low or (high is not None and (value > high if closed_high
                                                                          else value >= high)):
        bound = "" if high is None else (f" and <= {high}" if closed_high else f" and < {high}")
        raise ValueError(f"{name} must be finite, >= {low}{bound} ({meaning}); got {value}")


@dataclass(frozen=True)
class AttentionSpec:
    """The mask and score modifiers of one attention call (``AttentionSpec.checked`` checks user input).

    ``window`` is stored as ``(left, right)`` with None for an unbounded side (-1, None, or a bound of
    :data:`MAX_SEQLEN` or more);
    ``softcap`` 0 and ``dropout_p`` 0 mean off. ``has_alibi`` says that an
    ``alibi_slopes`` tensor comes with the call.
    """

    causal: bool = False
    window: tuple[int | None, int | None] | None = None
    softmax_scale: float | None = None
    softcap: float = 0.0
    has_alibi: bool = False
    dropout_p: float = 0.0
    dropout_seed: int = 0

    def __post_init__(self):  # window as (left, right), None for an unbounded side
        if self.window is not None:
            object.__setattr__(self, "window", window_bounds(False, self.window))

    @classmethod
    def checked(cls, *, causal=False, window=None, softmax_scale=None, softcap=0.0, has_alibi=False,
                dropout_p=0.0) -> "AttentionSpec":
        """A spec from user arguments, each checked: a TypeError/ValueError names the one that is wrong.

        (The constructor itself only normalises ``window``: the kernels' own calls skip the checks,
        which cost microseconds of host time per call.)
        """
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool; got {causal!r}")
        check_window(window)
        if softmax_scale is not None:
            if not isinstance(softmax_scale, numbers.Real) or isinstance(softmax_scale, bool):
                raise TypeError(f"softmax_scale must be a float or None; got {softmax_scale!r}")
            if not _finite(softmax_scale):
                raise ValueError(f"softmax_scale must be finite; got {softmax_scale}")
        _check_float("softcap", softcap, low=0.0, meaning="0 for none, else scores become "
                     "softcap * tanh(scores / softcap)")
        _check_float("dropout_p", dropout_p, low=0.0, high=1.0, meaning="the probability of dropping "
                     "an attention weight")
        return cls(causal=causal, window=window, softmax_scale=softmax_scale, softcap=float(softcap),
                   has_alibi=has_alibi, dropout_p=float(dropout_p))

    def bounds(self, longest: int = MAX_SEQLEN) -> tuple[int | None, int | None]:
        """(left, right) reach of the band, None where unbounded (causal caps the right at 0), for a call whose
        query and key lengths are at most ``longest`` (see :func:`window_bounds`)."""
        return window_bounds(self.causal, self.window, longest)

    def scale(self, head_dim: int) -> float:
        """The softmax scale: the one given, else 1/sqrt(head_dim)."""
        return softmax_scale_for(head_dim, self.softmax_scale)
