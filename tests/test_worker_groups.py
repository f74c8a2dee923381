"""Tests sharing a module fixture run on one xdist worker (tests/conftest.py `share_module_fixtures`, with
scripts/test.sh's `--dist loadgroup`), which sets the fixture up once, and draw the inputs their id seeds with or
without xdist."""
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")


def test_the_groups_are_marked_before_the_xdist_worker_reads_them(request):
    """An xdist worker registers its collection hook after tests/conftest.py is loaded, and pluggy calls the hook
    registered last first: unless the conftest's hook is `tryfirst`, the worker reads no group marks, and each
    worker sets up every module fixture of its share of a module's tests (a warm-start test's processes, twice)."""
    hooks = request.config.pluginmanager.hook.pytest_collection_modifyitems.get_hookimpls()
    (ours,) = [h for h in hooks if Path(getattr(h.plugin, "__file__", "")) == CONFTEST]
    assert ours.tryfirst
    called_first = [h for h in reversed(hooks) if h.tryfirst]
    assert ours in called_first


class Item:
    """What `command_line_id` reads of a collected test."""

    def __init__(self, nodeid: str, group: str | None):
        self.nodeid, self.marks = nodeid, [pytest.mark.xdist_group(group).mark] if group else []

    def iter_markers(self, name: str):
        return [m for m in self.marks if m.name == name]


def test_a_test_kept_on_one_worker_is_seeded_by_the_id_a_command_line_names_it_by():
    command_line_id = sys.modules["conftest"].command_line_id
    assert command_line_id(Item("tests/runtime/test_a.py::test_b[c]@runtime.test_a", "runtime.test_a")) == \
        "tests/runtime/test_a.py::test_b[c]"
    assert command_line_id(Item("tests/test_a.py::test_b[x@y]", None)) == "tests/test_a.py::test_b[x@y]"
