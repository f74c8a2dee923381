"""The runtime wrapper: autograd.Function semantics, inference path, odd outputs."""
import copy

import pytest
import torch
import torch.nn as nn

import kiln
from kiln.autograd import aot_compile, aot_eager
from support.autograd import compile_module


def count_saved(fn):
    """How many tensors autograd saved for backward while running `fn()`."""
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t) or t, lambda t: t):
        out = fn()
    return out, len(packed)


class Mixed(nn.Module):
    """Outputs of every kind: differentiable, integer, constant, None, a tensor not needing grad."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x, y):
        h = self.lin(x)
        return {"h": h, "idx": h.argmax(-1), "n": 3, "none": None, "y2": y * 2}


def test_outputs_that_do_not_require_grad_none_and_constants():
    model = Mixed()
    x, y = torch.randn(2, 4), torch.randn(2)
    out = compile_module(model, [x, y])(x, y)
    ref = model(x, y)
    assert out["n"] == 3 and out["none"] is None
    assert out["h"].requires_grad and not out["idx"].requires_grad and not out["y2"].requires_grad
    assert torch.equal(out["idx"], ref["idx"]) and torch.equal(out["y2"], ref["y2"])
    out["h"].sum().backward()
    torch.testing.assert_close(model.lin.bias.grad, torch.full((3,), 2.0))  # batch of 2


def test_unused_input_gets_none_grad_and_unused_output_zero_grad():
    def f(a, b, c):
        return a * 2, (a + 1).sum()

    gm = torch.fx.symbolic_trace(f)
    a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    compiled = aot_eager(gm, [a, b, 1.5])
    first, second = compiled(a, b, 1.5)
    second.backward()  # `first` receives no gradient: the Function sees zeros for it
    torch.testing.assert_close(a.grad, torch.ones(3))
    assert b.grad is None


def test_an_unused_transposed_output_gets_zeros_with_its_traced_strides():
    def f(a):
        return (a * 2).t(), (a + 1).sum()

    a = torch.randn(3, 4, requires_grad=True)
    first, second = aot_eager(torch.fx.symbolic_trace(f), [a])(a)
    assert first.stride() == (1, 4)
    second.backward()  # the backward graph reads a zero gradient for `first`
    torch.testing.assert_close(a.grad, torch.ones(3, 4))


class ZeroFills(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the ATen ops that write zeros (`zeros` dispatches as `zero_` or `fill_`)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in (torch.ops.aten.zero_.default, torch.ops.aten.fill_.Scalar, torch.ops.aten.zeros.default)
        return func(*args, **(kwargs or {}))


def test_backward_makes_no_zero_gradients_for_batch_norm_statistics():
    """The running statistics are outputs of the compiled Function that no loss reaches; autograd must not
    fill a zero gradient for each (DenseNet-121: 363 fills per training step)."""
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2), nn.BatchNorm1d(2))
    x = torch.randn(5, 4)
    compiled = compile_module(model, [x])
    loss = compiled(x).sum()
    with ZeroFills() as fills:
        loss.backward()
    assert fills.count == 0
    assert model[1].num_batches_tracked.item() == 1 and model[0].weight.grad is not None


def test_retain_graph_allows_a_second_backward_and_is_required_for_it():
    lin = nn.Linear(3, 3)
    x = torch.randn(2, 3)
    compiled = compile_module(lin, [x])
    loss = compiled(x).pow(2).sum()
    loss.backward(retain_graph=True)
    once = lin.weight.grad.clone()
    loss.backward()
    torch.testing.assert_close(lin.weight.grad, 2 * once)
    loss = compiled(x).pow(2).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="second time|freed"):
        loss.backward()


def test_first_order_grad_with_create_graph_still_works_without_second_order():
    w = torch.randn(3, requires_grad=True)
    gm = torch.fx.symbolic_trace(lambda w: (w * w).sum())
    compiled = aot_eager(gm, [w])
    (g,) = torch.autograd.grad(compiled(w), w, create_graph=True)
    torch.testing.assert_close(g.detach(), 2 * w.detach())


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_inference_under_no_grad_saves_nothing_and_has_no_grad_fn(context):
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.randn(3, 4)
    compiled = compile_module(model, [x])
    with context():
        out, saved = count_saved(lambda: compiled(x))
        ref = model(x)
    assert saved == 0 and out.grad_fn is None and not out.requires_grad
    torch.testing.assert_close(out, ref)


def test_inference_when_no_input_requires_grad():
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh()).requires_grad_(False)
    x = torch.randn(3, 4)
    compiled = compile_module(model, [x])
    out, saved = count_saved(lambda: compiled(x))
    assert saved == 0 and out.grad_fn is None
    assert [requires_grad for requires_grad, *_ in compiled.runners] == [None]  # only the inference graph


def test_training_saves_exactly_what_the_partition_chose():
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    compiled = compile_module(model, [x])
    out, saved = count_saved(lambda: compiled(x))
    (split,) = compiled.partitions.values()
    assert saved == len(split.saved) > 0
    assert type(out.grad_fn).__name__ == "CompiledFunctionBackward"


def test_changing_which_inputs_require_grad_compiles_another_variant():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
    x = torch.randn(3, 4)
    compiled = compile_module(model, [x])
    model[0].requires_grad_(False)
    compiled(x).sum().backward()
    assert model[0].weight.grad is None and model[1].weight.grad is not None
    assert len(compiled.partitions) == 2


def test_non_contiguous_incoming_gradient():
    """The gradient arrives transposed, with other strides than the backward graph was traced with."""
    w = torch.randn(4, 3, requires_grad=True)
    gm = torch.fx.symbolic_trace(lambda x, w: (x @ w) * 1.0)
    x = torch.randn(2, 4)
    compiled = aot_eager(gm, [x, w])
    g = torch.randn(3, 2).t()
    assert not g.is_contiguous()
    compiled(x, w).backward(g)
    torch.testing.assert_close(w.grad, x.t() @ g)


def test_compiler_receives_separate_forward_and_backward_with_fake_inputs():
    received = []

    def compiler(gm, example_inputs):
        received.append((gm, example_inputs))
        return gm

    lin = nn.Linear(3, 2)
    x = torch.randn(4, 3)
    aot_compile(torch.fx.symbolic_trace(lin), [x], compiler)
    (fw, fw_inputs), (bw, bw_inputs) = received
    assert fw.meta["kiln.aot"]["kind"] == "forward" and bw.meta["kiln.aot"]["kind"] == "backward"
    assert [tuple(t.shape) for t in fw_inputs] == [(4, 3), (2, 3), (2,)]
    assert all(type(t).__name__ == "FakeTensor" for t in fw_inputs + bw_inputs)
    targets = {n.target for n in fw.graph.nodes if n.op == "call_function"}
    assert torch.ops.aten.addmm.default in targets
    assert tuple(bw_inputs[-1].shape) == (4, 2)  # the tangent comes last



def test_passes_are_named_timed_and_kept():
    lin = nn.Linear(3, 2)
    compiled = compile_module(lin, [torch.randn(4, 3)])
    (traces,) = compiled.traces.values()
    assert [t.name for t in traces] == ["analyze", "trace joint", "joint", "partition", "forward", "backward",
                                        "compile forward", "compile backward"]
    assert all(t.seconds >= 0 for t in traces)
    assert "torch.ops.aten" in traces[2].graph.code


def test_autocast_is_traced_into_the_graph_and_matches_eager():
    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    compiled = compile_module(lin, [x])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = compiled(x)
        ref = lin(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref)
    out.float().sum().backward()
    grad = lin.weight.grad.clone()
    lin.zero_grad()
    ref.float().sum().backward()
    torch.testing.assert_close(grad, lin.weight.grad)
    assert len(compiled.runners) == 2  # fp32 from the example inputs, then bf16 under autocast


def test_outputs_viewing_one_another_behave_as_in_eager():
    def f(x, w):
        y = x * w
        return y, y.view(-1), y

    x, w = torch.randn(2, 3), torch.randn(2, 3, requires_grad=True)
    first, flat, again = aot_eager(torch.fx.symbolic_trace(f), [x, w])(x, w)
    assert again is first and flat.data_ptr() == first.data_ptr()
    flat.mul_(2)  # in-place through one output shows in the other, as in eager
    torch.testing.assert_close(first, 2 * x * w.detach())
    first.sum().backward()
    torch.testing.assert_close(w.grad, 2 * x)


class FusedCopies(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the dtypes of each `_foreach_copy_` and counts single `copy_` calls."""

    def __init__(self):
        super().__init__()
        self.fused, self.single = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._foreach_copy_.default:
            self.fused.append({t.dtype for t in args[0]})
        self.single += func is torch.ops.aten.copy_.default
        return func(*args, **(kwargs or {}))


def test_mutated_inputs_receive_their_new_values_in_one_fused_copy_per_dtype_or_in_order():
    """Batch-norm statistics (float) and counters (int64) are written back with one fused copy per dtype
    (ATen fuses a copy into one kernel only for lists of one dtype); targets that share storage are copied
    one by one, in order, as eager's in-place ops ran."""
    from kiln.autograd.functionalize import InputMutation
    from kiln.autograd.runtime import MutationWriter
    from kiln.autograd.signature import TensorSpec

    mean, var, count = torch.zeros(4), torch.ones(4), torch.tensor(0)
    flat = [torch.randn(2, 4), mean, var, count]
    outs = [torch.randn(2, 4), torch.full((4,), 0.5), torch.full((4,), 2.0), torch.tensor(1)]
    write = MutationWriter([InputMutation(1, 1), InputMutation(2, 2), InputMutation(3, 3)],
                           [TensorSpec.of(t) for t in flat])
    with FusedCopies() as copies:
        write(flat, outs)
    assert mean.tolist() == [0.5] * 4 and var.tolist() == [2.0] * 4 and count.item() == 1
    assert copies.fused == [{torch.float32}, {torch.int64}] and copies.single == 0

    base = torch.zeros(6)
    overlapping = [base[:4], base[2:]]
    write = MutationWriter([InputMutation(0, 0), InputMutation(1, 1)], [TensorSpec.of(t) for t in overlapping])
    write(overlapping, [torch.ones(4), torch.full((4,), 2.0)])
    assert base.tolist() == [1, 1, 2, 2, 2, 2]  # the second write wins where they overlap


def test_running_statistics_are_written_in_one_fused_copy_without_moving_their_versions():
    """Eager's batch norm writes its running statistics without moving their version counters (no saved
    tensor of them can then go stale) and counts its batches with a versioned `add_`; kiln writes them back
    likewise, the statistics through `.data`, and fused: one copy per dtype for all the norms of a graph, not
    one per tensor (a ResNet-50's 106 per training step)."""
    class Blocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norms = torch.nn.ModuleList(torch.nn.BatchNorm1d(4) for _ in range(3))

        def forward(self, x):
            for norm in self.norms:
                x = torch.relu(norm(x))
            return x.sum()

    torch.manual_seed(0)
    eager_model = Blocks()
    compiled_model = copy.deepcopy(eager_model)
    compiled = kiln.compile(compiled_model)
    x = torch.randn(8, 4)
    names = [(k, name) for k in range(3) for name in ("running_mean", "running_var", "num_batches_tracked")]

    def versions(model):  # a deep copy's counters start elsewhere: compare how far a step moves them
        return [getattr(model.norms[k], name)._version for k, name in names]

    for _ in range(2):
        eager_before, compiled_before = versions(eager_model), versions(compiled_model)
        eager_model(x).backward()
        compiled(x).backward()
        for k, name in names:
            torch.testing.assert_close(getattr(compiled_model.norms[k], name), getattr(eager_model.norms[k], name))
        assert ([a - b for a, b in zip(versions(compiled_model), compiled_before)]
                == [a - b for a, b in zip(versions(eager_model), eager_before)])
    with FusedCopies() as copies:  # (a dispatch mode hides the version counters' moves: counted apart)
        compiled(x).backward()
    assert copies.fused == [{torch.float32}, {torch.int64}] and copies.single == 0
