"""When a compiled graph raises: re-run the frame eagerly, so the user sees eager's state and exception.

The output program replays a frame's Python side effects (list appends, attribute and global
stores, prints) after its graph has run. A graph that raises at run time (an integer division by
zero, an index out of range) therefore leaves none of them applied, where eager applied those
written before the raising op. Which ones those are is known only by running the frame's Python
code, so the program re-runs the whole frame eagerly instead: a function's entry by calling the
function, a continuation (the rest of a function after a graph break, which has no Python function)
by stepping through it natively from its first instruction, with the same stack and locals. That is
exact when the failed call left nothing visible behind:
- no side effect was replayed yet (the graph is the program's first statement);
- the inputs are as they were before the graph ran. kiln's own backends write inputs back only after
  the graph has finished; the capture-only backend (and a graph run op by op) writes them in place, as
  it goes, which moves their version counters. So a graph that writes inputs and has an op that may
  raise on values (`GraphBuilder.checks_values`) runs after a copy of the inputs it writes is taken,
  and the inputs are restored from it before the re-run (a graph without such an op copies nothing);
- random numbers drawn by the graph are drawn again: the default generators' state from before the
  graph is restored first (a graph drawing from a user's own `generator=` is not re-run);
- grad mode and autocast are back to what the frame was entered with: a graph run op by op that
  raised inside a `no_grad` or `torch.autocast` block has not left it (the state of autocast is saved
  before a graph that enters it runs).
When the call cannot be re-run the graph's own exception is raised, and side effects before it are lost.
"""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from kiln.capture.guards import HELPERS

# The message of the graph-side check an `assert` on a tensor's value becomes (opcodes/control.py): the
# graph raises RuntimeError with it, and the re-run raises eager's AssertionError.
ASSERT_CHECK_MESSAGE = "kiln: an assert statement on a tensor's value failed (eager raises AssertionError)"


def eager_error_type(error: Exception) -> type:
    """The exception type eager raises where the graph raised `error`."""
    if isinstance(error, RuntimeError) and ASSERT_CHECK_MESSAGE in str(error):
        return AssertionError
    return type(error)


class GraphRaised(Exception):
    """The graph of an output program raised `error` (caught by the frame that ran the program).

    `rng` is the generators' state before the graph ran (None: the graph draws no random numbers);
    `rerunnable` says whether re-running the frame eagerly reproduces eager's behaviour exactly, once
    `rewind` (when not None) has put back the inputs the graph wrote.
    """

    def __init__(self, error: Exception, rerunnable: bool, rng, rewind: Callable[[], None] | None = None,
                 in_python_block: bool = False):
        super().__init__(f"the compiled graph raised {type(error).__name__}: {error}")
        self.error, self.rerunnable, self.rng, self.rewind = error, rerunnable, rng, rewind
        # inside a block of a manager written in Python: its `__exit__` may suppress or replace the error, so eager
        # raising otherwise is no sign of a wrong graph
        self.in_python_block = in_python_block


def rng_state(cuda_devices: tuple[int, ...]):
    """The state of the CPU's default generator and of those of `cuda_devices` (the ones a graph draws from)."""
    return torch.get_rng_state(), [(d, torch.cuda.get_rng_state(d)) for d in cuda_devices]


def restore_rng_state(state) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    for device, device_state in cuda:
        torch.cuda.set_rng_state(device_state, device)


def input_versions(*tensors: torch.Tensor) -> tuple | None:
    """The version counters of the inputs a graph writes; None when one has none (an inference tensor)."""
    try:
        return tuple(t._version for t in tensors)
    except RuntimeError:
        return None


def snapshot_inputs(*tensors: torch.Tensor) -> tuple:
    """Copies of the inputs a graph writes, taken before it runs, with whether each required grad.

    The copy records autograd history where grad mode records it (as the graph's own ops do), so
    that an input restored from it passes gradients on to what it was computed from."""
    return tuple((t.clone(), t.requires_grad) for t in tensors)


def restorable(written: tuple, saved: tuple) -> bool:
    """Whether `restore_inputs` can put every written input back as it was: a view that a write made
    require grad cannot be detached again."""
    return all(not (t.requires_grad and not required and t._base is not None)
               for t, (_, required) in zip(written, saved))


def restore_inputs(written: tuple, saved: tuple) -> None:
    """Put the inputs a graph wrote back as `snapshot_inputs` saw them, last first (inputs may alias).

    A non-leaf that required grad is restored with grad mode on, so its history runs through the
    copy to what it was before; an input that a write made require grad is detached again; the
    rest (a leaf, which a graph writes only without recording) is restored without recording."""
    for t, (copy, required) in reversed(list(zip(written, saved))):
        if t.requires_grad and not required:
            t.detach_()
        with torch.set_grad_enabled(required and not t.is_leaf and copy.requires_grad):
            t.copy_(copy)


def autocast_snapshot() -> tuple:
    """The autocast state a graph entering `torch.autocast` may leave changed when it raises."""
    return HELPERS["___autocast_state"](), torch.is_autocast_cache_enabled(), _autocast_nesting()


def _autocast_nesting() -> int:
    """How many `torch.autocast` blocks are open (ATen offers no getter, only the counter's steps)."""
    nesting = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return nesting


def restore_autocast(state: tuple) -> None:
    """Leave the autocast blocks a raising graph entered, as their `with` statements do in eager."""
    (cpu, cuda, cpu_dtype, cuda_dtype), cache_enabled, nesting = state
    for device, enabled, dtype in (("cpu", cpu, cpu_dtype), ("cuda", cuda, cuda_dtype)):
        torch.set_autocast_enabled(device, enabled)
        torch.set_autocast_dtype(device, dtype)
    torch.set_autocast_cache_enabled(cache_enabled)
    for _ in range(_autocast_nesting() - nesting):
        if torch.autocast_decrement_nesting() == 0:  # the outermost block's exit clears the cast cache
            torch.clear_autocast_cache()


def graph_raised(error: Exception, entry_grad_enabled: bool, entry_autocast: tuple, rng=None, written: tuple = (),
                 versions: tuple | None = None, saved: tuple | None = None, autocast: tuple | None = None,
                 in_python_block: bool = False):
    """Called by the program when its graph raised: restore grad mode and autocast, then raise `GraphRaised`.

    `written` are the inputs the graph writes and `versions` their version counters before it ran
    (None: the frame is not to be re-run: a continuation already stepped through natively, or a
    graph drawing from a user's generator);
    `saved` their copies (None: the graph has no op that checks values); `autocast` the autocast state
    before a graph entering it ran; `in_python_block`: see `GraphRaised`.
    """
    torch._C._set_grad_enabled(entry_grad_enabled)
    if autocast is not None:
        restore_autocast(autocast)
    untouched = versions is not None and input_versions(*written) == versions
    rewind = None
    if not untouched and versions is not None and saved is not None and restorable(written, saved):
        rewind = functools.partial(restore_inputs, written, saved)
    same_autocast = HELPERS["___autocast_state"]() == entry_autocast
    raise GraphRaised(error, (untouched or rewind is not None) and same_autocast, rng, rewind, in_python_block)
