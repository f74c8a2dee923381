"""`aot_compile`: a captured graph in, a callable running compiled ATen graphs out.

The passes, in order, each printable as Python and logged to `kiln.aot`:

    analyze       fake run of gm: output structure, aliases, which outputs need grad
    trace         ATen graph of the forward, or the joint forward+backward  (joint.py)
    functionalize pure ops; input mutations become outputs                  (functionalize.py)
    partition     min-cut split of the joint into forward and backward       (partition.py)
    compile       the code generator's `compiler` on each graph
    runtime       autograd.Function / inference wrapper                      (runtime.py)

Which graphs are built depends on the call: when grad mode is on and some input
requires grad, the training pair for that requires-grad pattern; otherwise the
inference graph. The variant the example inputs ask for is compiled at once; the
others lazily, on the first call that needs them.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

import torch

from kiln.autograd.functionalize import FUNCTIONALIZATION_DECOMPOSITIONS, functionalize
from kiln.autograd.joint import trace_forward, trace_joint
from kiln.autograd.partition import JointLayout, Partition, partition
from kiln.autograd.runtime import InferenceRunner, TrainingRunner
from kiln.autograd.signature import FlatProgram

log = logging.getLogger("kiln.aot")

Compiler = Callable[[torch.fx.GraphModule, list], Callable]


def aot_compile(gm: torch.fx.GraphModule, example_inputs: list, compiler: Compiler, *,
                decompositions: dict | None = None, name: str = "graph") -> Callable:
    """Compile `gm` (torch-level FX graph) through ATen graphs handed to `compiler`.

    `compiler(aten_gm, example_inputs)` receives the inference graph, or the forward and
    the backward graph separately, with fake example inputs; it returns a callable over
    the same flat positional tensors (or, if it sets `_boxed_call = True`, one list of them,
    which it may empty to free inputs early). The result has `gm`'s calling convention.
    """
    compiled = AOTCompiled(gm, example_inputs, compiler, decompositions or {}, name)
    flat = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    state = [t for _, t in gm.named_parameters()] + [t for _, t in gm.named_buffers()]
    compiled.runner(compiled.key(flat + state))
    return compiled


class AOTCompiled:
    """The callable `aot_compile` returns: one compiled runner per requires-grad pattern."""

    def __init__(self, gm: torch.fx.GraphModule, example_inputs: list, compiler: Compiler,
                 decompositions: dict, name: str):
        self.program = FlatProgram(gm, example_inputs)
        self.compiler = compiler
        self.decompositions = {**FUNCTIONALIZATION_DECOMPOSITIONS, **decompositions}
        self.name = name
        self.runners: dict[Any, Callable] = {}
        self.partitions: dict[Any, Partition] = {}

    def __call__(self, *args):
        flat = self.program.flatten_inputs(args)
        return self.runner(self.key(flat))(flat)

    @staticmethod
    def key(flat: list) -> tuple[bool, ...] | None:
        """None for inference; else which flat inputs require grad."""
        if not torch.is_grad_enabled() or not any(t.requires_grad for t in flat):
            return None
        return tuple(t.requires_grad for t in flat)

    def runner(self, key) -> Callable:
        if key not in self.runners:
            start = time.perf_counter()
            self.runners[key] = self._build_training(key) if key is not None else self._build_inference()
            log.info("%s: compiled %s in %.2f s", self.name, "training" if key else "inference",
                     time.perf_counter() - start)
        return self.runners[key]

    def _build_inference(self) -> Callable:
        program = self.program
        signature = program.analyze(None)
        traced = trace_forward(program.graph_function(signature), program.input_specs, self.decompositions)
        graph, mutations = functionalize(traced, program.input_specs)
        _log_graph(f"{self.name} inference graph", graph)
        compiled = self.compiler(graph, _example_inputs(graph))
        return InferenceRunner(program, signature, compiled, mutations)

    def _build_training(self, key: tuple[bool, ...]) -> Callable:
        program = self.program
        signature = program.analyze(key)
        if not signature.differentiable():  # nothing to differentiate: the inference graph serves
            return self.runner(None)
        joint = trace_joint(program.graph_function(signature), program.input_specs, key, signature,
                            self.decompositions)
        tangent_specs = [signature.graph_outputs[i] for i in signature.differentiable()]
        graph, mutations = functionalize(joint.gm, program.input_specs + tangent_specs)
        for m in mutations:
            if key[m.input_index]:
                raise NotImplementedError(
                    f"kiln: the graph mutates input {m.input_index} in place and that input requires grad")
        _log_graph(f"{self.name} joint graph", graph)
        num_grads = sum(joint.grad_mask)
        n_out = joint.num_outputs
        layout = JointLayout(
            num_primals=joint.num_primals,
            forward_outputs=list(range(n_out)) + [m.output_index for m in mutations],
            backward_outputs=list(range(n_out, n_out + num_grads)))
        split = partition(graph, layout)
        self.partitions[key] = split
        log.info("%s partition, %s", self.name, split.summary())
        _log_graph(f"{self.name} forward graph", split.forward)
        _log_graph(f"{self.name} backward graph", split.backward)
        forward = self.compiler(split.forward, _example_inputs(split.forward))
        backward = self.compiler(split.backward, _example_inputs(split.backward))
        # The forward graph returns outputs, then mutated values, then saved tensors.
        runner_mutations = [type(m)(m.input_index, n_out + k) for k, m in enumerate(mutations)]
        return TrainingRunner(program, signature, forward, backward, runner_mutations, len(split.saved),
                              joint.grad_mask)


def _example_inputs(gm: torch.fx.GraphModule) -> list:
    """Fake tensors for the placeholders of a traced graph (from make_fx's `val` metadata)."""
    return [n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")]


def _log_graph(title: str, gm: torch.fx.GraphModule) -> None:
    if log.isEnabledFor(logging.INFO):
        log.info("%s:\n%s", title, gm.print_readable(print_output=False))


def aot_eager(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """The `"aot_eager"` backend: ATen forward and backward graphs run op by op.

    Everything kiln's autograd stage does (tracing, functionalization, partition,
    runtime) and nothing of the code generator: it tells a bug of this stage from
    one of codegen.
    """
    return aot_compile(gm, example_inputs, _run_as_is, name="aot_eager")


def _run_as_is(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
    """Run `gm` node by node, freeing each value (inputs included) after its last use.

    A fresh Interpreter per call: one kept across calls would hold the last call's
    outputs (the saved activations among them) in its environment until the next call.
    """

    def run(args: list):
        return torch.fx.Interpreter(gm).boxed_run(args)

    run._boxed_call = True
    return run
