"""The decomposition tables tracing applies: the caller's, over functionalization's."""
import torch

from kiln.autograd.decompositions import FUNCTIONALIZATION, core_aten, tracing_table

from .helpers import run_as_is, train_and_compare
from .test_aot import Block

aten = torch.ops.aten


def test_tracing_table_always_holds_functionalization_decompositions():
    assert aten.native_batch_norm.default in tracing_table(None, training=False)
    table = tracing_table({aten.gelu.default: lambda x: x}, training=True)
    assert set(FUNCTIONALIZATION) <= set(table) and aten.gelu.default in table


def test_training_keeps_fused_attention_whose_decomposition_breaks_its_backward():
    sdpa_cpu = aten._scaled_dot_product_flash_attention_for_cpu.default
    assert sdpa_cpu in core_aten() and sdpa_cpu in tracing_table(core_aten(), training=False)
    assert sdpa_cpu not in tracing_table(core_aten(), training=True)


def test_core_aten_decomposition_trains_like_eager_and_decomposes_backward_ops():
    run_as_is.graphs.clear()
    train_and_compare(Block, lambda: [torch.randn(2, 5, 16)], lambda out: out.pow(2).mean(),
                      compile_kwargs={"decompositions": core_aten()})
    targets = {n.target for gm, _ in run_as_is.graphs for n in gm.graph.nodes if n.op == "call_function"}
    assert aten.native_layer_norm_backward.default not in targets and aten.t.default not in targets
    assert aten.native_layer_norm.default in targets  # a core op: kept
