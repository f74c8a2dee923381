"""End to end through aot_compile: training matches eager on small models (issue 3, "Show")."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from support.autograd import compile_module, train_and_compare


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        # No conv bias before BatchNorm: its true gradient is 0 and Adam would amplify rounding noise.
        self.conv1, self.bn1 = nn.Conv2d(3, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 2 * 2, 3)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x)), inplace=True), 2)
        return self.fc(torch.flatten(x, 1))


class Block(nn.Module):
    """Pre-LN transformer block: LayerNorm, causal attention via SDPA, MLP; dropout p=0."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + F.dropout(self.proj(att.transpose(1, 2).reshape(b, t, d)), p=0.0, training=True)
        return x + F.dropout(self.fc2(F.gelu(self.fc1(self.ln2(x)))), p=0.0, training=True)


class ManualAttention(nn.Module):
    """Attention written out (matmul, masked softmax) as older models do."""

    def __init__(self, d=16):
        super().__init__()
        self.ln, self.qkv, self.out = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.register_buffer("mask", torch.ones(5, 5, dtype=torch.bool).tril())  # sequence length 5

    def forward(self, x):
        q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~self.mask, float("-inf"))
        return x + self.out(F.dropout(scores.softmax(-1), p=0.0, training=True) @ v)


def mse_to_zero(out):
    return out.pow(2).mean()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_mlp_trains_like_eager(dtype):
    train_and_compare(MLP, lambda: [torch.randn(5, 8)], mse_to_zero, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cnn_with_batchnorm_trains_like_eager_including_running_stats(dtype):
    train_and_compare(CNN, lambda: [torch.randn(2, 3, 8, 8)], mse_to_zero, dtype=dtype,
                      optimizer=lambda p: torch.optim.Adam(p, lr=1e-2))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_transformer_block_trains_like_eager(dtype):
    train_and_compare(Block, lambda: [torch.randn(2, 5, 16)], mse_to_zero, dtype=dtype,
                      optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2))


def test_manual_attention_trains_like_eager():
    train_and_compare(ManualAttention, lambda: [torch.randn(2, 5, 16)], mse_to_zero)


class AddToInput(nn.Module):
    """Mutates its (non-grad) input in place, then uses it: eager's caller sees the mutation."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        x.add_(1)
        return self.lin(x).relu()


def test_inplace_op_on_input_trains_like_eager_and_mutates_the_input():
    torch.manual_seed(0)
    eager = AddToInput().double()
    compiled_model = AddToInput().double()
    compiled_model.load_state_dict(eager.state_dict())
    x_e, x_c = torch.randn(3, 4, dtype=torch.float64), None
    x_c = x_e.clone()
    compiled = compile_module(compiled_model, [x_c.clone()])
    for _ in range(3):
        eager(x_e).sum().backward()
        compiled(x_c).sum().backward()
        torch.testing.assert_close(x_c, x_e, rtol=0, atol=0)
        torch.testing.assert_close(compiled_model.lin.weight.grad, eager.lin.weight.grad)
    assert x_c.grad is None and not x_c.requires_grad


class ViewOfInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(2.0, dtype=torch.float64))

    def forward(self, x):
        return x.view(-1), x[1], (x * self.scale).sum(), x


def test_output_aliasing_input_is_a_view_of_the_real_input():
    model = ViewOfInput()
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    compiled = compile_module(model, [x])
    flat, row, total, same = compiled(x)
    assert same is x
    assert flat._base is x and row._base is x
    assert flat.data_ptr() == x.data_ptr() and row.data_ptr() == x.data_ptr() + 4 * 8
    (flat.sum() * 3 + row.sum() + total).backward()
    expected = torch.full((3, 4), 3.0, dtype=torch.float64) + model.scale.detach()
    expected[1] += 1
    torch.testing.assert_close(x.grad, expected)
    torch.testing.assert_close(model.scale.grad, x.detach().sum())


def test_output_alias_sees_later_mutation_of_the_input():
    x = torch.zeros(2, 2)
    compiled = compile_module(ViewOfInput().float(), [x])
    flat = compiled(x)[0]
    x.fill_(7)
    assert flat.tolist() == [7.0] * 4


class ModelWithLoss(nn.Module):
    """Seed 000's pattern: model and loss in one compiled module; a PassthroughLoss outside."""

    def __init__(self):
        super().__init__()
        self.model = MLP()
        self.expert = nn.Linear(8, 4)

    def forward(self, x):
        return F.mse_loss(self.model(x), self.expert(x).detach())


def test_loss_inside_the_graph_passthrough_loss():
    train_and_compare(ModelWithLoss, lambda: [torch.randn(6, 8)], lambda loss: loss,
                      optimizer=lambda p: torch.optim.Adam(p, lr=1e-2))


def test_no_grad_region_inside_the_graph_gets_no_gradient():
    """A capture emits `_set_grad_enabled(False)` around `with torch.no_grad()` (seed 000's expert)."""
    lin, expert = nn.Linear(4, 4).double(), nn.Linear(4, 4).double()
    graph = torch.fx.Graph()
    x, w, b, we, be = (graph.placeholder(n) for n in ("x", "w", "b", "we", "be"))
    out = graph.call_function(F.linear, (x, w, b))
    graph.call_function(torch._C._set_grad_enabled, (False,))
    target = graph.call_function(F.linear, (x, we, be))
    graph.call_function(torch._C._set_grad_enabled, (True,))
    graph.output(graph.call_function(F.mse_loss, (out, target)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    from kiln.autograd import aot_eager
    inputs = [torch.randn(3, 4, dtype=torch.float64), lin.weight, lin.bias, expert.weight, expert.bias]
    aot_eager(gm, inputs)(*inputs).backward()
    assert expert.weight.grad is None and expert.bias.grad is None
    inputs_ref = [inputs[0], *(p.detach().requires_grad_() for p in inputs[1:3])]
    F.mse_loss(F.linear(*inputs_ref), F.linear(inputs[0], expert.weight, expert.bias).detach()).backward()
    torch.testing.assert_close(lin.weight.grad, inputs_ref[1].grad)
    torch.testing.assert_close(lin.bias.grad, inputs_ref[2].grad)


def test_seed_003_compiled_model_then_loss_backward():
    """Seed 003 `train(model, x)`: the model's graph compiled, `.sum().backward()` on its output."""
    torch.manual_seed(0)
    model = nn.Linear(10, 10)
    x = torch.randn(10)
    compiled = compile_module(model, [x])
    compiled(x).sum().backward()
    torch.testing.assert_close(model.weight.grad, x.expand(10, 10))
    torch.testing.assert_close(model.bias.grad, torch.ones(10))


class Tied(nn.Module):
    """Input embedding and output projection share one weight (GPT-2, many LMs)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.emb(ids)))


def test_tied_weights_get_both_gradient_contributions():
    train_and_compare(Tied, lambda: [torch.randint(0, 10, (6,))], lambda out: out.logsumexp(-1).mean())


def test_cnn_with_batchnorm_in_eval_mode_fine_tunes_like_eager():
    """Frozen statistics (eval mode) while the weights train: BN reads, never writes, its buffers."""
    train_and_compare(lambda: CNN().eval(), lambda: [torch.randn(2, 3, 8, 8)], mse_to_zero)
