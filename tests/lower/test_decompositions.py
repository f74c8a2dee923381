"""The code generator's decomposition table (kiln/lower/decompositions.py): built from PyTorch's core-ATen table
made once per process, since each `core_aten_decompositions()` call builds that table anew from every registered
op, a cost every process importing kiln paid once per use."""
from __future__ import annotations

import pytest
import torch

from kiln.lower import decompositions

aten = torch.ops.aten


def test_a_table_is_built_without_making_the_core_table_again(monkeypatch):
    def made_again():
        pytest.fail("core_aten_decompositions() called again: the core table is made once per process")

    monkeypatch.setattr(decompositions, "core_aten_decompositions", made_again)
    for fallback_random in (False, True):
        table = decompositions.decomposition_table.__wrapped__(fallback_random)  # built now, not the cached one
        assert aten.mse_loss.default in table  # from the core table
        assert table[aten.addcmul.default] is decompositions.OWN[aten.addcmul.default]  # kiln's own over it
        assert (aten._scaled_dot_product_attention_math.default in table) != fallback_random  # draws dropout


def test_kilns_own_decomposition_over_a_core_one_still_computes_eagers_value():
    """addcmul's own decomposition wraps the core one (a 0-d float32 operand read at bf16, as eager reads it)."""
    h = torch.randn(8, dtype=torch.bfloat16)
    s = torch.tensor(0.1)
    decompose = decompositions.decomposition_table()[aten.addcmul.default]
    torch.testing.assert_close(decompose(h, h, s), torch.addcmul(h, h, s), rtol=0, atol=0)


@pytest.mark.parametrize("index", [torch.tensor(5), torch.tensor(-1), torch.tensor([[0, 11], [-12, 3]]),
                                   torch.tensor([7])], ids=["0-dim", "0-dim negative", "2-dim", "1-dim"])
def test_take_with_an_index_of_any_rank_compiles_into_one_graph(index, monkeypatch):
    """torch's `take` decomposition subscripts the flattened input with the index tensor; a 0-dim integer index
    subscripts as a Python int, read with `.item()`, so the trace needed tensor data and the graph ran op by op (a
    fallback, an error under strict). kiln's decomposition is one `index` op: values, gradient and eager's error for
    an index out of range."""
    import kiln

    monkeypatch.setenv("KILN_STRICT", "1")
    x = torch.randn(3, 4, requires_grad=True)
    kiln_x = x.detach().clone().requires_grad_()
    compiled = kiln.compile(lambda x, i: torch.take(x, i) * 2)
    got, want = compiled(kiln_x, index), torch.take(x, index) * 2
    torch.testing.assert_close(got, want)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(kiln_x.grad, x.grad)
    with pytest.raises(IndexError, match="out of range"):
        compiled(kiln_x.detach(), torch.tensor(12))


def test_an_accumulating_put_and_takes_backward_add_up_duplicate_indices(monkeypatch):
    """`put(..., accumulate=True)`, which `take`'s backward is, decomposes into an accumulating `index_put` that
    kiln lowers (before, the op ran through ATen): an index that repeats adds each of its values, as eager."""
    import kiln
    from support.lowering import check, count_externs

    monkeypatch.setenv("KILN_STRICT", "1")
    x, index, source = torch.randn(3, 4), torch.tensor([[1, 1], [-1, 5]]), torch.randn(2, 2)
    assert count_externs(check(lambda x, i, s: torch.put(x * 1, i, s, accumulate=True), x, index, source)) == 0
    leaf, kiln_leaf = x.clone().requires_grad_(), x.clone().requires_grad_()
    (torch.take(leaf, index) * source).sum().backward()
    kiln.compile(lambda x, i, s: (torch.take(x, i) * s).sum())(kiln_leaf, index, source).backward()
    torch.testing.assert_close(kiln_leaf.grad, leaf.grad)
