"""A kernel stores an input's new value into the input itself (kiln/schedule/input_writes.py) where nothing
reads the old value after it, and only there: each case runs eagerly and compiled on equal inputs and
compares the results and the mutated inputs; `in_place` says whether the compiled wrapper allocates the
new value (False: the runtime copies it in, as before)."""
import copy

import pytest
import torch

import kiln
from support.triton_device import DEVICE, skip_unless_kernels_run


def accumulate(x, g):
    x.add_(g)


def two_states(p, b, g):
    """SGD with Nesterov momentum: the momentum buffer's new value is read by the parameter's update."""
    b.mul_(0.9).add_(g)
    p.sub_(g + 0.9 * b, alpha=0.1)


def old_state_also_returned(p, b, g):
    before = b * 3  # the old buffer, read in the kernel that overwrites it
    two_states(p, b, g)
    return before


def shifted_into_itself(x):
    x[1:].copy_(x[:-1] * 2)  # each element's new value is its neighbour's old one


def old_value_read_later(x, y):
    x.mul_(2)
    return y * 0 + (x - x) + y.sum()  # reads the new x only


def reduction_of_old_value_after(x):
    s = x.sum()  # the old x, reduced: may run after the write unless the write waits
    x.mul_(3)
    return s


def view_returned(x):
    x.add_(1)
    return x[1:]


def new_value_returned_as_a_view(x):
    y = x * 2
    x.copy_(y)
    return y.t()  # a view of y, which eager keeps apart from x


def cast_into_half(x, y):
    x.copy_(y * 2)


def reduced_and_pointwise(a, b, x):
    a.copy_(x.sum(0))  # a reduction's result: not written in place
    b.add_(1)


def running_average_of_row_means(s, x):
    s.mul_(0.9).add_(x.mean(1), alpha=0.1)  # the reduction's epilogue computes the new value: stored into s


def running_average_read_in_the_rows(s, x):
    s.mul_(0.9).add_((x - s[:, None]).sum(1))  # the old s, read in the loop over each row, then overwritten


CASES = {
    "accumulate": (accumulate, lambda: (torch.randn(4, 5), torch.randn(4, 5)), True),
    "two_states": (two_states, lambda: (torch.randn(8), torch.randn(8), torch.randn(8)), True),
    "old_state_also_returned": (old_state_also_returned, lambda: (torch.randn(8), torch.randn(8), torch.randn(8)),
                                None),
    "shifted_into_itself": (shifted_into_itself, lambda: (torch.randn(6, 3),), False),
    "old_value_read_later": (old_value_read_later, lambda: (torch.randn(5), torch.randn(5)), None),
    "reduction_of_old_value_after": (reduction_of_old_value_after, lambda: (torch.randn(7, 3),), None),
    "view_returned": (view_returned, lambda: (torch.randn(4),), None),
    "new_value_returned_as_a_view": (new_value_returned_as_a_view, lambda: (torch.randn(3, 4),), None),
    "cast_into_half": (cast_into_half, lambda: (torch.randn(6).half(), torch.randn(6)), True),
    "reduced_and_pointwise": (reduced_and_pointwise, lambda: (torch.randn(3), torch.randn(3), torch.randn(2, 3)), None),
    "running_average_of_row_means": (running_average_of_row_means, lambda: (torch.randn(6), torch.randn(6, 33)),
                                     True),
    "running_average_read_in_the_rows": (running_average_read_in_the_rows,
                                         lambda: (torch.randn(6), torch.randn(6, 33)), True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_new_values_of_inputs_match_eager(name, compiled_graphs):
    fn, make, in_place = CASES[name]
    torch.manual_seed(0)
    eager_args = make()
    kiln_args = [a.clone() for a in eager_args]
    with torch.no_grad():
        expected = fn(*eager_args)
        got = kiln.compile(fn, fullgraph=True)(*kiln_args)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(kiln_args, list(eager_args))
    if isinstance(got, torch.Tensor):  # an output aliases an input in kiln's result only as it does in eager
        for a, k in zip(eager_args, kiln_args):
            assert (got.untyped_storage().data_ptr() == k.untyped_storage().data_ptr()) == \
                (expected.untyped_storage().data_ptr() == a.untyped_storage().data_ptr())
    if in_place is not None:
        wrapper = compiled_graphs[-1].artefacts["wrapper.py"]
        assert ("empty_strided" not in wrapper) == in_place, wrapper


def test_a_value_written_in_place_is_the_callers_tensor():
    """The input keeps its storage: views the caller holds see the new value, as after eager's add_."""
    x = torch.zeros(6)
    view = x[2:4]
    with torch.no_grad():
        kiln.compile(accumulate)(x, torch.ones(6))
    assert torch.equal(view, torch.ones(2)) and torch.equal(x, torch.ones(6))


def test_a_non_contiguous_input_is_written_through_its_copy():
    """An input whose strides differ from those compiled for is copied to them first (the wrapper's restride):
    the kernel writes the copy and the runtime copies it back into the input."""
    fn = kiln.compile(accumulate, dynamic=False)
    with torch.no_grad():
        x, g = torch.zeros(4, 5), torch.ones(4, 5)
        fn(x, g)
        base = torch.zeros(5, 4)
        fn(base.t(), g)  # a transposed input: guards may recompile, or the wrapper restrides
    assert torch.equal(base, torch.ones(5, 4))


def test_an_input_written_in_place_moves_its_version_counter():
    """As eager's in-place op does: a backward that saved the input's old value raises instead of reading the
    new one."""
    x, g = torch.zeros(4), torch.ones(4)
    before = x._version
    with torch.no_grad():
        kiln.compile(accumulate)(x, g)
    assert x._version == before + 1  # once, as eager's add_: not again when the runtime finds it written


def test_batch_norm_statistics_written_under_no_grad_move_their_versions_as_eager():
    """A batch norm in training mode under no_grad (an inference graph) writes its running statistics without
    moving their version counters and counts its batches with a versioned `add_`, in eager and in kiln."""
    class Blocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norms = torch.nn.ModuleList(torch.nn.BatchNorm2d(4) for _ in range(2))

        def forward(self, x):
            for norm in self.norms:
                x = torch.relu(norm(x))
            return x

    torch.manual_seed(0)
    eager_model = Blocks()
    compiled_model = copy.deepcopy(eager_model)
    compiled = kiln.compile(compiled_model)
    x = torch.randn(8, 4, 3, 3)
    buffers = [(norm, name) for norm in range(2) for name in ("running_mean", "running_var", "num_batches_tracked")]

    def versions(model):
        return [getattr(model.norms[k], name)._version for k, name in buffers]

    with torch.no_grad():
        for _ in range(2):
            eager_before, compiled_before = versions(eager_model), versions(compiled_model)
            torch.testing.assert_close(compiled(x), eager_model(x))
            assert ([a - b for a, b in zip(versions(compiled_model), compiled_before)]
                    == [a - b for a, b in zip(versions(eager_model), eager_before)] == [0, 0, 1] * 2)
            for k, name in buffers:
                torch.testing.assert_close(getattr(compiled_model.norms[k], name), getattr(eager_model.norms[k], name))


def written_then_multiplied(b):
    b[0].zero_()
    t = b @ b.mT  # a matmul template reads the new value, stored into the input
    return t, t.exp() * t.sigmoid()


def test_a_template_reading_the_new_value_reads_the_input(compiled_graphs):
    """On the Triton target the matmul is a template whose spec names its operands: the new value renamed to the
    input it is stored into is renamed there too (fuzz seed 442662 on the GPU: the template's kernel failed to
    build, naming a buffer the schedule no longer had, and fell back to ATen)."""
    skip_unless_kernels_run()
    eager_args = [torch.randn(5, 3, device=DEVICE)]
    kiln_args = [eager_args[0].clone()]
    with torch.no_grad():
        expected = written_then_multiplied(*eager_args)
        got = kiln.compile(written_then_multiplied, options={"cpu_backend": "triton"})(*kiln_args)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(kiln_args, eager_args)
    assert "_mm" in compiled_graphs[-1].artefacts["kernels.py"]


@pytest.mark.parametrize("row_length", [33, 1 << 17], ids=["one_kernel", "split_reduction"])
@pytest.mark.parametrize("name", ["running_average_of_row_means", "running_average_read_in_the_rows"])
def test_a_reduction_epilogue_stores_into_the_input_on_triton(name, row_length, compiled_graphs):
    """On the Triton target too, a reduction kernel's epilogue stores the new value into the input, having read
    the row's old element in its loop; a long reduction over few rows is split into a partial kernel and a
    combining one, and the old element is read by the first, the new one stored by the second."""
    skip_unless_kernels_run()
    fn = CASES[name][0]
    torch.manual_seed(0)
    eager_args = [torch.randn(3, device=DEVICE), torch.randn(3, row_length, device=DEVICE)]
    kiln_args = [a.clone() for a in eager_args]
    with torch.no_grad():
        fn(*eager_args)
        kiln.compile(fn, options={"cpu_backend": "triton"})(*kiln_args)
    torch.testing.assert_close(kiln_args, eager_args)
    artefacts = compiled_graphs[-1].artefacts
    assert "empty_strided" not in artefacts["wrapper.py"]
    assert ("_partial" in artefacts["kernels.py"]) == (row_length > 33)
