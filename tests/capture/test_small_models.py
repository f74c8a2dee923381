"""Small models written the way people write them, captured whole and compared with eager:
a GPT-style decoder with a KV cache, a greedy decode loop, a ResNet block, an MoE router."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from support.capture import check, check_module, t


class CausalSelfAttention(nn.Module):
    def __init__(self, d=16, heads=4):
        super().__init__()
        self.heads, self.d = heads, d
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x, cache=None):
        b, s, _ = x.size()
        q, k, v = self.qkv(x).split(self.d, dim=2)
        q, k, v = [z.view(b, s, self.heads, self.d // self.heads).transpose(1, 2) for z in (q, k, v)]
        if cache is not None:
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        scale = 1.0 / math.sqrt(k.size(-1))
        att = (q @ k.transpose(-2, -1)) * scale
        t_q, t_k = q.size(2), k.size(2)
        mask = torch.ones(t_q, t_k, dtype=torch.bool).tril(diagonal=t_k - t_q)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, s, self.d)
        return self.proj(y)


class GPT(nn.Module):
    def __init__(self, vocab=11, d=16, layers=2, block=8):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(block, d)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(dict(ln1=nn.LayerNorm(d), attn=CausalSelfAttention(d), ln2=nn.LayerNorm(d),
                               mlp=nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))))
            for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx, caches=None, offset=0):
        pos = torch.arange(offset, offset + idx.shape[1], dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for i, blk in enumerate(self.blocks):
            cache = caches[i] if caches is not None else None
            x = x + blk["attn"](blk["ln1"](x), cache)
            x = x + blk["mlp"](blk["ln2"](x))
        return self.head(self.ln_f(x))


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_gpt_forward_one_graph(train):
    check_module(GPT, torch.randint(0, 11, (2, 6)), graphs=1, fullgraph=True, train=train, atol=1e-4)


def test_gpt_with_kv_cache_matches_eager():
    torch.manual_seed(0)
    model = GPT().eval()
    compiled = kiln.compile(model, backend="eager", fullgraph=True)
    idx = torch.randint(0, 11, (1, 3))
    e_caches, c_caches = [{}, {}], [{}, {}]
    torch.testing.assert_close(compiled(idx, c_caches), model(idx, e_caches), atol=1e-5, rtol=1e-4)
    step = torch.randint(0, 11, (1, 1))
    torch.testing.assert_close(compiled(step, c_caches, 3), model(step, e_caches, 3), atol=1e-5, rtol=1e-4)
    for e, c in zip(e_caches, c_caches):
        assert list(e) == list(c) == ["k", "v"]
        torch.testing.assert_close(c["k"], e["k"])


def greedy_decode(model, idx, steps=3):
    for _ in range(steps):
        logits = model(idx)
        nxt = logits[:, -1, :].argmax(dim=-1, keepdim=True)
        idx = torch.cat([idx, nxt], dim=1)
    return idx


def test_greedy_decode_loop():
    torch.manual_seed(0)
    model = GPT().eval()

    def fn(idx):
        return greedy_decode(model, idx)

    check(fn, torch.randint(0, 11, (2, 3)), graphs=1, fullgraph=True)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin=4, cout=8, stride=2):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)) \
            if stride != 1 or cin != cout else None

    def forward(self, x):
        identity = x
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return F.relu(out)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_resnet_block(train):
    check_module(BasicBlock, t(2, 4, 8, 8, grad=True), graphs=1, fullgraph=True, train=train, atol=1e-4)


class MoE(nn.Module):
    def __init__(self, d=8, experts=4, k=2):
        super().__init__()
        self.k = k
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList(nn.Linear(d, d) for _ in range(experts))

    def forward(self, x):
        weights, chosen = self.router(x).softmax(-1).topk(self.k, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            gate = (weights * (chosen == e)).sum(-1, keepdim=True)
            out = out + gate * expert(x)
        return out


def test_moe_dense_routing():
    check_module(MoE, t(5, 8, grad=True), graphs=1, fullgraph=True)
