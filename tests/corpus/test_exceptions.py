"""Exceptions inside compiled code, as Dynamo's exception tests exercise them: compiled code raises what eager
raises (same type), try/except/finally and raise-from inside the traced function, exceptions from torch ops
(shape mismatches, bad indices) and from Python (KeyError, IndexError, assert), before and after graph breaks."""
import pytest
import torch

from .reference import Table, check, globals_state, t

torch.manual_seed(0)
cases = Table()
A, B = t(4), t(4)
M = t(3, 4)
LOG = []
RAISES = "torch.compile runs a frame that raises an uncaught exception eagerly (its graph is dropped)"


class CustomError(Exception):
    pass


def _fails(x):
    raise CustomError("from helper")


@cases((A,), torch_gives_up=RAISES)
def raise_value_error(a):
    b = a + 1
    raise ValueError(f"bad {b.shape[0]}")


@cases((A,), torch_gives_up=RAISES)
def raise_custom_error_from_helper(a):
    return _fails(a + 1)


@cases((A,))
def assert_false(a):
    assert a.shape[0] == 5, "wrong size"
    return a


@cases((A,))
def assert_true_passes(a):
    assert a.dim() == 1
    return a * 2


@cases((A,))
def key_error_from_dict(a):
    d = {"x": a}
    return d["y"]


@cases((A,))
def index_error_from_list(a):
    xs = [a]
    return xs[3]


@cases((A,))
def attribute_error(a):
    return a.no_such_attribute


@cases((A,))
def type_error_wrong_arguments(a):
    def two(x, y):
        return x + y
    return two(a)


@cases((A, t(3)))
def shape_mismatch_in_add(a, b):
    return a + b


@cases((M, M))
def shape_mismatch_in_matmul(m, n):
    return m @ n


@cases((A,))
def view_with_wrong_size(a):
    return a.view(3, 3)


@cases((A,))
def tensor_index_out_of_range(a):
    return a[10]


@cases((A,))
def dtype_error_in_op(a):
    return torch.bitwise_and(a, a)


@cases((A,))
def zero_division_python(a):
    n = 0
    return a * (1 / n)


@cases((A,))
def try_except_caught(a):
    try:
        raise KeyError("k")
    except KeyError:
        a = a + 1
    return a


@cases((A,))
def try_except_with_binding(a):
    try:
        raise ValueError("abc")
    except ValueError as e:
        return a * len(str(e))


@cases((A,))
def try_except_else_finally(a):
    out = a
    try:
        out = out + 1
    except RuntimeError:
        out = out * 0
    else:
        out = out * 2
    finally:
        out = out - 3
    return out


@cases((A,), state=globals_state(globals(), LOG=[]))
def finally_runs_on_raise(a):
    try:
        raise IndexError("i")
    finally:
        LOG.append("finally")


@cases((A,))
def except_tuple_of_types(a):
    try:
        [][1]
    except (KeyError, IndexError):
        a = a - 1
    return a


@cases((A,))
def exception_from_torch_op_caught(a):
    try:
        a.view(7)
    except RuntimeError:
        return a + 100
    return a


@cases((A,))
def raise_from(a):
    try:
        raise KeyError("inner")
    except KeyError as e:
        raise RuntimeError("outer") from e


@cases((A,))
def reraise(a):
    try:
        raise ValueError("again")
    except ValueError:
        a = a + 1
        raise


@cases((A,))
def nested_try(a):
    try:
        try:
            raise TypeError("t")
        except ValueError:
            a = a * 0
    except TypeError:
        a = a + 5
    return a


@cases((A,))
def exception_class_checks(a):
    e = CustomError("x")
    return a + isinstance(e, Exception) + len(e.args)


@cases((A,), torch_gives_up=RAISES)
def raise_after_graph_break(a):
    b = a + a.sum().item()
    raise CustomError(str(b.shape))


@cases((A,))
def exception_caught_after_graph_break(a):
    try:
        b = a * a.sum().item()
        raise ValueError("v")
    except ValueError:
        return a - 1
    return b


@cases((A,))
def stop_iteration_from_next(a):
    it = iter([])
    return next(it)


@cases((A,))
def int_of_bad_string(a):
    return a + int("x1")


@cases((A,))
def not_implemented_from_method(a):
    class Abstract:
        def run(self, x):
            raise NotImplementedError

    return Abstract().run(a)


@cases((A,))
def raise_in_loop_caught_each_time(a):
    for i in range(3):
        try:
            if i % 2:
                raise ValueError(i)
            a = a + 1
        except ValueError:
            a = a * 2
    return a


@cases((t(4, dtype=torch.int64),))
def integer_division_by_zero_tensor(n):
    return n // torch.zeros(4, dtype=torch.int64)


@cases((t(4, dtype=torch.int64),))
def integer_modulo_by_zero_tensor(n):
    return n % torch.zeros(4, dtype=torch.int64)


@cases((M,))
def gather_index_out_of_range(m):
    return m.gather(1, torch.tensor([[0], [9], [1]]))


@cases((M,))
def index_select_out_of_range(m):
    return m.index_select(0, torch.tensor([0, 7]))


@cases((A,))
def embedding_index_out_of_range(a):
    table = a.view(2, 2)
    return torch.nn.functional.embedding(torch.tensor([0, 5]), table)


@pytest.mark.parametrize("fn, calls, options", cases.params)
def test_exception_case_matches_eager(fn, calls, options):
    check(fn, *calls, **options)


INVALID_VALUES_ON_DEFAULT_BACKEND = [
    pytest.param(integer_division_by_zero_tensor, id="int_floordiv_by_zero"),
    pytest.param(gather_index_out_of_range, id="gather_out_of_range"),
]


@pytest.mark.parametrize("fn", INVALID_VALUES_ON_DEFAULT_BACKEND)
def test_invalid_values_raise_on_default_backend(fn):
    arg = t(4, dtype=torch.int64) if "division" in fn.__name__ else M
    check(fn, (arg,), backend="inductor")
