"""Exercise checks: ``from flashlib.course import checks`` then ``checks.check_...(answer)``.

Each check runs the learner's answer on the exercise's deterministic cases (fixed
adversarial ones, then random ones seeded from the exercise id) under a time
limit, prints one verdict (with the likely mistake when it fails) and returns it.
The shared machinery is in :mod:`.framework`; one module per notebook topic.
:data:`CHECKS` maps every exercise id of :mod:`flashlib.course.registry` to its
check, for the grader.
"""
from .framework import EXERCISES, Check, run_check  # noqa: F401
from . import (across_devices, attention_basics, backward, decoding, forward, in_practice, masking, matmul,
               online_softmax, performance)
from .attention_basics import check_naive_attention, check_stable_softmax
from .matmul import check_matmul_kernel
from .online_softmax import check_merge_partials, check_online_update
from .forward import check_flash_forward_kernel
from .backward import check_ds, check_dkdv_kernel
from .masking import check_causal_block_range, check_padding_mask
from .performance import check_achieved_tflops, check_attention_flops, check_roofline_time_ms
from .in_practice import check_attend, check_gqa_attention
from .decoding import check_merge_splits, check_paged_gather_index
from .across_devices import check_ring_step_merge

#: Exercise id -> its Check, for every exercise of the registry.
CHECKS: dict[str, Check] = {check.exercise: check for check in (
    attention_basics.NAIVE_ATTENTION_CHECK, attention_basics.STABLE_SOFTMAX_CHECK,
    matmul.MATMUL_KERNEL_CHECK,
    online_softmax.ONLINE_UPDATE_CHECK, online_softmax.MERGE_PARTIALS_CHECK,
    forward.FORWARD_KERNEL_CHECK,
    backward.DS_CHECK, backward.DKDV_CHECK,
    masking.CAUSAL_BLOCK_RANGE_CHECK, masking.PADDING_MASK_CHECK,
    performance.ATTENTION_FLOPS_CHECK, performance.ACHIEVED_TFLOPS_CHECK, performance.ROOFLINE_TIME_CHECK,
    in_practice.ATTEND_CHECK, in_practice.GQA_ATTENTION_CHECK,
    decoding.MERGE_SPLITS_CHECK, decoding.PAGED_GATHER_INDEX_CHECK,
    across_devices.RING_STEP_MERGE_CHECK,
)}

__all__ = ["EXERCISES", "CHECKS", "run_check", "check_naive_attention", "check_stable_softmax",
           "check_matmul_kernel", "check_online_update", "check_merge_partials",
           "check_flash_forward_kernel"]
__all__ += ["check_ds", "check_dkdv_kernel"]
__all__ += ["check_causal_block_range", "check_padding_mask"]
__all__ += ["check_attention_flops", "check_achieved_tflops", "check_roofline_time_ms"]
__all__ += ["check_attend", "check_gqa_attention"]
__all__ += ["check_merge_splits", "check_paged_gather_index"]
__all__ += ["check_ring_step_merge"]
