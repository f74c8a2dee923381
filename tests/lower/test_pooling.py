"""Max pooling with indices and average pooling, forward and backward, lowered to pointwise kernels and
compared with eager.

Inputs are rounded so windows hold ties, and carry NaNs and -inf: indices must match eager's exactly
(first of equal values, last NaN, first inside position of an all -inf window). The Triton cases run
the same graphs through Triton's interpreter on the CPU (TRITON_INTERPRET=1).
"""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

import kiln
from kiln.lower.decompositions import decomposition_table
from kiln.pipeline import compile_aten_graph
from support.lowering import assert_same, check, check_triton, count_externs
from support.triton_device import skip_unless_kernels_run

aten = torch.ops.aten
TORCH_VERSION = tuple(int(p) for p in torch.__version__.split(".")[:2])

# (kernel, stride, padding, dilation, ceil_mode, input size)
CONFIGS = {
    "2x2_s2": ([2, 2], [2, 2], [0, 0], [1, 1], False, (2, 3, 8, 8)),  # the tutorial CNN
    "3x3_s2_p1": ([3, 3], [2, 2], [1, 1], [1, 1], False, (2, 3, 9, 10)),  # ResNet's stem
    "2x2_s2_odd": ([2, 2], [2, 2], [0, 0], [1, 1], False, (1, 2, 7, 5)),
    "2x2_s2_ceil": ([2, 2], [2, 2], [0, 0], [1, 1], True, (1, 2, 7, 5)),
    "3x3_s2_p1_ceil": ([3, 3], [2, 2], [1, 1], [1, 1], True, (1, 2, 8, 6)),
    "3x3_s1_p1": ([3, 3], [1, 1], [1, 1], [1, 1], False, (1, 2, 5, 6)),
    "3x2_s_2x1": ([3, 2], [2, 1], [1, 0], [1, 1], False, (2, 2, 7, 6)),
    "5x5_s3_p2": ([5, 5], [3, 3], [2, 2], [1, 1], True, (1, 2, 11, 9)),
    "1x1": ([1, 1], [1, 1], [0, 0], [1, 1], False, (1, 2, 3, 4)),
    "3d_input": ([2, 2], [2, 2], [1, 1], [1, 1], False, (3, 6, 7)),
    "dilated": ([3, 3], [2, 2], [1, 1], [2, 2], False, (1, 2, 9, 8)),
    "dilated_ceil": ([2, 3], [2, 1], [1, 1], [3, 2], True, (1, 2, 8, 7)),
    "dilated_columns_ceil": ([3, 3], [2, 2], [0, 0], [1, 2], True, (1, 2, 3, 6)),  # OpInfo's sample
}


def _input(size, dtype=torch.float32, seed=0):
    """Small integers (many ties), a few NaNs, and an all -inf corner (every window there starts at -inf)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, size, generator=g).to(dtype)
    flat = x.view(-1)
    flat[torch.randperm(flat.numel(), generator=g)[:3]] = float("nan")
    x[..., :3, :3] = float("-inf")
    return x


def _pool(config):
    kernel, stride, padding, dilation, ceil_mode, _ = config
    return lambda x: aten.max_pool2d_with_indices(x, kernel, stride, padding, dilation, ceil_mode)


def _pool_backward(config):
    kernel, stride, padding, dilation, ceil_mode, _ = config
    return lambda g, x, i: aten.max_pool2d_with_indices_backward(g, x, kernel, stride, padding, dilation, ceil_mode, i)


def _assert_indices_exact(compiled, fn, *inputs):
    """Indices are compared exactly (assert_close on int64 is exact too; this names the case on failure)."""
    got, ref = compiled(*inputs), fn(*inputs)
    assert torch.equal(got[1], ref[1]), (got[1], ref[1])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_forward(name):
    config = CONFIGS[name]
    x = _input(config[-1])
    compiled = check(_pool(config), x)
    assert count_externs(compiled) == 0, compiled.artefacts["schedule"]
    assert compiled.artefacts["num_kernels"] == 1, compiled.artefacts["schedule"]  # values and indices together
    _assert_indices_exact(compiled, _pool(config), x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64], ids=str)
def test_forward_dtypes_and_channels_last(dtype):
    config = CONFIGS["3x3_s2_p1"]
    x = _input(config[-1], dtype).contiguous(memory_format=torch.channels_last)
    compiled = check(_pool(config), x)
    assert count_externs(compiled) == 0, compiled.artefacts["schedule"]
    _assert_indices_exact(compiled, _pool(config), x)


def test_nan_and_ties_pick_eagers_index():
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([[[[1.0, nan, 5.0, 5.0], [nan, 2.0, 5.0, -0.0],
                        [-inf, -inf, 0.0, -0.0], [-inf, -inf, -0.0, 0.0]]]])
    config = CONFIGS["2x2_s2"]
    compiled = check(_pool(config), x)
    _assert_indices_exact(compiled, _pool(config), x)
    assert compiled(x)[1].flatten().tolist() == [4, 2, 8, 10]


def test_relu_fuses_into_the_pool():
    config = CONFIGS["3x3_s2_p1"]
    fn = lambda x: _pool(config)(torch.relu(x))[0]  # noqa: E731  (inference: the indices are not computed)
    compiled = check(fn, torch.randn(2, 3, 9, 10))
    assert count_externs(compiled) == 0
    assert compiled.artefacts["num_kernels"] == 1
    assert "int64_t*" not in compiled.artefacts["kernels.cpp"]  # no indices buffer written


def test_large_window_stays_an_extern():
    fn = lambda x: aten.max_pool2d_with_indices(x, [6, 6], [2, 2])  # noqa: E731
    compiled = check(fn, torch.randn(1, 2, 12, 12))
    assert "max_pool2d_with_indices" in str(compiled.artefacts["ir"])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_backward(name):
    config = CONFIGS[name]
    x = _input(config[-1])
    values, indices = _pool(config)(x)
    grad = torch.randn(values.shape, generator=torch.Generator().manual_seed(1))
    compiled = check(_pool_backward(config), grad, x, indices)
    assert count_externs(compiled) == 0, compiled.artefacts["schedule"]


def test_backward_fuses_with_relus_backward():
    config = CONFIGS["2x2_s2"]
    x = torch.randn(config[-1])
    values, indices = _pool(config)(torch.relu(x))
    grad = torch.randn(values.shape)
    pool_backward = _pool_backward(config)
    fn = lambda g, x, i: aten.threshold_backward(pool_backward(g, torch.relu(x), i), torch.relu(x), 0.0)  # noqa: E731
    compiled = check(fn, grad, x, indices)
    assert count_externs(compiled) == 0
    assert compiled.artefacts["num_kernels"] == 1


def test_backward_of_more_windows_than_it_sums_stays_an_extern():
    """A 4x4 window dilated by 2 at stride 1 puts each input element under 16 windows (past MAX_WINDOWS)."""
    config = ([4, 4], [1, 1], [0, 0], [2, 2], False, (1, 2, 11, 11))
    x = _input(config[-1])
    values, indices = _pool(config)(x)
    compiled = check(_pool_backward(config), torch.randn(values.shape), x, indices)
    assert "max_pool2d_with_indices_backward" in str(compiled.artefacts["ir"])


@pytest.mark.sampled(every=2)  # CI: half the configurations (each compiles twice, forward and backward)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_symbolic_sizes_forward_and_backward(name):
    """Traced with symbolic input sizes (the output sizes are then floor divisions of them), the pool and its
    backward are still kernels: every bound a window may cross stays in its mask unless the guards rule it out."""
    config = CONFIGS[name]
    x = _input(config[-1])
    forward = check(_pool(config), x, mode="symbolic")
    assert count_externs(forward) == 0, forward.artefacts["schedule"]
    _assert_indices_exact(forward, _pool(config), x)
    values, indices = _pool(config)(x)
    grad = torch.randn(values.shape, generator=torch.Generator().manual_seed(1))
    backward = check(_pool_backward(config), grad, x, indices, mode="symbolic")
    assert count_externs(backward) == 0, backward.artefacts["schedule"]


@pytest.mark.parametrize("name", ["3x3_s2_p1_ceil", "dilated_ceil"])
def test_one_dynamic_compile_pools_every_size(name, compiled_graphs):
    """kiln.compile(dynamic=True): one graph per direction serves inputs of several sizes, even and odd (ceil_mode's
    last window in or out of the input), with eager's values, indices and gradients."""
    kernel, stride, padding, dilation, ceil_mode, size = CONFIGS[name]
    fn = lambda x: nn.functional.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode).sin()  # noqa: E731
    kiln.reset()
    compiled = kiln.compile(fn, dynamic=True)
    for grow in range(3):
        x = _input(size[:-2] + (size[-2] + grow, size[-1] + 2 * grow), torch.float64).requires_grad_()
        expected, got = fn(x), compiled(x)
        torch.testing.assert_close(got, expected, equal_nan=True)
        cotangent = torch.randn(expected.shape, generator=torch.Generator().manual_seed(grow), dtype=torch.float64)
        torch.testing.assert_close(torch.autograd.grad(got, x, cotangent)[0],
                                   torch.autograd.grad(expected, x, cotangent)[0], equal_nan=True)
    # torch 2.11 (the GPU machine's) compiles a second forward/backward pair for one of the sizes where 2.13 serves
    # all three with one: observed, its guard not analysed yet
    pairs = 1 if TORCH_VERSION >= (2, 13) else 2
    assert len(compiled_graphs) == 2 * pairs, [g.artefacts["name"] for g in compiled_graphs]
    assert all(count_externs(g) == 0 for g in compiled_graphs), [str(g.artefacts["schedule"]) for g in compiled_graphs]


class SmallCNN(nn.Module):
    """The tutorial CNN's shape: conv-relu-pool twice, then linear layers; a ResNet-style pool first."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(3, 6, 3), nn.Conv2d(6, 8, 3)
        self.fc1, self.fc2 = nn.Linear(8 * 2 * 2, 16), nn.Linear(16, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(x, 3, 2, 1)
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2, 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2, 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def test_joint_graph_of_a_cnn_has_no_pool_externs():
    """The training step traced at the ATen level (forward and backward in one graph), like AOT autograd."""
    torch.manual_seed(0)
    model, x = SmallCNN(), torch.randn(2, 3, 27, 27)
    params = dict(model.named_parameters())

    def step(x, *weights):
        out = torch.func.functional_call(model, dict(zip(params, weights)), (x,))
        return torch.autograd.grad(out.square().sum(), weights)

    gm = make_fx(step, decomposition_table=decomposition_table())(x, *params.values())
    inputs = [x] + [p.detach() for p in params.values()]
    compiled = compile_aten_graph(gm, inputs)
    assert "fallback" not in compiled.artefacts, compiled.artefacts.get("fallback")
    assert "max_pool" not in str(compiled.artefacts["schedule"]), compiled.artefacts["schedule"]
    assert_same(compiled(*inputs), step(x, *params.values()))


def test_cnn_trains_through_kiln_compile(compiled_graphs):
    torch.manual_seed(0)
    model, x = SmallCNN(), torch.randn(2, 3, 27, 27)
    loss = kiln.compile(model)(x).square().sum()
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ref = model(x).square().sum()
    ref.backward()
    torch.testing.assert_close(loss, ref)
    for g, p in zip(grads, model.parameters()):
        torch.testing.assert_close(g, p.grad, atol=1e-5, rtol=1e-4)
    assert len(compiled_graphs) == 2  # forward and backward
    for compiled in compiled_graphs:
        assert "fallback" not in compiled.artefacts, compiled.artefacts.get("fallback")
        assert "max_pool" not in str(compiled.artefacts["schedule"]), compiled.artefacts["schedule"]


# ----------------------------------------------------------------------------- average pooling

# (kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, input size)
AVG_CONFIGS = {
    "2x2_s2": ([2, 2], [2, 2], [0, 0], False, True, None, (2, 3, 8, 8)),  # DenseNet's transitions
    "3x3_s2_p1": ([3, 3], [2, 2], [1, 1], False, True, None, (2, 3, 9, 10)),
    "3x3_s2_p1_ceil_exclude_pad": ([3, 3], [2, 2], [1, 1], True, False, None, (1, 2, 8, 6)),
    "3x3_s2_p1_ceil_include_pad": ([3, 3], [2, 2], [1, 1], True, True, None, (1, 2, 8, 6)),  # clipped last window
    "2x3_s_1x2_exclude_pad": ([2, 3], [1, 2], [1, 1], False, False, None, (1, 2, 7, 5)),
    "3x3_divisor_override": ([3, 3], [1, 1], [1, 1], False, True, 5, (1, 2, 5, 6)),
    "5x5_s3_p2_ceil": ([5, 5], [3, 3], [2, 2], True, True, None, (1, 2, 11, 9)),
    "3d_input": ([2, 2], [2, 2], [1, 1], True, False, None, (3, 7, 6)),
}


def _avg_pool(config):
    kernel, stride, padding, ceil_mode, include_pad, divisor, _ = config
    return lambda x: aten.avg_pool2d(x, kernel, stride, padding, ceil_mode, include_pad, divisor)


def _avg_pool_backward(config):
    kernel, stride, padding, ceil_mode, include_pad, divisor, _ = config
    return lambda g, x: aten.avg_pool2d_backward(g, x, kernel, stride, padding, ceil_mode, include_pad, divisor)


@pytest.mark.sampled(every=2, classes=("name",))
@pytest.mark.parametrize("name", list(AVG_CONFIGS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_avg_pool_forward_and_backward(name, dtype):
    """Eager's divisor in every corner: padding counted or not, ceil_mode's clipped windows, an override."""
    config = AVG_CONFIGS[name]
    x = torch.randn(config[-1], generator=torch.Generator().manual_seed(0)).to(dtype)
    forward = check(_avg_pool(config), x)
    grad = torch.randn(_avg_pool(config)(x).shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    backward = check(_avg_pool_backward(config), grad, x)
    assert count_externs(forward) == 0 and count_externs(backward) == 0


@pytest.mark.sampled(every=2)
@pytest.mark.parametrize("name", list(AVG_CONFIGS))
def test_avg_pool_with_symbolic_sizes(name):
    """Traced with symbolic input sizes: the divisor's clipping and the backward's window bounds are masks over
    the symbols, not Python comparisons; forward and backward stay kernels with eager's values."""
    config = AVG_CONFIGS[name]
    x = torch.randn(config[-1], generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    forward = check(_avg_pool(config), x, mode="symbolic")
    grad = torch.randn(_avg_pool(config)(x).shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    backward = check(_avg_pool_backward(config), grad, x, mode="symbolic")
    assert count_externs(forward) == 0 and count_externs(backward) == 0


def test_avg_pool_backward_fuses_into_the_batch_norm_backward_before_it():
    """DenseNet's transition: relu -> avg_pool 2x2 stride 2; the pool's backward is a gather (one window
    per input element) inside relu's backward kernel."""
    config = AVG_CONFIGS["2x2_s2"]
    x = torch.randn(config[-1])
    grad = torch.randn(_avg_pool(config)(x).shape)
    pool_backward = _avg_pool_backward(config)
    fn = lambda g, x: aten.threshold_backward(pool_backward(g, torch.relu(x)), torch.relu(x), 0.0)  # noqa: E731
    compiled = check(fn, grad, x)
    assert count_externs(compiled) == 0
    assert compiled.artefacts["num_kernels"] == 1


# ----------------------------------------------------------------------------- the Triton target


def _triton_check(fn, *inputs):
    """`fn` compiled for the Triton target, compared with eager, no externs."""
    skip_unless_kernels_run()
    return check_triton(fn, *inputs)


@pytest.mark.parametrize("name", ["2x2_s2", "3x3_s2_p1", "3x3_s2_p1_ceil", "dilated_ceil"])
def test_triton_forward_and_backward(name):
    config = CONFIGS[name]
    x = _input(config[-1])
    _triton_check(_pool(config), x)
    values, indices = _pool(config)(x)
    grad = torch.randn(values.shape, generator=torch.Generator().manual_seed(1))
    _triton_check(_pool_backward(config), grad, x, indices)


def test_triton_half_channels_last():
    config = CONFIGS["3x3_s2_p1"]
    _triton_check(_pool(config), _input(config[-1], torch.float16).contiguous(memory_format=torch.channels_last))


@pytest.mark.parametrize("name", ["2x2_s2", "3x3_s2_p1_ceil_include_pad"])
def test_triton_avg_pool_forward_and_backward(name):
    config = AVG_CONFIGS[name]
    x = torch.randn(config[-1], generator=torch.Generator().manual_seed(0))
    _triton_check(_avg_pool(config), x)
    _triton_check(_avg_pool_backward(config), torch.randn(_avg_pool(config)(x).shape), x)


def test_backward_stores_a_summed_channels_last_gradient_channels_last():
    """The gradient reaching ResNet's stem pooling is the sum of two channels-last gradients (the residual
    block's branches). Read at every window, it is stored once, in the order its loads read: channels-last,
    not transposed to NCHW and then read across channels by the window kernel."""
    config = CONFIGS["3x3_s2_p1"]
    x = _input(config[-1]).contiguous(memory_format=torch.channels_last)
    values, indices = _pool(config)(x)
    a, b = (torch.randn(values.shape).contiguous(memory_format=torch.channels_last) for _ in range(2))
    pool_backward = _pool_backward(config)
    compiled = check(lambda a, b, x, i: pool_backward(a + b, x, i), a, b, x, indices)
    n, c, h, w = a.shape  # the IR prints a permuted dense buffer with its dims in memory order
    summed = [line for line in str(compiled.artefacts["ir"]).splitlines() if "add(load(arg0" in line]
    assert len(summed) == 1 and f"float32[{n}, {h}, {w}, {c}] = pointwise" in summed[0], summed
