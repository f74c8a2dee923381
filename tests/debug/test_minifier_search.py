"""The minifier's reductions and search on small graphs, with backends that fail on purpose (no code generated)."""
from __future__ import annotations

import operator

import torch
import torch.fx

from kiln.debug.minifier import delta
from kiln.debug.minifier.check import ACCURACY, CRASH, OK, Checker
from kiln.debug.minifier.graphs import Case, lifted


def chain(x, y):
    a = torch.sin(x) + y
    b = torch.tanh(a) * 2
    c = torch.cos(b).sum(-1)
    return c, a.exp()


def case_of(fn, *inputs) -> Case:
    return Case(torch.fx.symbolic_trace(fn), list(inputs))


def fails_on(op, minimum_numel: int = 0):
    """A backend that raises on `op` when the op's input has at least `minimum_numel` elements."""
    def backend(gm, inputs):
        values = Case(gm, inputs).values()
        for node in gm.graph.nodes:
            if node.target is op and values[node.args[0]].numel() >= minimum_numel:
                raise NotImplementedError(f"no kernel for {op.__name__}")
        return gm
    return backend


def wrong_on(op):
    """A backend whose `op` computes the wrong thing (adds 1)."""
    def backend(gm, inputs):
        graph = torch.fx.Graph()
        env = {}
        for node in gm.graph.nodes:
            env[node] = graph.node_copy(node, lambda n: env[n])
            if node.target is op:
                env[node] = graph.call_function(torch.add, (env[node], 1))
        return torch.fx.GraphModule(gm, graph)
    return backend


def minified(case: Case, backend, time_limit: float = 60) -> tuple[Case, bool]:
    checker = Checker("capture", backend)
    failure = checker.outcome(case)
    assert failure.kind in (CRASH, ACCURACY)
    return delta.minify(case, checker, failure, time_limit, progress=lambda message: None)


def ops(case: Case) -> list:
    return [n.target for n in case.compute_nodes]


def test_truncate_keeps_the_prefix_and_returns_its_leaves():
    case = case_of(chain, torch.randn(3, 4), torch.randn(3, 4))
    short = case.truncated(3)  # sin, add, tanh
    assert ops(short) == [torch.sin, operator.add, torch.tanh]
    assert [n.name for n in short.outputs()] == ["tanh"]


def test_a_subgraph_replaced_by_its_input_is_fed_eagers_value():
    case = case_of(chain, torch.randn(3, 4), torch.randn(3, 4))
    nodes = {n.name: n for n in case.gm.graph.nodes}
    values = case.values()
    cut = case.rebuild([nodes["tanh"]], {nodes["add"]})
    assert ops(cut) == [torch.tanh] and torch.equal(cut.inputs[0], values[nodes["add"]])
    torch.testing.assert_close(cut.gm(*cut.inputs)[0], values[nodes["tanh"]])


def test_bypass_removes_a_node_that_keeps_shape_and_dtype():
    case = case_of(lambda x: torch.relu(torch.neg(x)), torch.randn(4))
    neg = next(n for n in case.compute_nodes if n.target is torch.neg)
    assert ops(case.bypassed(neg)) == [torch.relu]


def test_shrink_halves_each_tensor_input():
    case = case_of(chain, torch.randn(6, 4), torch.randn(6, 4))
    assert [tuple(t.shape) for t in case.shrunk().inputs] == [(3, 2), (3, 2)]
    assert [tuple(t.shape) for t in case.shrunk({1}).inputs] == [(6, 4), (3, 2)]


def test_attributes_are_lifted_to_inputs():
    module = torch.nn.Linear(4, 2)
    case = lifted(torch.fx.symbolic_trace(module), [torch.randn(3, 4)])
    assert len(case.inputs) == 3 and not any(n.op == "get_attr" for n in case.gm.graph.nodes)
    torch.testing.assert_close(case.gm(*case.inputs), module(case.inputs[0]))


def test_a_crash_is_minified_to_the_op_with_the_smallest_input():
    case = case_of(chain, torch.randn(8, 8), torch.randn(8, 8))
    small, finished = minified(case, fails_on(torch.tanh))
    assert finished and ops(small) == [torch.tanh] and small.size == (1, 1)


def test_a_crash_that_needs_size_keeps_its_size():
    case = case_of(chain, torch.randn(8, 8), torch.randn(8, 8))
    small, _ = minified(case, fails_on(torch.tanh, minimum_numel=16))
    assert ops(small) == [torch.tanh] and 16 <= small.size[1] < 64


def test_an_accuracy_failure_is_minified_to_the_wrong_op():
    case = case_of(chain, torch.randn(8, 8), torch.randn(8, 8))
    small, _ = minified(case, wrong_on(torch.cos))
    assert ops(small) == [torch.cos]


def test_a_candidate_must_fail_the_same_way():
    case = case_of(chain, torch.randn(4, 4), torch.randn(4, 4))
    checker = Checker("capture", fails_on(torch.tanh))
    failure = checker.outcome(case)
    other = Checker("capture", wrong_on(torch.cos)).outcome(case)
    assert failure.kind == CRASH and failure.error_type == "NotImplementedError"
    assert not other.same_failure(failure)
    assert Checker("capture", lambda gm, inputs: gm).outcome(case).kind == OK


def test_the_time_limit_returns_the_smallest_failing_case_so_far():
    case = case_of(chain, torch.randn(8, 8), torch.randn(8, 8))
    small, finished = minified(case, fails_on(torch.tanh), time_limit=0)
    assert not finished and small is not None and torch.tanh in ops(small)
