"""The policy's rules on what an answer may reach: modules followed along attribute chains, functions that look
code up by a string, forbidden names in another spelling; and the course's own answers still accepted.

Each answer here goes into the course's own exercise cell (``exercises/``), in place of its first placeholder, and
is checked with the given cells of that notebook, as the grader checks it (statically: nothing here runs).
"""
import ast
import builtins
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import nbformat
import pytest

from flashlib.course import answers, policy, reach, registry

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = REPO / "solutions"
EXERCISES = REPO / "exercises"


def answer_cell(key: str, answer: str, code: str):
    """(exercise, cell source, regions, given sources) with ``code`` as the first region of ``answer``'s cell."""
    canonical = nbformat.read(EXERCISES / f"{key}.ipynb", as_version=4)
    submission = answers.take_answers(canonical, canonical, key)
    exercise = next(e for e in registry.exercises_of(key) if e.answer == answer)
    [cell] = submission.answer_cells(exercise.key)
    lines = cell.source.split("\n")
    first, last = cell.regions[0]
    indent = lines[first - 1][: len(lines[first - 1]) - len(lines[first - 1].lstrip())]
    body = [indent + line if line.strip() else "" for line in textwrap.dedent(code).strip("\n").split("\n")]
    source = "\n".join(lines[: first - 1] + body + lines[last:])
    given = [c.source for c in submission.cells if c.kind != answers.ANSWER]
    return exercise, source, [(first, first + len(body) - 1)], given


def notebook_names(key: str) -> set[str]:
    """The globals the course's cells of notebook ``key`` bind, as the grader reads them."""
    canonical = nbformat.read(EXERCISES / f"{key}.ipynb", as_version=4)
    return answers.names_an_answer_may_read(answers.canonical_cells(canonical, key))


def refusals(key: str, answer: str, code: str, pass_given: bool = True) -> str:
    """The refusals of ``code`` as the grader words them, joined by ' | ' ('' when accepted)."""
    exercise, source, regions, given = answer_cell(key, answer, code)
    extra = {"given_sources": given, "notebook_names": notebook_names(key)} if pass_given else {}
    found = policy.check_answer(exercise, source, regions, policy.flashlib_names(given), **extra)
    return " | ".join(str(refusal) for refusal in found)


# ------------------------------------------------------------------ the red team's bypasses

RED_TEAM = [
    # string-based lookup through the operator module, reached as an attribute of torch.functional
    ("01_naive_attention", "naive_attention",
     'return torch.functional.operator.attrgetter("sys.modules")(torch)["flashlib.reference"].naive_attention(q, k, v)',
     ["`torch.functional.operator` is the module `operator`", "`.attrgetter` is not allowed",
      "`torch` is a module"]),
    # the typing module as an attribute of Triton's core, inside a kernel
    ("04_flash_forward", "flash_forward_kernel",
     'tl.core.typing.operator.attrgetter("sys.modules")(tl.core.typing)["builtins"].exec("0")',
     ["`tl.core.typing` is the module `typing`", "`.attrgetter` is not allowed", "`.exec` is not allowed"]),
    # the class of a forbidden function
    ("01_naive_attention", "stable_softmax", "return torch.nn.Softmax(dim=-1)(x)",
     ["`.Softmax` is not allowed in this answer (it is `softmax` by another spelling)"]),
    ("01_naive_attention", "stable_softmax", "return torch.nn.LogSoftmax(dim=-1)(x).exp()",
     ["`.LogSoftmax` is not allowed in this answer (it is `log_softmax` by another spelling)"]),
    ("03_online_softmax", "merge_partials", "s = torch.nn.Softmin(dim=-1)\nreturn m_a, l_a, o_a",
     ["`.Softmin` is not allowed in this answer (it is `softmin` by another spelling)"]),
    # a class that holds a forbidden name: its log_prob subtracts the max for the learner (session 72's audit)
    ("01_naive_attention", "stable_softmax",
     "a = torch.nn.AdaptiveLogSoftmaxWithLoss(x.shape[-1], x.shape[-1] + 1, [x.shape[-1]])\n"
     "return a.log_prob(x.reshape(-1, x.shape[-1]))[:, :x.shape[-1]].exp().reshape(x.shape)",
     ["`.AdaptiveLogSoftmaxWithLoss` is not allowed in this answer (it holds `softmax`"]),
    ("09_decoding", "merge_splits", "n = torch.nn\nreturn n.AdaptiveLogSoftmaxWithLoss",
     ["`.AdaptiveLogSoftmaxWithLoss` is not allowed in this answer (it holds `softmax`"]),
    ("01_naive_attention", "stable_softmax", "return torch.nn.functional.softmin(-x, dim=-1)",
     ["`.softmin` is not allowed in this answer"]),
    ("01_naive_attention", "stable_softmax", "return torch.distributions.Categorical(logits=x).probs",
     ["`.distributions` is not allowed in this answer"]),
    # escape attributes on anything
    ("01_naive_attention", "stable_softmax", "x.exec('0')\nreturn x", ["`.exec` is not allowed"]),
    ("01_naive_attention", "stable_softmax", "x.setattr(x, 'y', 0)\nreturn x", ["`.setattr` is not allowed"]),
    ("01_naive_attention", "stable_softmax", "return x.np.exp(x)", ["`.np` is not allowed"]),
    # not the red team's: a generator's frame holds the notebook's globals and builtins, looked up by string
    ("01_naive_attention", "naive_attention",
     "g = (i for i in [])\nreturn g.gi_frame.f_builtins['__import__']('flashlib.reference').naive_attention(q, k, v)",
     ["`.gi_frame` is not allowed", "`.f_builtins` is not allowed"]),
    # round two: torch.fx looks methods up by name, tl.str_to_ty evaluates part of its string
    ("01_naive_attention", "stable_softmax",
     "g = torch.fx.Graph()\nt = g.placeholder('x')\nf = g.call_method('__getattribute__', (t, 'backward'))\n"
     "return torch.fx.GraphModule(torch.nn.Module(), g)(x)",
     ["`torch.fx` is the module `torch.fx`, which leads out", "`.call_method` is not allowed"]),
    ("05_flash_backward", "ds", "tl.str_to_ty(\"tensordesc<fp32[16],__import__('sys')>\", None)\nreturn p",
     ["`.str_to_ty` is not allowed"]),
    ("04_flash_forward", "flash_forward_kernel", "y = tl.str_to_ty('fp32', None)", ["`.str_to_ty` is not allowed"]),
    # ... every torch function, SDPA among them, by the string of its name
    ("01_naive_attention", "naive_attention",
     "f = [f for fs in torch.overrides.get_overridable_functions().values() for f in fs "
     "if 'scaled_dot_product' in str(f)][0]\nreturn f(q, k, v)",
     ["`torch.overrides` is the module `torch.overrides`", "`.get_overridable_functions` is not allowed"]),
    # softmax under other names, in Python and in kernels
    ("01_naive_attention", "stable_softmax",
     "return torch.nn.Softmax2d()(x.reshape(-1, x.shape[-1], 1, 1)).reshape(x.shape)",
     ["`.Softmax2d` is not allowed in this answer (it is `softmax2d` by another spelling)"]),
    ("01_naive_attention", "stable_softmax", "return F.gumbel_softmax(x * 1e6, tau=1e6)",
     ["`.gumbel_softmax` is not allowed"]),
    # a learner audit's answer: exp(-cross_entropy) of every target is the softmax (it passed, 2/2)
    ("01_naive_attention", "stable_softmax",
     "return torch.exp(-torch.nn.functional.cross_entropy(\n"
     "    x.unsqueeze(-1).expand(*x.shape, x.shape[-1]).transpose(-1, -2).reshape(-1, x.shape[-1]),\n"
     "    torch.arange(x.shape[-1]).repeat(x.numel() // x.shape[-1]), reduction='none')).view_as(x)",
     ["`.cross_entropy` is not allowed"]),
    ("01_naive_attention", "stable_softmax", "return torch.nn.CrossEntropyLoss(reduction='none')(x, x)",
     ["`.CrossEntropyLoss` is not allowed"]),
    ("01_naive_attention", "stable_softmax",
     "return F.scaled_dot_product_attention(x[None], torch.eye(x.shape[-1])[None], torch.eye(x.shape[-1])[None], "
     "scale=1.0)[0]", ["`.scaled_dot_product_attention` is not allowed"]),
    ("01_naive_attention", "stable_softmax", "return torch.exp(x - x.logcumsumexp(-1)[..., -1:])",
     ["`.logcumsumexp` is not allowed"]),
    ("04_flash_forward", "flash_forward_kernel", "p = tl.softmax(qk)", ["`.softmax` is not allowed"]),
    ("05_flash_backward", "flash_dkdv_kernel", "p = tl.softmax(qk)", ["`.softmax` is not allowed"]),
    # someone else's attention: flex_attention, and notebook 08's model switched back to sdpa through self
    ("01_naive_attention", "naive_attention", "return torch.nn.attention.flex_attention.flex_attention(q, k, v)",
     ["`torch.nn.attention` is the module `torch.nn.attention`, which leads out"]),
    ("08_in_practice", "GQAttention",
     "if False:\n    flash_attention(x, x, x)\nself.set_attention('sdpa')\nreturn self.attend(x, x, x)",
     ["`.set_attention` is not allowed", "`.attend` is not allowed"]),
    # a class body reads the global until it binds the name: `ld` is torch.load, whatever torch is later
    ("01_naive_attention", "stable_softmax", "class A:\n    ld = torch.load\n    torch = None\nreturn A.ld",
     ["`torch.load`"]),
    ("01_naive_attention", "stable_softmax", "class A:\n    e = exec\n    exec = None\nreturn x",
     ["`exec` is not allowed"]),
    # a class body that binds a name reads the global one, never the function's local of that name
    ("01_naive_attention", "stable_softmax",
     "getattr = None\nclass K:\n    f = getattr(x, 'soft' + 'max')\n    getattr = 0\nreturn K.f(-1)",
     ["`getattr` is not allowed"]),
    # a comprehension's target stores into d[...]: the index is read, and is no variable of the comprehension
    ("01_naive_attention", "stable_softmax", "d = {}\nreturn [getattr(x, 'soft' + 'max') for d[getattr] in [0]][0](-1)",
     ["`getattr` is not allowed"]),
    # attributes stored by for, with and comprehension targets: monkey-patching too
    ("01_naive_attention", "stable_softmax", "for torch.allclose in [None]:\n    pass\nreturn x",
     ["assigning to attributes"]),
    ("01_naive_attention", "stable_softmax", "y = [0 for torch.allclose in [None]]\nreturn x",
     ["assigning to attributes"]),
    ("01_naive_attention", "stable_softmax", "with torch.no_grad() as torch.allclose:\n    pass\nreturn x",
     ["assigning to attributes"]),
    # a double underscore stays refused, even for the answer's own name
    ("01_naive_attention", "stable_softmax", "__x = x\nreturn __x", ["`__x`: names starting with _"]),
    # an assignment into a subscript of an attribute is still one to the attribute's object
    ("01_naive_attention", "stable_softmax", "x.data[0] = 0\nreturn x", ["assigning to attributes"]),
]


@pytest.mark.parametrize("key, answer, code, culprits", RED_TEAM)
@pytest.mark.parametrize("pass_given", [True, False], ids=["given-sources", "course-imports"])
def test_the_red_teams_bypasses_are_refused_naming_the_culprit(key, answer, code, culprits, pass_given):
    found = refusals(key, answer, code, pass_given)
    for culprit in culprits:
        assert culprit in found, found


@pytest.mark.parametrize("name", registry.STRING_ACCESS)
def test_what_looks_code_up_by_a_string_is_refused_as_an_attribute_and_as_a_name(name):
    assert f"`.{name}` is not allowed" in refusals("01_naive_attention", "stable_softmax", f"x.{name}\nreturn x")
    assert f"`{name}` is not allowed" in refusals("01_naive_attention", "stable_softmax", f"{name}\nreturn x")


def _foreign_modules_reached(root: str, owner: types.ModuleType, depth: int = 2):
    """``root.a``, ``root.a.b``: the chains from ``owner`` through the course's public modules that reach a module
    outside the course's."""
    for name, value in sorted(vars(owner).items()):
        if name.startswith("_") or name in registry.ESCAPE_ATTRIBUTES or name in registry.STRING_ACCESS:
            continue
        if issubclass(type(value), types.ModuleType):
            module = vars(value).get("__name__", "")
            if module.split(".")[0] not in registry.ANSWER_MODULES:
                yield f"{root}.{name}", module
            elif depth > 1 and not any(part.startswith("_") for part in module.split(".")) and not any(
                    module == escape or module.startswith(escape + ".") for escape in registry.ESCAPE_MODULES):
                yield from _foreign_modules_reached(f"{root}.{name}", value, depth - 1)


def test_every_standard_library_module_a_library_imported_is_refused_by_one_rule():
    """No list of names: whatever module torch, triton.language or math happen to hold (operator, typing,
    functools, collections, ...) is refused where an answer reaches it, naming the module."""
    import torch
    import triton.language as tl

    chains = [*_foreign_modules_reached("torch", torch), *_foreign_modules_reached("tl", tl)]
    assert len(chains) > 20 and {"operator", "typing"} <= {module for _, module in chains}
    for chain, module in chains:
        if chain.startswith("tl."):
            found = refusals("04_flash_forward", "flash_forward_kernel", f"y = {chain}.x")
        else:
            found = refusals("01_naive_attention", "stable_softmax", f"y = {chain}.x\nreturn x")
        assert f"`{chain}` is the module `{module}`" in found, chain


@pytest.mark.parametrize("code, words", [
    # a module held as a value would take its attributes out of sight
    ("m = torch.functional\nreturn m.operator", "`torch.functional` is a module"),
    ("return [torch.nn][0].functional", "`torch.nn` is a module"),
    ("f = lambda m: m.operator\nreturn f(torch.functional)", "`torch.functional` is a module"),
    # ... and a comprehension's own name does not hide the global in its first iterable
    ("y = [0 for torch in torch.functional.operator.x]\nreturn x", "`torch.functional.operator` is the module"),
    # code or files loaded by torch itself
    ("return torch.load('x.pt', weights_only=False)", "`torch.load` comes from `torch.serialization`"),
    ("return torch.hub.load('.', 'x', source='local')", "`torch.hub` is the module `torch.hub`, which leads out"),
    ("return torch.ops.aten.add(x, x)", "`torch.ops` is the module `torch.ops`, which leads out"),
    ("return torch.utils.cpp_extension.load_inline('x', '')", "`.load_inline` is not allowed"),
])
def test_what_a_chain_reaches_is_judged_in_the_graders_process(code, words):
    assert words in refusals("01_naive_attention", "stable_softmax", code)


def test_a_verdict_does_not_depend_on_what_the_grader_loaded_before():
    """torch.onnx is made on demand by torch's __getattr__: once judged "cannot be checked" in a fresh grader
    and followed in one where some test had imported it. Now a submodule nobody imported is judged by its name
    (imported to be followed where its name allows it), the same in both."""
    code = ("from flashlib.course import policy, registry\n"
            "import sys, torch\n"
            "assert 'torch.onnx' not in sys.modules\n"
            "ex = registry.exercise('01_naive_attention.stable_softmax')\n"
            "src = 'def stable_softmax(x):\\n    return torch.onnx.{attr}\\n'\n"
            "print([r.message for r in policy.check_answer(ex, src, [(2, 2)], set())])\n")
    for attr in ("x", "utils"):
        fresh = subprocess.run([sys.executable, "-c", code.format(attr=attr)], capture_output=True, text=True,
                               timeout=300, check=True).stdout.strip()
        import torch.onnx  # noqa: F401 - loaded here, as another test may have done
        exercise, source, regions, given = answer_cell("01_naive_attention", "stable_softmax",
                                                       f"return torch.onnx.{attr}")
        here = str([r.message for r in policy.check_answer(exercise, source, regions, set())])
        assert fresh == here, attr
    assert "`torch.onnx` is the module `torch.onnx`, which leads out" in here  # judged by its name, loaded or not


def test_a_module_held_by_a_class_is_refused_where_the_class_is_held():
    found = refusals("04_flash_forward", "flash_forward_kernel", "s = tl.semantic.TritonSemantic\nt = s.lang.typing")
    assert "`tl.semantic.TritonSemantic` holds a module (`tl.semantic.TritonSemantic.lang`)" in found


def test_a_global_no_cell_of_the_notebook_binds_is_refused(monkeypatch):
    """Notebook 09 imports no math. A learner who imported it in a cell of their own passed the notebook's check
    and raised NameError in the grader (which runs only the course's cells), with the cause cut from the report."""
    found = refusals("09_decoding", "merge_splits", "return o_parts[0], -math.inf")
    assert "`math` is not defined by the notebook's cells" in found
    assert refusals("01_naive_attention", "stable_softmax", "return x * math.pi / math.pi") == ""  # 01 imports it
    assert refusals("09_decoding", "merge_splits", "return o_parts[0], -math.inf", pass_given=False) == ""
    # IPython puts display into a kernel's builtins; the grader's worker has none: refused in both places alike
    monkeypatch.setattr(builtins, "display", print, raising=False)
    assert "`display` is not defined" in refusals("01_naive_attention", "stable_softmax", "display(x)\nreturn x")


def test_a_given_cells_alias_of_a_module_is_followed():
    exercise, source, regions, given = answer_cell("01_naive_attention", "stable_softmax",
                                                   "return G.torch.functional.operator")
    given = given + ["G = torch.nn.functional"]
    found = " | ".join(map(str, policy.check_answer(exercise, source, regions, set(), given_sources=given)))
    assert "`G.torch.functional.operator` is the module `operator`" in found


# ------------------------------------------------------------------ what stays allowed

@pytest.mark.parametrize("pass_given", [True, False], ids=["given-sources", "course-imports"])
def test_every_solution_is_accepted(pass_given):
    for key in registry.notebooks():
        canonical = nbformat.read(EXERCISES / f"{key}.ipynb", as_version=4)
        solution = nbformat.read(SOLUTIONS / f"{key}.ipynb", as_version=4)
        submission = answers.take_answers(solution, canonical, key)
        given = [c.source for c in submission.cells if c.kind != answers.ANSWER]
        extra = {"given_sources": given, "notebook_names": notebook_names(key)} if pass_given else {}
        for cell in submission.cells:
            if cell.kind == answers.ANSWER:
                found = policy.check_answer(registry.exercise(cell.exercise), cell.source, cell.regions,
                                            policy.flashlib_names(given), **extra)
                assert found == [], (cell.exercise, found)


@pytest.mark.parametrize("key, answer, code", [
    # methods of the answer's own values are never looked up, whatever their names
    ("01_naive_attention", "stable_softmax",
     "y = x.select(-1, 0)\nz = list(x.shape).copy()\nw = x.clone().copy_(x)\nn_p = 1\n"
     "return (x - x.amax(dim=-1, keepdim=True)).exp() / y.numel()"),
    # a module's evaluation mode is not the builtin eval
    ("01_naive_attention", "stable_softmax",
     "layer = torch.nn.Identity().eval()\nreturn layer((x - x.amax(dim=-1, keepdim=True)).exp()) / 1"),
    # torch.nn.functional, torch and math chains
    ("01_naive_attention", "naive_attention",
     "s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])\n"
     "return torch.nn.functional.softmax(s, dim=-1).to(torch.float32) @ v"),
    ("05_flash_backward", "ds", "return F.relu(p) * 0 + p * (dp - d[..., None]) * math.exp(0.0) + math.pi * 0"),
    # a learner's own variable named like an import is theirs, not the module
    ("05_flash_backward", "ds", "F = p * (dp - d[..., None])\nreturn F"),
    ("05_flash_backward", "ds", "math = [p]\nreturn [math for math in math][0] * (dp - d[..., None])"),
    # Triton: tl.math, tl.* dtypes, triton.cdiv
    ("04_flash_forward", "flash_forward_kernel",
     "s = tl.math.exp2(tl.zeros([16, 16], dtype=tl.float32)) * triton.cdiv(4, 2)\n"
     "t = tl.extra.cuda.libdevice.exp(s) if tl.constexpr(False) else s"),
    # an index that reads attributes is read, not assigned to (session 51's audit: refused as monkey-patching)
    ("01_naive_attention", "stable_softmax",
     "m = x.amax(dim=-1, keepdim=True)\nm[torch.isinf(m)] = 0\nm[m == -math.inf] = 0\nreturn (x - m).exp()"),
    # the learner's own variables may be named like what the exercise forbids: they hold only what was assigned
    ("01_naive_attention", "stable_softmax",
     "e = (x - x.amax(dim=-1, keepdim=True)).exp()\nsoftmax = e / e.sum(-1, keepdim=True)\nsoft_max = softmax\n"
     "type = x.dtype\nvars = e.sum(-1)\nreturn soft_max.to(type)"),
    ("09_decoding", "merge_splits",
     "m = lse_parts.amax(0)\nlog_sum_exp = m + (lse_parts - m).exp().sum(0).log()\n"
     "return (o_parts * (lse_parts - log_sum_exp).exp()[..., None]).sum(0), log_sum_exp"),
    ("06_masking", "causal_block_range", "tiles = 1\nreturn 0, tiles * 0 + n_k"),
    # a local's annotation is never evaluated; IPython's display is no name the grader has, but is refused alike
    ("01_naive_attention", "stable_softmax", "e: Tensor = (x - x.amax(dim=-1, keepdim=True)).exp()\n"
                                             "return e / e.sum(-1, keepdim=True)"),
    # a class body reading what it bound itself (a name no notebook cell binds)
    ("01_naive_attention", "stable_softmax", "class Cfg:\n    dim = -1\n    keep = dim\n"
                                             "e = (x - x.amax(dim=Cfg.keep, keepdim=True)).exp()\n"
                                             "return e / e.sum(Cfg.dim, keepdim=True)"),
    # and their own helpers may start with one underscore
    ("01_naive_attention", "stable_softmax",
     "def _shifted(a):\n    return a - a.amax(dim=-1, keepdim=True)\n_e = _shifted(x).exp()\n"
     "return _e / _e.sum(-1, keepdim=True)"),
])
def test_legit_answer_code_is_accepted(key, answer, code):
    assert refusals(key, answer, code) == ""


def test_holds_name_finds_long_forbidden_names_inside_others_and_spares_the_answers_own_names():
    assert policy.holds_name("AdaptiveLogSoftmaxWithLoss", "softmax")
    assert policy.holds_name("special_log_softmax_x", "log_softmax")
    assert not policy.holds_name("Softmax", "softmax")  # the same name is same_name's, not held
    assert not policy.holds_name("gradient", "grad") and not policy.holds_name("torchvision", "torch")  # too short
    # the answer's own locals may hold a forbidden name: a learner's softmax_out is theirs
    assert refusals("01_naive_attention", "stable_softmax",
                    "softmax_out = torch.exp(x - x.amax(dim=-1, keepdim=True))\n"
                    "return softmax_out / softmax_out.sum(dim=-1, keepdim=True)") == ""


def test_same_name_is_case_and_underscore_blind_and_nothing_more():
    assert policy.same_name("Softmax", "softmax") and policy.same_name("LogSoftmax", "log_softmax")
    assert policy.same_name("MULTIHEAD_ATTENTION", "MultiheadAttention")
    assert policy.same_name("soft_max_", "softmax")
    assert not policy.same_name("Softmax2d", "softmax") and not policy.same_name("expand", "exp")
    # exp is forbidden in notebook 08, expand (GQA's broadcast of k and v) is not
    assert refusals("08_in_practice", "attend", "k = k.expand(-1, -1, -1, -1)\n"
                    "return flash_attention(q, k, v, causal=True, layout='bnhd')") == ""
    # the short names of ALWAYS_FORBIDDEN are compared exactly: a learner's n_p is not numpy
    assert refusals("01_naive_attention", "stable_softmax", "n_p = N_P = 1\nreturn x * n_p") == ""


def test_given_imports_reads_what_the_given_cells_bind():
    bound = reach.given_imports([
        "import math\nimport torch.nn.functional\nimport triton.language as tl\n"
        "from flashlib import flash_attention as fa\nF = torch.nn.functional\nG = F.relu\n",
        "def helper():\n    import os\n    return os\ndef math():\n    pass\ntorch.backends.x = 1\ntl = tl\n",
        "import copy\ncopy = copy.deepcopy(copy)\n",  # unreadable: it may still be the module, so it stays one
    ])
    assert bound == {"torch": ("torch", ()), "tl": ("triton.language", ()), "copy": ("copy", ()),
                     "fa": ("flashlib", ("flash_attention",)), "F": ("torch", ("nn", "functional")),
                     "G": ("torch", ("nn", "functional", "relu"))}


def test_global_reads_follow_pythons_scopes():
    tree = ast.parse(textwrap.dedent("""
        def f(a):
            b = torch
            c = [torch for torch in torch]
            class K:
                torch = 1
                d = torch
                def m(self):
                    return torch
            return (lambda torch: torch)(a)
    """))
    reads = reach.global_reads(tree)
    got = [(node.lineno, node.col_offset) for node in ast.walk(tree)
           if isinstance(node, ast.Name) and node.id == "torch" and id(node) in reads]
    # line 3: `b = torch`; line 4: the first iterable only; line 7: a class body reads a global until the name is
    # bound there (taken as a global read wherever it stands, the safe side); line 9: the method does not see K's
    assert sorted(got) == [(3, 8), (4, 28), (7, 12), (9, 19)]


def test_deep_answers_are_read_without_recursion_or_refused_by_name():
    """Every walk here is a loop: a chain of 2 000 attributes is followed (to the module it reaches), and a cell
    Python's own parser cannot read (RecursionError, not SyntaxError) is refused, not a crash of the grader."""
    long_chain = "torch" + ".nn.functional.torch" * 700 + ".functional.operator.x"
    found = refusals("01_naive_attention", "stable_softmax", f"y = {long_chain}\nreturn x")
    assert "is the module `operator`" in found
    assert "nested too deeply" in refusals("01_naive_attention", "stable_softmax", "return " + "x + " * 100_000 + "x")


@pytest.mark.parametrize("key, answer, code, words", [
    # only torch in a kernel is "not Triton code"; tl.softmax is Triton, and does the exercise
    ("05_flash_backward", "flash_dkdv_kernel", "p = tl.softmax(qk)", "`.softmax` is not allowed in this answer: it "
                                                                     "would do the exercise for you"),
    ("04_flash_forward", "flash_forward_kernel", "x = torch.zeros(1)", "a kernel's answer is Triton code"),
    # the model's own switch back to another attention
    ("08_in_practice", "GQAttention", "flash_attention(x, x, x)\nreturn self.attend(x, x, x)",
     "`.attend` is not allowed in this answer: the answer must call `flash_attention` itself"),
    ("01_naive_attention", "stable_softmax", "print(type(x))\nreturn x", "use `x.dtype`, or `isinstance`"),
])
def test_a_refusal_says_why_in_the_words_of_its_rule(key, answer, code, words):
    assert words in refusals(key, answer, code)


@pytest.mark.parametrize("exercise", [e for e in registry.EXERCISES if "logsumexp" in e.forbidden
                                      and e.kind != registry.KERNEL], ids=lambda e: e.key)
def test_an_exercise_says_what_its_answer_may_not_use(exercise):
    """`torch.logsumexp` was refused in notebook 09 with no word of it in the exercise (session 51's audit)."""
    nb = nbformat.read(EXERCISES / f"{exercise.notebook}.ipynb", as_version=4)
    index = next(i for i, cell in enumerate(nb.cells)
                 if cell.cell_type == "code" and f"def {exercise.answer}(" in cell.source)
    text = next(cell.source for cell in reversed(nb.cells[:index]) if cell.cell_type == "markdown")
    assert all(f"`{name}`" in text for name in ("softmax", "log_softmax", "logsumexp")), exercise.key


def test_the_check_cell_reads_the_courses_cells_not_the_learners_saved_notebook():
    """A learner edits exercises/ itself: a scratch `import math` cell saved there once counted as a given cell
    in the check cell (which then passed what the grader refused), and a saved copy of an answer cell made every
    check cell of the notebook raise. The check cells read make_exercises' record instead, which holds exactly
    the given cells of the course's exercise notebooks."""
    from flashlib.course.make_exercises import COURSE_CELLS, _expected, course_cells_record

    assert COURSE_CELLS.read_text(encoding="utf-8") == course_cells_record(_expected(SOLUTIONS))
    for key in registry.notebooks():
        canonical = nbformat.read(EXERCISES / f"{key}.ipynb", as_version=4)
        given_sources, names = answers.course_cells(key)
        cells = answers.canonical_cells(canonical, key)
        assert given_sources == [cell.source for cell in cells if cell.kind != answers.ANSWER]
        assert names == answers.names_an_answer_may_read(cells) and names


def test_a_refusal_met_on_several_lines_is_said_once():
    found = [policy.Refusal(5, "`math` is not defined"), policy.Refusal(2, "`.softmax` is not allowed"),
             policy.Refusal(9, "`math` is not defined")]
    assert policy.describe(found) == ("answer refused: lines 5, 9: `math` is not defined; "
                                      "line 2: `.softmax` is not allowed")
