"""The harness itself must be able to fail: a backend that corrupts outputs, mutates an input or raises is caught."""
import pytest

import kiln

from .reference import check, t


def _off_by_one(gm, example_inputs):
    """A backend returning every graph output plus one: a stand-in for a wrong answer."""
    def run(*args):
        return type(out := gm(*args))(o + 1 for o in out)
    return run


def _mutates_first_input(gm, example_inputs):
    def run(*args):
        args[0].add_(1)
        return gm(*args)
    return run


def _raises(gm, example_inputs):
    def run(*args):
        raise ValueError("backend failed at run time")
    return run


@pytest.mark.parametrize("backend, message", [(_off_by_one, "not close"),
                                              (_mutates_first_input, "args after the call"),
                                              (_raises, "backend failed at run time")])
def test_harness_catches_a_wrong_backend(backend, message):
    with pytest.raises((AssertionError, ValueError, kiln.KilnStrictError), match=message):
        check(lambda x: (x * 0).sum(), (t(4),), backend=backend)


def test_harness_catches_a_different_exception_type():
    def raises_key_error(x):
        y = x * 2
        return {"y": y}["missing"]
    check(raises_key_error, (t(4),), torch_gives_up="the frame raises")  # the same KeyError on both sides
    # kiln runs the frame again eagerly when its graph raises, so the user gets eager's KeyError; the graph's
    # ValueError is a fallback kiln warns about, which the harness fails on
    with pytest.raises(AssertionError, match="raised ValueError: backend failed at run time; running it eagerly "
                                             "raised KeyError instead"):
        check(raises_key_error, (t(4),), backend=_raises, torch_gives_up="the frame raises")
