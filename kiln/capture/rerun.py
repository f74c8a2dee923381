"""When a compiled graph raises: re-run the frame eagerly, so the user sees eager's state and exception.

The output program replays a frame's Python side effects (list appends, attribute and global
stores, prints) after its graph has run. A graph that raises at run time (an integer division by
zero, an index out of range) therefore leaves none of them applied, where eager applied those
written before the raising op. Which ones those are is known only by running the frame's Python
code, so the program re-runs the whole frame eagerly instead. That is exact when the failed call
left nothing visible behind:
- no side effect was replayed yet (the graph is the program's first statement);
- the graph wrote no input tensor before it raised: a written input's version counter moved (kiln's
  own backends write inputs back only after the graph has finished; the capture-only backend writes
  them in place, as it goes);
- random numbers drawn by the graph are drawn again: the default generators' state from before the
  graph is restored first (a graph drawing from a user's own `generator=` is not re-run);
- grad mode is back to what the frame was entered with (a graph that raised inside a `no_grad`
  block has not turned it back on), and autocast is as it was (else the frame is not re-run).
When the call cannot be re-run the graph's own exception is raised, and side effects before it are lost.
"""
from __future__ import annotations

import torch

from kiln.capture.guards import HELPERS


class GraphRaised(Exception):
    """The graph of an output program raised `error` (caught by the frame that ran the program).

    `rng` is the generators' state before the graph ran (None: the graph draws no random numbers);
    `rerunnable` says whether re-running the frame eagerly reproduces eager's behaviour exactly.
    """

    def __init__(self, error: Exception, rerunnable: bool, rng):
        super().__init__(f"the compiled graph raised {type(error).__name__}: {error}")
        self.error, self.rerunnable, self.rng = error, rerunnable, rng


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


def graph_raised(error: Exception, entry_grad_enabled: bool, entry_autocast: tuple, rng=None, written: tuple = (),
                 versions: tuple | None = None):
    """Called by the program when its graph raised: restore grad mode, then raise `GraphRaised`.

    `written` are the inputs the graph writes and `versions` their version counters before it ran
    (None: the frame is not to be re-run: a continuation, or a graph drawing from a user's generator).
    A graph run op by op that raised inside an autocast block has left it on; a re-run would start
    inside it, so the frame is not re-run then.
    """
    torch._C._set_grad_enabled(entry_grad_enabled)
    untouched = versions is not None and input_versions(*written) == versions
    raise GraphRaised(error, untouched and HELPERS["___autocast_state"]() == entry_autocast, rng)
