"""`optimizer.step()` inside a kiln-compiled function runs kiln's compiled update: the same parameters and
state as eager's step, one graph however the learning rate changes, eager's own step where the compiled
one does not apply."""
import logging
import os

import pytest
import torch

import kiln
from kiln import optim


def setup(make_optimizer, seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    return model, make_optimizer(model.parameters())


def set_grads(model, step):
    gen = torch.Generator().manual_seed(step)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)


def run_steps(model, optimizer, step_fn, steps=4):
    for i in range(steps):
        set_grads(model, i)
        step_fn()


def assert_same(eager, compiled):
    (em, eo), (cm, co) = eager, compiled
    torch.testing.assert_close(list(cm.parameters()), list(em.parameters()), rtol=1e-5, atol=1e-6)
    for s, t in zip(eo.state.values(), co.state.values()):
        assert s.keys() == t.keys()
        for key in s:
            torch.testing.assert_close(t[key], s[key], rtol=1e-5, atol=1e-6)


VARIANTS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "sgd_momentum_nesterov": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    "sgd_foreach_off": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.5, foreach=False, maximize=True),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "adam_amsgrad_wd": lambda ps: torch.optim.Adam(ps, lr=0.01, amsgrad=True, weight_decay=0.1),
    "adam_fused": lambda ps: torch.optim.Adam(ps, lr=0.01, fused=True),
    "adamw_foreach": lambda ps: torch.optim.AdamW(ps, lr=0.01, foreach=True),
    "adamw_fused": lambda ps: torch.optim.AdamW(ps, lr=0.01, fused=True, betas=(0.8, 0.9)),
}


# CI runs a sample; KILN_TRAIN_SWEEP=1 runs every variant
SAMPLE = ["sgd_momentum_nesterov", "adam_amsgrad_wd", "adamw_fused", "sgd_foreach_off"]


@pytest.mark.parametrize("name", list(VARIANTS) if os.environ.get("KILN_TRAIN_SWEEP") else SAMPLE)
def test_compiled_step_matches_eager(name, compiled_graphs):
    eager, compiled = setup(VARIANTS[name]), setup(VARIANTS[name])
    run_steps(*eager, eager[1].step)
    run_steps(*compiled, kiln.compile(lambda: compiled[1].step(), fullgraph=True))
    assert_same(eager, compiled)
    assert compiled_graphs, "the update went through kiln's code generator"
    assert len(optim._steps[compiled[1]].entries) == 1


def test_scheduler_changes_lr_without_recompiling(caplog):
    caplog.set_level(logging.INFO, logger="kiln.recompiles")
    make = VARIANTS["adamw_foreach"]
    eager, compiled = setup(make), setup(make)
    schedulers = [torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.7) for _, o in (eager, compiled)]
    compiled_step = kiln.compile(lambda: compiled[1].step())
    lrs = []
    for i in range(5):
        set_grads(eager[0], i), set_grads(compiled[0], i)
        eager[1].step(), compiled_step()
        for scheduler in schedulers:
            scheduler.step()
        lrs.append(compiled[1].param_groups[0]["lr"])
    assert len(set(lrs)) == 5
    assert_same(eager, compiled)
    assert len(optim._steps[compiled[1]].entries) == 1
    assert not [r for r in caplog.records if "optimizer step" in r.getMessage()]


def test_a_tensor_learning_rate_is_used_as_given():
    make = lambda ps: torch.optim.Adam(ps, lr=torch.tensor(0.01), foreach=False)  # noqa: E731
    eager, compiled = setup(make), setup(make)
    run_steps(*eager, eager[1].step)
    run_steps(*compiled, kiln.compile(lambda: compiled[1].step()))
    assert_same(eager, compiled)


def test_changed_hyperparameter_recompiles_and_says_why(caplog):
    caplog.set_level(logging.INFO, logger="kiln.recompiles")
    make = VARIANTS["adam"]
    eager, compiled = setup(make), setup(make)
    compiled_step = kiln.compile(lambda: compiled[1].step())
    for i in range(4):
        if i == 2:
            for _, o in (eager, compiled):
                o.param_groups[0]["weight_decay"] = 0.5
        set_grads(eager[0], i), set_grads(compiled[0], i)
        eager[1].step(), compiled_step()
    assert_same(eager, compiled)
    assert len(optim._steps[compiled[1]].entries) == 2
    assert any("hyperparameters changed" in r.getMessage() for r in caplog.records)


def test_state_dict_round_trip():
    make = VARIANTS["adam"]
    eager, compiled = setup(make), setup(make)
    compiled_step = kiln.compile(lambda: compiled[1].step())
    run_steps(*eager, eager[1].step)
    run_steps(*compiled, compiled_step)
    fresh = setup(make, seed=3)  # other parameters and no state, given the compiled optimizer's state
    with torch.no_grad():
        for p, q in zip(fresh[0].parameters(), compiled[0].parameters()):
            p.copy_(q)
    fresh[1].load_state_dict(compiled[1].state_dict())
    fresh_step = kiln.compile(lambda: fresh[1].step())
    for i in range(4, 6):
        for model, _ in (eager, fresh):
            set_grads(model, i)
        eager[1].step(), fresh_step()
    assert_same(eager, fresh)


@pytest.mark.parametrize("case", ["closure", "hook", "other_optimizer"])
def test_what_the_compiled_step_does_not_cover_runs_eagerly(case):
    make = (lambda ps: torch.optim.RMSprop(ps, lr=0.01)) if case == "other_optimizer" else VARIANTS["adam"]
    eager, compiled = setup(make), setup(make)
    calls = []
    for _, o in (eager, compiled):
        if case == "hook":
            o.register_step_post_hook(lambda opt, args, kwargs: calls.append(type(opt).__name__))
    closure = (lambda: None) if case == "closure" else None
    compiled_step = kiln.compile(lambda: compiled[1].step(closure))
    run_steps(*eager, lambda: eager[1].step(closure))
    run_steps(*compiled, compiled_step)
    assert_same(eager, compiled)
    assert compiled[1] not in optim._steps or not optim._steps[compiled[1]].entries
    if case == "hook":
        assert len(calls) == 8
