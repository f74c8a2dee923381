"""Run test scenarios on two processes of one gloo process group (torch.multiprocessing, spawn).

Spawning costs seconds (each process imports torch and kiln), so a test module spawns once, in a
module-scoped fixture: `run_on_ranks(module, names)` runs the named scenario functions of `module` in
order on every rank and returns, per scenario, the list of what each rank's call returned. A scenario
that raises on any rank is reported with its traceback when a test reads its result (`Results[name]`).
The group has a short timeout, so a rank left waiting by its peer's failure ends instead of hanging.
"""
from __future__ import annotations

import datetime
import importlib
import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from unittest import mock

WORLD_SIZE = 2


class ScenarioFailed(AssertionError):
    pass


class Results(dict):
    """scenario name -> [rank 0's result, rank 1's result]; reading a failed scenario raises its traceback."""

    def __getitem__(self, name: str) -> list:
        per_rank = super().__getitem__(name)
        errors = [r["error"] for r in per_rank if isinstance(r, dict) and "error" in r]
        if errors:
            raise ScenarioFailed(f"scenario {name} failed:\n" + "\n".join(errors))
        return per_rank


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, module: str, names: list[str], out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    import kiln

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE, timeout=datetime.timedelta(seconds=120))
    scenarios = importlib.import_module(module)
    results = {}
    try:
        for name in names:
            torch.manual_seed(0)
            kiln.reset()  # each scenario compiles its own (kiln.compile calls naming one backend share captures)
            start = time.perf_counter()
            try:
                results[name] = getattr(scenarios, name)(rank)
            except Exception:
                results[name] = {"error": f"rank {rank}: {traceback.format_exc()}"}
            if os.environ.get("KILN_RANKS_TIMING"):
                print(f"rank {rank}: {name} {time.perf_counter() - start:.1f}s", flush=True)
    finally:
        Path(out_dir, f"{rank}.pkl").write_bytes(pickle.dumps(results))
        dist.destroy_process_group()
    # Leave without the interpreter's teardown: with cold compile caches, a rank's C++ teardown sometimes aborts
    # ("terminate called without an active exception") after its results are written, failing a run that passed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_on_ranks(module: str, names: list[str]) -> Results:
    """Run `module`'s scenario functions `names` (each `fn(rank) -> picklable`) on WORLD_SIZE gloo ranks."""
    import torch.multiprocessing as mp

    # Spawned ranks see no GPU: they are CPU ranks of a gloo group. On a GPU machine FSDP2's device mesh otherwise
    # picks `cuda:rank` for each, and a rank past the machine's GPU count crashed (SIGSEGV).
    with tempfile.TemporaryDirectory() as out_dir, mock.patch.dict(os.environ, CUDA_VISIBLE_DEVICES=""):
        mp.spawn(_rank_main, args=(_free_port(), module, names, out_dir), nprocs=WORLD_SIZE, join=True)
        per_rank = [pickle.loads(Path(out_dir, f"{rank}.pkl").read_bytes()) for rank in range(WORLD_SIZE)]
    return Results({name: [ranks[name] for ranks in per_rank] for name in names})
