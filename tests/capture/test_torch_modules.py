"""torch.nn's own modules, whose forwards are full of checks (fast paths, tracing-state queries):
each must give eager's result and gradients, captured or breaking, never wrong."""
import pytest
import torch
import torch.nn as nn

from support.capture import check_module, t


def _mha():
    return nn.MultiheadAttention(8, 2, batch_first=True)


class MHA(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = _mha()

    def forward(self, x):
        out, weights = self.attn(x, x, x, need_weights=True)
        return out, weights


class MHAMasked(MHA):
    def forward(self, x):
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), diagonal=1)
        out, _ = self.attn(x, x, x, attn_mask=mask, need_weights=False)
        return out


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)

    def forward(self, x):
        return self.enc(x)


class LSTM(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(8, 6, batch_first=True)

    def forward(self, x):
        out, (h, c) = self.rnn(x)
        return out, h, c


class GRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(8, 4, num_layers=2, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0]


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(4, 8, 3, padding=1, groups=2), nn.InstanceNorm2d(8), nn.GELU(),
            nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(8, 3))

    def forward(self, x):
        return self.body(x)


class Misc(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.EmbeddingBag(10, 4, mode="mean")
        self.prelu = nn.PReLU()
        self.up = nn.Upsample(scale_factor=2)
        self.bil = nn.Bilinear(4, 4, 2)
        self.unflatten = nn.Unflatten(1, (2, 2))

    def forward(self, idx):
        e = self.prelu(self.emb(idx))
        return self.bil(e, e), self.up(self.unflatten(e)), nn.Identity()(e)


# (module, inputs, graphs): RNNs break at flatten_parameters' weakref call and run natively
CASES = [
    (MHA, lambda: (t(2, 5, 8, grad=True),), 1),
    (MHAMasked, lambda: (t(2, 5, 8, grad=True),), 1),
    (Encoder, lambda: (t(2, 5, 8, grad=True),), 1),
    (LSTM, lambda: (t(2, 5, 8, grad=True),), None),
    (GRU, lambda: (t(2, 5, 8),), None),
    (ConvNet, lambda: (t(2, 3, 8, 8, grad=True),), 1),
    (Misc, lambda: (torch.randint(0, 10, (3, 4)),), 1),
]


@pytest.mark.parametrize("make,args,graphs", CASES, ids=[c[0].__name__ for c in CASES])
@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_torch_module_matches_eager(make, args, graphs, train):
    check_module(make, *args(), train=train, atol=1e-4, graphs=graphs)


class PermutedLayerNorm(nn.LayerNorm):
    """SqueezeBERT's layer norm: the base class's forward called by name on channels-first input."""

    def forward(self, x):
        return nn.LayerNorm.forward(self, x.permute(0, 2, 1)).permute(0, 2, 1)


def test_torch_module_method_called_through_its_class_is_inlined():
    check_module(lambda: PermutedLayerNorm(4), torch.randn(2, 4, 3), graphs=1, fullgraph=True)
