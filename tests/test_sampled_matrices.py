"""CI's sample of a parametrized test's matrix (`@pytest.mark.sampled`, tests/support/sweeps.py `diagonal`)."""
import itertools

from support.sweeps import diagonal


def matrix(**sizes: int) -> list[dict[str, int]]:
    """Every case of a matrix with the given axis sizes, as positions along each axis."""
    return [dict(zip(sizes, case)) for case in itertools.product(*map(range, sizes.values()))]


def test_the_sample_keeps_one_case_in_every_and_each_value_of_every_axis():
    cases = matrix(program=28, backend=3, grad=2)
    kept = [cases[i] for i in diagonal(cases, 3, ("program",))]
    assert len(kept) == len(cases) // 3
    for axis, size in (("program", 28), ("backend", 3), ("grad", 2)):
        assert {case[axis] for case in kept} == set(range(size))
    # each program meets both grad modes, on backends that turn with the program
    assert all({c["grad"] for c in kept if c["program"] == p} == {0, 1} for p in range(28))


def test_every_pair_of_two_class_axes_keeps_a_case():
    cases = matrix(program=7, layout=3, backend=2)
    kept = [cases[i] for i in diagonal(cases, 2, ("program", "layout"))]
    assert {(c["program"], c["layout"]) for c in kept} == {(p, lay) for p in range(7) for lay in range(3)}


def test_a_class_the_diagonal_misses_keeps_its_first_case():
    """One axis alone: the diagonal would keep every third value; a class axis keeps them all."""
    cases = matrix(op=5)
    assert diagonal(cases, 3, ()) == [0, 3]
    assert diagonal(cases, 3, ("op",)) == [0, 1, 2, 3, 4]

