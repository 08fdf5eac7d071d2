"""flashlib.model: a small GPT whose attention is naive, SDPA or flashlib, and its text.

The three attention choices must give the same model: the same outputs and the same
gradients, and training from the same weights on the same batches must give the
same losses up to float32 rounding, while the loss falls.
"""
import copy
import importlib.util
import math
from pathlib import Path

import pytest
import torch

import flashlib
from flashlib import model as M
from flashlib import runtime, validation

DEVICE = runtime.DEVICE
TOL = validation.tolerance(torch.float32)
GRAD_TOL = runtime.pick(gpu=TOL, cpu=1e-4)      # gradients add up more rounded terms; TF32 on a GPU
LOSS_TOL = 1e-5     # the loss-curve tolerance of notebook 08: a hundred float32 epsilons
ATTENTION_CHOICES = ("naive", "sdpa", "flashlib")


def _tiny(vocab=20, **sizes):
    config = dict(vocab_size=vocab, context=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16)
    config.update(sizes)
    torch.manual_seed(0)
    return M.GPT(M.GPTConfig(**config)).to(DEVICE)


# ------------------------------------------------------------------------- the text
def test_the_text_ships_with_the_installed_package():
    text = M.load_text()
    path = Path(flashlib.__file__).parent / "data" / M.TEXT_NAME
    assert path.is_file() and path.stat().st_size <= 300_000
    assert text == path.read_text(encoding="utf-8")
    assert len(text) > 100_000 and text.isascii()
    assert "The next day they did it all again." in text


def test_the_text_is_what_its_generator_writes():
    script = Path(flashlib.__file__).parent / "data" / "make_tales.py"
    spec = importlib.util.spec_from_file_location("make_tales", script)
    make_tales = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_tales)
    assert make_tales.make_text() == M.load_text()


def test_pyproject_declares_the_text_as_package_data():
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert "data/*.txt" in pyproject


def test_tokenizer_round_trip_and_errors():
    text = M.load_text()
    tok = M.CharTokenizer(text)
    assert tok.vocab_size == len(set(text)) and tok.chars == sorted(tok.chars)
    sample = text[:500]
    ids = tok.encode(sample)
    assert ids.dtype == torch.long and ids.shape == (500,)
    assert tok.decode(ids) == sample
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.encode("héllo")


def test_get_batch_targets_are_inputs_shifted_by_one():
    data = torch.arange(1000)
    x, y = M.get_batch(data, 4, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 16)
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)


# ------------------------------------------------------------------------ the model
def test_shapes_and_parameter_counts_with_gqa():
    model = _tiny(n_heads=4, n_kv_heads=2, head_dim=16)
    attn = model.blocks[0].attn
    assert (attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features) == (64, 32, 32)
    idx = torch.randint(0, 20, (3, 32), device=DEVICE)
    logits, loss = model(idx, idx)
    assert logits.shape == (3, 32, 20)
    assert abs(loss.item() - math.log(20)) < 0.1   # small initial weights: close to uniform


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        M.CausalSelfAttention(64, 4, 3)
    with pytest.raises(ValueError, match="attention must be one of"):
        M.attention_function("flash")
    with pytest.raises(ValueError, match="context is 32"):
        _tiny()(torch.zeros(1, 33, dtype=torch.long, device=DEVICE))


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_the_three_attention_choices_agree_on_outputs_and_gradients(kv_heads):
    base = _tiny(n_heads=2, n_kv_heads=kv_heads)
    idx = torch.randint(0, 20, (2, 32), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    results = {}
    for choice in ATTENTION_CHOICES:
        model = copy.deepcopy(base).set_attention(choice)
        assert all(block.attn.attend is M.ATTENTION[choice] for block in model.blocks)
        logits, loss = model(idx, idx)
        loss.backward()
        results[choice] = (logits.detach(), {n: p.grad for n, p in model.named_parameters()})
    ref_logits, ref_grads = results["naive"]
    for choice in ("sdpa", "flashlib"):
        logits, grads = results[choice]
        assert validation.relative_error(logits, ref_logits) <= TOL, choice
        for name, grad in grads.items():
            assert validation.relative_error(grad, ref_grads[name]) <= GRAD_TOL, (choice, name)


def test_the_attention_functions_match_the_float64_reference_per_layout():
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 24, 4, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 24, 2, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    expected = M.naive_attend(q, k, v)
    bhnd = flashlib.naive_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
    assert torch.allclose(expected, bhnd.transpose(1, 2))
    for fn in (M.sdpa_attend, M.flashlib_attend):
        out = fn(*(t.float().to(DEVICE) for t in (q, k, v)))
        assert out.shape == (2, 24, 4, 16)
        assert validation.relative_error(out, expected) <= TOL, fn.__name__


def test_a_function_can_be_plugged_in():
    calls = []

    def spy(q, k, v):
        calls.append((q.shape, k.shape))
        return M.sdpa_attend(q, k, v)

    model = _tiny().set_attention(spy)
    model(torch.zeros(1, 8, dtype=torch.long, device=DEVICE))
    assert calls == [((1, 8, 2, 16), (1, 8, 1, 16))] * 2
    assert "attention='spy'" in repr(model.blocks[0].attn)


def test_a_short_training_run_gives_the_same_losses_with_sdpa_and_flashlib():
    """Same init, same batches: the curves differ by float32 rounding only, and the loss falls."""
    text = M.load_text()
    tok = M.CharTokenizer(text)
    data = tok.encode(text)
    base = _tiny(vocab=tok.vocab_size, n_layers=1, n_heads=2, n_kv_heads=1)
    runs = {choice: M.train(copy.deepcopy(base).set_attention(choice), data, steps=12, batch_size=2, lr=1e-2)
            for choice in ("sdpa", "flashlib")}
    assert len(runs["flashlib"]) == 12
    assert M.relative_loss_gap(runs["flashlib"], runs["sdpa"]) < LOSS_TOL
    assert runs["sdpa"][0] == pytest.approx(math.log(tok.vocab_size), rel=0.02)
    assert max(runs["flashlib"][-3:]) < 0.85 * math.log(tok.vocab_size)


def test_relative_loss_gap():
    assert M.relative_loss_gap([1.0, 2.2], [1.0, 2.0]) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="different lengths"):
        M.relative_loss_gap([1.0], [1.0, 2.0])


def test_generate_appends_tokens_deterministically():
    model = _tiny().set_attention("sdpa")
    start = torch.zeros(2, 3, dtype=torch.long, device=DEVICE)
    out = M.generate(model, start, 40, generator=torch.Generator().manual_seed(0), top_k=5)
    again = M.generate(model, start, 40, generator=torch.Generator().manual_seed(0), top_k=5)
    assert out.shape == (2, 43) and torch.equal(out[:, :3], start) and torch.equal(out, again)
    assert int(out.max()) < 20


# ------------------------------------------------------------------ generation with a KV cache
def test_cached_forward_gives_the_logits_of_the_whole_sequence():
    """Prefill 5 tokens into the paged cache, then feed 4 one at a time: each step's logits are those of
    one forward over the whole sequence at that position."""
    model = _tiny(n_heads=4, n_kv_heads=2).eval()
    idx = torch.randint(0, 20, (2, 9), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    with torch.no_grad():
        full = model(idx)
        cache = M.PagedKVCache(model.config, 2, 9, page_size=4, device=DEVICE)
        steps = [model(idx[:, :5], cache=cache)] + [model(idx[:, t:t + 1], cache=cache) for t in range(5, 9)]
    assert cache.tokens == 9 and cache.lengths.tolist() == [9, 9]
    assert validation.relative_error(torch.cat(steps, dim=1), full.double()) < TOL
    # the pages are a permutation of the pool, and every layer's pool holds what the sequence wrote
    assert sorted(cache.block_table.flatten().tolist()) == list(range(cache.k[0].shape[0]))
    assert cache.memory_bytes() == 2 * 2 * cache.k[0].numel() * 4
    with pytest.raises(ValueError, match=r"the cache holds 12 tokens per sequence: 9 cached \+ 4 new do not fit"):
        model(idx[:, :4], cache=cache)
    with pytest.raises(ValueError, match="cache holds 2 sequences but idx has batch 1"):
        model(idx[:1, :1], cache=cache)


@pytest.mark.parametrize("kv_heads", [2, 1])
def test_greedy_tokens_are_the_same_with_and_without_the_cache(kv_heads):
    model = _tiny(n_heads=4, n_kv_heads=kv_heads, context=40)
    start = torch.randint(0, 20, (2, 6), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    plain = M.generate(model, start, 25, temperature=0)
    cached = M.generate(model, start, 25, temperature=0, kv_cache=True, page_size=8)
    assert torch.equal(plain, cached)
    sampled = M.generate(model, start, 12, generator=torch.Generator().manual_seed(3))
    sampled_cached = M.generate(model, start, 12, generator=torch.Generator().manual_seed(3), kv_cache=True)
    assert torch.equal(sampled, sampled_cached)


def test_cuda_graph_decoding_needs_the_cache_and_a_gpu():
    model = _tiny()
    start = torch.zeros(1, 4, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match="cuda_graph=True replays the decoding step of the KV cache"):
        M.generate(model, start, 3, cuda_graph=True)
    with pytest.raises(TypeError, match="cuda_graph must be None .* or a bool; got 'yes'"):
        M.generate(model, start, 3, kv_cache=True, cuda_graph="yes")
    if DEVICE.type != "cuda":
        with pytest.raises(ValueError, match="cuda_graph=True needs a CUDA device; idx is on cpu"):
            M.generate(model, start, 3, kv_cache=True, cuda_graph=True)


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 5])
def test_gpu_graphed_decoding_gives_the_tokens_and_cache_of_eager_decoding(page_size, monkeypatch):
    """Greedy tokens from replayed CUDA graphs equal eager cached decoding and plain decoding (float32),
    and the graph really replaces the eager steps (one capture for all of them)."""
    captured = []
    real = M.GraphedDecodeStep.__init__

    def counting(self, *args):
        captured.append(1)
        real(self, *args)

    monkeypatch.setattr(M.GraphedDecodeStep, "__init__", counting)
    model = _tiny(n_heads=4, n_kv_heads=2, context=80)
    start = torch.randint(0, 20, (3, 7), generator=torch.Generator().manual_seed(4)).to(DEVICE)
    graphed = M.generate(model, start, 50, temperature=0, kv_cache=True, page_size=page_size)
    assert captured == [1]
    eager = M.generate(model, start, 50, temperature=0, kv_cache=True, page_size=page_size, cuda_graph=False)
    assert captured == [1]
    plain = M.generate(model, start, 50, temperature=0)
    assert torch.equal(graphed, eager) and torch.equal(graphed, plain)


def test_the_cache_is_bounded_by_the_context_and_says_so():
    model = _tiny(context=16)
    start = torch.zeros(1, 10, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match=r"prompt \(10\) \+ max_new_tokens \(7\) = 17 must fit the model's context \(16\)"):
        M.generate(model, start, 7, kv_cache=True)
    assert M.generate(model, start, 7).shape == (1, 17)  # without the cache it slides past the context
    for bad in (-1.0, None, float("nan"), float("inf"), True):  # None and NaN failed inside torch, not here
        with pytest.raises(ValueError, match=rf"temperature must be a finite number >= 0 \(0: greedy\); got {bad!r}"):
            M.generate(model, start, 1, temperature=bad)
    for bad in (-1, 2.0, True):  # -1 once returned the prompt silently, 2.0 failed inside torch.zeros
        with pytest.raises(ValueError, match=rf"max_new_tokens must be an int >= 0; got {bad!r}"):
            M.generate(model, start, bad, kv_cache=True)
    with pytest.raises(ValueError, match=r"top_k must be None \(sample from every token\) or an int >= 1; got 0"):
        M.generate(model, start, 1, top_k=0)


def test_the_experiments_compare_no_more_steps_than_they_train():
    for experiment in M.EXPERIMENT.values():
        assert 0 < experiment["compared_steps"] <= experiment["train"]["steps"]


@pytest.mark.gpu
def test_gpu_experiment_of_notebook_08_matches_sdpa_to_rounding_over_its_compared_steps():
    """The GPU run of notebook 08, section 5, in full float32 (torch's default, which flashlib follows)."""
    text = M.load_text()
    tok = M.CharTokenizer(text)
    data = tok.encode(text)
    experiment = M.EXPERIMENT["gpu"]
    torch.manual_seed(0)
    base = M.GPT(M.GPTConfig(vocab_size=tok.vocab_size, **experiment["model"])).to(DEVICE)
    runs = {choice: M.train(copy.deepcopy(base).set_attention(choice), data, **experiment["train"])
            for choice in ("sdpa", "flashlib")}
    compared = experiment["compared_steps"]
    assert M.relative_loss_gap(runs["flashlib"][:compared], runs["sdpa"][:compared]) < LOSS_TOL
    assert sum(runs["flashlib"][-10:]) / 10 < 0.8 * math.log(tok.vocab_size)


def test_generate_names_a_bad_prompt_or_page_size_and_treats_an_empty_batch_alike_with_and_without_the_cache():
    """An empty prompt and a 1D prompt failed with IndexError deep inside; page_size=2.5 inside torch.zeros; a batch
    of no sequence returned (0, N + new) without the cache and raised the cache's own error with it."""
    model = _tiny(context=16)
    start = torch.zeros(2, 3, dtype=torch.long, device=DEVICE)
    with pytest.raises(ValueError, match=r"idx must hold a prompt of at least one token per sequence; got shape "
                                         r"\(2, 0\)"):
        M.generate(model, start[:, :0], 2)
    for bad, got in ((start[0], r"a torch.int64 tensor of shape \(3,\)"), (start.float(), "a torch.float32 tensor"),
                     ([[1, 2]], "a list")):
        with pytest.raises(TypeError, match=rf"idx must be a \(B, N\) torch.int64 \(or int32\) tensor of token ids; "
                                            rf"got {got}"):
            M.generate(model, bad, 2)
    for bad in (2.5, 0, True):
        with pytest.raises(ValueError, match=rf"page_size must be an int >= 1 .*; got {bad!r}"):
            M.generate(model, start, 2, kv_cache=True, page_size=bad)
    for kv_cache in (False, True):
        out = M.generate(model, start[:0], 4, kv_cache=kv_cache)
        assert out.shape == (0, 7) and out.dtype == start.dtype


def test_generate_hands_the_model_back_in_the_mode_it_came_in():
    """generate once left a training model in eval mode, silently turning its dropout off for the training after."""
    model = _tiny(context=16)
    start = torch.zeros(1, 3, dtype=torch.long, device=DEVICE)
    for training in (True, False):
        for kv_cache in (False, True):
            model.train(training)
            M.generate(model, start, 2, kv_cache=kv_cache)
            assert model.training is training and all(m.training is training for m in model.modules())
    model.train()
    with pytest.raises(ValueError, match="must fit the model's context"):  # an error on the way out, too
        M.generate(model, start, 20, kv_cache=True)
    assert model.training
