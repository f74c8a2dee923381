"""Small models of the families kiln's users train, each returning a tensor: the loss (training) or the logits.

The Hugging Face ones (GPT-2, a Llama-style decoder, BERT) are built from transformers' configs with random
weights. timm and torchvision are not installed everywhere the tests run, so the vision families are written
here in their usual form at toy sizes:

- `ViT`: patch embedding by a strided convolution, a class token, pre-norm transformer blocks with fused
  attention (`scaled_dot_product_attention`), GELU MLPs;
- `SwinBlock`: a Swin Transformer block pair (windowed attention with a relative-position bias gathered from a
  table, then shifted windows with `torch.roll` and the attention mask of the shifted regions);
- `ConvNeXtBlock`: a ConvNeXt stage (7x7 depthwise convolution, channels-last LayerNorm via permutes,
  pointwise MLP as linears, layer scale, residual), with a stem and a downsampling layer;
- `ResNet`: a ResNet-18-style network (basic blocks with batch norm, ReLU, a strided shortcut, max and average
  pooling);
- `MobileNetV2`: torchvision's MobileNetV2 at toy width (inverted residuals: 1x1 expansion, depthwise 3x3 of
  stride 1 or 2, linear 1x1 projection, each with batch norm, ReLU6 between, residual where shapes allow).

`MODELS[name](train)` -> (module, inputs): CPU tensors; tests choose where the values come from.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, BATCH, SEQ, IMAGE, CLASSES = 128, 2, 16, 32, 10


class LanguageModel(nn.Module):
    """A Hugging Face LM called positionally: the loss of predicting `ids` when training, else the logits."""

    def __init__(self, model: nn.Module, train: bool):
        super().__init__()
        self.model, self.training_loss = model, train

    def forward(self, ids):
        out = self.model(input_ids=ids, labels=ids if self.training_loss else None)
        return out.loss if self.training_loss else out.logits


class Classifier(nn.Module):
    """An image classifier with its cross-entropy loss when training (`labels` given)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images, labels=None):
        logits = self.model(images)
        return logits if labels is None else F.cross_entropy(logits, labels)


def _hf(config_class: str, model_class: str, **config):
    def build(train: bool):
        import transformers

        cfg = getattr(transformers, config_class)(use_cache=False, **config)
        model = LanguageModel(getattr(transformers, model_class)(cfg), train).train(train)
        return model, [torch.randint(0, VOCAB, (BATCH, SEQ))]
    return build


def _vision(make):
    def build(train: bool):
        torch.manual_seed(0)
        model = Classifier(make()).train(train)
        images = torch.randn(BATCH, 3, IMAGE, IMAGE)
        return model, [images, torch.randint(0, CLASSES, (BATCH,))] if train else [images]
    return build


class Attention(nn.Module):
    """Multi-head self-attention over (batch, tokens, dim), with an optional additive bias/mask per head."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)

    def forward(self, x, bias=None):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.proj(out.transpose(1, 2).reshape(b, n, c))


class Mlp(nn.Sequential):
    def __init__(self, dim: int, hidden: int):
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))


class ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), Attention(dim, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim), Mlp(dim, dim * 4)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, dim: int = 64, depth: int = 2, heads: int = 4, patch: int = 8):
        super().__init__()
        tokens = (IMAGE // patch) ** 2
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, tokens + 1, dim) * 0.02)
        self.blocks = nn.Sequential(*[ViTBlock(dim, heads) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, CLASSES)

    def forward(self, images):
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.blocks(x))[:, 0])


class WindowAttention(nn.Module):
    """Swin's attention inside (window x window) patches, with a learned relative-position bias."""

    def __init__(self, dim: int, heads: int, window: int):
        super().__init__()
        self.attn, self.window, self.heads = Attention(dim, heads), window, heads
        self.table = nn.Parameter(torch.randn((2 * window - 1) ** 2, heads) * 0.02)
        coords = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window - 1)
        self.register_buffer("index", relative[..., 0] * (2 * window - 1) + relative[..., 1], persistent=False)

    def forward(self, windows, mask=None):
        n = self.window * self.window
        bias = self.table[self.index.reshape(-1)].reshape(n, n, self.heads).permute(2, 0, 1).unsqueeze(0)
        if mask is not None:  # (windows per image, n, n) -> per window of the batch
            nw = mask.shape[0]
            bias = (bias + mask.unsqueeze(1)).repeat(windows.shape[0] // nw, 1, 1, 1)
        return self.attn(windows, bias)


class SwinBlock(nn.Module):
    """One Swin block: layer norm, (shifted) window attention, MLP; `shift` 0 for the plain windows."""

    def __init__(self, dim: int, heads: int, window: int, size: int, shift: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn, self.mlp = WindowAttention(dim, heads, window), Mlp(dim, dim * 4)
        self.window, self.size, self.shift = window, size, shift
        if shift:
            region = torch.zeros(1, size, size, 1)
            bounds = (slice(0, -window), slice(-window, -shift), slice(-shift, None))
            for k, (h, w) in enumerate((h, w) for h in bounds for w in bounds):
                region[:, h, w, :] = k
            ids = self._partition(region).squeeze(-1)
            mask = ids.unsqueeze(1) - ids.unsqueeze(2)
            self.register_buffer("mask", mask.masked_fill(mask != 0, -100.0), persistent=False)
        else:
            self.mask = None

    def _partition(self, x):
        b, h, w, c = x.shape
        s = self.window
        return x.view(b, h // s, s, w // s, s, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, s * s, c)

    def forward(self, x):
        b, hw, c = x.shape
        y = self.norm1(x).view(b, self.size, self.size, c)
        if self.shift:
            y = torch.roll(y, (-self.shift, -self.shift), dims=(1, 2))
        y = self.attn(self._partition(y), self.mask)
        s, n = self.window, self.size // self.window
        y = y.view(b, n, n, s, s, c).permute(0, 1, 3, 2, 4, 5).reshape(b, self.size, self.size, c)
        if self.shift:
            y = torch.roll(y, (self.shift, self.shift), dims=(1, 2))
        x = x + y.reshape(b, hw, c)
        return x + self.mlp(self.norm2(x))


class Swin(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 2, window: int = 4, patch: int = 4):
        super().__init__()
        size = IMAGE // patch
        self.embed, self.norm0 = nn.Conv2d(3, dim, patch, stride=patch), nn.LayerNorm(dim)
        self.blocks = nn.Sequential(SwinBlock(dim, heads, window, size, 0),
                                    SwinBlock(dim, heads, window, size, window // 2))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, CLASSES)

    def forward(self, images):
        x = self.norm0(self.embed(images).flatten(2).transpose(1, 2))
        return self.head(self.norm(self.blocks(x)).mean(1))


class ChannelsLastNorm(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor (ConvNeXt's downsampling norm)."""

    def forward(self, x):
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm, self.mlp = nn.LayerNorm(dim), Mlp(dim, dim * 4)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.gamma * self.mlp(self.norm(y))
        return x + y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, dims=(16, 32)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], 4, stride=4), ChannelsLastNorm(dims[0]))
        self.stage1 = nn.Sequential(ConvNeXtBlock(dims[0]), ConvNeXtBlock(dims[0]))
        self.down = nn.Sequential(ChannelsLastNorm(dims[0]), nn.Conv2d(dims[0], dims[1], 2, stride=2))
        self.stage2 = ConvNeXtBlock(dims[1])
        self.norm, self.head = nn.LayerNorm(dims[1]), nn.Linear(dims[1], CLASSES)

    def forward(self, images):
        x = self.stage2(self.down(self.stage1(self.stem(images))))
        return self.head(self.norm(x.mean((2, 3))))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, widths=(16, 32)):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 7, 2, 3, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.layer1 = BasicBlock(widths[0], widths[0], 1)
        self.layer2 = BasicBlock(widths[0], widths[1], 2)
        self.fc = nn.Linear(widths[1], CLASSES)

    def forward(self, images):
        x = self.layer2(self.layer1(self.stem(images)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, relu6: bool = True) -> nn.Sequential:
    """torchvision's Conv2dNormActivation: conv without bias, batch norm, ReLU6 (none after a projection)."""
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.ReLU6()) if relu6 else nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        self.residual = stride == 1 and cin == cout
        self.block = nn.Sequential(conv_bn(cin, hidden, 1), conv_bn(hidden, hidden, 3, stride, groups=hidden),
                                   conv_bn(hidden, cout, 1, relu6=False))

    def forward(self, x):
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetV2(nn.Module):
    # (expansion, channels, blocks, first stride), torchvision's table at toy width and depth
    SETTINGS = ((1, 8, 1, 1), (6, 12, 2, 2), (6, 16, 2, 2))

    def __init__(self, stem: int = 8, last: int = 32):
        super().__init__()
        layers, cin = [conv_bn(3, stem, 3, 2)], stem
        for expand, cout, blocks, stride in self.SETTINGS:
            for i in range(blocks):
                layers.append(InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        self.features = nn.Sequential(*layers, conv_bn(cin, last, 1))
        self.classifier = nn.Linear(last, CLASSES)

    def forward(self, images):
        return self.classifier(F.adaptive_avg_pool2d(self.features(images), 1).flatten(1))


_HF_DECODER = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                   vocab_size=VOCAB, max_position_embeddings=64)

MODELS = {
    "gpt2": _hf("GPT2Config", "GPT2LMHeadModel", n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64,
                bos_token_id=0, eos_token_id=0),
    "llama": _hf("LlamaConfig", "LlamaForCausalLM", num_key_value_heads=2, bos_token_id=0, eos_token_id=0,
                 pad_token_id=0, **_HF_DECODER),
    "bert": _hf("BertConfig", "BertForMaskedLM", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=64),
    "vit": _vision(ViT),
    "swin": _vision(Swin),
    "convnext": _vision(ConvNeXt),
    "resnet": _vision(ResNet),
    "mobilenet_v2": _vision(MobileNetV2),
}
