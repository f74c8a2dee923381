"""Whole training steps under kiln.compile: zero_grad, the forward (optionally under autocast), backward
through compiled autograd, gradient clipping and the optimizer's compiled update, compared with eager after
every step (loss, parameters, optimizer state).

CI runs a sample of the model x optimizer x variant matrix; KILN_TRAIN_SWEEP=1 runs all of it.
"""
import copy
import itertools

import pytest
import torch

import kiln
from support.sweeps import full


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))

    def forward(self, x):
        return self.net(x)

    @staticmethod
    def batch():
        return torch.randn(4, 8)


class ConvBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)  # a bias before BN gets only rounding noise
        self.bn = torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.head(y.mean(dim=(2, 3)))

    @staticmethod
    def batch():
        return torch.randn(2, 3, 6, 6)


class Block(torch.nn.Module):
    """A pre-norm transformer block: attention and an MLP, each with a residual."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 2 * dim), torch.nn.GELU(), torch.nn.Linear(2 * dim, dim))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))

    @staticmethod
    def batch():
        return torch.randn(2, 5, 16)


# Adam divides by the root of the squared grad: a grad that is zero in exact arithmetic (the key bias of
# attention) is rounding noise, which a small eps would turn into a full-size update of either sign.
OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=1e-4),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-2, eps=1e-3),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, eps=1e-3),
}
MODELS = {"mlp": MLP, "conv_bn": ConvBN, "block": Block}
VARIANTS = {"plain": {}, "autocast": {"autocast": True}, "clip": {"clip": True}}

ALL = list(itertools.product(MODELS, OPTIMIZERS, VARIANTS))
SAMPLE = [("mlp", "sgd", "plain"), ("mlp", "adamw", "clip"), ("conv_bn", "adam", "clip"),
          ("block", "adamw", "plain"), ("mlp", "adam", "autocast")]
CASES = ALL if full("KILN_TRAIN_SWEEP") else SAMPLE


def make_step(model, optimizer, scheduler, autocast=False, clip=False):
    def step(x):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        scheduler.step()
        return loss
    return step


def setup(model_name, optimizer_name):
    torch.manual_seed(0)
    model = MODELS[model_name]()
    optimizer = OPTIMIZERS[optimizer_name](model.parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    return model, optimizer, scheduler


def assert_same_state(eager_opt, kiln_opt, tol):
    for s, t in zip(eager_opt.state.values(), kiln_opt.state.values()):
        assert s.keys() == t.keys()
        for key in s:
            torch.testing.assert_close(t[key], s[key], **tol, msg=f"optimizer state {key!r}")


@pytest.mark.parametrize("model_name,optimizer_name,variant", CASES)
def test_five_steps_match_eager(model_name, optimizer_name, variant):
    options = VARIANTS[variant]
    tol = {"rtol": 2e-2, "atol": 2e-2} if options.get("autocast") else {"rtol": 1e-4, "atol": 1e-5}
    eager_parts, kiln_parts = setup(model_name, optimizer_name), setup(model_name, optimizer_name)
    eager_step = make_step(*eager_parts, **options)
    kiln.config.compiled_autograd = True
    kiln_step = kiln.compile(make_step(*kiln_parts, **options), fullgraph=True)
    torch.manual_seed(1)
    for i in range(5):
        x = MODELS[model_name].batch()
        expected, got = eager_step(x), kiln_step(x)
        torch.testing.assert_close(got, expected, **tol, msg=f"loss at step {i}")
        for (name, p), q in zip(eager_parts[0].named_parameters(), kiln_parts[0].parameters()):
            torch.testing.assert_close(q, p, **tol, msg=f"{name} after step {i}")
        assert_same_state(eager_parts[1], kiln_parts[1], tol)


def test_optimizer_state_dict_round_trip_keeps_training_in_step():
    eager_parts, kiln_parts = setup("mlp", "adam"), setup("mlp", "adam")
    eager_step = make_step(*eager_parts)
    kiln.config.compiled_autograd = True
    kiln_step = kiln.compile(make_step(*kiln_parts))
    batches = [MLP.batch() for _ in range(4)]
    for x in batches[:2]:
        eager_step(x), kiln_step(x)
    saved = copy.deepcopy(kiln_parts[1].state_dict())
    kiln_step(batches[2])  # a step that the restore undoes
    kiln_parts[1].load_state_dict(saved)
    with torch.no_grad():
        for p, q in zip(kiln_parts[0].parameters(), eager_parts[0].parameters()):
            p.copy_(q)
    for x in batches[2:]:
        torch.testing.assert_close(kiln_step(x), eager_step(x), rtol=1e-4, atol=1e-5)
    assert_same_state(eager_parts[1], kiln_parts[1], {"rtol": 1e-4, "atol": 1e-5})


def test_grad_read_after_zero_grad_sees_the_reset():
    """zero_grad() is made after the graph it was captured in; a later `.grad` read ends that graph first."""
    model, optimizer, scheduler = setup("mlp", "sgd")
    model(MLP.batch()).sum().backward()

    def reset_and_read():
        optimizer.zero_grad()
        return model.net[0].weight.grad

    assert kiln.compile(reset_and_read)() is None
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.allows_fallback("frame: a graph break inside the autocast block makes the step run eagerly")
def test_a_break_inside_autocast_runs_the_step_eagerly_and_correctly():
    def make(parts):
        model, optimizer, _ = parts

        def step(x):
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = model(x)
                kiln.graph_break()
                loss = y.float().pow(2).mean()
            loss.backward()
            optimizer.step()
            return loss
        return step

    eager_parts, kiln_parts = setup("mlp", "adam"), setup("mlp", "adam")
    kiln.config.compiled_autograd = True
    eager_step, kiln_step = make(eager_parts), kiln.compile(make(kiln_parts))
    tol = {"rtol": 2e-2, "atol": 2e-2}  # the frame runs natively, its nested calls compiled: bf16 rounding
    for _ in range(3):
        x = MLP.batch()
        torch.testing.assert_close(kiln_step(x), eager_step(x), **tol)
    torch.testing.assert_close(list(kiln_parts[0].parameters()), list(eager_parts[0].parameters()), **tol)
