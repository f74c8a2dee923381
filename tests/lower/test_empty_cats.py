"""`torch.cat` of legacy empty 1-d tensors (shape (0,)), which eager skips whatever the other inputs' rank: where
every input is one, the result is empty and kiln's lowering had no input left to read (its body was None, and
the graph or kernel fell back to ATen; fuzz seed 200368). Each case runs strict through kiln's default backend,
so a fallback fails it, and compares with eager.
"""
import pytest
import torch

import kiln

CASES = {
    "two empties": (lambda a: torch.cat([a, a]), (torch.float32,)),
    "two empties, then an op": (lambda a: torch.cat([a, a], dim=0) + 1, (torch.float32,)),
    "empties of ints": (lambda a: torch.cat([a, a, a]) * 2, (torch.int64,)),
    "empties of bools": (lambda a: ~torch.cat([a, a]), (torch.bool,)),
    "a cast of the empty cat": (lambda a: torch.cat([a, a]).to(torch.bfloat16).view(torch.int16), (torch.float32,)),
    "an empty beside a 2-d tensor": (lambda a: torch.cat([a, torch.ones(2, 3)]) * 3, (torch.float32,)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_cat_of_empties_compiles_and_matches_eager(name):
    fn, (dtype,) = CASES[name]
    a = torch.empty(0, dtype=dtype)
    got = kiln.compile(fn)(a)
    want = fn(a)
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want)
