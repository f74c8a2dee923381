"""The `kiln.aot` log: joint, forward and backward graphs as code, and the partition decision."""
import logging

import torch
import torch.nn as nn

from support.autograd import compile_module


def test_aot_log_prints_graphs_and_partition(caplog):
    model = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 1))
    with caplog.at_level(logging.INFO, logger="kiln.aot"):
        compile_module(model, [torch.randn(2, 4)], name="mlp")
    text = "\n".join(r.getMessage() for r in caplog.records if r.name == "kiln.aot")
    for title in ("mlp joint graph", "mlp forward graph", "mlp backward graph"):
        assert title in text
    assert "torch.ops.aten.addmm.default" in text and "def forward(self" in text
    assert "mlp partition, min_cut: save" in text and "naive save-all" in text and "bytes" in text


def test_aot_log_silent_by_default(caplog):
    with caplog.at_level(logging.WARNING, logger="kiln.aot"):
        compile_module(nn.Linear(2, 2), [torch.randn(1, 2)])
    assert not [r for r in caplog.records if r.name == "kiln.aot"]
