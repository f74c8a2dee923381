"""The autotuner (kiln/runtime/autotune.py) and mode="max-autotune" / "max-autotune-no-cudagraphs".

Generated Triton kernels run on `DEVICE` (tests/support/triton_device.py): on the CPU through Triton's
interpreter (TRITON_INTERPRET=1, KILN_CPU_BACKEND=triton), where timings mean nothing but the
mechanism is the same, or on the GPU under KILN_TRITON_TEST_DEVICE=cuda. Either way every
candidate runs, the fastest by the timer is kept, the decision is written to the cache and read
back by the next compile. Deterministic timers are passed as parameters (`Autotuned(timer=...)`,
`load_kernels(timer=...)`).
"""
from __future__ import annotations

import io
import itertools
import json
import logging

import pytest
import torch

import kiln
from kiln.config import MODES, OPTIONS, validate_options
from kiln.runtime import autotune
from support.triton_device import DEVICE, skip_unless_kernels_run


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_CPU_BACKEND", "triton")
    # `stats` accumulates over the process (like kiln.runtime.cache.stats): tests read differences


def fixed_timer(times: dict, calls: list):
    """A timer giving `times[label]` ms and running each candidate once; `calls` records the labels timed."""
    def timer(label, run):
        calls.append(label)
        run()
        return times[label]
    return timer


def counting(results: list, value):
    def fn(*args):
        results.append(value)
    return fn


# ----------------------------------------------------------------------------- Autotuned itself


def test_winner_is_the_fastest_by_the_given_timings():
    ran = []
    calls = []
    tuned = autotune.Autotuned("k", "src", {"a": counting(ran, "a"), "b": counting(ran, "b"), "c": counting(ran, "c")},
                               num_tensors=1, timer=fixed_timer({"a": 3.0, "b": 1.0, "c": 2.0}, calls))
    x = torch.zeros(4)
    tuned(x, 7)
    assert calls == ["a", "b", "c"]
    assert tuned.decisions[(7,)]["winner"] == "b"
    assert ran[-1] == "b"  # the call itself ran the winner
    ran.clear()
    tuned(x, 7)
    assert ran == ["b"] and calls == ["a", "b", "c"]  # decided once per size set


def test_a_single_candidate_is_not_benchmarked():
    calls = []
    tuned = autotune.Autotuned("k", "src", {"only": counting([], 0)}, 0, timer=fixed_timer({"only": 1.0}, calls))
    tuned()
    assert calls == [] and tuned.decisions == {}


def test_ties_keep_the_first_candidate_and_failures_are_never_chosen():
    def broken(*args):
        raise RuntimeError("out of shared memory")

    calls = []
    tuned = autotune.Autotuned("k", "src", {"default": counting([], 0), "broken": broken, "same": counting([], 1)},
                               num_tensors=0, timer=lambda label, run: (calls.append(label), run(), 1.0)[2])
    tuned()
    assert tuned.decisions[()]["winner"] == "default"
    assert tuned.decisions[()]["timings"]["broken"] == float("inf")
    with pytest.raises(RuntimeError, match="every candidate failed"):
        autotune.pick({"x": float("inf")})


def test_decision_is_cached_on_disk_and_read_back_without_benchmarking(tmp_path):
    calls = []
    timer = fixed_timer({"a": 2.0, "b": 1.0}, calls)
    x = torch.zeros(2, 3)
    first = autotune.Autotuned("k", "source-hash", {"a": counting([], 0), "b": counting([], 1)}, 1, timer=timer)
    first(x)
    files = list((tmp_path / "autotune").rglob("*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert data["winner"] == "b" and data["kernel"] == "k" and data["timings_ms"] == {"a": 2.0, "b": 1.0}
    assert data["args"] == [[[2, 3], [3, 1], "float32"]]
    before = dict(autotune.stats)
    second = autotune.Autotuned("k", "source-hash", {"a": counting([], 0), "b": counting([], 1)}, 1, timer=timer)
    second(x)
    assert calls == ["a", "b"]  # no timing the second time
    assert second.decisions[()] == {"winner": "b", "timings": None, "source": "disk"}
    assert autotune.stats["disk_hits"] == before["disk_hits"] + 1 and autotune.stats["tunings"] == before["tunings"]
    # another source, other sizes or another dtype: another decision
    third = autotune.Autotuned("k", "other-source", {"a": counting([], 0), "b": counting([], 1)}, 1, timer=timer)
    third(x)
    fourth = autotune.Autotuned("k", "source-hash", {"a": counting([], 0), "b": counting([], 1)}, 1, timer=timer)
    fourth(torch.zeros(2, 3, dtype=torch.float64))
    assert calls == ["a", "b"] * 3
    assert len(list((tmp_path / "autotune").rglob("*.json"))) == 3


def test_log_names_kernel_candidates_winner_and_time(caplog):
    tuned = autotune.Autotuned("fused_relu_3", "h", {"XBLOCK=64": counting([], 0), "XBLOCK=128": counting([], 1)}, 0,
                               timer=fixed_timer({"XBLOCK=64": 0.5, "XBLOCK=128": 0.25}, []))
    with caplog.at_level(logging.INFO, logger="kiln.autotune"):
        tuned()
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "kiln.autotune")
    assert "fused_relu_3" in text and "2 candidates" in text and "XBLOCK=64 0.5000 ms" in text
    assert "winner XBLOCK=128 (0.2500 ms" in text


def test_progress_bar_on_a_terminal(monkeypatch):
    pytest.importorskip("tqdm")

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    monkeypatch.setattr("sys.stderr", out)
    monkeypatch.setattr(kiln.config, "progress_delay", 0.0)
    autotune.benchmark("kernel7", {"a": counting([], 0), "b": counting([], 1)}, (), lambda label, run: 1.0)
    assert "kiln autotune kernel7" in out.getvalue()


# ----------------------------------------------------------------------------- options and modes


def test_options_and_modes_are_listed_and_validated():
    for name in ("max_autotune", "epilogue_fusion", "shape_padding"):
        assert name in kiln.list_options() and name in OPTIONS
    modes = kiln.list_mode_options()
    assert modes["max-autotune"] == {"max_autotune": True, "triton.cudagraphs": True}
    assert modes["max-autotune-no-cudagraphs"] == {"max_autotune": True}
    assert OPTIONS["shape_padding"].default is True  # as in torch
    assert kiln.list_mode_options("max-autotune")["triton.cudagraphs"] is True
    resolved = validate_options("max-autotune-no-cudagraphs", {"epilogue_fusion": False})
    assert resolved.max_autotune and not resolved.epilogue_fusion and not resolved.triton_cudagraphs
    assert validate_options(None, None).max_autotune is False
    with pytest.raises(ValueError, match="unknown option 'max_autotun'.*max_autotune"):
        validate_options(None, {"max_autotun": True})
    with pytest.raises(ValueError, match="known modes: .*max-autotune-no-cudagraphs"):
        validate_options("max-autotune-everything", None)
    with pytest.raises(TypeError):
        validate_options(None, {"shape_padding": 1})
    assert set(MODES) >= {"default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"}


# ----------------------------------------------------------------------------- compiled graphs


def workload(x, w, b):
    h = torch.nn.functional.linear(x, w, b).relu()
    return h.softmax(-1), (x * x).sum(0)


def inputs():
    """The workload's inputs on the device the kernels run on (tests/support/triton_device.py)."""
    torch.manual_seed(0)
    return tuple(t.to(DEVICE) for t in (torch.randn(6, 20), torch.randn(12, 20), torch.randn(12)))


@pytest.mark.parametrize("mode", ["default", "max-autotune-no-cudagraphs", "max-autotune"])
def test_kiln_compile_equals_eager_under_each_mode(mode):
    skip_unless_kernels_run()
    from kiln.codegen import triton as triton_target

    kiln.reset()
    triton_target._loaded.clear()  # no decision held by a kernel module another test loaded
    args = inputs()
    before = dict(autotune.stats)
    compiled = kiln.compile(workload, mode=mode)
    with torch.no_grad():
        got = compiled(*args)
        ref = workload(*args)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, atol=2e-5, rtol=2e-5)
    tuned = autotune.stats["tunings"] - before["tunings"]
    assert (tuned > 0) == (mode != "default")


def test_second_compile_reads_the_decisions_back(tmp_path):
    """The cache files are written by the first compile; a new process (no kernel module loaded yet)
    compiling the same graph benchmarks nothing."""
    skip_unless_kernels_run()
    from kiln.codegen import triton as triton_target
    from kiln.pipeline import compile_aten_graph
    from support.lowering import trace

    args = inputs()
    options = validate_options("max-autotune-no-cudagraphs", {"cpu_backend": "triton"})
    gm = trace(workload, *args)
    triton_target._loaded.clear()
    before = dict(autotune.stats)
    compiled = compile_aten_graph(gm, list(args), options)
    assert "fallback" not in compiled.artefacts, compiled.artefacts.get("fallback")
    compiled(*args)
    tunings = autotune.stats["tunings"] - before["tunings"]
    assert tunings >= 3  # the kernels with a choice to make (the matmul template group included)
    files = list((tmp_path / "autotune").rglob("*.json"))
    assert len(files) == tunings
    winners = {json.loads(f.read_text())["kernel"]: json.loads(f.read_text())["winner"] for f in files}
    assert set(winners) <= set(compiled.artefacts["kernel_names"]) and len(winners) == tunings
    assert any(w == "aten" or w.startswith("template") for w in winners.values())

    triton_target._loaded.clear()  # what a second process starts with
    before = dict(autotune.stats)
    again = compile_aten_graph(trace(workload, *args), list(args), options)
    for g, r in zip(again(*args), workload(*args)):
        torch.testing.assert_close(g, r, atol=2e-5, rtol=2e-5)
    assert autotune.stats["tunings"] == before["tunings"]
    assert autotune.stats["timings"] == before["timings"]
    assert autotune.stats["disk_hits"] - before["disk_hits"] == tunings


def test_injected_timer_picks_the_fastest_generated_config():
    """Through `load_kernels(timer=...)`: for each kernel the candidate the timer calls fastest (here the
    last one listed) is the one kept, and the graph still equals eager with it."""
    skip_unless_kernels_run()
    from codegen.test_mm_template import build

    args = list(inputs())
    timed = itertools.count()

    def last_is_fastest(label, run):
        """Each candidate timed faster than the one before (labels repeat across kernels: count calls)."""
        run()
        return 100.0 - next(timed)

    options = validate_options("max-autotune-no-cudagraphs", {"cpu_backend": "triton"})
    from kiln.codegen import triton as triton_target

    triton_target._loaded.clear()
    call, sched, ns, source = build(workload, args, options, last_is_fastest)
    for g, r in zip(call(*args), workload(*args)):
        torch.testing.assert_close(g, r, atol=2e-5, rtol=2e-5)
    chosen = 0
    for group in sched.kernels():
        tuned = ns[group.name]
        labels = list(tuned.candidates)
        if len(labels) > 1:
            assert tuned.decisions[()]["winner"] == labels[-1], (group.name, labels)
            chosen += 1
    assert chosen >= 3


@pytest.mark.skipif(not torch.cuda.is_available() or DEVICE != "cuda",
                    reason="needs a CUDA device (KILN_TRITON_TEST_DEVICE=cuda)")
def test_max_autotune_with_cuda_graphs_on_gpu():
    kiln.reset()
    args = [a.half() for a in inputs()]
    compiled = kiln.compile(workload, mode="max-autotune")
    with torch.no_grad():
        for _ in range(3):  # warm-up (autotunes), record, replay
            got = compiled(*args)
        ref = workload(*args)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, atol=2e-2, rtol=2e-2)
