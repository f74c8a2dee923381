"""Inputs that require grad but never reach the loss keep `.grad` None, as in eager (issue 21, class 10).

torch.compile gives such inputs a zero gradient; kiln must not: a zero `.grad` makes optimizers
with weight decay or momentum move parameters that eager leaves alone.
"""
import pytest
import torch

import kiln
from support.differential import check


def detached_second(a, b):
    return (a * 2).sum(), (b * 0).detach()


def shape_only(a, b):
    return a * b.shape[0]


def mask_only(a, b):
    return a * (b > 0)


def through_detach(a, b):
    return a + b.detach()


def not_used(a, b):
    return a.sin()


def under_no_grad(a, b):
    with torch.no_grad():
        c = b * 2
    return a * c


def times_zero(a, b):  # used: eager's gradient is a zero tensor, not None
    return a + b * 0


def integer_of_b(a, b):
    return a * b.argmax(), b.long()


def norms_of_order_zero(a, b):  # outputs that require grad (eager's node has edges), gradients None
    return torch.linalg.vector_norm(a, 0), torch.norm(b * 2, 0)


PROGRAMS = [detached_second, shape_only, mask_only, through_detach, not_used, under_no_grad, times_zero, integer_of_b,
            norms_of_order_zero]


@pytest.mark.sampled(every=2, classes=("program",))
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_unused_input_keeps_grad_none(program, backend):
    def make(call):
        return (torch.linspace(-1.0, 1.0, 6).requires_grad_(), torch.linspace(2.0, -3.0, 6).requires_grad_())
    check(program, make, backend, calls=2)


class PartlyUsed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used = torch.nn.Linear(4, 4)
        self.unused = torch.nn.Linear(4, 4)
        self.scale = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.used(x) * self.scale.detach()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_parameters_not_used_in_forward_keep_grad_none(backend):
    torch.manual_seed(0)
    eager = PartlyUsed()
    compiled_model = PartlyUsed()
    compiled_model.load_state_dict(eager.state_dict())
    compiled = kiln.compile(compiled_model, backend=backend)
    x = torch.randn(3, 4)
    for _ in range(2):
        eager(x).sum().backward()
        compiled(x).sum().backward()
    for (name, p), q in zip(eager.named_parameters(), compiled_model.parameters()):
        assert (q.grad is None) == (p.grad is None), f"{name}: {q.grad} instead of {p.grad}"
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad)


def two_heads(a, b):
    return a * 2, (b * 3).sin(), a * b


def shared_and_private(a, b):
    h = a.exp()
    return h * b, h.sum(), b.cos()


def mutated_and_private(a, b):
    a = a * 1
    a.mul_(2)
    return a, b * 4


@pytest.mark.sampled(every=2, classes=("program", "loss_from"))
@pytest.mark.parametrize("loss_from", [(0,), (1,), (2,), (0, 1), (1, 2)])
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", [two_heads, shared_and_private], ids=lambda f: f.__name__)
def test_outputs_left_out_of_the_loss_give_no_gradient(program, backend, loss_from):
    """A backward from some outputs only: inputs that only the others reach keep `.grad` None."""
    def make(call):
        return (torch.linspace(-1.0, 1.0, 5).requires_grad_(), torch.linspace(0.5, 2.0, 5).requires_grad_())
    check(program, make, backend, calls=2, loss_from=loss_from)


@pytest.mark.parametrize("loss_from", [(0,), (1,)])
def test_loss_from_one_output_of_a_graph_with_an_intermediate_mutation(loss_from):
    def make(call):
        return (torch.linspace(-1.0, 1.0, 5).requires_grad_(), torch.linspace(0.5, 2.0, 5).requires_grad_())
    check(mutated_and_private, make, "aot_eager", calls=2, loss_from=loss_from)


def written_after_a_break(a, b):
    t = a @ a.t()
    u = b.detach().requires_grad_() * 2  # a graph break: t is an output of the first graph, an input of the next
    t[:1].add_(1)  # the second graph writes it: t's history now runs through that graph's backward node
    return u


def zeroed_after_a_break(a, b):
    t = a * 3
    u = b.detach().requires_grad_() + 1
    t.zero_()
    return u.exp()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("program", [written_after_a_break, zeroed_after_a_break], ids=lambda f: f.__name__)
def test_backward_node_reached_with_no_gradient_gives_none(program, backend):
    """Fuzz seed 300002: the loss reaches the first graph's backward node only through the edge of an input the
    next graph wrote, which carries no gradient; eager's formulas then give none, and `a.grad` stays None."""
    def make(call):
        return [torch.linspace(-1.0, 1.0, 9).reshape(3, 3).requires_grad_(), torch.linspace(0.5, 1.5, 2 + call)]
    check(program, make, backend, calls=2)
