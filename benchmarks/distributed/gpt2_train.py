"""GPT-2 training on several processes, DDP and FSDP2: eager, torch.compile and kiln in one run.

    torchrun --nproc_per_node 2 benchmarks/distributed/gpt2_train.py                  # 2 GPUs, NCCL, GPT-2 small
    torchrun --nproc_per_node 2 benchmarks/distributed/gpt2_train.py --device cpu --backend gloo --size tiny

Each (parallelism, compiler) pair trains a GPT-2 (transformers' GPT2LMHeadModel from a config, random weights,
dropout off so that runs are comparable) from the same weights on the same batches: bf16 autocast, AdamW,
`--steps` steps. DDP: the whole model wrapped, then compiled (`compile(DDP(model))`, kiln's and torch.compile's
bucketed graphs). FSDP2: each transformer block compiled and then sharded with `fully_shard`, then the root
(torchtitan's recipe). The losses of every step are checked against eager's (`--loss-rtol`); the step time is
the median of the steps after `--warmup`, the first step's time (compile included) is kept too. Rank 0 writes
the JSON and a markdown table (`--out`, default benchmarks/results/gpt2_distributed/<date>_<machine>_<commit>).
The NCCL settings of the machine (NCCL_NVLS_ENABLE=0 and friends) are left as they are.
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/: common.py
import kiln  # noqa: E402
from common import result_path, write_json  # noqa: E402

SIZES = {  # GPT2Config fields; "small" is GPT-2 small (124M parameters)
    "small": dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257),
    "tiny": dict(n_layer=2, n_embd=64, n_head=4, n_positions=64, vocab_size=512),
}
COMPILERS = ("eager", "torch.compile", "kiln")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--backend", default=None, help="process group backend (default: nccl on cuda, gloo on cpu)")
    p.add_argument("--size", default="small", choices=sorted(SIZES))
    p.add_argument("--batch", type=int, default=None, help="sequences per rank (default: 8 small, 2 tiny)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: 1024 small, 32 tiny)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the step time")
    p.add_argument("--parallel", nargs="+", default=["ddp", "fsdp"], choices=["ddp", "fsdp"])
    p.add_argument("--compilers", nargs="+", default=list(COMPILERS), choices=COMPILERS)
    p.add_argument("--loss-rtol", type=float, default=2e-2, help="largest relative loss difference from eager")
    p.add_argument("--out", default=None, help="JSON path (a .md table is written beside it)")
    args = p.parse_args(argv)
    args.backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    args.batch = args.batch or (8 if args.size == "small" else 2)
    args.seq = args.seq or (1024 if args.size == "small" else 32)
    return args


def build_model(size: str, device: torch.device) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(**SIZES[size], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    return GPT2LMHeadModel(config).to(device)


def compile_fn(compiler: str):
    """The compiler as a function of a module (identity for eager)."""
    if compiler == "torch.compile":
        return torch.compile
    if compiler == "kiln":
        return kiln.compile
    return lambda module: module


def wrap(model: torch.nn.Module, parallel: str, compiler: str, device: torch.device) -> torch.nn.Module:
    compile_ = compile_fn(compiler)
    if parallel == "ddp":
        return compile_(DDP(model, device_ids=[device.index] if device.type == "cuda" else None))
    blocks = model.transformer.h
    for i, block in enumerate(blocks):
        blocks[i] = compile_(block)
        fully_shard(blocks[i])
    fully_shard(model)
    return model


def batches(args, rank: int, device: torch.device) -> list[torch.Tensor]:
    vocab = SIZES[args.size]["vocab_size"]
    generator = torch.Generator().manual_seed(1000 + rank)
    return [torch.randint(0, vocab, (args.batch, args.seq), generator=generator).to(device) for _ in range(args.steps)]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train(model, data: list[torch.Tensor], device: torch.device) -> tuple[list[float], list[float]]:
    """Losses and step times (seconds) of one training run."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses, times = [], []
    for ids in data:
        synchronize(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    return losses, times


def kiln_captures(model: torch.nn.Module) -> dict:
    """What kiln captured for `model` (the compiled DDP wrapper, or the compiled blocks of FSDP2)."""
    contexts = {id(c): c for m in (model, *model.modules()) if (c := getattr(m, "_kiln_context", None))}
    records = [r for c in contexts.values() for r in c.records]
    buckets = [len(r.graph.meta["kiln.ddp_buckets"]) for r in records
               if r.graph is not None and "kiln.ddp_buckets" in r.graph.meta]
    return {"kiln_graphs": len(records), "kiln_graph_breaks": sum(r.graph_break is not None for r in records),
            "kiln_ddp_buckets": buckets}


def reset_compilers() -> None:
    kiln.reset()
    torch._dynamo.reset()


def run_one(args, base: torch.nn.Module, parallel: str, compiler: str, device, rank: int) -> dict:
    reset_compilers()
    model = wrap(copy.deepcopy(base), parallel, compiler, device)
    try:
        losses, times = train(model, batches(args, rank, device), device)
    except Exception as e:  # one failing pair is reported, the others still run
        return {"parallel": parallel, "compiler": compiler, "error": f"{type(e).__name__}: {e}"[:2000],
                "traceback": traceback.format_exc()[-4000:]}
    timed = times[args.warmup:] or times
    tokens = args.batch * args.seq * dist.get_world_size()
    step = statistics.median(timed)
    result = {"parallel": parallel, "compiler": compiler, "losses": losses, "first_step_s": times[0],
              "step_ms": 1000 * step, "tokens_per_s": tokens / step}
    return dict(result, **kiln_captures(model)) if compiler == "kiln" else result


def compare_losses(results: list[dict], rtol: float, device: torch.device) -> None:
    """Each run's largest relative loss difference from eager's on this rank, reduced over ranks (max)."""
    eager = {r["parallel"]: r["losses"] for r in results if r["compiler"] == "eager" and "losses" in r}
    for r in results:
        if "losses" not in r or r["parallel"] not in eager:
            continue
        diff = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(r["losses"], eager[r["parallel"]], strict=True))
        worst = torch.tensor(diff, dtype=torch.float64, device=device)  # NCCL reduces GPU tensors only
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        r["loss_max_rel_diff"] = worst.item()
        r["losses_match"] = worst.item() <= rtol


def markdown(results: list[dict], args, machine: str) -> str:
    lines = [f"GPT-2 {args.size} training, {dist.get_world_size()} ranks ({machine}, {args.backend}), batch "
             f"{args.batch}x{args.seq} per rank, bf16 autocast, AdamW, {args.steps} steps (step time: median "
             f"after {args.warmup})", "",
             "| parallel | compiler | step ms | tokens/s | first step s | max loss rel. diff vs eager | losses ok |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['parallel']} | {r['compiler']} | error: {r['error'][:120]} | | | | no |")
            continue
        lines.append(f"| {r['parallel']} | {r['compiler']} | {r['step_ms']:.1f} | {r['tokens_per_s']:.0f} | "
                     f"{r['first_step_s']:.1f} | {r.get('loss_max_rel_diff', 0.0):.2e} | "
                     f"{'yes' if r.get('losses_match', True) else 'NO'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    dist.init_process_group(args.backend)
    rank, local_rank = dist.get_rank(), int(os.environ.get("LOCAL_RANK", 0))
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
    device = torch.device(args.device, local_rank) if args.device == "cuda" else torch.device("cpu")
    base = build_model(args.size, device)
    results = []
    for parallel in args.parallel:
        for compiler in args.compilers:
            results.append(run_one(args, base, parallel, compiler, device, rank))
            done = results[-1]
            if "error" in done:  # on any rank: a peer may be left waiting in a collective, so say it now
                print(f"rank {rank}: {parallel} {compiler}: {done['traceback']}", flush=True)
            elif rank == 0:  # progress: a run cut short still shows which pairs finished, and how
                print(f"{parallel} {compiler}: step {done['step_ms']:.1f} ms, first step {done['first_step_s']:.1f} s",
                      flush=True)
    compare_losses(results, args.loss_rtol, device)
    if rank == 0:
        machine = torch.cuda.get_device_name(device).replace(" ", "-") if args.device == "cuda" else "cpu"
        out = args.out or result_path("gpt2_distributed", f"{machine}x{dist.get_world_size()}")
        write_json(out, {"args": vars(args), "world_size": dist.get_world_size(), "machine": machine,
                         "torch": torch.__version__, "results": results})
        table = markdown(results, args, machine)
        with open(os.path.splitext(out)[0] + ".md", "w") as f:
            f.write(table)
        print(table)
    dist.destroy_process_group()
    ok = all("error" not in r and r.get("losses_match", True) for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
