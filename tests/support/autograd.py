"""Shared checks for the autograd tests: a model trained eagerly and through aot_eager must agree."""
from __future__ import annotations

import copy

import torch
import torch.fx

from kiln.autograd import aot_compile


def run_as_is(gm, example_inputs):
    """The compiler that runs ATen graphs op by op, recording what it was handed."""
    run_as_is.graphs.append((gm, example_inputs))
    return gm


run_as_is.graphs = []


def compile_module(module: torch.nn.Module, example_inputs: list, **kwargs):
    """symbolic_trace `module` (parameters stay get_attr/call_module) and aot_compile it."""
    gm = torch.fx.symbolic_trace(module)
    return aot_compile(gm, example_inputs, run_as_is, **kwargs)


def assert_close(a, b, dtype, what):
    tol = {torch.float64: dict(rtol=1e-9, atol=1e-11), torch.float32: dict(rtol=1e-4, atol=1e-5)}[dtype]
    torch.testing.assert_close(a, b, **tol, msg=lambda m: f"{what}: {m}")


def train_and_compare(make_model, make_inputs, loss_fn, *, dtype=torch.float64, steps=3, optimizer=None,
                      compile_kwargs=None):
    """Train an eager copy and an aot_eager copy for `steps` steps; every loss, grad and buffer must match."""
    torch.manual_seed(0)
    eager = make_model().to(dtype)
    compiled_model = copy.deepcopy(eager)
    inputs = [x.to(dtype) if x.is_floating_point() else x for x in make_inputs()]
    compiled = compile_module(compiled_model, inputs, **(compile_kwargs or {}))
    make_opt = optimizer or (lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9))
    opt_e, opt_c = make_opt(eager.parameters()), make_opt(compiled_model.parameters())
    for step in range(steps):
        losses = []
        for fn, opt in ((eager, opt_e), (compiled, opt_c)):
            opt.zero_grad()
            loss = loss_fn(fn(*inputs))
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        assert_close(losses[1], losses[0], dtype, f"loss at step {step}")
        for (name, pe), (_, pc) in zip(eager.named_parameters(), compiled_model.named_parameters()):
            assert (pc.grad is None) == (pe.grad is None), f"{name}: gradient presence differs from eager"
            if pe.grad is not None:
                assert_close(pc.grad, pe.grad, dtype, f"grad of {name} at step {step}")
            assert_close(pc, pe, dtype, f"{name} after step {step}")
        for (name, be), (_, bc) in zip(eager.named_buffers(), compiled_model.named_buffers()):
            assert_close(bc, be, dtype, f"buffer {name} after step {step}")
    return compiled


class Cube(torch.autograd.Function):
    """x ** 3 as a custom autograd.Function (saves its input; backward 3 x^2 g): the plain case of a user's
    Function for the capture, corpus and compiled-autograd tests."""

    @staticmethod
    def forward(ctx, v):
        ctx.save_for_backward(v)
        return v ** 3

    @staticmethod
    def backward(ctx, grad):
        (v,) = ctx.saved_tensors
        return 3 * v * v * grad
