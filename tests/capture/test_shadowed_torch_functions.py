"""Graph nodes whose target FX would print under another object's name.

FX prints a function of a `torch*` module by its qualified name. `torch.functional` wraps `_VF` builtins
under their own names (`torch.broadcast_tensors(*tensors)` calls `_VF.broadcast_tensors(tensors)`): a
graph node calling the builtin printed as `torch.broadcast_tensors` and ran the wrapper, with the tuple
as its first tensor. Called through `*args`, capture inlines the wrapper and records the builtin, so
each case here calls through `*args`, as OpInfo-style code does.
"""
from __future__ import annotations

import pytest
import torch

import kiln

CASES = {
    "broadcast_tensors": (torch.broadcast_tensors, lambda: (torch.randn(3, 1), torch.randn(1, 4), torch.randn(4))),
    "meshgrid": (lambda *t: torch.meshgrid(*t, indexing="ij"), lambda: (torch.randn(3), torch.randn(4))),
    "einsum": (lambda *t: torch.einsum("ij,jk->ik", *t), lambda: (torch.randn(3, 4), torch.randn(4, 2))),
    "cdist": (torch.cdist, lambda: (torch.randn(2, 3, 4), torch.randn(2, 5, 4))),
    "tensordot": (lambda *t: torch.tensordot(*t, dims=1), lambda: (torch.randn(3, 4), torch.randn(4, 2))),
    "cartesian_prod": (torch.cartesian_prod, lambda: (torch.randn(3), torch.randn(2))),
    "norm_fro": (lambda *t: torch.norm(*t, p="fro", dim=(0, 1)), lambda: (torch.randn(3, 4),)),
    "split_sizes": (lambda *t: torch.split(*t, [1, 2]), lambda: (torch.randn(3, 4),)),
}


@pytest.mark.parametrize("name", CASES)
def test_functions_called_through_star_args_run_the_op_eager_runs(name):
    op, make = CASES[name]

    def fn(x, args):
        return op(x, *args)

    inputs = make()
    ref = fn(inputs[0], inputs[1:])
    got = kiln.compile(fn, dynamic=False, fullgraph=True)(inputs[0], inputs[1:])
    torch.testing.assert_close(got, ref)


def test_a_builtin_shadowed_in_torch_is_called_by_object():
    from kiln.capture.graph import printable_target

    builtin = torch._C._VariableFunctions.broadcast_tensors
    assert torch.broadcast_tensors is not builtin  # torch.functional's wrapper takes *tensors
    wrapped = printable_target(builtin)
    assert wrapped is not builtin and wrapped((torch.ones(2, 1), torch.ones(3)))[0].shape == (2, 3)
    assert printable_target(torch.add) is torch.add  # its printed name is itself


@torch.library.custom_op("kilntest_capture::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


twice.register_fake(lambda x: torch.empty_like(x))


def test_a_custom_op_definition_is_recorded_as_its_operator():
    """`torch.library.custom_op` returns a definition object whose call runs the operator: the graph calls the
    operator itself, by the name the later stages and the compile cache know it by."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.randn(3)
    torch.testing.assert_close(kiln.compile(lambda t: twice(t) + 1, backend=backend, fullgraph=True)(x), x * 2 + 1)
    (gm,) = graphs
    assert torch.ops.kilntest_capture.twice.default in {n.target for n in gm.graph.nodes}
    assert "torch.ops.kilntest_capture.twice.default" in gm.code
