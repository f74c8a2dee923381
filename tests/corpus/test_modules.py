"""nn.Module patterns as Dynamo's test_modules exercises them: containers (Sequential, ModuleList, ModuleDict,
ParameterList/Dict), buffers updated in forward, the training flag, hooks, submodule reuse, attributes that
change between calls, and forward signatures with defaults and keywords. Parameters get gradients compared too."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from .reference import Table, call, check_module, t

torch.manual_seed(0)
X = t(2, 4)
X3 = t(2, 3, 4)
modules = Table()


def register(cls, *calls, marks=()):
    """Add a module class (built with no arguments) to the table; calls default to one on X."""
    modules(*(calls or ((X,),)), marks=marks)(cls)
    return cls


class BasicLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return F.relu(self.fc(x))


class SequentialStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4), nn.Tanh())

    def forward(self, x):
        return self.body(x)


class SequentialIndexAndSlice(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))

    def forward(self, x):
        return self.body[0](x) + self.body[1:](x) + self.body[-1](x)


class ModuleListLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


class ModuleListEnumerateZip(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
        self.norms = nn.ModuleList([nn.LayerNorm(4) for _ in range(2)])

    def forward(self, x):
        for i, (layer, norm) in enumerate(zip(self.layers, self.norms)):
            x = norm(layer(x)) * (i + 1)
        return x


class ModuleListIndexing(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(4)])

    def forward(self, x):
        x = self.layers[0](x) + self.layers[-1](x)
        for layer in self.layers[1:3]:
            x = layer(x)
        return x, len(self.layers)


class ModuleListReversed(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

    def forward(self, x):
        for layer in reversed(self.layers):
            x = layer(x).sin()
        return x


class ModuleDictLookup(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 3)})

    def forward(self, x):
        outs = {name: head(x) for name, head in self.heads.items()}
        return outs, self.heads["a"](x), "b" in self.heads, list(self.heads.keys())


class ParameterListAndDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.weights = nn.ParameterList([nn.Parameter(torch.randn(4)) for _ in range(2)])
        self.biases = nn.ParameterDict({"one": nn.Parameter(torch.randn(4))})

    def forward(self, x):
        for w in self.weights:
            x = x * w
        return x + self.biases["one"]


class RawParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(4) * 2)
        self.offset = nn.Parameter(torch.zeros(1), requires_grad=False)

    def forward(self, x):
        return x * self.scale + self.offset


class BufferRunningMean(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("running", torch.zeros(4))
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        with torch.no_grad():
            self.running.mul_(0.9).add_(y.mean(0) * 0.1)
        return y - self.running


class BufferCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.steps += 1
        return x * self.steps


class NonPersistentBuffer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("mask", torch.tensor([1.0, 0.0, 1.0, 0.0]), persistent=False)

    def forward(self, x):
        return x * self.mask


class TrainingFlagBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return y * 2 if self.training else y - 1


class BatchNormTrain(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(x)


class BatchNormTwoSteps(BatchNormTrain):
    """Two training steps: the running statistics of the first feed the state after the second."""


class BatchNormEval(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.bn.running_mean.fill_(0.5)
        self.eval()

    def forward(self, x):
        return self.bn(x)


class DropoutEval(nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(4, 4)
        self.eval()

    def forward(self, x):
        return self.drop(self.fc(x))


class AttributeCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        self.calls += 1
        return self.fc(x)


class AttributeListAppend(nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x):
        self.seen.append(tuple(x.shape))
        return x + len(self.seen)


class ConstantAttributes(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 0.5
        self.use_bias = True
        self.act = "gelu"
        self.fc = nn.Linear(4, 4, bias=self.use_bias)

    def forward(self, x):
        y = self.fc(x) * self.scale
        return F.gelu(y) if self.act == "gelu" else F.relu(y)


class OptionalSubmodule(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.proj = None

    def forward(self, x):
        y = self.fc(x)
        if self.proj is not None:
            y = self.proj(y)
        return y


class SharedSubmodule(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.again = self.fc

    def forward(self, x):
        return self.again(self.fc(x))


class NestedModules(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = SequentialStack()
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.inner(x))


class ForwardWithDefaults(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, scale=2.0, mask=None):
        y = self.fc(x) * scale
        return y if mask is None else y * mask


class HelperMethodCalls(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def _project(self, x):
        return self.fc(x)

    def forward(self, x):
        return self._project(x) + self._project(x * 2)


class Inherited(BasicLinear):
    def forward(self, x):
        return super().forward(x) * 3


class PropertyOnModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    @property
    def out_features(self):
        return self.fc.out_features

    def forward(self, x):
        return self.fc(x) * self.out_features


class ParametersIteratedInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        penalty = sum(p.pow(2).sum() for p in self.parameters())
        names = [n for n, _ in self.named_parameters()]
        return self.fc(x).sum() + penalty, len(names)


class ModulesIteratedInForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.ReLU()

    def forward(self, x):
        for m in self.children():
            x = m(x)
        return x, sum(1 for _ in self.modules())


class ConvBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return self.pool(F.relu(self.bn(self.conv(x)))).flatten(1)


class EmbeddingBag(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, ids):
        return self.norm(self.emb(ids)).mean(1)


class AttentionBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True)

    def forward(self, x):
        out, _ = self.attn(x, x, x, need_weights=False)
        return out


class TransformerEncoderTiny(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(4, 2, dim_feedforward=8, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)

    def forward(self, x):
        return self.enc(x)


class GRUCellLoop(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(4, 4)

    def forward(self, x):
        h = torch.zeros(x.shape[0], 4)
        for step in range(x.shape[1]):
            h = self.cell(x[:, step], h)
        return h


class LSTMModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(4, 3, batch_first=True)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return out, h


class ModuleReturnsDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return {"logits": y, "probs": y.softmax(-1), "n": y.shape[-1]}


class InPlaceActivation(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.act(self.fc(x))


class WeightTransposeUse(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return x @ self.fc.weight.t() + self.fc.bias, self.fc.weight.shape


class ModuleCallsFunctionalWithParams(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 4))

    def forward(self, x):
        return F.linear(x, self.weight), F.normalize(self.weight, dim=1)


class IdentityAndFlatten(nn.Module):
    def __init__(self):
        super().__init__()
        self.id = nn.Identity()
        self.flat = nn.Flatten()
        self.unflat = nn.Unflatten(1, (2, 2))

    def forward(self, x):
        return self.unflat(self.flat(self.id(x)))


class SiLUGELUStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.SiLU(), nn.Linear(4, 4), nn.GELU(), nn.Softmax(-1))

    def forward(self, x):
        return self.body(x)


class GroupAndInstanceNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.gn = nn.GroupNorm(2, 4)
        self.inorm = nn.InstanceNorm1d(4, affine=True)

    def forward(self, x):
        return self.gn(x), self.inorm(x)


for module_class in (BasicLinear, SequentialStack, ModuleListLoop, ModuleListEnumerateZip,
                     ModuleListIndexing, ModuleListReversed, ModuleDictLookup, ParameterListAndDict, RawParameter,
                     BufferRunningMean, BufferCounter, NonPersistentBuffer, TrainingFlagBranch, BatchNormTrain,
                     BatchNormEval, DropoutEval, AttributeCounter, ConstantAttributes, OptionalSubmodule,
                     SharedSubmodule, NestedModules, HelperMethodCalls, Inherited, PropertyOnModule,
                     ParametersIteratedInForward, ModulesIteratedInForward, ModuleReturnsDict, InPlaceActivation,
                     WeightTransposeUse, ModuleCallsFunctionalWithParams, IdentityAndFlatten, SiLUGELUStack):
    register(module_class)
register(AttributeListAppend, (X,), (t(3, 4),))
register(ForwardWithDefaults, (X,), call(X, scale=0.5), call(X, mask=t(2, 4)))
register(ConvBlock, (t(2, 2, 5, 5),))
register(EmbeddingBag, (torch.randint(0, 10, (2, 3)),))
register(AttentionBlock, (X3,))
register(TransformerEncoderTiny, (X3,))
register(GRUCellLoop, (X3,))
register(LSTMModule, (X3,))
register(GroupAndInstanceNorm, (t(2, 4, 3),))
register(BatchNormTwoSteps, (X,), (X,))
register(SequentialIndexAndSlice)


@pytest.mark.parametrize("make, calls, options", modules.params)
def test_module_matches_eager(make, calls, options):
    check_module(make, *calls, **options)


def _hooked(kind):
    """A Linear with a forward hook or pre-hook that changes what flows through it."""
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    if kind == "forward":
        m[0].register_forward_hook(lambda mod, args, out: out * 2)
    elif kind == "pre":
        m[0].register_forward_pre_hook(lambda mod, args: (args[0] + 1,))
    elif kind == "pre_with_kwargs":
        m[0].register_forward_pre_hook(lambda mod, args, kwargs: ((args[0] * 3,), kwargs), with_kwargs=True)
    elif kind == "global_state":
        calls = []
        m.register_forward_hook(lambda mod, args, out: calls.append(1))
        m.calls = calls
    return m


@pytest.mark.parametrize("kind", ["forward", "pre", "pre_with_kwargs", "global_state"])
def test_module_hooks(kind):
    check_module(lambda: _hooked(kind), (X,))


@pytest.mark.parametrize("training", [True, False])
def test_training_flag_of_module_set_before_compile(training):
    def make():
        m = TrainingFlagBranch()
        m.train(training)
        return m
    check_module(make, (X,))


def test_changing_training_flag_between_calls_recompiles():
    """A mode switch on the module between calls must be guarded: outputs follow the new branch."""
    import copy

    import kiln
    torch.manual_seed(0)
    eager = TrainingFlagBranch()
    compiled_src = copy.deepcopy(eager)
    compiled = kiln.compile(compiled_src, backend="eager")
    for mode in (True, False, True):
        eager.train(mode)
        compiled_src.train(mode)
        torch.testing.assert_close(compiled(X), eager(X))


def test_module_attribute_change_between_calls_is_guarded():
    """A plain attribute read by forward is guarded: changing it changes the output."""
    import kiln
    m = ConstantAttributes()
    compiled = kiln.compile(m, backend="eager")
    first = compiled(X)
    torch.testing.assert_close(first, m(X))
    m.scale = 3.0
    torch.testing.assert_close(compiled(X), m(X))
    m.act = "relu"
    torch.testing.assert_close(compiled(X), m(X))


THROUGH_AUTOGRAD_STAGE = [BasicLinear, SequentialStack, ModuleListLoop, BufferRunningMean, BufferCounter,
                          TrainingFlagBranch, BatchNormTrain, BatchNormEval, AttributeCounter, SharedSubmodule,
                          InPlaceActivation, ParameterListAndDict, RawParameter, ModuleReturnsDict]


@pytest.mark.parametrize("make", [pytest.param(cls, id=cls.__name__) for cls in THROUGH_AUTOGRAD_STAGE])
def test_module_through_autograd_stage(make):
    check_module(make, (X,), (X,), backend="aot_eager")


@pytest.mark.parametrize("make, args", [pytest.param(ConvBlock, (t(2, 2, 5, 5),), id="ConvBlock"),
                                        pytest.param(EmbeddingBag, (torch.randint(0, 10, (2, 3)),), id="EmbeddingBag"),
                                        pytest.param(TransformerEncoderTiny, (X3,), id="TransformerEncoderTiny")])
def test_larger_module_through_autograd_stage(make, args):
    check_module(make, args, backend="aot_eager")
