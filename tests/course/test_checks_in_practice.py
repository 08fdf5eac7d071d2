"""The notebook 08 checks pass right answers and name the mistake in wrong ones.

The wrong answers are written the way a learner plausibly writes them (calling
flashlib, transposing, repeating heads), independently of the check's own list of
mistakes, and each is tried on two seeds.
"""
import io
import math

import pytest
import torch
import torch.nn.functional as F

from flashlib import flash_attention
from flashlib.course import checks
from flashlib.course.checks import framework, in_practice
from flashlib.model import CausalSelfAttention, flashlib_attend, sdpa_attend

SEEDS = (0, 1)


# --------------------------------------------------------------------------- attend
def attend_right(q, k, v):
    return flash_attention(q, k, v, causal=True, layout="bnhd")


def attend_transposed(q, k, v):  # also right: transposed views in and out
    o = flash_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
    return o.transpose(1, 2)


def attend_blank(q, k, v):
    raise NotImplementedError("Exercise: write your code here")


def attend_not_causal(q, k, v):
    return flash_attention(q, k, v, layout="bnhd")


def attend_default_layout(q, k, v):
    return flash_attention(q, k, v, causal=True)


def attend_reshape(q, k, v):
    b, n, h, d = q.shape
    o = flash_attention(q.reshape(b, h, n, d), k.reshape(b, k.shape[2], n, d), v.reshape(b, v.shape[2], n, d),
                        causal=True)
    return o.reshape(b, n, h, d)


def attend_forgot_transpose_back(q, k, v):
    return flash_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)


def attend_scale_d_model(q, k, v):
    return flash_attention(q, k, v, causal=True, layout="bnhd", softmax_scale=1 / math.sqrt(q.shape[2] * q.shape[3]))


def attend_scale_one(q, k, v):
    return flash_attention(q, k, v, causal=True, layout="bnhd", softmax_scale=1.0)


def attend_repeat(q, k, v):
    group = q.shape[2] // k.shape[2]
    return flash_attention(q, k.repeat(1, 1, group, 1), v.repeat(1, 1, group, 1), causal=True, layout="bnhd")


def attend_crash(q, k, v):
    return flash_attention(q, k[:, :, :, :8], v, causal=True, layout="bnhd")


def test_attend_passes_right_answers(capsys):
    result = checks.check_attend(attend_right)
    assert result.passed and result.points == result.max_points == 2
    assert result.exercise == "08_in_practice.attend"
    assert capsys.readouterr().out == "✓ attend: correct on 5 cases (2/2 points)\n"
    # other right answers, on other random cases: the same verdict, word for word
    assert checks.check_attend(attend_transposed).feedback == result.feedback
    assert checks.check_attend(flashlib_attend, seed=3).feedback == result.feedback


def test_attend_blank_is_not_attempted(capsys):
    result = checks.check_attend(attend_blank)
    assert not result.passed and result.points == 0
    assert "not attempted yet: replace `raise NotImplementedError`" in result.feedback
    assert capsys.readouterr().out.strip() == result.feedback


def test_attend_must_use_flashlib():
    result = checks.check_attend(sdpa_attend)
    assert not result.passed
    assert "right values, but not computed by flashlib" in result.feedback


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("wrong, words", [
    (attend_not_causal, "causal=True is missing"),
    (attend_default_layout, "the (B, N, H, D) tensors were passed as if they were (B, H, N, D)"),
    (attend_reshape, "reshape (or view) to (B, H, N, D) scrambles the tokens and heads"),
    (attend_forgot_transpose_back, "the output is still (B, H, N, D)"),
    (attend_scale_d_model, "the scale is wrong"),
    (attend_scale_one, "the scale is wrong"),
    (attend_repeat, "k/v heads shared in the wrong order"),
], ids=lambda x: getattr(x, "__name__", None))
def test_attend_names_the_mistake(wrong, words, seed):
    result = checks.check_attend(wrong, seed=seed)
    assert not result.passed and result.points == 0
    assert f"likely mistake: {words}" in result.feedback, result.feedback
    # the fixed first case, whatever the seed
    assert "case 1 of 5: q (1, 12, 6, 16), k and v (1, 12, 2, 16) = (B, N, H, D), float32, GQA: 3 query " \
        "heads per k/v head; q, k and v are non-contiguous views of one fused projection" in result.feedback


def test_attend_first_case_hands_non_contiguous_views_of_one_fused_tensor():
    seen = []

    def spy(q, k, v):
        seen.append((q.is_contiguous(), k.is_contiguous(), v.is_contiguous(), q.stride(),
                     q.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()))
        return attend_right(q, k, v)

    assert checks.check_attend(spy).passed
    assert seen[0] == (False, False, False, (12 * 10 * 16, 10 * 16, 16, 1), True)
    assert all(seen_here[:3] == (True, True, True) for seen_here in seen[1:])


def test_attend_that_needs_contiguous_inputs_fails_with_the_line():
    def views_as_bhnd(q, k, v):
        b, n, h, d = q.shape
        o = flash_attention(q.view(b, h, n, d), k.view(b, k.shape[2], n, d), v.view(b, v.shape[2], n, d),
                            causal=True)
        return o.view(b, n, h, d)

    result = checks.check_attend(views_as_bhnd)
    assert not result.passed and "case 1 of 5" in result.feedback
    assert "your code raised RuntimeError" in result.feedback and "q.view(b, h, n, d)" in result.feedback


def _judged_from_saved_replies(check, answer):
    """What the grader decides: replies detached, saved and loaded with weights_only (no autograd graph),
    judged by the check that checks.CHECKS holds for the exercise."""
    assert checks.CHECKS[check.exercise] is check
    cases = framework.make_cases(check)
    replies = framework.run_learner(check, answer, cases)
    buffer = io.BytesIO()
    torch.save([(r.status, r.out.detach() if isinstance(r.out, torch.Tensor) else r.out, r.args, r.context)
                for r in replies], buffer)
    buffer.seek(0)
    loaded = [framework.Reply(status, out=out, args=args, context=context)
              for status, out, args, context in torch.load(buffer, weights_only=True)]
    return framework.judge(check, cases, loaded)


@pytest.mark.parametrize("answer, passes", [(attend_right, True), (attend_repeat, False),
                                            (attend_not_causal, False), (attend_default_layout, False)],
                         ids=lambda x: getattr(x, "__name__", None))
def test_attend_verdict_from_saved_replies(answer, passes):
    # The grader judges the values and the copies the call noted; that the answer calls flashlib it checks
    # from the source before running it (only the notebook's check looks at the autograd graph for it).
    passed, headline, details = _judged_from_saved_replies(in_practice.ATTEND_CHECK, answer)
    assert passed == passes, (headline, details)
    if not passes:
        assert details[0].startswith("case 1 of 5") and any(line.startswith("likely mistake") for line in details)


def test_the_grader_judge_does_not_look_for_flashlib_but_for_copies():
    """SDPA's attention in the model (right values, no flashlib node) fails the grader's judge on the copies its
    GQA path makes (repeat_interleave); without them it would pass, since flashlib's use is judged from the source."""
    passed, headline, _ = _judged_from_saved_replies(in_practice.ATTEND_CHECK, sdpa_attend)
    assert not passed and headline.startswith("right values, but your code copies"), headline



def attend_contiguous(q, k, v):   # right values, but a copy of each input
    o = flash_attention(*(t.transpose(1, 2).contiguous() for t in (q, k, v)), causal=True)
    return o.transpose(1, 2)


def attend_clone_q(q, k, v):
    return flash_attention(q.clone(), k, v, causal=True, layout="bnhd")


def attend_repeat_interleave(q, k, v):   # right values: GQA spelled out with copies of k and v
    group = q.shape[2] // k.shape[2]
    return flash_attention(q, k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2), causal=True,
                           layout="bnhd")


def attend_output_copied(q, k, v):
    o = flash_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
    return o.transpose(1, 2).contiguous()


@pytest.mark.parametrize("answer, copy", [(attend_contiguous, "CloneBackward0"), (attend_clone_q, "CloneBackward0"),
                                          (attend_repeat_interleave, "CloneBackward0"),
                                          (attend_output_copied, "CloneBackward0")],
                         ids=lambda x: getattr(x, "__name__", x))
def test_attend_that_copies_the_tensors_fails_in_the_notebook_and_the_grader(answer, copy):
    """The exercise asks for attention "without copying the tensors": flashlib reads the model's layout
    through strides and shares GQA heads itself. An answer that copies gets the values right, and fails."""
    result = checks.check_attend(answer)
    assert not result.passed and "right values, but your code copies the tensors" in result.feedback
    assert copy in result.feedback, result.feedback
    passed, headline, _ = _judged_from_saved_replies(in_practice.ATTEND_CHECK, answer)
    assert not passed and headline.startswith("right values, but your code copies") and copy in headline


def attend_copy_then_detach(q, k, v):   # hides the copy from the graph, and the gradient with it
    return flash_attention(q.contiguous(), k, v, causal=True, layout="bnhd").detach()


def attend_detached_k(q, k, v):
    return flash_attention(q, k.detach(), v, causal=True, layout="bnhd")


@pytest.mark.parametrize("answer", [attend_copy_then_detach, attend_detached_k])
def test_attend_whose_gradient_does_not_reach_the_inputs_fails_in_the_grader(answer):
    passed, headline, _ = _judged_from_saved_replies(in_practice.ATTEND_CHECK, answer)
    assert not passed and headline.startswith("right values, but no gradient flows"), headline
    assert not checks.check_attend(answer).passed


@pytest.mark.parametrize("answer", [attend_right, attend_transposed])
def test_attend_without_copies_passes_in_the_notebook_and_the_grader(answer):
    assert checks.check_attend(answer).passed
    assert _judged_from_saved_replies(in_practice.ATTEND_CHECK, answer)[0]


@pytest.mark.parametrize("noted", [None, "none", ["CloneBackward0", 3]])
def test_attend_copies_that_do_not_come_back_as_a_list_of_names_fail(noted):
    cases = framework.make_cases(in_practice.ATTEND_CHECK)
    replies = framework.run_learner(in_practice.ATTEND_CHECK, attend_right, cases)
    for reply in replies:
        assert reply.context["gradient reaches q, k, v"] is True
        if noted is None:
            reply.context.pop("copies")
        else:
            reply.context["copies"] = noted
    passed, headline, _ = framework.judge(in_practice.ATTEND_CHECK, cases, replies)
    assert not passed and "did not come back" in headline


def test_attend_crash_is_reported_with_the_line():
    result = checks.check_attend(attend_crash, seed=0)
    assert not result.passed
    assert "your code raised ValueError" in result.feedback
    assert "in attend_crash, line" in result.feedback and "k[:, :, :, :8]" in result.feedback


# ---------------------------------------------------------------------- GQA module
class Right(CausalSelfAttention):
    def forward(self, x):
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(b, n, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, n, self.n_kv_heads, self.head_dim)
        o = flash_attention(q, k, v, causal=True, layout="bnhd")
        return self.out_proj(o.reshape(b, n, -1))


class Blank(CausalSelfAttention):
    def forward(self, x):
        raise NotImplementedError("Exercise: write your code here")


def _module(forward):
    return type(forward.__name__, (CausalSelfAttention,), {"forward": forward})


def _qkv(self, x):
    b, n, _ = x.shape
    return (self.q_proj(x).view(b, n, self.n_heads, self.head_dim),
            self.k_proj(x).view(b, n, self.n_kv_heads, self.head_dim),
            self.v_proj(x).view(b, n, self.n_kv_heads, self.head_dim))


@_module
def RepeatKV(self, x):
    q, k, v = _qkv(self, x)
    group = self.n_heads // self.n_kv_heads
    k, v = k.repeat(1, 1, group, 1), v.repeat(1, 1, group, 1)   # head h gets k/v head h % H_kv
    return self.out_proj(flash_attention(q, k, v, causal=True, layout="bnhd").flatten(2))


@_module
def RepeatInterleaveKV(self, x):  # right, only wasteful
    q, k, v = _qkv(self, x)
    group = self.n_heads // self.n_kv_heads
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    return self.out_proj(flash_attention(q, k, v, causal=True, layout="bnhd").flatten(2))


@_module
def NotCausal(self, x):
    q, k, v = _qkv(self, x)
    return self.out_proj(flash_attention(q, k, v, layout="bnhd").flatten(2))


@_module
def DefaultLayout(self, x):
    q, k, v = _qkv(self, x)
    return self.out_proj(flash_attention(q, k, v, causal=True).flatten(2))


@_module
def ViewAsBHND(self, x):
    b, n, _ = x.shape
    q = self.q_proj(x).view(b, self.n_heads, n, self.head_dim)
    k = self.k_proj(x).view(b, self.n_kv_heads, n, self.head_dim)
    v = self.v_proj(x).view(b, self.n_kv_heads, n, self.head_dim)
    o = flash_attention(q, k, v, causal=True)
    return self.out_proj(o.reshape(b, n, -1))


@_module
def OutputNotTransposedBack(self, x):
    q, k, v = (t.transpose(1, 2) for t in _qkv(self, x))
    o = flash_attention(q, k, v, causal=True)          # (B, H, N, D)
    return self.out_proj(o.reshape(x.shape[0], x.shape[1], -1))


@_module
def ScaleDModel(self, x):
    q, k, v = _qkv(self, x)
    o = flash_attention(q, k, v, causal=True, layout="bnhd", softmax_scale=x.shape[-1] ** -0.5)
    return self.out_proj(o.flatten(2))


@_module
def NoOutProj(self, x):
    q, k, v = _qkv(self, x)
    return flash_attention(q, k, v, causal=True, layout="bnhd").flatten(2)


@_module
def HeadsMixedUp(self, x):
    b, n, _ = x.shape
    q = self.q_proj(x).view(b, n, self.n_heads, self.head_dim)
    k = self.k_proj(x).view(b, n, self.n_heads, -1)     # H where H_kv belongs
    v = self.v_proj(x).view(b, n, self.n_heads, -1)
    return self.out_proj(flash_attention(q, k, v, causal=True, layout="bnhd").flatten(2))


@_module
def WithSDPA(self, x):
    q, k, v = (t.transpose(1, 2) for t in _qkv(self, x))
    group = self.n_heads // self.n_kv_heads
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.out_proj(o.transpose(1, 2).flatten(2))


def test_gqa_attention_passes_right_answers(capsys):
    result = checks.check_gqa_attention(Right)
    assert result.passed and result.points == result.max_points == 2
    assert result.exercise == "08_in_practice.gqa_attention"
    assert capsys.readouterr().out == "✓ gqa_attention: correct on 5 cases (2/2 points)\n"
    assert checks.check_gqa_attention(CausalSelfAttention).passed   # the library's own, attention="flashlib"
    assert checks.check_gqa_attention(RepeatInterleaveKV).passed


def test_gqa_attention_blank_is_not_attempted():
    result = checks.check_gqa_attention(Blank)
    assert not result.passed and "not attempted yet" in result.feedback


def test_gqa_attention_must_use_flashlib():
    result = checks.check_gqa_attention(WithSDPA)
    assert not result.passed and "right values, but not computed by flashlib" in result.feedback


@pytest.mark.parametrize("wrong", [Right(32, 2), "GQAttention", lambda x: x, torch.nn.Linear])
def test_gqa_attention_wants_a_subclass(wrong):
    result = checks.check_gqa_attention(wrong)
    assert not result.passed
    assert "expected a" in result.feedback and "CausalSelfAttention" in result.feedback


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("wrong, words", [
    (RepeatKV, "k/v heads shared in the wrong order"),
    (NotCausal, "causal=True is missing"),
    (DefaultLayout, "the (B, N, H, D) tensors were passed as if they were (B, H, N, D)"),
    (ViewAsBHND, "reshape (or view) to (B, H, N, D) scrambles the tokens and heads"),
    (OutputNotTransposedBack, "the attention output was reshaped to (B, N, H * D) while still (B, H, N, D)"),
    (ScaleDModel, "the scale is wrong"),
    (NoOutProj, "the output projection is missing"),
], ids=lambda x: getattr(x, "__name__", None))
def test_gqa_attention_names_the_mistake(wrong, words, seed):
    result = checks.check_gqa_attention(wrong, seed=seed)
    assert not result.passed and result.points == 0
    assert f"likely mistake: {words}" in result.feedback, result.feedback
    assert "case 1 of 5: GQAttention(d_model=96, n_heads=6, n_kv_heads=2)" in result.feedback  # fixed, any seed


@pytest.mark.parametrize("answer, passes", [(Right, True), (RepeatKV, False), (NotCausal, False),
                                            (DefaultLayout, False), (WithSDPA, True)],
                         ids=lambda x: getattr(x, "__name__", None))
def test_gqa_attention_verdict_by_values_alone(answer, passes):
    passed, headline, details = _judged_from_saved_replies(in_practice.GQA_ATTENTION_CHECK, answer)
    assert passed == passes, (headline, details)
    if not passes:
        assert details[0].startswith("case 1 of 5: GQAttention(d_model=96, n_heads=6, n_kv_heads=2)")


def test_gqa_attention_module_call_leaves_the_case_inputs_alone():
    cases = framework.make_cases(in_practice.GQA_ATTENTION_CHECK)[:1]
    replies = framework.run_learner(in_practice.GQA_ATTENTION_CHECK, Right, cases)
    assert replies[0].status == "ok" and not framework.changed_inputs(cases[0].args, replies[0].args)
    x, sizes, weights = replies[0].args
    assert sizes == (96, 6, 2) and all(torch.equal(weights[k], cases[0].args[2][k]) for k in weights)


def test_gqa_attention_heads_mixed_up_is_a_readable_error():
    result = checks.check_gqa_attention(HeadsMixedUp, seed=0)
    assert not result.passed
    assert "case 1 of 5" in result.feedback and "n_kv_heads=2" in result.feedback
    assert "your code raised" in result.feedback
    assert "in HeadsMixedUp, line" in result.feedback
