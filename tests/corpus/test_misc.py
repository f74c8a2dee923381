"""Assorted behaviours from Dynamo's test_misc: tensor methods, in-place ops and views, user classes and their
attributes, guards that must notice a change between calls, side effects on Python state, and graph breaks."""
import pytest
import torch

from .reference import Table, after, check, falls_back, globals_state, t

torch.manual_seed(0)
cases = Table()
A, B = t(4), t(4)
M, N = t(3, 4), t(4, 5)
LOG = []
COUNTER = 0
SETTINGS = {"scale": 2.0}
THRESHOLD = 0.5


class Scaler:
    factor = 3.0

    def __init__(self, bias):
        self.bias = bias

    def apply(self, x):
        return x * self.factor + self.bias

    @property
    def doubled_bias(self):
        return self.bias * 2

    @staticmethod
    def clip(x):
        return x.clamp(-1, 1)

    @classmethod
    def make(cls, bias):
        return cls(bias)


class Base:
    def run(self, x):
        return x + 1


class Derived(Base):
    def run(self, x):
        return super().run(x) * 2


class Lazy:
    def __getattr__(self, name):
        return len(name)


class Slots:
    __slots__ = ("w",)

    def __init__(self, w):
        self.w = w


# --- tensor methods and in-place ops ----------------------------------------------------------------------------


@cases((A,))
def inplace_add_on_input(a):
    a.add_(1)
    return a * 2


@cases((A,))
def inplace_returns_self(a):
    y = a.mul_(2)
    return y is a


@cases((M,))
def inplace_on_view_of_input(m):
    m[0].zero_()
    m[:, 1].fill_(3.0)
    return m.sum()


@cases((A,))
def inplace_on_intermediate(a):
    b = a * 2
    b.add_(1).mul_(3)
    return b


@cases((A, B))
def setitem_with_tensor_value(a, b):
    c = a.clone()
    c[1:3] = b[:2]
    return c


@cases((M,))
def setitem_with_mask(m):
    c = m.clone()
    c[c > 0] = 0.0
    return c


@cases((M,))
def index_put_inplace(m):
    m.index_put_((torch.tensor([0, 2]),), torch.ones(4))
    return m


@cases((A,))
def out_variant(a):
    out = torch.empty(4)
    torch.add(a, 1, out=out)
    return out


@cases((M,))
def copy_into_input(m):
    m.copy_(torch.ones(3, 4))
    return m + 1


@cases((A,))
def chained_methods(a):
    return a.abs().sqrt().neg().exp().sum(dim=0, keepdim=True)


@cases((M,))
def reductions(m):
    return m.sum(), m.mean(1), m.amax(0), m.std(), m.var(1), m.prod(0), m.logsumexp(1)


@cases((M,))
def argmax_topk_sort(m):
    vals, idx = m.topk(2, dim=1)
    s, order = m.sort(dim=0)
    return m.argmax(), m.argmin(1), vals, idx, s, order


@cases((M,))
def views_and_reshapes(m):
    return m.view(4, 3), m.reshape(-1), m.t(), m.transpose(0, 1).contiguous(), m.unsqueeze(1).squeeze(1), m.flatten()


@cases((M,))
def view_of_input_returned(m):
    return m.view(-1), m[1:]


@cases((M,))
def split_chunk_unbind(m):
    return m.split(2, dim=1), m.chunk(3, dim=0), m.unbind(0)


@cases((M,))
def expand_repeat_tile(m):
    v = m[:, :1]
    return v.expand(3, 4), v.repeat(1, 4), m.tile((2, 1))


@cases((M,))
def narrow_select_gather(m):
    idx = torch.tensor([[0, 1], [2, 3], [1, 1]])
    return m.narrow(1, 1, 2), m.select(0, 1), m.gather(1, idx), m.index_select(1, torch.tensor([3, 0]))


@cases((M, N))
def matmul_family(m, n):
    return m @ n, torch.mm(m, n), torch.einsum("ij,jk->ik", m, n), torch.matmul(m[0], n)


@cases((M,))
def where_clamp_masked_fill(m):
    return torch.where(m > 0, m, 0.0), m.clamp(max=0.1), m.masked_fill(m < 0, -1.0)


@cases((M,))
def cumulative_ops(m):
    return m.cumsum(1), m.cumprod(0), torch.cummax(m, 1).values


@cases((t(4, dtype=torch.int64),))
def integer_tensor_ops(n):
    return n * 2, n // 3, n % 3, n.float() / 2, torch.div(n, 2, rounding_mode="floor")


@cases((M,))
def dtype_conversions(m):
    return m.to(torch.float64), m.half().float(), m.int(), m.type(torch.int32), m.to(dtype=torch.bfloat16)


@cases((M,))
def factories_like(m):
    return torch.zeros_like(m), torch.ones_like(m) * 2, torch.full_like(m, 3.0), m.new_ones(2), torch.arange(5) * 1.5


@cases((M,))
def stack_cat_flip(m):
    return torch.stack([m, m], 0), torch.cat([m, m], 1), m.flip(0), torch.roll(m, 1, 1)


@cases((M,))
def softmax_family(m):
    return m.softmax(-1), m.log_softmax(0), torch.sigmoid(m), torch.tanh(m), torch.nn.functional.silu(m)


@cases((M,))
def comparison_reductions(m):
    return (m > 0).any(), (m > 0).all(1), (m > 0).sum(), torch.count_nonzero(m > 0, dim=1)


@cases((t(2, 3, 4),))
def permute_and_movedim(x):
    return x.permute(2, 0, 1), x.movedim(0, -1), x.swapaxes(0, 1)


@cases((A,))
def scalar_tensor_arithmetic(a):
    s = a.sum()
    return a / s, s * 2 + 1, s.neg()


@cases((t(4, dtype=torch.bool),))
def bool_tensor_ops(mask):
    return ~mask, mask & mask, mask.int(), mask.logical_or(~mask)


# --- user classes ------------------------------------------------------------------------------------------------


@cases((A,))
def user_object_method(a):
    return Scaler(1.0).apply(a)


@cases((A,))
def user_object_property(a):
    return a + Scaler(0.5).doubled_bias


@cases((A,))
def user_static_and_class_methods(a):
    return Scaler.clip(a) + Scaler.make(2.0).bias


@cases((A,))
def super_call(a):
    return Derived().run(a)


@cases((A,))
def getattr_fallback(a):
    return a + Lazy().abc


@cases((A,))
def slots_object(a):
    s = Slots(2.0)
    s.w = s.w + 1
    return a * s.w


@cases((A,))
def object_attribute_mutation_local(a):
    s = Scaler(a)
    s.bias = s.bias + 1
    s.extra = 5
    return s.bias * s.extra


@cases((A, Scaler(2.0)))
def object_argument_attribute_write(a, obj):
    obj.bias = obj.bias + 1
    return obj.apply(a)


@cases((A,))
def class_defined_inside(a):
    class Local:
        def __init__(self, v):
            self.v = v

        def get(self):
            return self.v * 2
    return Local(a).get()


@cases((A,))
def isinstance_user_class(a):
    d = Derived()
    return a + isinstance(d, Base) + issubclass(Derived, Base) + (type(d) is Derived)


@cases((A, Scaler(1.5)))
def object_dunder_dict(a, obj):
    return a * len(vars(obj)) + obj.__dict__["bias"]


@cases((A,))
def user_object_returned(a):
    return Scaler(a + 1)


def _set_factor(v):
    def setup():
        Scaler.factor = v
    return setup


# torch.compile before 2.13 keeps one graph and the old factor (no guard on the class attribute); kiln recompiles
@cases(after(_set_factor(3.0), A), after(_set_factor(5.0), A),
       torch_gives_up=None if torch.__version__ >= (2, 13) else "torch < 2.13 does not guard a class attribute")
def class_attribute_guard(a):
    return a * Scaler.factor


def _set_global(name, v):
    def setup():
        globals()[name] = v
    return setup


@cases(after(_set_global("THRESHOLD", 0.5), A), after(_set_global("THRESHOLD", -0.5), A))
def global_float_guard(a):
    return a + THRESHOLD


@cases(after(_set_global("SETTINGS", {"scale": 2.0}), A), after(_set_global("SETTINGS", {"scale": 7.0}), A))
def global_dict_value_guard(a):
    return a * SETTINGS["scale"]


@cases(after(_set_global("LOG", []), A), after(_set_global("LOG", [1, 2]), A))
def global_list_length_guard(a):
    return a + len(LOG)


# --- side effects on Python state --------------------------------------------------------------------------------


@cases((A,), state=globals_state(globals(), LOG=[]))
def append_to_global_list(a):
    LOG.append("called")
    LOG.append(3)
    return a + 1


@cases((A,), state=globals_state(globals(), COUNTER=0))
def global_counter_increment(a):
    global COUNTER
    COUNTER += 1
    return a * COUNTER


@cases((A,), state=globals_state(globals(), SETTINGS={"scale": 2.0}))
def global_dict_write(a):
    SETTINGS["last"] = "seen"
    SETTINGS["scale"] = SETTINGS["scale"] * 2
    return a * SETTINGS["scale"]


@cases((A,), state=globals_state(globals(), LOG=[]))
def global_list_stores_tensor(a):
    b = a * 3
    LOG.append(b)
    return b + 1


@cases((A, []))
def argument_list_mutated(a, xs):
    xs.append(a + 1)
    xs.append(len(xs))
    return a


@cases((A, {"n": 1}))
def argument_dict_mutated(a, d):
    d["n"] += 1
    d["t"] = a * 2
    return a


@cases((A, [1, 2, 3]))
def argument_list_sliced_and_cleared(a, xs):
    head = xs[:2]
    xs.clear()
    return a * len(head)


@cases((A,), state=globals_state(globals(), LOG=[]))
def global_rebound(a):
    global LOG
    LOG = LOG + ["new"]
    return a


@cases((A,), state=globals_state(globals(), SETTINGS={"scale": 2.0}))
def global_dict_delete(a):
    del SETTINGS["scale"]
    return a + len(SETTINGS)


# --- graph breaks ----------------------------------------------------------------------------------------------


@cases((A,))
def item_breaks(a):
    n = a.sum().item()
    return a * n


@cases((A,))
def tolist_breaks(a):
    vals = a.tolist()
    return a + vals[0]


@cases((A,))
def data_dependent_branch(a):
    if a.sum() > 0:
        return a + 1
    return a - 1


@cases((A,), state=globals_state(globals(), LOG=[]))
def break_between_side_effects(a):
    LOG.append(1)
    b = a * 2
    LOG.append(int(b.sum() > 100))
    LOG.append(3)
    return b


@cases((A,), torch_gives_up="a graph break inside a loop makes torch.compile run the frame eagerly")
def break_in_loop(a):
    for _ in range(2):
        a = a + 1
        if a.max() > 100:
            a = a * 0
    return a


@cases((A,))
def break_in_nested_call(a):
    def inner(x):
        y = x + 1
        return y * (2.0 if y.mean() > 0 else 3.0)
    return inner(a) - 1


@cases((A,), marks=falls_back("graph_break: numpy, traced by torch.compile"))
def numpy_roundtrip(a):
    return torch.from_numpy(a.numpy() * 2)


@cases((A,))
def bool_of_tensor(a):
    return a * 2 if bool(a[0] > -100) else a


@cases((A,))
def float_of_tensor(a):
    return a + float(a.sum())


@cases((A,))
def tensor_in_format_string(a):
    s = f"{a.shape[0]}"
    return a * len(s)


@cases((A,))
def print_breaks(a):
    b = a + 1
    print(end="")
    return b * 2


@cases((A,))
def break_keeps_locals(a):
    x, y, z = a + 1, [a, 2], {"k": a * 3}
    _ = a.sum().item()
    return x + y[0] + z["k"] * y[1]


@pytest.mark.parametrize("fn, calls, options", cases.params)
def test_misc_case_matches_eager(fn, calls, options):
    check(fn, *calls, **options)
