"""`as_strided` lowered where its input's storage is known: a tensor the graph computed, no view, contiguous (eager's
meta value says so) is its own storage, so the result is an index rewrite of it (kiln/lower/ops/views.py). Torch's
CPU group norm reshapes its statistics this way: before, two ATen calls split every group norm's forward."""
import torch

from support.lowering import check, check_triton, count_externs
from support.triton_device import skip_unless_kernels_run


def offset_window_of_an_intermediate(x):
    return (x * 2).as_strided((3, 2), (1, 3), 1) + 1


def rows_of_a_contiguous_intermediate(x):
    return (x + 1).contiguous().as_strided((x.shape[0], x.shape[1] * x.shape[2]), (x.shape[1] * x.shape[2], 1)) * 3


def window_of_a_transposed_view(x):
    return (x * 2).t().as_strided((3, 2), (1, 3), 1) + 1


def window_of_an_input(x):
    return x.as_strided((3, 2), (1, 3), 1) + 1


def group_norm(x, w, b):
    return torch.nn.functional.group_norm(x, 2, w, b, 1e-5)


def test_a_window_of_a_computed_tensor_is_an_index_rewrite():
    assert count_externs(check(offset_window_of_an_intermediate, torch.randn(2, 4))) == 0
    assert count_externs(check(rows_of_a_contiguous_intermediate, torch.randn(2, 3, 4))) == 0


def test_a_window_of_a_view_or_an_input_reads_the_storage_through_aten():
    """A view's storage is its base's, an input's may hold more than the input: ATen knows them at run time."""
    assert count_externs(check(window_of_a_transposed_view, torch.randn(2, 4))) == 1
    assert count_externs(check(window_of_an_input, torch.randn(2, 4))) == 1


def test_a_cpu_group_norm_is_generated_code():
    assert count_externs(check(group_norm, torch.randn(3, 8, 4, 4), torch.randn(8), torch.randn(8))) == 0


def test_a_window_of_a_computed_tensor_in_a_triton_kernel():
    skip_unless_kernels_run()
    check_triton(offset_window_of_an_intermediate, torch.randn(2, 4))  # no extern, eager's values, sm_90 builds
