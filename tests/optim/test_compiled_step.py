"""`optimizer.step()` inside a kiln-compiled function runs kiln's compiled update, from the first step (which
creates the state) on: the same parameters and state as eager's step after every step, one graph however
the learning rate changes, eager's own step where the compiled one does not apply."""
import copy
import logging

import pytest
import torch

import kiln
from kiln import optim
from kiln.optim import initial_state
from support.sweeps import full


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


def run_side_by_side(eager, compiled, steps=4, first=0, between=None):
    """Steps of both, compared after every one; `between(i)` may change both before step i."""
    compiled_step = kiln.compile(lambda: compiled[1].step(), fullgraph=True)
    for i in range(first, first + steps):
        if between is not None:
            between(i)
        set_grads(eager[0], i), set_grads(compiled[0], i)
        eager[1].step(), compiled_step()
        assert_same(eager, compiled, f"after step {i}")


def graphs_per_structure(optimizer):
    """The updates a run compiles for one structure: the steady one, and the first step's where that step
    creates state other than by making it ahead of the update (SGD's first momentum buffer)."""
    return 2 if any(optimizer.state.values()) and initial_state.first_step_has_own_graph(optimizer) else 1


def assert_same(eager, compiled, when=""):
    (em, eo), (cm, co) = eager, compiled
    torch.testing.assert_close(list(cm.parameters()), list(em.parameters()), rtol=1e-5, atol=1e-6,
                               msg=f"parameters {when}")
    assert len(eo.state) == len(co.state)
    for p, q in zip(em.parameters(), cm.parameters()):
        s, t = eo.state.get(p, {}), co.state.get(q, {})
        assert s.keys() == t.keys(), when
        for key in s:
            torch.testing.assert_close(t[key], s[key], rtol=1e-5, atol=1e-6, check_device=False,
                                       msg=f"state {key!r} {when}")


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


@pytest.mark.parametrize("name", list(VARIANTS) if full("KILN_TRAIN_SWEEP") else SAMPLE)
def test_compiled_step_matches_eager(name, compiled_graphs):
    eager, compiled = setup(VARIANTS[name]), setup(VARIANTS[name])
    run_side_by_side(eager, compiled)
    assert compiled_graphs, "the update went through kiln's code generator"
    assert len(optim._steps[compiled[1]].entries) == graphs_per_structure(compiled[1])


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
    assert len(optim._steps[compiled[1]].entries) == graphs_per_structure(compiled[1])
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
    assert len(optim._steps[compiled[1]].entries) == graphs_per_structure(compiled[1]) + 1
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


@pytest.mark.parametrize("name", ["sgd_momentum_nesterov", "adam_amsgrad_wd", "adamw_fused"])
def test_the_first_step_is_compiled_and_creates_eagers_state(name, caplog):
    caplog.set_level(logging.INFO, logger="kiln.perf_hints")
    eager, compiled = setup(VARIANTS[name]), setup(VARIANTS[name])
    run_side_by_side(eager, compiled, steps=1)
    assert compiled[1].state, "the compiled first step created the state"
    assert len(optim._steps[compiled[1]].entries) == 1
    assert not [r for r in caplog.records if "runs eagerly" in r.getMessage()]


def test_a_param_group_added_during_training_gets_its_state_from_a_compiled_step():
    def make(ps):
        ps = list(ps)
        return torch.optim.Adam(ps[:2], lr=0.01)

    eager, compiled = setup(make), setup(make)

    def add_group(i):
        if i == 2:
            for model, opt in (eager, compiled):
                opt.add_param_group({"params": list(model.parameters())[2:], "lr": 0.05, "weight_decay": 0.1})

    run_side_by_side(eager, compiled, steps=4, between=add_group)


def test_what_the_user_changes_between_steps_is_seen(caplog):
    """Each change reaches the next compiled step as it reaches eager's: a replaced state tensor, a grad
    left unset, a parameter given other strides, and a grad that comes back."""
    caplog.set_level(logging.INFO, logger="kiln.perf_hints")
    make = VARIANTS["adam"]
    eager, compiled = setup(make), setup(make)

    def change(i):
        for model, opt in (eager, compiled):
            first = next(iter(model.parameters()))
            if i == 2:
                opt.state[first]["exp_avg"] = opt.state[first]["exp_avg"].clone() * 0.5
            if i == 3:  # column-major
                first.data = first.data.t().contiguous().t()

    compiled_step = kiln.compile(lambda: compiled[1].step(), fullgraph=True)
    for i in range(6):
        change(i)
        set_grads(eager[0], i), set_grads(compiled[0], i)
        if i == 4:
            for model, _ in (eager, compiled):
                list(model.parameters())[-1].grad = None
        eager[1].step(), compiled_step()
        assert_same(eager, compiled, f"after step {i}")
    # the update (the first step's state is made ahead of it), then one for the new strides and one without
    # the last grad
    assert len(optim._steps[compiled[1]].entries) == 3
    assert not [r for r in caplog.records if "runs eagerly" in r.getMessage()]


def test_load_state_dict_between_compiled_steps_replaces_what_they_read():
    make = VARIANTS["adamw_foreach"]
    eager, compiled = setup(make), setup(make)
    saved = {}

    def save_and_restore(i):
        for name, (model, opt) in (("eager", eager), ("compiled", compiled)):
            if i == 2:
                saved[name] = (copy.deepcopy(opt.state_dict()), copy.deepcopy(model.state_dict()))
            if i == 4:
                opt.load_state_dict(saved[name][0])
                model.load_state_dict(saved[name][1])

    run_side_by_side(eager, compiled, steps=6, between=save_and_restore)



@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.Adam(ps, lr=0.01),
    lambda ps: torch.optim.Adam(ps, lr=0.01, amsgrad=True, foreach=False),
    lambda ps: torch.optim.AdamW(ps, lr=0.01, fused=True, weight_decay=0.1),
], ids=["adam", "adam_amsgrad_for_loop", "adamw_fused"])
def test_adams_first_step_is_the_steady_update_over_its_initial_state(make):
    """The first step makes the state eager's first step makes, then runs the one update every step runs."""
    eager, compiled = setup(make), setup(make)
    run_side_by_side(eager, compiled, steps=3)
    assert len(optim._steps[compiled[1]].entries) == 1
    (_, eo), (_, co) = eager, compiled
    for p, q in zip(eager[0].parameters(), compiled[0].parameters()):
        assert co.state[q]["step"].dtype == eo.state[p]["step"].dtype


def test_a_parameter_whose_grad_comes_later_gets_its_initial_state_then():
    make = VARIANTS["adam_amsgrad_wd"]
    eager, compiled = setup(make), setup(make)

    def drop_last_grad(i):  # the last bias has no grad in the first two steps: no state until step 2
        for model, _ in (eager, compiled):
            set_grads(model, i)
            if i < 2:
                list(model.parameters())[-1].grad = None

    compiled_step = kiln.compile(lambda: compiled[1].step(), fullgraph=True)
    for i in range(4):
        drop_last_grad(i)
        eager[1].step(), compiled_step()
        assert_same(eager, compiled, f"after step {i}")
    assert len(optim._steps[compiled[1]].entries) == 2  # without the last bias, and with it


def test_the_first_step_under_float64_default_dtype_makes_eagers_step_dtype():
    prior = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        make = VARIANTS["adam"]
        eager, compiled = setup(make), setup(make)
        run_side_by_side(eager, compiled, steps=2)
        q = next(compiled[0].parameters())
        assert compiled[1].state[q]["step"].dtype == torch.float64
    finally:
        torch.set_default_dtype(prior)
