"""flashlib.hf: flashlib as a Transformers attention implementation, against Transformers' own on tiny models.

Tiny random models, no download, float32: Llama (GQA, RoPE, causal), Mistral (sliding window) and
Gemma 2 (softcap, a custom scale, sliding and full layers alternating). With no, right, left and
middle padding the logits and every parameter's gradient match ``sdpa`` (``eager`` for Gemma 2,
which sdpa does not run) on the tokens that are not padding; a training step runs; greedy generation
with a KV cache (dynamic and static) gives sdpa's tokens. BART's cross-attention to a padded encoder and
sequences packed into one row (restarting position_ids, or the collator's cu_seq_lens) match sdpa too.
Compiled with fullgraph=True, Llama with every padding, Mistral and Gemma 2 with padding match sdpa (or
eager), and NaN in padding is never read.
Each comparison also records which flashlib
entry point ran, so a model that silently used another implementation fails. 4D masks and the
errors are tested on the attention function directly.
"""
import copy
import io
import subprocess
import sys
import types

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="flashlib.hf needs Hugging Face Transformers: "
                                   "pip install flashlib[hf]")

from support.attention import pin_blocks

from flashlib import hf, runtime
from flashlib import ops as ops_module
from flashlib.reference import naive_attention
from flashlib.validation import relative_error

DEVICE = runtime.DEVICE

#: float32 against float32: the two differ only in the order of the sums (flashlib's online softmax over
#: key blocks, sdpa's one matmul), a few ulps (1.2e-7) per op. Measured on the CPU: logits 2e-7 to 3e-7,
#: gradients up to 7e-7 (max |difference| / max |reference|). 1e-5 leaves a 15x margin, while any mask
#: that is off (a sliding window off by one: 0.3; a padded key seen: > 1e-2) fails by orders of magnitude.
RTOL = 1e-5

#: A tiny Llama-style model: head_dim 16, 2 query heads per key/value head (GQA).
SIZES = {"vocab_size": 64, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "pad_token_id": 0}
PADDINGS = ("none", "right", "left", "middle")
#: The flashlib entry point each padding takes (the first word of each recorded call).
PATHS = {"none": "plain", "right": "seq_lens", "left": "varlen", "middle": "varlen"}


@pytest.fixture(scope="module")
def name():
    return hf.register()


@pytest.fixture
def calls(monkeypatch):
    """Every flashlib call the attention function makes: (entry point, N_q, N_k)."""
    log, plain, varlen, kvcache = [], hf.flash_attention, hf.flash_attention_varlen, hf.splitkv_attention

    def flash_attention(q, k, v, **kwargs):
        log.append(("plain" if kwargs.get("seq_lens") is None else "seq_lens", q.shape[1], k.shape[1]))
        return plain(q, k, v, **kwargs)

    def flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs):
        log.append(("varlen", max_q, max_k))
        return varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)

    def splitkv_attention(q, k_cache, v_cache, layout, spec, **kwargs):  # flash_attention_with_kvcache's kernel
        table = kwargs.get("block_table")  # one-token pages: a row's keys are its table's entries
        log.append(("kvcache", q.shape[1], k_cache.shape[1] if table is None else table.shape[1]))
        return kvcache(q, k_cache, v_cache, layout, spec, **kwargs)

    monkeypatch.setattr(hf, "flash_attention", flash_attention)
    monkeypatch.setattr(hf, "flash_attention_varlen", flash_attention_varlen)
    monkeypatch.setattr(hf, "splitkv_attention", splitkv_attention)
    return log


@pytest.fixture
def fresh_compiler():
    """Dynamo's caches emptied before and after: every test here compiles the same Transformers code objects, and
    their compiled versions would add up to the recompile limit (8) and make a later test fall back to eager."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def twins(name, config, model_class=transformers.LlamaForCausalLM, reference="sdpa", dtype=torch.float32):
    """Two models with the same random weights (drawn in float32, then cast to ``dtype``, so that models of
    different dtypes share them too): ``reference``'s attention and flashlib's."""
    torch.manual_seed(0)
    # _from_config writes attn_implementation into the config it is given: each model gets its own copy
    ref = model_class._from_config(copy.deepcopy(config), attn_implementation=reference, dtype=torch.float32)
    ours = model_class._from_config(copy.deepcopy(config), attn_implementation=name, dtype=torch.float32)
    ours.load_state_dict(ref.state_dict())
    assert ours.config._attn_implementation == name and ref.config._attn_implementation == reference
    return ref.to(DEVICE, dtype), ours.to(DEVICE, dtype)


def batch(padding, n=12):
    """Token ids (2, n) and an attention mask (1 = token, 0 = padding) of the given kind."""
    ids = torch.randint(1, SIZES["vocab_size"], (2, n), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, n, dtype=torch.long)
    if padding == "right":
        mask[0, 9:], mask[1, 5:] = 0, 0
    elif padding == "left":
        mask[0, :3], mask[1, :7] = 0, 0
    elif padding == "middle":
        mask[0, 4:6], mask[1, :2], mask[1, 8:] = 0, 0, 0
    return ids.to(DEVICE), mask.to(DEVICE)


def logits_and_grads(model, ids, mask, pass_mask=True):
    """Logits, and the gradient of every parameter, of a loss on the tokens that are not padding (the model is
    called without the mask when ``pass_mask`` is False)."""
    model.zero_grad()
    logits = model(ids, attention_mask=mask if pass_mask else None).logits
    kept = mask.bool()
    (logits[kept].float().square().mean()).backward()
    return logits.detach()[kept], {key: p.grad for key, p in model.named_parameters()}


def named_grads(model):
    """Each parameter's gradient by its name (a compiled wrapper's ``_orig_mod.`` prefix dropped)."""
    return {key.removeprefix("_orig_mod."): p.grad for key, p in model.named_parameters()}


def assert_close(ours, ref, rtol, what):
    error = relative_error(ours, ref)
    assert error <= rtol, f"{what}: relative error {error:.2e} > {rtol:.0e}"


# ---------------------------------------------------------------- against sdpa / eager
@pytest.mark.parametrize("padding", PADDINGS)
def test_llama_logits_and_gradients_match_sdpa(name, calls, padding):
    ref, ours = twins(name, transformers.LlamaConfig(**SIZES))
    ids, mask = batch(padding)
    ref_logits, ref_grads = logits_and_grads(ref, ids, mask)
    assert not calls, "the sdpa model must not call flashlib"
    logits, grads = logits_and_grads(ours, ids, mask)
    assert [call[0] for call in calls] == [PATHS[padding]] * SIZES["num_hidden_layers"]
    assert_close(logits, ref_logits, RTOL, "logits")
    for key, grad in grads.items():
        assert_close(grad, ref_grads[key], RTOL, f"gradient of {key}")


@pytest.mark.parametrize("padding", ("none", "left"))
def test_mixed_precision_under_autocast_matches_sdpa(name, calls, padding):
    """RoPE hands attention float32 q and k beside a bfloat16 v under torch.autocast: the call once raised
    "q, k, v must have the same dtype" for every RoPE model, where sdpa casts the three to autocast's dtype."""
    ref, ours = twins(name, transformers.LlamaConfig(**SIZES))
    ids, mask = batch(padding)
    device = DEVICE.type
    with torch.autocast(device, dtype=torch.bfloat16):
        ref_logits, ref_grads = logits_and_grads(ref, ids, mask)
        logits, grads = logits_and_grads(ours, ids, mask)
    assert [call[0] for call in calls] == [PATHS[padding]] * SIZES["num_hidden_layers"]
    assert logits.dtype == ref_logits.dtype == torch.bfloat16
    # bfloat16 products on both sides (the interpreter computes them in float32): a few bf16 ulps apart
    assert_close(logits.float(), ref_logits.float(), 2e-2, "logits")
    for key, grad in grads.items():
        assert grad.dtype == ref_grads[key].dtype == torch.float32, key
        assert_close(grad, ref_grads[key], 5e-2, f"gradient of {key}")


@pytest.mark.parametrize("padding", ("none", "right", "left"))
def test_mistral_sliding_window_matches_sdpa(name, calls, padding):
    """sliding_window=4 of 12 tokens: a window off by one would differ by ~0.3. The layers get the 2D mask
    (the sliding-window pattern is recognised), never an N x N one."""
    config = transformers.MistralConfig(**SIZES, sliding_window=4)
    ref, ours = twins(name, config, transformers.MistralForCausalLM)
    ids, mask = batch(padding)
    assert_close(ours(ids, attention_mask=mask).logits[mask.bool()], ref(ids, attention_mask=mask).logits[mask.bool()],
                 RTOL, "logits")
    assert [call[0] for call in calls] == [PATHS[padding]] * SIZES["num_hidden_layers"]


def test_gemma2_softcap_scale_and_windows_match_eager(name, calls):
    """Gemma 2: softcap 0.1 (small enough to bend these small scores: ignoring it errs by 3e-3), scale
    query_pre_attn_scalar**-0.5 (not 1/sqrt(head_dim)), a sliding layer (window 5) then a full one; against
    eager, as sdpa refuses softcap."""
    config = transformers.Gemma2Config(**SIZES, head_dim=16, query_pre_attn_scalar=24, attn_logit_softcapping=0.1,
                                       sliding_window=5, layer_types=["sliding_attention", "full_attention"])
    ref, ours = twins(name, config, transformers.Gemma2ForCausalLM, reference="eager")
    ids, mask = batch("left")
    assert_close(ours(ids, attention_mask=mask).logits[mask.bool()], ref(ids, attention_mask=mask).logits[mask.bool()],
                 RTOL, "logits")
    assert [call[0] for call in calls] == ["varlen", "varlen"]


def test_training_step(name, calls):
    """Three AdamW steps of the flashlib model on a left-padded batch: finite, changed weights, lower loss."""
    _, model = twins(name, transformers.LlamaConfig(**SIZES))
    ids, mask = batch("left")
    labels = ids.masked_fill(mask == 0, -100)
    before = {key: p.detach().clone() for key, p in model.named_parameters()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    losses = []
    for _ in range(3):
        loss = model(ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert calls and {call[0] for call in calls} == {"varlen"}
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(not torch.equal(p, before[key]) for key, p in model.named_parameters()), "every parameter moves"
    assert losses[-1] < losses[0], f"the loss should drop on a fixed batch: {losses}"


@pytest.mark.parametrize("padding", PADDINGS)
def test_compiled_llama_is_one_graph_and_matches_sdpa_with_any_padding(name, fresh_compiler, calls, padding):
    """torch.compile(fullgraph=True) of a model called with a padding mask (batched fine-tuning): the unpadding
    reads the lengths on the host, a graph break; compiled, each row's tokens are moved to its front instead and
    ``seq_lens`` masks the rest, the same attention with no value read. Logits and every gradient as sdpa's."""
    ref, ours = twins(name, transformers.LlamaConfig(**SIZES))
    ids, mask = batch(padding)
    ref_logits, ref_grads = logits_and_grads(ref, ids, mask)
    ours.compile(fullgraph=True, backend="aot_eager")  # in place: the parameters keep their names
    logits, grads = logits_and_grads(ours, ids, mask, pass_mask=padding != "none")
    assert [call[0] for call in calls] == ["plain" if padding == "none" else "seq_lens"] * SIZES["num_hidden_layers"]
    assert_close(logits, ref_logits, RTOL, "logits")
    for key, grad in grads.items():
        assert_close(grad, ref_grads[key], RTOL, f"gradient of {key}")


@pytest.mark.parametrize("model, padding", [("mistral", "left"), ("mistral", "right"), ("mistral", "middle"),
                                            ("gemma2", "left")])
def test_compiled_sliding_window_models_with_a_padding_mask_are_one_graph(name, fresh_compiler, calls, model, padding):
    """Mistral (window 4 of 12 tokens) and Gemma 2 (a sliding layer, then a full one, softcapped) compiled with
    fullgraph=True: Dynamo cannot read the sliding-window closure's cells, so it is recognised by plain Python once
    while tracing, and the layers get the 2D padding mask, as eager. Padding between tokens with a window is
    refused on the device, as eager refuses it on the host."""
    if model == "mistral":
        config, model_class, reference = transformers.MistralConfig(**SIZES, sliding_window=4), \
            transformers.MistralForCausalLM, "sdpa"
    else:
        config = transformers.Gemma2Config(**SIZES, head_dim=16, query_pre_attn_scalar=24, attn_logit_softcapping=0.1,
                                           sliding_window=5, layer_types=["sliding_attention", "full_attention"])
        model_class, reference = transformers.Gemma2ForCausalLM, "eager"
    ref, ours = twins(name, config, model_class, reference=reference)
    ids, mask = batch(padding)
    compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")
    if padding == "middle":
        with pytest.raises(RuntimeError, match="sliding window needs left or right padding"):
            compiled(ids, attention_mask=mask)
        return
    kept = mask.bool()
    assert_close(compiled(ids, attention_mask=mask).logits[kept], ref(ids, attention_mask=mask).logits[kept], RTOL,
                 "logits")
    assert [call[0] for call in calls] == ["seq_lens"] * SIZES["num_hidden_layers"]


@pytest.mark.parametrize("pattern", ["sliding causal", "sliding bidirectional"])
def test_while_tracing_only_the_sliding_causal_closure_is_left_to_the_layer(name, fresh_compiler, pattern):
    """The closure that passes the checks made while tracing is still recognised exactly: Transformers' bidirectional
    sliding window (same window, same local_size) gets the 4D mask, which the layer checks, not the 2D one."""
    from transformers import masking_utils

    config = transformers.MistralConfig(**SIZES, sliding_window=4)
    padding = torch.ones(2, 12, dtype=torch.bool, device=DEVICE)
    build = (masking_utils.sliding_window_causal_mask_function if pattern == "sliding causal"
             else masking_utils.sliding_window_bidirectional_mask_function)

    def mask():  # the closure made while tracing, as in a compiled model
        return hf.flashlib_attention_mask(2, 12, 12, mask_function=build(4), attention_mask=padding, local_size=4,
                                          config=config, use_vmap=False, device=DEVICE)

    assert torch.compile(mask, fullgraph=True, backend="eager")().dim() == (2 if pattern == "sliding causal" else 4)


def test_compiled_mistral_without_a_mask_is_one_graph_but_with_use_cache_false_reads_the_4d_mask(name, fresh_compiler,
                                                                                                  calls):
    """Without a padding mask and with its default cache the sliding window is recognised while tracing too (one
    graph, one plain call per layer). With use_cache=False as well, Transformers may add packed sequences (a tensor
    in the closure), so it is not: the layers get sdpa's 4D mask, read on the host, a graph break (fullgraph=True
    fails; the README says so: update it if this compiles), and the right result."""
    config = transformers.MistralConfig(**SIZES, sliding_window=4)
    ref, ours = twins(name, config, transformers.MistralForCausalLM)
    ids, _ = batch("none")
    assert_close(torch.compile(ours, fullgraph=True, backend="aot_eager")(ids).logits, ref(ids).logits, RTOL, "logits")
    assert [call[0] for call in calls] == ["plain"] * SIZES["num_hidden_layers"]
    with pytest.raises(torch._dynamo.exc.UserError, match="data-dependent"):
        torch.compile(ours, fullgraph=True, backend="aot_eager")(ids, use_cache=False)
    assert_close(torch.compile(ours, backend="aot_eager")(ids, use_cache=False).logits, ref(ids).logits, RTOL,
                 "logits")


@pytest.mark.parametrize("padding", ("left", "middle"))
def test_compiled_sliding_window_with_a_2d_mask_matches_eager_or_refuses_on_the_device(name, fresh_compiler, padding):
    """A layer with a window and a 2D padding mask, compiled with fullgraph=True: left padding as eager (which
    unpads); padding between tokens, which eager refuses with a ValueError, is refused by an assertion in the graph."""
    module, q, k, v = attention_inputs(seed=7)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]] if padding == "left" else
                        [[1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool, device=DEVICE)

    def attend(q, k, v):
        return hf.flashlib_attention_forward(module, q, k, v, mask, sliding_window=3)[0]

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    if padding == "middle":
        with pytest.raises(RuntimeError, match="sliding window needs left or right padding"):
            compiled(q, k, v)
        return
    assert_close(compiled(q, k, v), attend(q, k, v), RTOL, "outputs")


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_compiled_greedy_generation_is_one_graph_per_step_and_matches_sdpa(name, fresh_compiler, calls, cache):
    """The model compiled with fullgraph=True generates sdpa's tokens from a left-padded batch. The prompt is N_q ==
    N_k (tokens to the front, seq_lens); each decoding step (one query against the cache, sdpa's mask: its row is
    the keys it sees) moves the key tokens to the front for flash_attention_with_kvcache. A static cache's offset,
    a tensor, is not read on the host (Transformers' generate compiles a static cache's steps by itself on a GPU,
    in CUDA graphs, where a host read could not even be captured)."""
    ref, ours = twins(name, transformers.LlamaConfig(**SIZES))
    ids, mask = batch("left")
    options = {"attention_mask": mask, "max_new_tokens": 5, "min_new_tokens": 5, "do_sample": False,
               "pad_token_id": 0, "cache_implementation": None if cache == "dynamic" else "static"}
    expected = ref.generate(ids, **options)
    ours.compile(fullgraph=True, backend="aot_eager")
    assert torch.equal(ours.generate(ids, **options), expected)
    prompt = [call for call in calls if call[1] > 1]
    decoding = [call for call in calls if call[1] == 1]
    assert prompt and {call[0] for call in prompt} == {"seq_lens"}
    assert decoding and {call[0] for call in decoding} == {"kvcache"}


@pytest.mark.parametrize("model", ["llama, batch of one unpadded", "mistral", "bart"])
def test_compiled_generation_with_a_static_cache_gives_sdpas_tokens(name, fresh_compiler, model):
    """Static caches whose steps once broke the graph: an unpadded batch (Transformers then drops the mask in the
    last step's eager mask, and the compiled step saw a causal 4D mask that only the host could read), a
    sliding-window model and an encoder-decoder."""
    ids, mask = batch("left")
    if model.startswith("llama"):
        config, model_class, ids, mask = transformers.LlamaConfig(**SIZES), transformers.LlamaForCausalLM, ids[:1], \
            torch.ones_like(ids[:1])
    elif model == "mistral":
        config, model_class = transformers.MistralConfig(**SIZES, sliding_window=4), transformers.MistralForCausalLM
    else:
        config = transformers.BartConfig(vocab_size=64, d_model=64, encoder_layers=1, decoder_layers=1,
                                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                         decoder_ffn_dim=128, max_position_embeddings=64, pad_token_id=0,
                                         bos_token_id=1, eos_token_id=2, decoder_start_token_id=2)
        model_class = transformers.BartForConditionalGeneration
    ref, ours = (m.eval() for m in twins(name, config, model_class))
    options = {"attention_mask": mask, "max_new_tokens": 5, "min_new_tokens": 5, "do_sample": False,
               "pad_token_id": 0, "cache_implementation": "static"}
    expected = ref.generate(ids, **options)
    ours.compile(fullgraph=True, backend="aot_eager")
    assert torch.equal(ours.generate(ids, **options), expected)


def test_compiled_static_cache_steps_are_one_graph(name, fresh_compiler):
    """A static cache's decoding steps get sdpa's mask, whose shape stays put from step to step: one compiled graph
    serves them all (a 2D mask growing by a token a step compiled anew at every step, and on a GPU would capture a
    new CUDA graph at every step). No call log here: appending to one from the graph adds guards of its own."""
    from torch._dynamo.testing import CompileCounterWithBackend

    ref, ours = twins(name, transformers.LlamaConfig(**SIZES))
    ids, mask = batch("left")
    options = {"attention_mask": mask, "max_new_tokens": 5, "min_new_tokens": 5, "do_sample": False,
               "pad_token_id": 0, "cache_implementation": "static"}
    counter = CompileCounterWithBackend("aot_eager")
    ours.compile(fullgraph=True, backend=counter)
    with torch._dynamo.config.patch(automatic_dynamic_shapes=False):  # a shape that changes compiles anew
        assert torch.equal(ours.generate(ids, **options), ref.generate(ids, **options))
    assert counter.frame_count == 2, "one graph for the prompt, one for every decoding step"


def unpadded_reference(q, k, v, mask, window=None) -> torch.Tensor:
    """float64 ground truth of (B, H, N_q, D) q, causal, over (B, H_kv, N_k, D) k, v with a (B, N_k) bool padding
    mask, the queries being the last N_q positions: each row's kept tokens alone, as if they had never been padded
    (a window counts tokens), returned (B, N_q, H, D) as Transformers' attention returns it, 0 at padded queries."""
    n_q = q.shape[2]
    out = torch.zeros(q.shape[0], n_q, q.shape[1], q.shape[3], dtype=torch.float64, device=q.device)
    for b, kept in enumerate(mask):
        queries = kept[-n_q:]
        rows = naive_attention(q[b:b + 1, :, queries].double(), k[b:b + 1, :, kept].double(),
                               v[b:b + 1, :, kept].double(), causal=True,
                               window=None if window is None else (window - 1, 0))
        out[b, queries] = rows[0].transpose(0, 1)
    return out


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
@pytest.mark.parametrize("padding", ["left", "between tokens", "a padded query"])
def test_decoding_steps_eager_and_compiled_match_the_unpadded_reference(name, fresh_compiler, calls, padding, grad):
    """Two queries against six keys, eager and compiled with fullgraph=True, against float64 attention of each row's
    tokens alone: 0 at a padded query, and NaN in the padding of q, k and v never read, nor its gradients (compiled
    against eager, which unpads). A window (3) with left padding matches the reference; with other padding it is
    refused, eagerly on the host, compiled on the device. Inference goes through flash_attention_with_kvcache with
    no host read, eager too; with gradients, eager unpads into varlen, compiled packs into varlen."""
    module, q, k, v = attention_inputs(n_q=2, n_k=6, seed=8)
    rows = {"left": [[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1]],
            "between tokens": [[0, 0, 1, 1, 1, 1], [1, 0, 0, 1, 1, 1]],
            "a padded query": [[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 0]]}[padding]
    mask = torch.tensor(rows, dtype=torch.bool, device=DEVICE)
    expected = unpadded_reference(q, k, v, mask)
    k.transpose(1, 2)[~mask], v.transpose(1, 2)[~mask] = float("nan"), float("nan")
    q.transpose(1, 2)[~mask[:, -2:]] = float("nan")

    def attend(q, k, v, **options):
        return hf.flashlib_attention_forward(module, q, k, v, mask, **options)[0]

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    results = []
    for run in (attend, compiled):
        leaves = [t.clone().requires_grad_(grad) for t in (q, k, v)]
        out = run(*leaves)
        if grad:
            out.square().sum().backward()
        results.append((out.detach(), [t.grad for t in leaves]))
    (eager, eager_grads), (out, grads) = results
    assert [call[0] for call in calls] == (["varlen", "varlen"] if grad else ["kvcache", "kvcache"])
    assert_close(eager, expected, RTOL, "eager outputs")
    assert_close(out, expected, RTOL, "compiled outputs")
    if not grad:  # one query, a step of generation, is its row's last: it moves nowhere (0 where it is padding)
        for run in (attend, compiled):
            assert_close(run(q[:, :, -1:], k, v), expected[:, -1:], RTOL, f"{run.__name__}, one query")
    for a, b in zip(grads, eager_grads) if grad else ():
        assert not a.isnan().any() and not b.isnan().any()
        assert_close(a, b, RTOL, "gradients")
    if padding == "left":
        windowed = unpadded_reference(q.nan_to_num(), k.nan_to_num(), v.nan_to_num(), mask, window=3)
        assert_close(attend(q, k, v, sliding_window=3), windowed, RTOL, "eager windowed outputs")
        assert_close(compiled(q, k, v, sliding_window=3), windowed, RTOL, "compiled windowed outputs")
    else:
        with pytest.raises(ValueError, match="sliding window needs left or right padding"):
            attend(q, k, v, sliding_window=3)
        with pytest.raises(RuntimeError, match="sliding window needs left or right padding"):
            compiled(q, k, v, sliding_window=3)


def test_compiled_packed_sequences_from_the_collator_are_one_graph(name, fresh_compiler, calls):
    """DataCollatorWithFlattening's cu_seq_lens_q/k, compiled with fullgraph=True (use_cache=False, as in training):
    sdpa's logits and gradients. Beside them Transformers hands the layers its 4D mask of the sequences (it cannot
    rule out packing while tracing), which is checked against them on the device, not read on the host."""
    ref, ours = twins(name, transformers.LlamaConfig(**SIZES))
    sequences = [torch.randint(1, 64, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 3, 7)]
    collated = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)(
        [{"input_ids": s} for s in sequences])
    inputs = {key: value.to(DEVICE) if isinstance(value, torch.Tensor) else value
              for key, value in collated.items() if key != "labels"}
    results = []
    for model in (ref, torch.compile(ours, fullgraph=True, backend="aot_eager")):
        model.zero_grad()
        logits = model(**inputs, use_cache=False).logits
        logits.square().mean().backward()
        results.append((logits.detach(), named_grads(model)))
    (ref_logits, ref_grads), (logits, grads) = results
    assert_close(logits, ref_logits, RTOL, "logits")
    for key, grad in grads.items():
        assert_close(grad, ref_grads[key], RTOL, f"gradient of {key}")
    assert calls and {call[0] for call in calls} == {"varlen"}


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32], ids=["bool", "additive"])
def test_compiled_cu_seq_lens_that_disagree_with_the_mask_are_refused_on_the_device(name, fresh_compiler, dtype):
    module, q, k, v = attention_inputs(n_q=6, n_k=6)
    q, k, v = q[:1], k[:1], v[:1]
    blocks = torch.zeros(6, 6, dtype=torch.bool, device=DEVICE)
    blocks[:2, :2], blocks[2:, 2:] = True, True
    allowed = (blocks & torch.ones(6, 6, dtype=torch.bool, device=DEVICE).tril())[None, None]
    mask = allowed if dtype == torch.bool else torch.zeros(allowed.shape, device=DEVICE).masked_fill(~allowed, -1e9)

    def attend(cu):
        given = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": 4, "max_length_k": 4}
        return hf.flashlib_attention_forward(module, q, k, v, mask, **given)[0]

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    same = torch.tensor([0, 2, 6], dtype=torch.int32, device=DEVICE)
    assert_close(compiled(same), attend(same), RTOL, "cu_seq_lens as the mask says")
    for other in ([0, 3, 6], [0, 2, 5]):  # another split; sequences that leave the last token out
        with pytest.raises(RuntimeError, match="describe different sequences"):
            compiled(torch.tensor(other, dtype=torch.int32, device=DEVICE))


@pytest.mark.parametrize("pads", [False, True], ids=["all ones", "padding"])
def test_a_2d_mask_beside_cu_seq_lens_must_pad_nothing(name, fresh_compiler, pads):
    """The collator's cu_seq_lens with an all-ones 2D attention_mask: eager, Transformers drops the mask before the
    layer sees it; compiled, it reaches the layer, which asserts on the device that it pads nothing. A mask that
    pads is refused both ways (eager: it is not the packed sequences' mask)."""
    module, q, k, v = attention_inputs(n_q=6, n_k=6)
    q, k, v = q[:1], k[:1], v[:1]
    mask = torch.ones(1, 6, dtype=torch.bool, device=DEVICE)
    mask[0, 5] = not pads
    cu = torch.tensor([0, 2, 6], dtype=torch.int32, device=DEVICE)
    given = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": 4, "max_length_k": 4}

    def attend(q, k, v, mask):
        return hf.flashlib_attention_forward(module, q, k, v, mask, **given)[0]

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    if pads:
        with pytest.raises(ValueError, match="describe different sequences"):
            attend(q, k, v, mask)
        with pytest.raises(RuntimeError, match="describe different sequences"):
            compiled(q, k, v, mask)
    else:
        assert_close(compiled(q, k, v, mask), attend(q, k, v, None), RTOL, "the sequences, the mask padding nothing")


def test_compiled_attention_never_reads_padding(name, fresh_compiler):
    """Compiled (tokens moved to the front, then ``seq_lens``) as eager (unpadded): NaN in the padding of q, k and v
    reaches no valid output and no gradient, and the outputs at padding are 0."""
    module, q, k, v = attention_inputs(n_q=6, n_k=6, seed=6)
    mask = torch.tensor([[1, 0, 1, 1, 0, 1], [0, 0, 1, 1, 1, 1]], dtype=torch.bool, device=DEVICE)

    def attend(q, k, v):
        return hf.flashlib_attention_forward(module, q, k, v, mask)[0]

    results = []
    for run in (attend, torch.compile(attend, fullgraph=True, backend="aot_eager")):
        leaves = [t.clone() for t in (q, k, v)]
        for t in leaves:
            t.transpose(1, 2)[~mask] = float("nan")
        leaves = [t.requires_grad_() for t in leaves]
        out = run(*leaves)
        out.square().sum().backward()
        results.append((out.detach(), [t.grad for t in leaves]))
    (eager, eager_grads), (compiled, compiled_grads) = results
    assert torch.equal(compiled[~mask], torch.zeros_like(compiled[~mask]))
    assert_close(compiled, eager, RTOL, "outputs")
    for a, b in zip(compiled_grads, eager_grads):
        assert not a.isnan().any() and torch.equal(a.transpose(1, 2)[~mask], torch.zeros_like(a.transpose(1, 2)[~mask]))
        assert_close(a, b, RTOL, "gradients")


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_generation_matches_sdpa(name, calls, cache):
    """Left-padded batch of 2, 5 new tokens with a KV cache: the decoding steps are N_q = 1 query against
    the cached keys, through flash_attention_with_kvcache's split-KV kernel: with a dynamic cache the 2D mask's
    tokens; with a static one sdpa's 4D mask, whose one row is the keys the query sees (the empty slots past the
    last token left out)."""
    ref, ours = twins(name, transformers.LlamaConfig(**SIZES))
    ids, mask = batch("left")
    options = {"attention_mask": mask, "max_new_tokens": 5, "min_new_tokens": 5, "do_sample": False,
               "pad_token_id": 0, "cache_implementation": None if cache == "dynamic" else "static"}
    expected = ref.generate(ids, **options)
    assert torch.equal(ours.generate(ids, **options), expected)
    decoding = [call for call in calls if call[1] == 1]
    assert len(decoding) == 4 * SIZES["num_hidden_layers"] and all(call[2] > 1 for call in decoding)
    assert {call[0] for call in decoding} == {"kvcache"}


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("n_dec", [12, 8, 16], ids=["n_dec=n_enc", "shorter", "longer"])
@pytest.mark.parametrize("padding", ("right", "left"))
def test_bart_cross_attention_to_a_padded_encoder_matches_sdpa(name, fresh_compiler, calls, n_dec, padding, compiled):
    """Encoder-decoder: the encoder's padding masks the keys of cross-attention only, and every decoder query is
    valid. Decoder queries were once taken for the last N_q encoder positions, zeroing those that faced encoder
    padding (logits off by 5e-3), and N_dec > N_enc was refused. Compiled with fullgraph=True, the encoder's and the
    cross-attention's 4D masks are checked on the device, and the valid keys of all rows are moved to the front of
    the flat keys for one varlen call of fixed size (every query kept, as sdpa)."""
    config = transformers.BartConfig(vocab_size=64, d_model=64, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                     decoder_ffn_dim=128, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                                     eos_token_id=2, decoder_start_token_id=2)
    ref, ours = (model.eval() for model in twins(name, config, transformers.BartForConditionalGeneration))  # no dropout
    ids, mask = batch(padding)
    decoder_ids = torch.randint(3, 64, (2, n_dec), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    outputs = []
    for model in (ref, torch.compile(ours, fullgraph=True, backend="aot_eager") if compiled else ours):
        model.zero_grad()
        logits = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids, use_cache=False).logits
        logits.square().mean().backward()
        outputs.append((logits.detach(), named_grads(model)))
    (ref_logits, ref_grads), (logits, grads) = outputs
    assert_close(logits, ref_logits, RTOL, "decoder logits")
    for key, grad in grads.items():
        if key.endswith("k_proj.bias"):  # a key bias shifts every score of a row alike: its gradient is 0 + rounding
            assert grad.abs().max() < 1e-6 and ref_grads[key].abs().max() < 1e-6, key
        else:
            assert_close(grad, ref_grads[key], RTOL, f"gradient of {key}")
    # encoder self-attention and cross-attention go through varlen with every query kept, the decoder's plainly
    assert [(call[0], call[1]) for call in calls] == [("varlen", 12), ("plain", n_dec), ("varlen", n_dec)]


# ---------------------------------------------------------------- masks and errors, on the attention function
def attention_inputs(n_q=6, n_k=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 4, n_q, 16, generator=gen).to(DEVICE)
    k, v = (torch.randn(2, 2, n_k, 16, generator=gen).to(DEVICE) for _ in range(2))
    return types.SimpleNamespace(is_causal=True, num_key_value_groups=2), q, k, v


def test_4d_masks_reduce_to_padding_or_raise(name):
    """The 4D masks of sdpa (bool) and eager (additive) are accepted when they are padding + causal; a mask
    that says more (here: one future key) raises instead of being ignored, and so do biases."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module, q, k, v = attention_inputs()
    keys = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool, device=DEVICE)  # left padding
    allowed = torch.ones(6, 6, dtype=torch.bool, device=DEVICE).tril() & keys[:, None, None, :]  # (2, 1, 6, 6)
    additive = torch.zeros(allowed.shape, device=DEVICE).masked_fill(~allowed, torch.finfo(torch.float32).min)
    # -1e9 and -1e4 hide a key as fully as -inf (exp underflows to 0): they were once refused as biases
    large_negative = [torch.zeros(allowed.shape, device=DEVICE).masked_fill(~allowed, fill) for fill in (-1e9, -1e4)]
    expected = sdpa_attention_forward(module, q, k, v, allowed)[0]
    valid = keys  # queries are the key positions: compare the tokens only
    for mask in (keys, allowed, additive, *large_negative):
        out = hf.flashlib_attention_forward(module, q, k, v, mask)[0]
        assert out.shape == (2, 6, 4, 16)
        assert_close(out[valid], expected[valid], RTOL, f"output with a {tuple(mask.shape)} {mask.dtype} mask")
        assert (out[~valid] == 0).all(), "padded queries give 0"
    future = allowed.clone()
    future[1, 0, 2, 4] = True
    with pytest.raises(ValueError, match=r"\(2, 1, 6, 6\) torch.bool attention_mask .* not padding plus the causal"):
        hf.flashlib_attention_forward(module, q, k, v, future)
    with pytest.raises(ValueError, match="adds a bias"):
        hf.flashlib_attention_forward(module, q, k, v, additive + 0.5)
    with pytest.raises(ValueError, match=r"adds a bias to the scores \(values other than 0 and at most -10000"):
        hf.flashlib_attention_forward(module, q, k, v, additive.clamp_min(-100.0))  # -100 only lowers a weight


@pytest.mark.parametrize("n_q", [6, 3, 9])
def test_bidirectional_layers_mask_keys_only(name, n_q):
    """A layer that is not causal (an encoder, or cross-attention with N_q != N_k) given a key-padding mask, 2D or
    4D as sdpa's: every query row attends to the valid keys, as sdpa's (no row zeroed)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module, q, k, v = attention_inputs(n_q=n_q, n_k=6, seed=3)
    module.is_causal = False
    keys = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]], dtype=torch.bool, device=DEVICE)
    allowed = keys[:, None, None, :].expand(2, 1, n_q, 6)
    expected = sdpa_attention_forward(module, q, k, v, allowed)[0]
    for mask in (keys, allowed):
        out = hf.flashlib_attention_forward(module, q, k, v, mask)[0]
        assert_close(out, expected, RTOL, f"every row, with a {tuple(mask.shape)} mask")
    with pytest.raises(ValueError, match=r"a bidirectional layer's 2D mask must be \(B, N_k\) with B = 2"):
        hf.flashlib_attention_forward(module, q, k, v, keys[:, :5])


@pytest.mark.parametrize("model", ["llama", "mistral-window-3"])
def test_packed_sequences_match_sdpa_and_never_attend_across(name, calls, model):
    """Padding-free packing: three sequences in one row, with position_ids that restart (Transformers then builds a
    block-diagonal causal mask) or with the collator's cu_seq_lens_q/k. Logits and gradients match sdpa, which
    matches each sequence run alone; the flashlib model takes flash_attention_varlen over the three."""
    config = (transformers.LlamaConfig(**SIZES) if model == "llama"
              else transformers.MistralConfig(**SIZES, sliding_window=3))
    ref, ours = twins(name, config, transformers.LlamaForCausalLM if model == "llama"
                      else transformers.MistralForCausalLM)
    lengths = (5, 3, 7)
    sequences = [torch.randint(1, 64, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in lengths]
    collated = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)(
        [{"input_ids": s} for s in sequences])
    by_positions = {"input_ids": collated["input_ids"], "position_ids": collated["position_ids"]}
    by_keywords = {key: value for key, value in collated.items() if key != "labels"}
    expected = None
    for inputs in (by_positions, by_keywords):
        inputs = {key: value.to(DEVICE) if isinstance(value, torch.Tensor) else value for key, value in inputs.items()}
        results = []
        for model_ in (ref, ours):
            model_.zero_grad()
            logits = model_(**inputs, use_cache=False).logits
            logits.square().mean().backward()
            results.append((logits.detach(), {key: p.grad.clone() for key, p in model_.named_parameters()}))
        (ref_logits, ref_grads), (logits, grads) = results
        assert_close(logits, ref_logits, RTOL, "logits")
        for key, grad in grads.items():
            assert_close(grad, ref_grads[key], RTOL, f"gradient of {key}")
        expected = ref_logits if expected is None else expected
        assert_close(logits, expected, RTOL, "the same logits either way")
    alone = torch.cat([ref(torch.tensor([s], device=DEVICE), use_cache=False).logits[0] for s in sequences])
    assert_close(expected[0], alone, RTOL, "each sequence alone")
    assert {call[0] for call in calls} == {"varlen"} and all(call[1] == max(lengths) for call in calls)


@pytest.mark.parametrize("n_q", [6, 4])
def test_compiled_bidirectional_layers_check_4d_masks_on_the_device_and_never_read_padding(name, fresh_compiler, n_q):
    """A bidirectional layer's 4D mask while tracing: key padding as eager (NaN in the padded keys reaches no output
    and no gradient, every query row attends), and what eager refuses on the host (a mask that is not padding, a
    bias, heads that differ) refused on the device."""
    module, q, k, v = attention_inputs(n_q=n_q, n_k=6, seed=9)
    module.is_causal = False
    keys = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 1, 1, 0, 1, 1]], dtype=torch.bool, device=DEVICE)
    padding = keys[:, None, None, :].expand(2, 1, n_q, 6)
    not_padding = padding.clone()
    not_padding[0, 0, 1, 5] = True  # one query sees a key no other sees
    bias = torch.zeros(padding.shape, device=DEVICE).masked_fill(~padding, float("-inf"))
    bias[1, 0, 0, 1] = -3.0
    heads = padding.expand(2, 2, n_q, 6).clone()
    heads[0, 1, :, 0] = False
    k.transpose(1, 2)[~keys], v.transpose(1, 2)[~keys] = float("nan"), float("nan")

    def attend(q, k, v, mask):
        return hf.flashlib_attention_forward(module, q, k, v, mask)[0]

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    results = []
    for run in (attend, compiled):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = run(*leaves, padding)
        out.square().sum().backward()
        results.append((out.detach(), [t.grad for t in leaves]))
    (eager, eager_grads), (out, grads) = results
    assert not out.isnan().any()
    assert_close(out, eager, RTOL, "outputs")
    for a, b in zip(grads, eager_grads):
        assert not a.isnan().any()
        assert_close(a, b, RTOL, "gradients")
    for mask, words in ((not_padding, "not padding plus the bidirectional pattern"), (bias, "adds a bias"),
                        (heads, "differs between heads")):
        with pytest.raises(ValueError, match=words):
            attend(q, k, v, mask)
        with pytest.raises(RuntimeError, match=words):
            compiled(q, k, v, mask)


def test_one_query_takes_its_4d_row_as_the_keys_it_sees(name, fresh_compiler):
    """A decoding step's sdpa mask, (B, 1, 1, N_k): its one row is the keys the query sees (padding, a static
    cache's empty slots past the query, a window's bound), and flashlib attends to exactly those, eager and
    compiled with fullgraph=True, as sdpa does, whatever the layer's own window; a bias is refused."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module, q, k, v = attention_inputs(n_q=1, n_k=8, seed=10)
    rows = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 1, 1, 0, 0]], dtype=torch.bool, device=DEVICE)
    mask = rows[:, None, None, :]
    k.transpose(1, 2)[~rows], v.transpose(1, 2)[~rows] = float("nan"), float("nan")  # never read
    expected = sdpa_attention_forward(module, q, k.nan_to_num(), v.nan_to_num(), mask)[0]

    def attend(q, k, v, mask, **options):
        return hf.flashlib_attention_forward(module, q, k, v, mask, **options)[0]

    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    for run in (attend, compiled):
        for options in ({}, {"sliding_window": 2}):
            assert_close(run(q, k, v, mask, **options), expected, RTOL, f"{run.__name__} {options}")
    bias = torch.zeros(mask.shape, device=DEVICE).masked_fill(~mask, float("-inf"))
    bias[0, 0, 0, 3] = -2.0
    with pytest.raises(ValueError, match="adds a bias"):
        attend(q, k, v, bias)
    with pytest.raises(RuntimeError, match="adds a bias"):
        compiled(q, k, v, bias)


def test_compiled_decoding_steps_with_dynamic_shapes_are_one_graph(name, fresh_compiler):
    """torch.compile(dynamic=True) of a decoding step's attention over a cache that grows a token a step (a dynamic
    cache): one graph serves every length (nothing in the layer specializes to the sizes), and each step matches
    eager."""
    module, q, _, _ = attention_inputs(n_q=1, n_k=6, seed=5)

    def attend(q, k, v, mask):
        return hf.flashlib_attention_forward(module, q, k, v, mask)[0]

    compiled = torch.compile(attend, dynamic=True, backend="aot_eager")
    torch._dynamo.utils.counters.clear()
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for n_k in range(6, 10):
            k, v = (torch.randn(2, 2, n_k, 16, generator=gen).to(DEVICE) for _ in range(2))
            mask = torch.ones(2, n_k, dtype=torch.bool, device=DEVICE)
            mask[1, :2] = False
            assert_close(compiled(q, k, v, mask), attend(q, k, v, mask), RTOL, f"N_k = {n_k}")
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("model", ["llama", "mistral-window-10"])
def test_an_eager_forward_makes_one_padding_plan_for_all_its_layers(name, calls, monkeypatch, model):
    """Eager decoding steps of a left-padded batch (``generate`` with Transformers' dynamic cache): the mask's lengths,
    order and block table are made once a forward and shared by both layers, and a sliding window's check of the
    padding (a host read) runs once a forward too; each layer making its own (SHARE_PADDING_PLAN = False) gives the
    same scores, bit for bit. A mask that did not come from the model's mask function (a direct call) gets a plan of
    its own at every call."""
    made, edge_checks = [], []
    plan_class, padded_at_an_edge = hf._PaddingPlan, hf._padded_at_an_edge

    class CountedPlan(plan_class):
        def __init__(self, mask, shared=False):
            made.append(tuple(mask.shape))
            super().__init__(mask, shared)

    def counted_padded_at_an_edge(mask, lengths):
        edge_checks.append(tuple(mask.shape))
        return padded_at_an_edge(mask, lengths)

    monkeypatch.setattr(hf, "_PaddingPlan", CountedPlan)
    monkeypatch.setattr(hf, "_padded_at_an_edge", counted_padded_at_an_edge)
    windowed = model == "mistral-window-10"  # the cache keeps the window's last keys, which here hold padding
    _, ours = twins(name, transformers.MistralConfig(**SIZES, sliding_window=10) if windowed
                    else transformers.LlamaConfig(**SIZES), transformers.MistralForCausalLM if windowed
                    else transformers.LlamaForCausalLM)
    ids, mask = batch("left")
    results = {}
    for shared in (True, False):
        monkeypatch.setattr(hf, "SHARE_PADDING_PLAN", shared)
        made.clear(), calls.clear()
        out = ours.generate(ids, attention_mask=mask, max_new_tokens=3, min_new_tokens=3, do_sample=False,
                            pad_token_id=0, output_scores=True, return_dict_in_generate=True)
        assert [call[0] for call in calls] == ["varlen"] * 2 + ["kvcache"] * 4  # the prompt; two steps of two layers
        # the model's mask function makes a plan for every eager forward's mask (the prompt's goes unused); a window's
        # cache holds its last 10 keys
        steps = [(2, 10), (2, 10)] if windowed else [(2, 13), (2, 14)]
        steps = steps if shared else [shape for shape in steps for layer in range(2)]
        assert made == ([(2, 12)] + steps if shared else steps)
        # the prompt's unpadding asks each layer where its padding is (one host read, as flash-attention-2's)
        assert edge_checks == [(2, 12), (2, 12)] + (steps if windowed else [])
        edge_checks.clear()
        results[shared] = out.scores
    assert all(torch.equal(a, b) for a, b in zip(results[True], results[False]))
    module, q, k, v = attention_inputs(n_q=1, n_k=6, seed=3)
    keys = torch.tensor([[0, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], dtype=torch.bool, device=DEVICE)
    made.clear()
    with torch.no_grad():
        for _ in range(2):
            hf.flashlib_attention_forward(module, q, k, v, keys)
    assert len(made) == 2
    # A shared plan follows its mask's values: written in place (here through a view), the mask gets a new plan. And
    # the mask stays a plain tensor, which a hook may save or copy
    monkeypatch.setattr(hf, "SHARE_PADDING_PLAN", True)
    shared = hf._with_a_shared_plan(keys.clone())
    plan = hf._padding_plan(shared)
    assert hf._padding_plan(shared) is plan and plan.lengths.tolist() == [5, 4]
    torch.save(copy.deepcopy(shared), io.BytesIO())
    shared[1:, 1:2].fill_(True)
    assert hf._padding_plan(shared) is not plan and hf._padding_plan(shared).lengths.tolist() == [5, 5]


@pytest.mark.parametrize("layout", ["bhnd cache", "bnhd cache", "one row", "sliced", "offset"])
def test_decoding_reads_the_cache_where_it_lies_through_one_token_pages(layout):
    """A decoding step's keys are read in place, not copied to the front of each row: one-token pages over the
    cache's own memory whose block table lists each row's kept tokens in order, for Transformers' (B, H, N, D) cache
    seen as (B, N, H, D), a (B, N, H, D) cache, one row, a static cache cut to its mask's length, and a view that
    starts inside its storage."""
    gen = torch.Generator().manual_seed(11)
    batch = 1 if layout == "one row" else 3
    if layout in ("bhnd cache", "sliced"):
        k, v = (torch.randn(batch, 2, 12, 8, generator=gen).transpose(1, 2) for _ in range(2))
    elif layout == "offset":
        k, v = (torch.randn(batch + 1, 2, 15, 8, generator=gen)[1:, :, 3:].transpose(1, 2) for _ in range(2))
        assert k.storage_offset() > 0
    else:
        k, v = (torch.randn(batch, 12, 2, 8, generator=gen) for _ in range(2))
    if layout == "sliced":
        k, v = k[:, :9], v[:, :9]
    keys = torch.rand(batch, k.shape[1], generator=gen) < 0.6
    keys[:, 0] = True
    plan = hf._PaddingPlan(keys)
    order = plan.order
    k_pages, v_pages, table = hf._token_pages(k, v, plan)
    assert table.dtype == torch.int32 and table.shape == keys.shape
    assert k_pages.shape[1:] == (1, 2, 8) and int(table.max()) < k_pages.shape[0]
    for pages, t in ((k_pages, k), (v_pages, v)):
        assert pages.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()  # a view: nothing copied
        assert torch.equal(pages[table.long(), 0], t.take_along_dim(order[:, :, None, None], dim=1))
    other = v.transpose(1, 2).contiguous().transpose(1, 2) if v.is_contiguous() else v.contiguous()
    assert hf._token_pages(k, other, plan) is None  # k and v laid out differently: the tokens are moved
    if layout == "offset":  # Inductor keeps the view's offset in its as_strided, as eager does
        def gathered(k, v, keys):
            pages, _, table = hf._token_pages(k, v, hf._PaddingPlan(keys))
            return pages[table.long(), 0] * 1.0

        compiled = torch.compile(gathered, fullgraph=True, backend="inductor")
        assert torch.equal(compiled(k, v, keys), gathered(k, v, keys))
    # bfloat16 in the interpreter is upcast, which would copy every overlapping page: the tokens are moved instead
    assert (hf._token_pages(k.bfloat16(), v.bfloat16(), plan) is None) == runtime.INTERPRET


def test_nan_in_padding_never_reaches_a_valid_output_or_gradient(name):
    """Key padding of a bidirectional layer (cross-attention, N_q != N_k) and the padding around packed sequences
    are never read: NaN there leaves the outputs and gradients of the valid tokens as they are without it."""
    module, q, k, v = attention_inputs(n_q=5, n_k=6, seed=4)
    module.is_causal = False
    keys = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool, device=DEVICE)
    blocks = torch.zeros(6, 6, dtype=torch.bool, device=DEVICE)
    blocks[:2, :2], blocks[2:5, 2:5] = True, True  # two sequences, the last token padding
    packed = (blocks & torch.ones(6, 6, dtype=torch.bool, device=DEVICE).tril())[None, None].expand(2, 1, 6, 6)
    causal = types.SimpleNamespace(is_causal=True, num_key_value_groups=2)
    for layer, mask, queries, padded in ((module, keys, q, (0, slice(None), slice(4, None))),
                                         (causal, packed, attention_inputs(n_q=6, n_k=6, seed=5)[1],
                                          (slice(None), slice(None), slice(5, None)))):
        results = []
        for fill in (None, float("nan")):
            leaves = [t.clone() for t in (queries, k, v)]
            if fill is not None:
                for t in leaves[1:] if layer is module else leaves:
                    t[padded] = fill
            leaves = [t.requires_grad_() for t in leaves]
            out = hf.flashlib_attention_forward(layer, *leaves, mask)[0]
            valid = out if layer is module else out[:, :5]
            valid.square().sum().backward()
            results.append((valid.detach(), [t.grad.clone() for t in leaves]))
        (clean, clean_grads), (dirty, dirty_grads) = results
        assert torch.equal(clean, dirty) and not dirty.isnan().any()
        for a, b in zip(clean_grads, dirty_grads):
            kept = torch.ones_like(a, dtype=torch.bool)
            kept[padded] = False
            assert torch.equal(a[kept], b[kept]) and not b[kept].isnan().any()


def test_packed_sequences_and_their_mask_must_agree(name):
    module, q, k, v = attention_inputs(n_q=6, n_k=6)
    q, k, v = q[:1], k[:1], v[:1]
    blocks = torch.zeros(6, 6, dtype=torch.bool, device=DEVICE)
    blocks[:2, :2], blocks[2:, 2:] = True, True
    mask = (blocks & torch.ones(6, 6, dtype=torch.bool, device=DEVICE).tril())[None, None]
    cu = torch.tensor([0, 2, 6], dtype=torch.int32, device=DEVICE)
    given = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": 4, "max_length_k": 4}
    out = hf.flashlib_attention_forward(module, q, k, v, mask, **given)[0]
    assert_close(out, hf.flashlib_attention_forward(module, q, k, v, mask)[0], RTOL, "cu_seq_lens as the mask says")
    other = dict(given, cu_seq_lens_q=torch.tensor([0, 3, 6], dtype=torch.int32, device=DEVICE))
    other["cu_seq_lens_k"] = other["cu_seq_lens_q"]
    with pytest.raises(ValueError, match="describe different sequences"):
        hf.flashlib_attention_forward(module, q, k, v, mask, **other)
    with pytest.raises(ValueError, match="one row \\(batch 1\\) with all of"):
        hf.flashlib_attention_forward(module, q, k, v, None, cu_seq_lens_q=cu)
    across = mask.clone()
    across[0, 0, 3, 1] = True  # a token that sees the previous sequence: neither padding nor packing
    with pytest.raises(ValueError, match="not padding plus the causal pattern"):
        hf.flashlib_attention_forward(module, q, k, v, across)


def test_window_with_padding_between_tokens_raises(name):
    module, q, k, v = attention_inputs()
    holes = torch.tensor([[1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]], dtype=torch.bool, device=DEVICE)
    with pytest.raises(ValueError, match="sliding window needs left or right padding"):
        hf.flashlib_attention_forward(module, q, k, v, holes, sliding_window=3)


def test_asking_for_attention_weights_is_answered_with_a_warning(name):
    module, q, k, v = attention_inputs()
    with pytest.warns(UserWarning, match="does not return attention weights"):
        out, weights = hf.flashlib_attention_forward(module, q, k, v, None, output_attentions=True)
    assert weights is None and out.shape == (2, 6, 4, 16)


def test_unsupported_keywords_raise(name):
    module, q, k, v = attention_inputs()
    with pytest.raises(NotImplementedError, match="s_aux"):
        hf.flashlib_attention_forward(module, q, k, v, None, s_aux=torch.zeros(4, device=DEVICE))


def test_queries_are_the_last_keys_without_a_mask(name):
    """N_q < N_k without padding (a cached step of 2 tokens): bottom-right causal, as the model's positions."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    module, q, k, v = attention_inputs(n_q=2, n_k=6)
    causal = torch.ones(6, 6, dtype=torch.bool, device=DEVICE).tril()[-2:]
    expected = sdpa_attention_forward(module, q, k, v, causal.expand(2, 1, 2, 6))[0]
    assert_close(hf.flashlib_attention_forward(module, q, k, v, None)[0], expected, RTOL, "output")


# ---------------------------------------------------------------- registration
def test_register_is_idempotent_and_refuses_names_transformers_misreads(name):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    assert name == hf.DEFAULT_NAME == hf.register() == hf.register(name)
    assert AttentionInterface()[name] is hf.flashlib_attention_forward
    assert AttentionMaskInterface()[name] is hf.flashlib_attention_mask
    with pytest.raises(ValueError, match="flash"):  # Transformers would try to load it as a flash-attn Hub kernel
        hf.register("flashlib")
    with pytest.raises(ValueError, match="already exists"):
        hf.register("sdpa")


def test_import_without_transformers_fails_only_at_register():
    code = ("import sys; sys.modules['transformers'] = None\n"
            "import flashlib.hf\n"
            "try:\n    flashlib.hf.register()\nexcept ImportError as error:\n    print(error)\n")
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert "pip install flashlib[hf]" in result.stdout


# ---------------------------------------------------------------- on a GPU, in 16 bits
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("padding", ("none", "right", "left"))
def test_gpu_half_precision_no_worse_than_sdpa(name, calls, monkeypatch, dtype, padding):
    """Logits and gradients in 16 bits, each against sdpa in float32 with the same weights: flashlib's error
    is at most twice sdpa's own in that dtype (plus one 16-bit ulp of slack, for errors that are tiny)."""
    pin_blocks(monkeypatch, [ops_module])
    config = transformers.LlamaConfig(**SIZES)
    exact, _ = twins(name, config)
    ref, ours = twins(name, config, dtype=dtype)
    ids, mask = batch(padding, n=40)
    results = [logits_and_grads(model, ids, mask) for model in (exact, ref, ours)]
    (exact_logits, exact_grads), (ref_logits, ref_grads), (logits, grads) = results
    slack = torch.finfo(dtype).eps
    assert relative_error(ref_logits, exact_logits) < 0.05, "sdpa in 16 bits is near float32: the weights are shared"
    assert_close(logits, exact_logits, 2 * relative_error(ref_logits, exact_logits) + slack, "logits")
    for key, grad in grads.items():
        assert_close(grad, exact_grads[key], 2 * relative_error(ref_grads[key], exact_grads[key]) + slack,
                     f"gradient of {key}")
    assert {call[0] for call in calls} == {PATHS[padding]}


@pytest.mark.gpu
@pytest.mark.parametrize("padding", ("left", "middle"))
def test_gpu_compiled_llama_with_padding_no_worse_than_sdpa(name, fresh_compiler, calls, monkeypatch, padding):
    """Inductor with fullgraph=True in bfloat16 (tokens moved to the front, then seq_lens): logits and gradients
    no further from float32 sdpa than twice bfloat16 sdpa's own error (plus one ulp)."""
    pin_blocks(monkeypatch, [ops_module])
    config = transformers.LlamaConfig(**SIZES)
    exact, _ = twins(name, config)
    ref, ours = twins(name, config, dtype=torch.bfloat16)
    ids, mask = batch(padding, n=40)
    ours.compile(fullgraph=True)
    results = [logits_and_grads(model, ids, mask) for model in (exact, ref, ours)]
    (exact_logits, exact_grads), (ref_logits, ref_grads), (logits, grads) = results
    slack = torch.finfo(torch.bfloat16).eps
    assert_close(logits, exact_logits, 2 * relative_error(ref_logits, exact_logits) + slack, "logits")
    for key, grad in grads.items():
        assert_close(grad, exact_grads[key], 2 * relative_error(ref_grads[key], exact_grads[key]) + slack,
                     f"gradient of {key}")
    assert {call[0] for call in calls} == {"seq_lens"}


@pytest.mark.gpu
def test_gpu_generate_with_a_static_cache_compiles_its_steps_and_matches_sdpa(name, fresh_compiler, calls):
    """On a GPU, Transformers' generate compiles a static cache's steps by itself (Inductor, CUDA graphs): each
    step one graph with flashlib in it, and the left-padded batch gets sdpa's greedy tokens (float32)."""
    ref, ours = twins(name, transformers.LlamaConfig(**SIZES))
    ids, mask = batch("left")
    options = {"attention_mask": mask, "max_new_tokens": 8, "min_new_tokens": 8, "do_sample": False,
               "pad_token_id": 0, "cache_implementation": "static"}
    expected = ref.generate(ids, **options)
    assert torch.equal(ours.generate(ids, **options), expected)
    assert {call[0] for call in calls if call[1] == 1} == {"kvcache"}


@pytest.mark.gpu
def test_gpu_eager_decoding_step_reads_nothing_on_the_host(name):
    """An eager decoding step with padding (a dynamic cache's step of generate) makes no host sync: CUDA's sync
    debug mode set to "error" raises at any, as the unpadding's nonzero and lengths would; the output matches the
    float64 reference of each row's tokens alone."""
    module, q, k, v = attention_inputs(n_q=1, n_k=64, seed=12)
    mask = torch.ones(2, 64, dtype=torch.bool, device=DEVICE)
    mask[0, :9] = False  # left padding
    mask[1, 20:23] = False  # between tokens
    expected = unpadded_reference(q, k, v, mask)
    hf.flashlib_attention_forward(module, q, k, v, mask)  # compiles the kernels
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = hf.flashlib_attention_forward(module, q, k, v, mask)[0]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert_close(out, expected, RTOL, "outputs")
