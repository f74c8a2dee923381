"""The Triton launcher's per-call fast path (kiln/codegen/triton/launch.py), on CPU tensors with the compiled
binary's C launcher replaced by a recorder: which launches take it, and what they hand the C launcher.

The fast path is for the specialization precompiled at graph compile time: 16-byte aligned tensors and the
graph's static integers. A tensor the kernel may receive unaligned (an input, a view with an offset) is checked
per call; one that is always a fresh allocation is not. A launch that fails a check goes the slow way."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kiln.codegen.triton import launch  # noqa: E402

HEAD = ("function", "cooperative", "pdl", None, None, "metadata", None, None, None)


@pytest.fixture
def recorded(monkeypatch):
    """(a launcher factory, the fast launches, the slow launches) with no GPU behind them."""
    monkeypatch.setattr(launch, "_current_stream", lambda device: 7)
    fast, slow = [], []

    def make(num_tensors: int, check: tuple | None) -> launch.Launcher:
        launcher = launch.Launcher(lambda: None, num_tensors, 4, check_alignment=check, XBLOCK=8)
        launcher.fast, launcher.fast_ints = (lambda *args: fast.append(args), HEAD), (100,)
        monkeypatch.setattr(launcher, "_call", lambda grid, args: slow.append((grid, args)))
        return launcher

    return make, fast, slow


def _tensors(n: int, unaligned: int | None = None) -> list[torch.Tensor]:
    """`n` tensors, the one at `unaligned` starting 4 bytes into its storage."""
    out = [torch.zeros(64) for _ in range(n)]
    if unaligned is not None:
        out[unaligned] = torch.zeros(65)[1:]
    return out


@pytest.mark.parametrize("check", [None, (0, 2), (1,)], ids=["every tensor", "some tensors", "one tensor"])
def test_aligned_tensors_launch_through_the_c_launcher_with_their_addresses(recorded, check):
    make, fast, slow = recorded
    tensors = _tensors(3)
    make(3, check)((4, 2), *tensors, 100)
    assert not slow
    (args,) = fast
    assert args[:4] == (4, 2, 1, 7)  # grid x, grid y, grid z, the device's current stream
    assert args[4:4 + len(HEAD)] == HEAD
    assert list(args[4 + len(HEAD):]) == [t.data_ptr() for t in tensors] + [100, 8]  # ints, then constexprs


@pytest.mark.parametrize("check, unaligned, takes_fast_path", [
    (None, 1, False), ((0, 2), 2, False), ((0, 2), 1, True), ((1,), 1, False), ((1,), 0, True), ((), 0, True)])
def test_an_unaligned_tensor_leaves_the_fast_path_only_where_it_is_checked(recorded, check, unaligned,
                                                                          takes_fast_path):
    make, fast, slow = recorded
    make(3, check)(5, *_tensors(3, unaligned), 100)
    assert (len(fast), len(slow)) == ((1, 0) if takes_fast_path else (0, 1))


def test_other_integers_than_the_precompiled_ones_take_the_slow_path(recorded):
    make, fast, slow = recorded
    make(2, None)(5, *_tensors(2), 101)
    assert not fast and len(slow) == 1


def test_a_launch_hook_added_or_assigned_takes_the_slow_path(recorded, monkeypatch):
    """Triton runs its launch hooks (profilers install them) only on its own path: with one installed, a launch
    must go through it. A hook is added to the loaded chain, or assigned in the chain's place."""
    make, fast, slow = recorded
    launcher, runtime = make(2, None), launch._RUNTIME
    launcher(5, *_tensors(2), 100)
    assert (len(fast), len(slow)) == (1, 0)

    def hook(*args, **kwargs):
        pass

    chain, slow_before = runtime.launch_enter_hook, 0
    if hasattr(chain, "add"):  # Triton 3.6's HookChain
        chain.add(hook)
        try:
            launcher(5, *_tensors(2), 100)
        finally:
            chain.remove(hook)
        assert (len(fast), len(slow)) == (1, 1)
        slow_before = 1
    monkeypatch.setattr(runtime, "launch_exit_hook", hook)
    launcher(5, *_tensors(2), 100)
    assert (len(fast), len(slow)) == (1, slow_before + 1)


class _LoadingBinary:
    """A compiled kernel as Triton 3.6 loads it on first use: its launcher is set before its function handle,
    with a pause between (the driver loading the binary) where another thread can read both."""

    def __init__(self):
        import threading

        self._run, self.function, self.packed_metadata = None, None, "metadata"
        self.loading = threading.Event()

    @property
    def run(self):
        if self._run is None:
            self._run = lambda *args: None
            self.loading.set()
            import time

            time.sleep(0.05)
            self.function = 1234
        return self._run


def test_two_launchers_of_one_shared_binary_get_its_function_handle():
    """Identical kernels share one compiled binary; their launchers are precompiled side by side, and each must
    read the binary's function once it is loaded, not the None of a load in progress."""
    import threading

    binary, heads = _LoadingBinary(), []

    def first():
        heads.append(launch._direct_launch(binary)[1])

    def second():
        binary.loading.wait()
        heads.append(launch._direct_launch(binary)[1])

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [head[0] for head in heads] == [1234, 1234]


def test_other_binaries_load_while_one_is_loading():
    """A load builds the kernel signature's C launcher (a C compiler run where Triton's cache lacks it) and loads
    the binary onto the GPU; the build's other kernels load meanwhile, not one at a time behind it."""
    import threading

    first_loading, second_loaded = threading.Event(), threading.Event()

    class WaitsForTheSecond(_LoadingBinary):
        @property
        def run(self):
            if self._run is None:
                first_loading.set()
                self.saw_second = second_loaded.wait(timeout=5)
                self._run, self.function = (lambda *args: None), 1
            return self._run

    first, second, heads = WaitsForTheSecond(), _LoadingBinary(), []
    loading_first = threading.Thread(target=lambda: heads.append(launch._direct_launch(first)[1]))
    loading_first.start()
    first_loading.wait()
    heads.append(launch._direct_launch(second)[1])
    second_loaded.set()
    loading_first.join()
    assert first.saw_second
    assert sorted(head[0] for head in heads) == [1, 1234]
