"""Real model code captured whole: tiny randomly initialised Hugging Face models.

Each model is built from a config (no network, random weights), compiled with
`kiln.compile(model, backend="eager", fullgraph=True)` and compared with eager:
inference outputs (logits, loss), a second call with fresh inputs of the same
shapes (which must not recompile: one capture record), and in training mode a
forward+backward whose parameter gradients must match eager's. Beyond GPT-2, BERT
and Llama with default (SDPA) and eager attention: padding masks, return_dict=False,
a config written by forward, KV-cache decoding, dropout under one seed, the
output-capturing hooks, the aot_eager backend, and a few more architectures.
Known gap (a graph break, so fullgraph=True raises; fullgraph=False runs correctly):
the first call with output_hidden_states/output_attentions installs hooks under a
threading.Lock. The whole zoo (every architecture, against torch.compile) is hf_zoo.py.
"""
from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from support.capture import CountingBackend
from support.threads import one_torch_thread

transformers = pytest.importorskip("transformers")

import kiln  # noqa: E402
from kiln.api import context_of  # noqa: E402

VOCAB, BATCH, SEQ = 128, 2, 8


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matmuls (support/threads.py)."""
    with one_torch_thread():
        yield


def gpt2(**overrides):
    options = dict(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                   attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**options, **overrides}))


def _bert_config(**overrides):
    options = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, vocab_size=VOCAB,
                   max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertConfig(**{**options, **overrides})


def bert(**overrides):
    return transformers.BertModel(_bert_config(**overrides))


def bert_cls(**overrides):
    # problem_type set up front: left None, the first forward sets it on the config, and the
    # next call recompiles on that changed attribute (see test_config_written_by_forward)
    overrides.setdefault("problem_type", "single_label_classification")
    return transformers.BertForSequenceClassification(_bert_config(num_labels=3, **overrides))


def llama(**overrides):
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64,
                                   bos_token_id=0, eos_token_id=0, pad_token_id=0, **overrides)
    return transformers.LlamaForCausalLM(cfg)


def ids(generator):
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)


def lm_inputs(g, labels=False):
    x = ids(g)
    return {"input_ids": x, "labels": ids(g)} if labels else {"input_ids": x}


def bert_inputs(g, labels=False):
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, SEQ - 3:] = 0  # padding in the second row: the mask matters
    out = {"input_ids": ids(g), "attention_mask": mask, "token_type_ids": torch.zeros(BATCH, SEQ, dtype=torch.long)}
    if labels:
        out["labels"] = torch.randint(0, 3, (BATCH,), generator=g)
    return out


def _tensors(out) -> dict[str, torch.Tensor]:
    """The tensor fields of a ModelOutput (or tuple), by name."""
    items = out.items() if hasattr(out, "items") else enumerate(out)
    return {str(k): v for k, v in items if isinstance(v, torch.Tensor)}


def assert_outputs_close(actual, expected, atol=1e-5, rtol=1e-4):
    assert type(actual) is type(expected)
    a, e = _tensors(actual), _tensors(expected)
    assert a.keys() == e.keys()
    for k in e:
        torch.testing.assert_close(a[k], e[k], atol=atol, rtol=rtol, msg=f"output {k!r} differs")


def compile_strict(model):
    """fullgraph=True: the first graph break is an error naming its reason and line."""
    return kiln.compile(model, backend="eager", fullgraph=True)


@contextlib.contextmanager
def _no_capture_failure():
    """A capture that fails outright warns and runs eagerly (never breaking the user's program); here it is an error."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="kiln: ")
        yield


CASES = {
    "gpt2": (gpt2, lm_inputs, False),
    "gpt2_loss": (gpt2, lm_inputs, True),
    "gpt2_no_cache": (lambda: gpt2(use_cache=False), lm_inputs, False),
    "bert": (bert, bert_inputs, False),
    "bert_cls": (bert_cls, bert_inputs, True),
    "llama": (llama, lm_inputs, False),
    "llama_loss": (llama, lm_inputs, True),
    # the eager attention paths (and the AttentionInterface lookup through Mapping.get's try/except)
    "gpt2_eager_attention": (lambda: gpt2(attn_implementation="eager"), lm_inputs, False),
    "bert_eager_attention": (lambda: bert(attn_implementation="eager"), bert_inputs, False),
    "llama_eager_attention": (lambda: llama(attn_implementation="eager"), lm_inputs, True),
    # left padding: the causal+padding mask is built inside the graph
    "gpt2_padded": (gpt2, lambda g, labels: padded_lm_inputs(g), False),
    "llama_padded": (llama, lambda g, labels: padded_lm_inputs(g), False),
}


def padded_lm_inputs(g):
    mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    mask[1, :3] = 0
    return {"input_ids": ids(g), "attention_mask": mask}


@pytest.mark.parametrize("name", list(CASES))
def test_inference_matches_eager_one_graph(name):
    make, inputs, labels = CASES[name]
    torch.manual_seed(0)
    model = make().eval()
    compiled = compile_strict(model)
    g = torch.Generator().manual_seed(1)
    with _no_capture_failure(), torch.no_grad():
        for _ in range(2):  # the second call has fresh inputs of the same shapes: no recompile
            kwargs = inputs(g, labels)
            assert_outputs_close(compiled(**kwargs), model(**kwargs))
    records = context_of(compiled).records
    assert len(records) == 1, [r.recompile_reason for r in records]
    assert records[0].graph_break is None and records[0].op_count > 0


TRAIN_CASES = ["gpt2_loss", "bert_cls", "llama_loss"]


@pytest.mark.parametrize("name", TRAIN_CASES)
def test_training_gradients_match_eager(name):
    make, inputs, labels = CASES[name]
    torch.manual_seed(0)
    model = make().train()
    compiled = compile_strict(model)
    g = torch.Generator().manual_seed(2)
    with _no_capture_failure():
        for _ in range(2):
            kwargs = inputs(g, labels)
            model.zero_grad(set_to_none=True)
            expected = model(**kwargs)
            expected.loss.backward()
            expected_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
            model.zero_grad(set_to_none=True)
            actual = compiled(**kwargs)
            actual.loss.backward()
            actual_grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
            assert_outputs_close(actual, expected)
            assert actual_grads.keys() == expected_grads.keys() and expected_grads
            for n in expected_grads:
                torch.testing.assert_close(actual_grads[n], expected_grads[n], atol=1e-5, rtol=1e-4,
                                           msg=f"gradient of {n} differs")
    assert len(context_of(compiled).records) == 1


def test_return_dict_false_gives_tuple():
    torch.manual_seed(0)
    model = gpt2().eval()
    compiled = compile_strict(model)
    g = torch.Generator().manual_seed(3)
    x = ids(g)
    with _no_capture_failure(), torch.no_grad():
        out, ref = compiled(x, return_dict=False), model(x, return_dict=False)
    assert isinstance(out, tuple)
    torch.testing.assert_close(out[0], ref[0])


def test_config_written_by_forward():
    """BertForSequenceClassification sets config.problem_type on its first call (through the config's
    validating __setattr__): the store is replayed after the graph, and the next call recompiles on it."""
    torch.manual_seed(0)
    model = bert_cls(problem_type=None).eval()
    compiled = compile_strict(model)
    g = torch.Generator().manual_seed(4)
    with _no_capture_failure(), torch.no_grad():
        kwargs = bert_inputs(g, labels=True)
        out = compiled(**kwargs)
        assert model.config.problem_type == "single_label_classification"
        assert_outputs_close(out, model(**kwargs))
        kwargs = bert_inputs(g, labels=True)
        assert_outputs_close(compiled(**kwargs), model(**kwargs))
    records = context_of(compiled).records
    assert len(records) == 2 and "problem_type" in records[1].recompile_reason


@pytest.mark.parametrize("make", [gpt2, llama], ids=["gpt2", "llama"])
def test_decoding_with_a_kv_cache(make):
    """The prompt's DynamicCache (built in the graph, rebuilt by the output program) is fed back in; the
    cache's in-place growth is replayed on the user's object. Step 2 recompiles (new kwarg, new sizes,
    marked dynamic); step 3 reuses that entry."""
    torch.manual_seed(0)
    model = make().eval()
    compiled = compile_strict(model)
    g = torch.Generator().manual_seed(5)
    x = ids(g)
    with _no_capture_failure(), torch.no_grad():
        out, ref = compiled(input_ids=x), model(input_ids=x)
        assert_outputs_close(out, ref)
        cache, ref_cache = out.past_key_values, ref.past_key_values
        assert type(cache) is type(ref_cache)
        for step in range(3):
            token = ids(g)[:, :1]
            assert_outputs_close(compiled(input_ids=token, past_key_values=cache),
                                 model(input_ids=token, past_key_values=ref_cache))
            assert cache.get_seq_length() == ref_cache.get_seq_length() == SEQ + step + 1
    records = context_of(compiled).records
    assert len(records) == 3 and all(r.graph_break is None for r in records)


DROPOUT_CASES = {
    "gpt2": (lambda: gpt2(resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1), lambda g: lm_inputs(g, True)),
    "bert_cls": (lambda: bert_cls(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1),
                 lambda g: bert_inputs(g, True)),
    "llama": (lambda: llama(attention_dropout=0.1), lambda g: lm_inputs(g, True)),
}


@pytest.mark.parametrize("name", list(DROPOUT_CASES))
def test_training_with_dropout_draws_the_same_random_numbers(name):
    """Dropout p=0.1 in training: the graph's random ops run in eager's order, so one seed gives one answer."""
    make, inputs = DROPOUT_CASES[name]
    torch.manual_seed(0)
    model = make().train()
    compiled = compile_strict(model)
    g = torch.Generator().manual_seed(6)
    with _no_capture_failure():
        kwargs = inputs(g)
        torch.manual_seed(7)
        actual = compiled(**kwargs)
        actual.loss.backward()
        actual_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad(set_to_none=True)
        torch.manual_seed(7)
        expected = model(**kwargs)
        expected.loss.backward()
    assert_outputs_close(actual, expected)
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(actual_grads[n], p.grad, atol=1e-5, rtol=1e-4, msg=f"gradient of {n} differs")
    assert len(context_of(compiled).records) == 1


@pytest.mark.parametrize("flag", ["output_hidden_states", "output_attentions"])
@pytest.mark.parametrize("name", ["gpt2", "bert", "llama"])
def test_output_capturing_hooks(name, flag):
    """An eager call with output_hidden_states/attentions installs transformers' capturing hooks on the
    layers; the compiled model inlines them (hidden states collected in the graph, set on the output
    after construction, in eager's key order), with and without the flag."""
    # SDPA returns no attention weights: output_attentions runs on the eager-attention variant
    make, inputs, _ = CASES[name if flag == "output_hidden_states" else f"{name}_eager_attention"]
    torch.manual_seed(0)
    model = make().eval()
    g = torch.Generator().manual_seed(8)
    with torch.no_grad():
        model(**inputs(g, False), **{flag: True})  # installs the hooks (under a lock kiln does not trace)
    compiled = compile_strict(model)
    with _no_capture_failure(), torch.no_grad():
        for on in (True, False, True):
            kwargs = {**inputs(g, False), flag: on}
            actual, expected = compiled(**kwargs), model(**kwargs)
            assert list(actual.keys()) == list(expected.keys())
            for a, e in zip(actual.to_tuple(), expected.to_tuple()):
                if isinstance(e, tuple):
                    assert len(a) == len(e)
                    for x, y in zip(a, e):
                        torch.testing.assert_close(x, y)
                elif isinstance(e, torch.Tensor):
                    torch.testing.assert_close(a, e)
            if on:
                captured = getattr(actual, flag.removeprefix("output_"))
                assert len(captured) == model.config.num_hidden_layers + (flag == "output_hidden_states")
    assert len(context_of(compiled).records) == 2  # one per value of the flag


@pytest.mark.parametrize("name", TRAIN_CASES)
def test_training_through_aot_eager(name):
    """The captured graphs also go through kiln's AOT autograd (joint graph, partition) and match eager."""
    make, inputs, labels = CASES[name]
    torch.manual_seed(0)
    model = make().train()
    compiled = kiln.compile(model, backend="aot_eager", fullgraph=True)
    kwargs = inputs(torch.Generator().manual_seed(9), labels)
    with _no_capture_failure():
        actual = compiled(**kwargs)
        actual.loss.backward()
    actual_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    expected = model(**kwargs)
    expected.loss.backward()
    assert_outputs_close(actual, expected)
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(actual_grads[n], p.grad, atol=1e-5, rtol=1e-4, msg=f"gradient of {n} differs")


def _decoder_options():
    return dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64, pad_token_id=0, bos_token_id=0,
                eos_token_id=0)


def _lm_with_labels(g):
    return {"input_ids": ids(g), "labels": ids(g)}


MORE_ARCHITECTURES = {
    "bert_masked_lm": (lambda: transformers.BertForMaskedLM(_bert_config()),
                       lambda g: {**bert_inputs(g), "labels": ids(g)}),
    "mistral_sliding_window": (lambda: transformers.MistralForCausalLM(
        transformers.MistralConfig(**_decoder_options(), sliding_window=4)), _lm_with_labels),
    "qwen2": (lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**_decoder_options())), _lm_with_labels),
    "gemma": (lambda: transformers.GemmaForCausalLM(transformers.GemmaConfig(**_decoder_options(), head_dim=16)),
              _lm_with_labels),
    "t5_no_cache": (lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
        d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=VOCAB, d_kv=16, decoder_start_token_id=0,
        pad_token_id=0, use_cache=False)), _lm_with_labels),
    # with a cache, EncoderDecoderCache(config=...) deep-copies the config inside the graph
    "t5_cache": (lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
        d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=VOCAB, d_kv=16, decoder_start_token_id=0,
        pad_token_id=0, use_cache=True)), lambda g: {"input_ids": ids(g), "decoder_input_ids": ids(g)}),
    "vit": (lambda: transformers.ViTForImageClassification(transformers.ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, image_size=32,
        patch_size=8, num_labels=3, problem_type="single_label_classification")),
            lambda g: {"pixel_values": torch.randn(2, 3, 32, 32, generator=g), "labels": torch.tensor([0, 2])}),
}


@pytest.mark.parametrize("name", list(MORE_ARCHITECTURES))
def test_more_architectures_inference(name):
    make, inputs = MORE_ARCHITECTURES[name]
    torch.manual_seed(0)
    model = make().eval()
    compiled = compile_strict(model)
    g = torch.Generator().manual_seed(10)
    with _no_capture_failure(), torch.no_grad():
        for _ in range(2):
            kwargs = inputs(g)
            assert_outputs_close(compiled(**kwargs), model(**kwargs))
    assert len(context_of(compiled).records) == 1


@pytest.mark.allows_fallback("graph_break: OPT's layer drop branches on a random draw inside a try block")
def test_opt_layer_drop_compiles_its_layers_once_for_all():
    """OPT's decoder draws per layer whether to drop it (a data-dependent branch inside transformers' try block):
    the decoder frame runs eagerly and its six layers are compiled from there. A layer is guarded by its class, so
    the six share one entry, as under torch.compile (whose graph count is measured here); each computes with its
    own weights (loss and gradients as eager, under one seed per step)."""
    config = transformers.OPTConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=6, ffn_dim=64,
                                    num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=32,
                                    layerdrop=0.3, use_cache=False)
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    counts = {}
    for name, compile_ in (("torch", torch.compile), ("kiln", kiln.compile)):
        torch.manual_seed(0)
        model, reference = transformers.OPTForCausalLM(config).train(), transformers.OPTForCausalLM(config).train()
        reference.load_state_dict(model.state_dict())
        torch._dynamo.reset()
        backend = CountingBackend()
        compiled = compile_(model, backend=backend)
        for step in range(3):
            torch.manual_seed(step)
            loss = compiled(input_ids=x, labels=x).loss
            loss.backward()
            torch.manual_seed(step)
            expected = reference(input_ids=x, labels=x).loss
            expected.backward()
            torch.testing.assert_close(loss, expected)
        for (n, p), q in zip(model.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=f"gradient of {n} differs")
        counts[name] = backend.graphs
    assert counts["kiln"] <= counts["torch"], counts
