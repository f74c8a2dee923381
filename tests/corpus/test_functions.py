"""Functions as Dynamo's test_functions.py exercises them: constants, calls, closures, defaults, *args/**kwargs,
builtins on constants and tensors, containers, comparisons and tensor attributes, each a small function."""
import functools
import math
import operator

import pytest
import torch
import torch.nn.functional as F

from .reference import Table, check, t

torch.manual_seed(0)
cases = Table()
A, B, C = t(4), t(4), t(4)
M = t(3, 4)
SCALE = 2.5
FLAG = True
LOOKUP = {"w": 3.0, "b": -1.0}


def helper_sub(a, b):
    return a - b


def helper_default(a, b, alpha=2.0):
    return a + alpha * b


def helper_kwonly(a, *, k=3):
    return a * k


def helper_varargs(*xs):
    return sum(xs[1:], xs[0])


def helper_varkw(a, **kw):
    for name in sorted(kw):
        a = a + kw[name]
    return a


class WithClassAttr:
    a = 1


# --- constants and arithmetic -------------------------------------------------------------------------------


@cases((A, B, C))
def constant_float(a, b, c):
    return a - b * c + 1.0


@cases((A, B, C))
def constant_int(a, b, c):
    return a - b * c + 1


@cases((A,))
def constant_folding(a):
    one, two, three = 1, 2, 3
    return one + two - three + a


@cases((A, B))
def constant_branch(a, b):
    lo, hi = 2, 3
    return a - b if lo > hi else b - a


@cases((A, B))
def power_and_floordiv(a, b):
    return a ** 2 + (b // 0.5) + a % 1.5


@cases((A,))
def unary_ops(a):
    return -a + (+a) + abs(a)


@cases((A, B))
def comparison_ops(a, b):
    return (a < b), (a <= b), (a > b), (a >= b), (a == b), (a != b)


@cases((t(4, dtype=torch.int64), t(4, dtype=torch.int64)))
def bitwise_ops(a, b):
    return a & b, a | b, a ^ b, ~a, a << 1, a >> 1


@cases((A,))
def python_float_math(a):
    return a * math.sqrt(2.0) + math.pi - math.floor(2.7) + math.log(math.e)


@cases((A,))
def int_math_on_constants(a):
    n = math.gcd(12, 18) + math.factorial(3) + max(2, 7) - min(1, 4)
    return a + n


@cases((A,))
def float_from_string(a):
    y = float(1.25)
    y += float("0.75")
    return a + y


@cases((A,))
def int_conversion(a):
    return a * int(3.9) + int("2")


@cases((A,))
def round_and_divmod(a):
    q, r = divmod(17, 5)
    return a * round(2.567, 2) + q - r


@cases((A,))
def number_methods(a):
    ratio = (0.75).as_integer_ratio()
    return a * ratio[0] / ratio[1] + (5).bit_length() + (2.0).is_integer()


# --- calls, defaults, keywords ------------------------------------------------------------------------------


@cases((A, B))
def global_function(a, b):
    return helper_sub(a, b)


@cases((A, B))
def via_torch_function(a, b):
    return torch.sub(a, b)


@cases((A, B))
def via_tensor_method(a, b):
    return a.sub(b)


@cases((A, B))
def bound_method_in_local(a, b):
    method = a.sub
    return method(b)


@cases((A, B))
def bound_method_star_args(a, b):
    method = a.sub
    args = (b,)
    kwargs = {}
    return method(*args, **kwargs)


@cases((A, B))
def keywords_swapped(a, b):
    return helper_sub(b=a, a=b)


@cases((A, B))
def default_argument(a, b):
    return helper_default(a, b)


@cases((A, B))
def default_overridden_by_keyword(a, b):
    return helper_default(a, b, alpha=-1.0)


@cases((A,))
def keyword_only_argument(a):
    return helper_kwonly(a) + helper_kwonly(a, k=5)


@cases((A, B, C))
def varargs_call(a, b, c):
    return helper_varargs(a, b, c)


@cases((A, B))
def varargs_from_list(a, b):
    args = [a, b]
    return helper_sub(*args)


@cases((A, B))
def varkw_call(a, b):
    return helper_varkw(a, y=b, x=2.0)


@cases((A, B))
def kwargs_dict_unpacked(a, b):
    kw = {"b": b, "alpha": 0.5}
    return helper_default(a, **kw)


@cases(((A, B),))
def tuple_argument(pair):
    x, y = pair
    return x * y


@cases(([A, B, C],))
def list_argument(xs):
    return xs[0] + xs[1] * xs[2]


@cases(({"x": A, "y": B},))
def dict_argument(d):
    return d["x"] - d["y"]


@cases((A, 3))
def int_argument(a, n):
    return a * n


@cases((A, 0.5))
def float_argument(a, s):
    return a + s


@cases((A, None))
def none_argument(a, maybe):
    return a if maybe is None else a + maybe


@cases((A, "relu"))
def string_argument_selects_op(a, name):
    return torch.relu(a) if name == "relu" else torch.tanh(a)


@cases((A, True))
def bool_argument(a, flag):
    return a + 1 if flag else a - 1


def _with_default_tensor(a, extra=None):
    return a if extra is None else a + extra


@cases((A, B))
def optional_argument_given(a, b):
    return _with_default_tensor(a, b)


@cases((A,))
def optional_argument_missing(a):
    return _with_default_tensor(a)


# --- closures and nested functions ---------------------------------------------------------------------------


@cases((A,))
def inner_function(a):
    def double(x):
        return torch.add(x, x)
    return double(a)


@cases((A, B))
def closure_reads_tensor(a, b):
    def plus_b(x):
        return x + b
    return plus_b(a)


@cases((A,))
def closure_reads_constant(a):
    k = 4

    def times_k(x):
        return x * k
    return times_k(a)


@cases((A,))
def closure_writes_nonlocal(a):
    total = 0

    def bump(n):
        nonlocal total
        total += n
    bump(2)
    bump(3)
    return a * total


@cases((A,))
def nested_closure_two_levels(a):
    s = 2

    def outer(x):
        def inner(y):
            return y * s
        return inner(x) + s
    return outer(a)


@cases((A,))
def lambda_local(a):
    square = lambda x: x * x  # noqa: E731
    return square(a) + square(2)


@cases((A, B))
def lambda_with_default(a, b):
    combine = lambda x, y=1.0: x - y  # noqa: E731
    return combine(a) + combine(a, b)


@cases((A,))
def closure_returned_and_called(a):
    def make_adder(n):
        return lambda x: x + n
    add3 = make_adder(3)
    return add3(a)


@cases((A,))
def recursive_function(a):
    def power(x, n):
        return x if n == 1 else x * power(x, n - 1)
    return power(a, 3)


@cases((A, B))
def functools_partial(a, b):
    sub_from_b = functools.partial(helper_sub, b=b)
    return sub_from_b(a)


@cases((A,))
def functools_partial_of_torch(a):
    clamp = functools.partial(torch.clamp, min=-0.5, max=0.5)
    return clamp(a)


@cases((A,))
def functools_reduce(a):
    return functools.reduce(operator.add, [a, a * 2, a * 3])


@cases((A,))
def functools_wraps_decorator(a):
    def twice(fn):
        @functools.wraps(fn)
        def wrapper(x):
            return fn(fn(x))
        return wrapper

    @twice
    def step(x):
        return x * 2 + 1
    return step(a)


@cases((A,))
def function_attribute_read(a):
    return a + len(helper_sub.__name__)


# --- globals and module-level values --------------------------------------------------------------------------


@cases((A,))
def global_float(a):
    return a * SCALE


@cases((A,))
def global_bool_branch(a):
    return a + 1 if FLAG else a - 1


@cases((A,))
def global_dict_lookup(a):
    return a * LOOKUP["w"] + LOOKUP["b"]


@cases((A,))
def global_module_function(a):
    return F.relu(a) + F.gelu(a)


@cases((A,))
def math_module_constant(a):
    return a * math.tau


# --- builtins ---------------------------------------------------------------------------------------------------


@cases((A,))
def len_of_tensor(a):
    return a + len(a)


@cases((A,))
def len_of_constants(a):
    return a + len([1, 2, 3]) + len({"k": 1}) + len((1, 2)) + len("abc")


@cases((M,))
def range_over_size(m):
    out = m[0]
    for i in range(1, m.size(0)):
        out = out + m[i]
    return out


@cases((A, B))
def range_with_step(a, b):
    for i in range(0, 6, 2):
        a = a + b * i
    return a


@cases((M,))
def enumerate_rows(m):
    acc = torch.zeros(4)
    for i, row in enumerate(m):
        acc = acc + i * row
    return acc


@cases((A, B))
def zip_lists(a, b):
    return [x * y for x, y in zip([a, b], [b, a])]


@cases((A, B, C))
def sum_of_tensors(a, b, c):
    return sum([a, b, c])


@cases((A,))
def min_max_constants(a):
    return a * max([3, 1, 2]) - min(4, 5, 6)


@cases((A, B))
def max_of_tensors(a, b):
    return max(a.sum(), b.sum()) + 0, torch.max(a, b)


@cases((A,))
def sorted_constants(a):
    return a + sorted([3, 1, 2])[0] * sorted((5, 4), reverse=True)[0]


@cases((A,))
def reversed_list(a):
    vals = list(reversed([1.0, 2.0, 3.0]))
    return a * vals[0]


@cases((A,))
def any_all_constants(a):
    return a + any([False, True]) + all([True, True])


@cases((A,))
def abs_pow_of_python(a):
    return a + abs(-2) + pow(2, 3)


@cases((A,))
def isinstance_tensor(a):
    return a + 1 if isinstance(a, torch.Tensor) else a


@cases((A, [1, 2]))
def isinstance_tuple_of_types(a, xs):
    return a * 2 if isinstance(xs, (list, tuple)) else a


@cases((A,))
def isinstance_parameter_false(a):
    return a + 1 if isinstance(a, torch.nn.Parameter) else a - 1


@cases((A,))
def callable_builtins(a):
    if callable(sum) and callable(torch.abs) and callable(lambda: 0):
        return a + 1
    return a - 1


@cases((A, [1, 2, 3]))
def callable_on_noncallables(a, xs):
    return a + 1 if callable(xs) or callable(3) else a - 1


@cases((A,))
def callable_on_class_instance(a):
    class CallMe:
        def __call__(self):
            return 1
    return a * 2 if callable(CallMe()) else a


@cases((A,))
def getattr_hasattr(a):
    if hasattr(WithClassAttr, "a"):
        a = a + getattr(WithClassAttr, "a")
    if hasattr(WithClassAttr, "b"):
        a = a + 100
    return a + getattr(WithClassAttr, "missing", 7)


@cases((A,))
def type_checks(a):
    return a + (type(3) is int) + (type(a) is torch.Tensor)


@cases((A,))
def id_comparison(a):
    x = [1]
    y = x
    return a + (id(x) == id(y))


@cases((A,))
def str_formatting(a):
    key = f"layer_{2}"
    return a + len(key) + len("{}-{}".format(1, 2)) + len("%d" % 42)


@cases((A,))
def str_methods(a):
    name = "Hello_World"
    parts = name.lower().split("_")
    return a * len(parts) + name.startswith("He") + name.endswith("x") + len(name.replace("l", ""))


@cases((A,))
def chr_ord_hash(a):
    return a + ord("a") - ord(chr(96)) + (hash(3) == hash(3))


@cases((A,))
def map_and_filter(a):
    vals = list(map(lambda v: v * 2, [1, 2, 3]))
    odd = list(filter(lambda v: v % 2, [1, 2, 3, 4]))
    return a * sum(vals) + len(odd)


@cases((A, B))
def map_over_tensors(a, b):
    return list(map(torch.sin, [a, b]))


@cases((A,))
def iter_next(a):
    it = iter([1, 2, 3])
    first = next(it)
    second = next(it)
    return a * first + second + next(it, 10) + next(it, 10)


# --- tensor attributes and torch predicates --------------------------------------------------------------------


@cases((M,))
def tensor_shape_arithmetic(m):
    rows, cols = m.shape
    return m.view(cols, rows) * rows + m.ndim + m.dim() + m.numel()


@cases((M,))
def tensor_size_calls(m):
    return m.new_zeros(m.size(0), m.size(-1) * 2) + m.size()[1]


@cases((t(2, 6),))
def shape_tuple_concat(x):
    new_shape = x.size()[:-1] + (2, 3)
    return x.view(*new_shape).permute(0, 2, 1)


@cases((A,))
def dtype_branch(a):
    return a + 1 if a.dtype == torch.float32 else a - 1


@cases((A,))
def dtype_properties(a):
    return a + a.is_floating_point() + a.dtype.is_floating_point + torch.is_floating_point(a) + a.is_complex()


@cases((A,))
def default_dtype_compare(a):
    return a + 1 if a.dtype == torch.get_default_dtype() else a - 1


@cases((A,))
def finfo_iinfo(a):
    return a.clamp(min=torch.finfo(a.dtype).min) + torch.iinfo(torch.int16).bits


@cases((A,))
def promote_types(a):
    return a + 1 if a.dtype == torch.promote_types(torch.int32, torch.float32) else a - 1


@cases((A,))
def device_checks(a):
    if not a.is_cuda and a.device.type == "cpu":
        return a + torch.ones(1, device=torch.device("cpu"))
    return a


@cases((A,))
def tensor_is_contiguous(a):
    b = M.t()
    return a + a.is_contiguous() + b.is_contiguous()


@cases((t(4, grad=True),))
def requires_grad_attribute(a):
    return a * 2 if a.requires_grad else a


@cases((A,))
def element_size_and_stride(a):
    return a * a.element_size() + a.stride()[0] + M.stride(0)


@cases((A,))
def torch_is_tensor(a):
    return a + torch.is_tensor(a) + torch.is_tensor(3)


@cases((A,))
def is_grad_enabled_query(a):
    return a + 1 if torch.is_grad_enabled() else a - 1


@cases((A,))
def tensor_from_python_list(a):
    return a + torch.tensor([1.0, 2.0, 3.0, 4.0])


@cases((A,))
def tensor_from_range(a):
    return torch.tensor(range(a.size(0))) + a


@cases((A,))
def cat_list_variants(a):
    kw = {"tensors": (a, a), "dim": 0}
    return torch.cat([a, a]), torch.cat((a, a), dim=0), torch.cat(**kw), torch.cat(tensors=[a, a])


@cases((t(10),))
def slicing_forms(a):
    return a[5], a[:5], a[5:], a[2:5], a[::2], a[-3:], torch.unsqueeze(a, 0)[:, 2:]


@cases((t(10),))
def unpack_slices(a):
    x, y = a[:5], a[5:]
    return x - y


@cases((t(3, 4), t(4)))
def broadcast_ops(m, v):
    return m + v, m * v[None, :], (m.T @ m) @ v


@cases((A,))
def calculate_fan(a):
    return a + torch.nn.init._calculate_correct_fan(M, "fan_in")


@pytest.mark.parametrize("fn, calls, options", cases.params)
def test_function_matches_eager(fn, calls, options):
    check(fn, *calls, **options)
