"""A sampled subset of the transformers zoo (hf_zoo.py) in CI; the whole sweep on demand.

Each case compiles one architecture in one mode with kiln and with torch.compile (counting backends, in
this test run) and asserts: kiln captures no more graphs than torch.compile, succeeds with fullgraph=True
wherever torch.compile does, computes what eager computes, and runs no frame eagerly. `HF_ZOO=all` runs
every architecture of hf_architectures.py (slow: hours on two cores), `HF_ZOO=bert,t5` some of them;
`python -m tests.e2e.hf_zoo --all` writes the table instead. kiln's default backend is checked on one
case here (its C++ build dominates the time); the sweep checks it on every case.
"""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("transformers")

import hf_zoo  # noqa: E402
from hf_architectures import ARCHITECTURES  # noqa: E402
from hf_zoo import MODES, run_case  # noqa: E402

from support.sweeps import full  # noqa: E402
from support.threads import one_torch_thread  # noqa: E402

# one decoder, one encoder-decoder (a config deep-copied in the forward), one vision model, one encoder
# whose forward builds an activation module through ACT2FN, one audio model whose training loss (CTC) breaks
# where torch.compile's does (a data-dependent size, a `torch.backends.cudnn.flags` block)
SAMPLE = ["qwen3", "t5", "vit", "deberta_v2", "wav2vec2"]
SELECTED = (list(ARCHITECTURES) if full("HF_ZOO", "all")
            else [n for n in os.environ.get("HF_ZOO", "").split(",") if n] or SAMPLE)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    with one_torch_thread():
        yield


# a case that falls back counts it in the result (kiln_fallbacks) and fails its assertion, so the sweep runs
# with KILN_STRICT=0: strict would raise inside the count instead of reporting what fell back
@pytest.mark.allows_fallback("frame: counted and asserted on by the harness itself")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", SELECTED)
def test_capture_at_least_as_good_as_torch_compile(name, mode):
    result = run_case(name, mode, checks=("capture",))
    assert "case" not in result.errors, result.errors
    assert result.capture_ok(), result


@pytest.mark.parametrize("name, mode", [("qwen3", "training")])
def test_default_backend_equals_eager(name, mode):
    result = run_case(name, mode, checks=("default",))
    assert result.kiln_default == "ok", result


def test_activation_module_built_in_forward_stays_in_the_graph():
    """`ACT2FN[name](x)` in a forward builds a parameterless module per call (transformers' activation table is
    an OrderedDict whose __getitem__ instantiates): built once at capture, it stays in the one graph."""
    import transformers.activations

    import kiln

    def forward(x):
        return transformers.activations.ACT2FN["gelu_new"](x) + transformers.activations.ACT2FN["silu"](x)

    x = torch.randn(4)
    compiled = kiln.compile(forward, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(x), forward(x))


@pytest.mark.parametrize("kiln_error, flagged", [(0.015, False), (5.0, True)], ids=["rounding", "wrong"])
def test_a_difference_float32_rounding_explains_is_not_reported(monkeypatch, kiln_error, flagged):
    """Against the float64 truth: eager's float32 gradient is 1e-3 off, kiln's either 15 times that
    (an ill-conditioned batch norm: rounding) or half the largest value (a wrong gradient)."""
    truth = torch.tensor([10.0, -4.0, 0.5], dtype=torch.float64)
    eager = ({}, {"w": (truth + 1e-3).float()})
    kiln_result = ({}, {"w": (truth + torch.tensor([0.0, kiln_error, 0.0], dtype=torch.float64)).float()})
    monkeypatch.setattr(hf_zoo, "_float64_step", lambda name, mode: ({}, {"w": truth}))
    wrong = hf_zoo.differences(kiln_result, eager)
    assert wrong == ["grad w"]
    assert hf_zoo.beyond_rounding("any", "training", kiln_result, eager, wrong) == (["grad w"] if flagged else [])


@pytest.mark.parametrize("torch_correct, equal, passes", [(False, True, True), (False, False, False),
                                                          (True, None, False), (None, None, False)])
def test_a_model_that_traces_another_path_passes_only_where_kiln_equals_torch_compile(torch_correct, equal, passes):
    """transformers 5.17's UMT5 decoder attends causally when traced (`is_tracing()` builds a causal mask) and
    not when run eagerly: kiln and torch.compile return the same values, both unlike eager's. Such a case passes
    only where torch.compile's values differ from eager's too and kiln's equal torch.compile's."""
    result = hf_zoo.CaseResult("umt5", "inference", torch_graphs=4, kiln_graphs=1, torch_fullgraph=False,
                               kiln_fullgraph=True, kiln_capture_correct=False,
                               torch_capture_correct=torch_correct, kiln_equals_torch=equal)
    assert result.capture_ok() is passes


class _CausalWhenTraced(torch.nn.Module):
    """Like transformers 5.17's UMT5 decoder: a causal mask only when traced (`is_compiling()`)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        scores = self.proj(x) @ x.transpose(-1, -2)
        if torch.compiler.is_compiling():
            scores = scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf"))
        return scores.softmax(-1) @ x


@pytest.mark.parametrize("traced_path", [True, False], ids=["listed", "not_listed"])
def test_the_default_backend_of_a_model_tracing_another_path_is_compared_with_torch_compile(monkeypatch,
                                                                                            traced_path):
    """A model listed in TRACED_PATH passes where kiln computes what torch.compile's capture computes; one not
    listed is compared with eager, and the other path is a difference."""
    class Toy:
        kind = "toy"
        build = staticmethod(_CausalWhenTraced)

    monkeypatch.setitem(hf_zoo.ARCHITECTURES, "toy", Toy)
    monkeypatch.setitem(hf_zoo.INPUTS, "toy", lambda model, generator, training: {
        "x": torch.randn(2, 5, 4, generator=generator)})
    if traced_path:
        monkeypatch.setitem(hf_zoo.TRACED_PATH, "toy", "masks only when traced")
    result = run_case("toy", "inference", checks=("default",))
    assert result.default_reference == ("torch.compile" if traced_path else "eager")
    assert (result.kiln_default == "ok") is traced_path, result
