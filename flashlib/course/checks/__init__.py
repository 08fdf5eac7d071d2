"""Exercise checks: ``from flashlib.course import checks`` then ``checks.check_...(answer)``.

Each check runs the learner's answer on fresh random cases under a time limit,
prints one verdict (with the likely mistake when it fails), records an
:class:`~flashlib.course.results.ExerciseResult` for the grader and returns it.
The shared machinery is in :mod:`.framework`; one module per notebook topic.
Modules are imported in notebook order, so :data:`EXERCISES` lists them in order.
"""
from .framework import EXERCISES, run_check  # noqa: F401
from .attention_basics import check_naive_attention, check_stable_softmax
from .matmul import check_matmul_kernel
from .online_softmax import check_merge_partials, check_online_update
from .forward import check_flash_forward_kernel
from .backward import check_ds, check_dkdv_kernel
from .masking import check_causal_block_range, check_padding_mask
from .performance import check_achieved_tflops, check_attention_flops, check_roofline_time_ms
from .in_practice import check_attend, check_gqa_attention

__all__ = ["EXERCISES", "run_check", "check_naive_attention", "check_stable_softmax",
           "check_matmul_kernel", "check_online_update", "check_merge_partials",
           "check_flash_forward_kernel"]
__all__ += ["check_ds", "check_dkdv_kernel"]
__all__ += ["check_causal_block_range", "check_padding_mask"]
__all__ += ["check_attention_flops", "check_achieved_tflops", "check_roofline_time_ms"]
__all__ += ["check_attend", "check_gqa_attention"]
