"""nn.Modules: forward inlined, submodules, containers, parameters and buffers, self.training,
properties, inherited forward and super().forward."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from support.capture import check_module, t


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class WithBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.full((4,), 2.0))
        self.weight = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return x * self.weight * self.scale


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class StackIndexed(Stack):
    def forward(self, x):
        x = self.layers[0](x)
        x = self.layers[-1](x)
        for i in range(len(self.layers)):
            x = self.layers[i](x) + x
        for layer in self.layers[1:]:
            x = layer(x)
        return x


class EnumerateList(Stack):
    def forward(self, x):
        outs = []
        for i, layer in enumerate(self.layers):
            x = layer(x) * (i + 1)
            outs.append(x)
        return torch.stack(outs).sum(0)


class Dict(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 3)})

    def forward(self, x):
        out = {}
        for name in self.heads:
            out[name] = self.heads[name](x)
        for name, head in self.heads.items():
            out[name + "2"] = head(x).sum()
        return out


class Seq(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4), nn.LayerNorm(4))

    def forward(self, x):
        return self.body(x) + self.body[0](x)[:, :4]


class SeqIter(Seq):
    def forward(self, x):
        for m in self.body:
            x = m(x)
        return x, len(self.body)


class Training(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        x = self.drop(self.fc(x))
        if self.training:
            return x * 2
        return x - 1


class BN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class Prop(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.factor = 3.0

    @property
    def scaled_weight(self):
        return self.fc.weight * self.factor

    def forward(self, x):
        return x @ self.scaled_weight.T


class Helper(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def _block(self, x, k=2):
        return self.fc(x) * k

    def forward(self, x):
        return self._block(x) + self._block(x, k=3)


class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(x).relu()


class Inherits(Base):
    pass


class Overrides(Base):
    def forward(self, x):
        return super().forward(x) * 2 + 1


class OverridesExplicitSuper(Base):
    def forward(self, x):
        return super(OverridesExplicitSuper, self).forward(x) - Base.forward(self, x)


class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = MLP()
        self.b = Overrides()
        self.proj = nn.Linear(2, 4)

    def forward(self, x):
        return self.b(self.proj(self.a(x)))


class KwargsForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, scale=1.0, *, bias=None):
        y = self.fc(x) * scale
        if bias is not None:
            y = y + bias
        return y


class ParamList(nn.Module):
    def __init__(self):
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.randn(4)) for _ in range(3)])
        self.pd = nn.ParameterDict({"w": nn.Parameter(torch.randn(4))})

    def forward(self, x):
        for p in self.ps:
            x = x * p
        return x + self.pd["w"]


class SharedWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(self.fc(x))


class Attention(nn.Module):
    def __init__(self, d=8, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (z.view(b, s, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        att = att.softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, d)
        return self.out(y)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(8)
        self.attn = Attention()
        self.ln2 = nn.LayerNorm(8)
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TorchModules(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.gru_free = nn.Sequential(nn.Conv1d(4, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.SiLU())
        self.pool = nn.AdaptiveAvgPool1d(1)

    def forward(self, idx):
        x = self.emb(idx).transpose(1, 2)
        return self.pool(self.gru_free(x)).flatten(1)


class ModuleAttrsConfig(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3, stride=2)

    def forward(self, x):
        k = self.conv.kernel_size[0] + self.conv.stride[0] + self.conv.out_channels
        return self.conv(x) * k


class NamedChildren(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        for _name, child in self.named_children():
            x = child(x)
        return x


def _x(*shape, grad=True):
    return t(*shape, grad=grad)


CASES = [
    (MLP, (_x(3, 4),)),
    (WithBuffer, (_x(3, 4),)),
    (Stack, (_x(3, 4),)),
    (StackIndexed, (_x(3, 4),)),
    (EnumerateList, (_x(3, 4),)),
    (Dict, (_x(3, 4),)),
    (Seq, (_x(3, 4),)),
    (SeqIter, (_x(3, 4),)),
    (BN, (_x(2, 3, 5, 5),)),
    (Prop, (_x(3, 4),)),
    (Helper, (_x(3, 4),)),
    (Inherits, (_x(3, 4),)),
    (Overrides, (_x(3, 4),)),
    (OverridesExplicitSuper, (_x(3, 4),)),
    (Nested, (_x(3, 4),)),
    (KwargsForward, (_x(3, 4),)),
    (ParamList, (_x(3, 4),)),
    (SharedWeights, (_x(3, 4),)),
    (Attention, (_x(2, 5, 8),)),
    (Block, (_x(2, 5, 8),)),
    (TorchModules, (torch.randint(0, 10, (2, 6)),)),
    (ModuleAttrsConfig, (_x(1, 3, 7, 7),)),
    (NamedChildren, (_x(3, 4),)),
]


@pytest.mark.parametrize("make,args", CASES, ids=[c[0].__name__ for c in CASES])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_module_one_graph(make, args, train):
    check_module(make, *args, graphs=1, records=1, fullgraph=True, train=train)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_training_flag_branch(train):
    check_module(Training, t(3, 4, grad=True), graphs=1, fullgraph=True, train=train)


def test_forward_kwargs_at_call():
    import kiln

    torch.manual_seed(0)
    m = KwargsForward()
    c = kiln.compile(m, backend="eager", fullgraph=True)
    x, b = t(3, 4), t(4)
    torch.testing.assert_close(c(x, 2.0, bias=b), m(x, 2.0, bias=b))
    torch.testing.assert_close(c(x), m(x))


def test_batchnorm_running_stats_updated_in_training():
    import copy

    import kiln

    torch.manual_seed(0)
    m = BN().train()
    ref = copy.deepcopy(m)
    c = kiln.compile(m, backend="eager", fullgraph=True)
    x = t(2, 3, 5, 5)
    c(x)
    ref(x)
    torch.testing.assert_close(m.bn.running_mean, ref.bn.running_mean)
    torch.testing.assert_close(m.bn.running_var, ref.bn.running_var)
    assert int(m.bn.num_batches_tracked) == int(ref.bn.num_batches_tracked) == 1


def test_method_of_module_compiled_directly():
    import kiln

    torch.manual_seed(0)
    m = Helper()
    c = kiln.compile(m._block, backend="eager", fullgraph=True)
    x = t(3, 4)
    torch.testing.assert_close(c(x, k=5), m._block(x, k=5))


def test_module_called_inside_function():
    from support.capture import check

    torch.manual_seed(0)
    m = MLP()

    def fn(x):
        return m(x).sum(-1) + m.fc1.bias.sum()

    check(fn, t(3, 4, grad=True), graphs=1, fullgraph=True)


class Truthiness(nn.Module):
    def __init__(self, with_layers):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.layers = nn.ModuleList([nn.Identity()] if with_layers else [])
        self.opt = None

    def forward(self, x):
        if self.fc:
            x = x * 2
        if self.layers:
            x = x * 100
        if not self.opt:
            x = x + 1
        if self.fc.bias is not None and self.fc.weight.requires_grad:
            x = x - 1
        return self.fc(x)


@pytest.mark.parametrize("with_layers", [True, False])
def test_module_truthiness(with_layers):
    check_module(lambda: Truthiness(with_layers), t(2, 4, grad=True), graphs=1, fullgraph=True)
