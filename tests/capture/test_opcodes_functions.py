"""Calls inlined into the graph: closures, lambdas, defaults, keyword-only, *args/**kwargs,
nested functions, methods of user objects, dataclasses, namedtuples, partials, recursion.
"""
import dataclasses
import functools
import typing

import pytest
import torch

from support.capture import check, t

SCALE = 3.0


def helper(x, k=2):
    return x * k


def with_defaults(x, a=1, b=2.0):
    return x * a + b


def kwonly(x, *, scale, shift=0.5):
    return x * scale + shift


def varargs(*xs):
    out = xs[0]
    for x in xs[1:]:
        out = out + x
    return out


def varkw(x, **kw):
    for k in sorted(kw):
        x = x + kw[k]
    return x


def everything(a, b=2, *args, c, d=4, **kw):
    return a * b + sum(args) + c * d + sum(kw.values())


def call_helper(x):
    return helper(x) + helper(x, 3) + helper(x, k=4)


def call_defaults(x):
    return with_defaults(x), with_defaults(x, 2), with_defaults(x, b=0.0), with_defaults(x, 3, 1.0)


def call_kwonly(x):
    return kwonly(x, scale=2.0) + kwonly(x, scale=1.0, shift=-1.0)


def call_varargs(x):
    return varargs(x, x * 2, x * 3)


def call_varkw(x):
    return varkw(x, a=1.0, b=x)


def call_everything(x):
    return everything(x, 3, x, x, c=x, e=x)


def call_star_star(x):
    args = (x,)
    kwargs = {"k": 5}
    return helper(*args, **kwargs)


def closure_read(x):
    y = x * 2

    def inner(z):
        return z + y

    return inner(x)


def closure_write(x):
    acc = x

    def bump():
        nonlocal acc
        acc = acc * 2

    bump()
    bump()
    return acc


def closure_counter(x):
    count = 0

    def inc():
        nonlocal count
        count += 1
        return count

    inc()
    inc()
    return x * inc()


def lambda_simple(x):
    f = lambda a, b=1: a * b + 1  # noqa: E731
    return f(x), f(x, 3)


def lambda_closure(x):
    k = x.shape[0]
    g = lambda a: a * k  # noqa: E731
    return g(x)


def nested_def_three_levels(x):
    def a(v):
        def b(w):
            def c(u):
                return u.sin()
            return c(w) * 2
        return b(v) + 1
    return a(x)


def returns_function(k):
    def f(x):
        return x * k
    return f


def call_returned_function(x):
    f = returns_function(3)
    return f(x)


def global_constant(x):
    return x * SCALE


def recursion(x, n=3):
    if n == 0:
        return x
    return recursion(x * 2, n - 1)


def partial_call(x):
    f = functools.partial(helper, k=5)
    return f(x)


def higher_order(x):
    def apply(fn, v):
        return fn(v)
    return apply(torch.relu, x) + apply(lambda v: v * 2, x)


def function_attr_name(x):
    return x * len(helper.__name__)


class Holder:
    def __init__(self, scale):
        self.scale = scale

    def apply(self, x):
        return x * self.scale

    @property
    def double(self):
        return self.scale * 2

    @staticmethod
    def stat(x):
        return x + 1

    @classmethod
    def make(cls, s):
        return cls(s)


HOLDER = Holder(4.0)


def object_method(x):
    return HOLDER.apply(x) + HOLDER.double + Holder.stat(x)


def new_object_in_graph(x):
    h = Holder(2.0)
    return h.apply(x) + h.double


def classmethod_factory(x):
    return Holder.make(3.0).apply(x)


def object_argument(x, h):
    return h.apply(x)


@dataclasses.dataclass
class Config:
    width: int
    scale: float = 1.5


def dataclass_argument(x, cfg):
    return x[: cfg.width] * cfg.scale


def dataclass_made_inside(x):
    cfg = Config(2)
    return x * cfg.scale + cfg.width


class Pair(typing.NamedTuple):
    left: torch.Tensor
    right: torch.Tensor


def namedtuple_return(x):
    return Pair(x * 2, x + 1)


def namedtuple_argument(p):
    return p.left * p.right + p[0]


def namedtuple_unpack(p):
    a, b = p
    return a - b


def namedtuple_replace(x):
    p = Pair(x, x)
    q = p._replace(right=x * 3)
    return q.right, q._asdict()["left"]


def isinstance_checks(x, h):
    out = x
    if isinstance(x, torch.Tensor):
        out = out + 1
    if isinstance(h, Holder):
        out = out * 2
    if isinstance(3, (int, float)):
        out = out - 1
    if not isinstance(x, (list, tuple)):
        out = out * 3
    return out


def getattr_hasattr(x, h):
    s = getattr(h, "scale")
    d = getattr(h, "missing", 10.0)
    return x * s + d + (1 if hasattr(h, "scale") else 0) + (1 if hasattr(h, "nope") else 0)


def callable_check(x):
    if callable(helper):
        return x + 1
    return x - 1


def decorated_inner(x):
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            return fn(*a, **k) * 2
        return wrapper

    @deco
    def f(v):
        return v + 1

    return f(x)


def kwargs_forwarding(x):
    def inner(a, *, b):
        return a - b

    def outer(*args, **kwargs):
        return inner(*args, **kwargs)

    return outer(x, b=x * 0.5)


def default_is_mutable_list(x, acc=None):
    acc = [] if acc is None else acc
    acc.append(x)
    return torch.stack(acc)


CASES = [
    (call_helper, (t(3, grad=True),)),
    (call_defaults, (t(3),)),
    (call_kwonly, (t(3),)),
    (call_varargs, (t(3, grad=True),)),
    (call_varkw, (t(3),)),
    (call_everything, (t(3),)),
    (call_star_star, (t(3),)),
    (closure_read, (t(3, grad=True),)),
    (closure_write, (t(3),)),
    (closure_counter, (t(3),)),
    (lambda_simple, (t(3),)),
    (lambda_closure, (t(4),)),
    (nested_def_three_levels, (t(3, grad=True),)),
    (call_returned_function, (t(3),)),
    (global_constant, (t(3),)),
    (recursion, (t(3),)),
    (partial_call, (t(3),)),
    (higher_order, (t(3),)),
    (function_attr_name, (t(3),)),
    (object_method, (t(3),)),
    (new_object_in_graph, (t(3),)),
    (classmethod_factory, (t(3),)),
    (object_argument, (t(3), Holder(5.0))),
    (dataclass_argument, (t(4), Config(3))),
    (dataclass_made_inside, (t(3),)),
    (namedtuple_return, (t(3),)),
    (namedtuple_argument, (Pair(t(3, grad=True), t(3)),)),
    (namedtuple_unpack, (Pair(t(3), t(3)),)),
    (namedtuple_replace, (t(3),)),
    (isinstance_checks, (t(3), HOLDER)),
    (getattr_hasattr, (t(3), HOLDER)),
    (callable_check, (t(3),)),
    (decorated_inner, (t(3),)),
    (kwargs_forwarding, (t(3),)),
    (default_is_mutable_list, (t(3),)),
    (varargs, (t(2), t(2), t(2))),
    (with_defaults, (t(2),)),
]


@pytest.mark.parametrize("fn,args", CASES, ids=[f"{c[0].__name__}-{i}" for i, c in enumerate(CASES)])
def test_inlined_calls_one_graph(fn, args):
    check(fn, *args, graphs=1, records=1, fullgraph=True)


def test_kwonly_at_entry():
    check(kwonly, t(3), kwargs={"scale": 2.0}, graphs=1, fullgraph=True)


def test_everything_at_entry():
    check(everything, t(3), 2, t(3), kwargs={"c": 1.5, "z": 2.0}, graphs=1, fullgraph=True)


def test_varkw_at_entry():
    check(varkw, t(3), kwargs={"a": t(3), "b": 1.0}, graphs=1, fullgraph=True)


def test_returned_closure_is_callable():
    import kiln

    fn = kiln.compile(returns_function, backend="eager")
    f = fn(4)
    x = t(3)
    torch.testing.assert_close(f(x), x * 4)


def test_returned_lambda_sees_graph_value():
    import kiln

    def make(x):
        y = x * 2
        return lambda z: z + y

    compiled = kiln.compile(make, backend="eager")
    x = t(3)
    torch.testing.assert_close(compiled(x)(x), make(x)(x))


def late_binding_closures(x):
    fns = [lambda: i for i in range(3)]  # noqa: B023 - late binding is the point
    return x * sum(f() for f in fns)


def closure_over_loop_variable(x):
    fns = []
    for k in range(3):
        def f(v):
            return v * k  # noqa: B023
        fns.append(f)
    return [f(x) for f in fns]


def shared_cell_two_closures(x):
    state = x

    def read():
        return state

    def write(v):
        nonlocal state
        state = v

    write(x * 5)
    return read()


@pytest.mark.parametrize("fn", [late_binding_closures, closure_over_loop_variable, shared_cell_two_closures],
                         ids=lambda f: f.__name__)
def test_closure_cell_semantics(fn):
    check(fn, t(3), graphs=1, fullgraph=True)
