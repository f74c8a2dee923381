"""A compiled region is one named range in torch.profiler traces; off the profiler nothing is recorded."""
from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

import kiln
from kiln.api import context_of
from kiln.capture import entry


def double_sin(x):
    return torch.sin(x) * 2


def test_compiled_region_is_one_named_range_with_its_graph_id(tmp_path):
    compiled = kiln.compile(double_sin)
    x = torch.randn(16)
    compiled(x)  # compile outside the trace
    gid = context_of(compiled).records[0].id
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            compiled(x)
    names = [e.name for e in prof.events()]
    assert names.count(f"kiln: double_sin (graph {gid})") == 2
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    assert f"kiln: double_sin (graph {gid})" in trace.read_text()


def test_hot_path_counts_nothing_without_profiler_or_kiln_run():
    compiled = kiln.compile(double_sin, backend="eager")
    x = torch.randn(4)
    assert not entry.instrumentation.timing
    for _ in range(3):
        compiled(x)
    record = context_of(compiled).records[0]
    assert record.calls == 0 and context_of(compiled).run_seconds == 0.0
    entry.instrumentation.timing = True
    try:
        compiled(x)
    finally:
        entry.instrumentation.timing = False
    assert record.calls == 1 and record.run_seconds > 0


def test_generated_kernels_are_ranges_named_by_what_they_fuse():
    compiled = kiln.compile(lambda x: (x.sin() * 2).softmax(-1))
    x = torch.randn(8, 16)
    compiled(x)
    gid = context_of(compiled).records[0].id
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        compiled(x)
    names = [e.name for e in prof.events()]
    assert f"kiln: graph{gid}/inference" in names  # the ATen graph behind the region
    assert any(n.startswith("fused_sin_max_exp_sum") for n in names), names
