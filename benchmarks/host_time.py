"""Host milliseconds per step of eager, torch.compile and kiln, on the zoo's host-bound models at a tiny width.

The zoo (benchmarks/zoo) shows kiln behind torch.compile on a few workloads whose GPU kernel time is the same for
both: the difference is host time, the Python that runs around the kernels each step. This script measures it
alone. Each workload keeps its zoo model's depth (so its graphs, kernels and buffers per step are those of the
zoo's) at a tiny width, so that a kernel takes a few microseconds and a step's time is its host time:

    whisper_train   transformers Whisper, 6 + 6 layers, AdamW, autocast (bf16 on CUDA)
    whisper_infer   the same, forward under no_grad
    t5_train        transformers T5, 6 + 6 layers, AdamW, autocast
    t5_infer        the same, forward under no_grad
    vit_train       transformers ViT, 12 layers, AdamW, autocast
    vit_infer       the same, forward under no_grad at batch 1

Per (workload, compiler), after warm-up steps:

    host_ms          wall time to issue one step, the GPU synchronized before it and not waited for after it
                     (median); on the CPU the whole step
    step_ms          the same step with the synchronize after it
    back_to_back_ms  wall time per step of steps run back to back
    syncs_per_step   on CUDA, the calls in one step that wait for the GPU, with their places

and with `--parts`, for kiln, microseconds per step inside its layers of the host path: the guard functions of
the compiled frames and the generated wrappers of the compiled graphs (the rest of the step is the frame entry
and output program, the autograd runtime and engine, the optimizer and eager code between graphs).
With `--profile N`, the top N functions by own time of a cProfile of a few steps of kiln and torch.compile.

    python benchmarks/host_time.py                              # all workloads, CUDA if there is one
    python benchmarks/host_time.py --device cpu --workloads vit_infer,t5_train --parts --out run.json
    python benchmarks/host_time.py --save                       # results/host_time/<date>_<device>_<commit>.json
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from host_profile import _synchronizing_calls  # noqa: E402
from step_parts import KilnParts  # noqa: E402

from common import compiled, result_path, settled, write_json  # noqa: E402  (also makes the run strict: KILN_STRICT=1)


class _Seq2Seq(nn.Module):
    """A transformers encoder-decoder called positionally: (encoder input, decoder ids[, labels])."""

    def __init__(self, model, input_name: str):
        super().__init__()
        self.model, self.input_name = model, input_name

    def forward(self, inputs, decoder_ids, labels=None):
        out = self.model(**{self.input_name: inputs}, decoder_input_ids=decoder_ids, labels=labels)
        return out.loss if labels is not None else out.logits


class _Classifier(nn.Module):
    """transformers ViT called positionally: (pixels[, labels])."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixels, labels=None):
        out = self.model(pixel_values=pixels, labels=labels)
        return out.loss if labels is not None else out.logits


def whisper(batch: int, device):
    import transformers

    cfg = transformers.WhisperConfig(d_model=64, encoder_layers=6, decoder_layers=6, encoder_attention_heads=4,
                                     decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                                     num_mel_bins=16, max_source_positions=32, vocab_size=512, pad_token_id=0,
                                     bos_token_id=1, eos_token_id=2, decoder_start_token_id=1, use_cache=False)
    model = _Seq2Seq(transformers.WhisperForConditionalGeneration(cfg), "input_features").to(device)

    def make(gen):
        features = torch.randn(batch, cfg.num_mel_bins, 64, generator=gen).to(device)
        ids = torch.randint(0, cfg.vocab_size, (batch, 16), generator=gen).to(device)
        return features, ids, ids
    return model, make


def t5(batch: int, device):
    import transformers

    cfg = transformers.T5Config(d_model=64, d_ff=128, d_kv=16, num_layers=6, num_heads=4, vocab_size=512,
                                decoder_start_token_id=0, use_cache=False)
    model = _Seq2Seq(transformers.T5ForConditionalGeneration(cfg), "input_ids").to(device)

    def make(gen):
        ids = torch.randint(0, cfg.vocab_size, (batch, 32), generator=gen).to(device)
        return ids, ids, ids
    return model, make


def vit(batch: int, device):
    import transformers

    cfg = transformers.ViTConfig(hidden_size=64, num_hidden_layers=12, num_attention_heads=4, intermediate_size=128,
                                 image_size=64, patch_size=16, num_labels=10)
    model = _Classifier(transformers.ViTForImageClassification(cfg)).to(device)

    def make(gen):
        pixels = torch.randn(batch, 3, 64, 64, generator=gen).to(device)
        return pixels, torch.randint(0, 10, (batch,), generator=gen).to(device)
    return model, make


# wall time (on the GPU machine, alone), or the thread's CPU time where other processes share the cores: host work
# is CPU work, and a thread's CPU time does not count the time other processes held its core
CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}

# name -> (builder, batch, train)
WORKLOADS = {
    "whisper_train": (whisper, 2, True),
    "whisper_infer": (whisper, 2, False),
    "t5_train": (t5, 2, True),
    "t5_infer": (t5, 2, False),
    "vit_train": (vit, 2, True),
    "vit_infer": (vit, 1, False),
}


def make_step(name: str, compiler: str, device: torch.device, amp: torch.dtype | None):
    """One step of a workload through a compiler: forward (and backward and AdamW when it trains), and the
    compiled module."""
    build, batch, train = WORKLOADS[name]
    torch.manual_seed(0)
    model, make_inputs = build(batch, device)
    model.train(train)
    for module in model.modules():  # dropout off: steps draw no random numbers, so every compiler does the same
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    inputs = make_inputs(torch.Generator().manual_seed(0))
    fn = compiled(model, compiler)
    if not train:
        def infer():
            with torch.no_grad():
                return fn(*inputs[:-1])
        return infer, fn
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            loss = fn(*inputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss
    return step, fn


def _times(step, steps: int, sync, clock) -> tuple[float, float]:
    host, total = [], []
    for _ in range(steps):
        sync()
        t0 = clock()
        step()
        t1 = clock()
        sync()
        host.append((t1 - t0) * 1e3)
        total.append((clock() - t0) * 1e3)
    return statistics.median(host), statistics.median(total)


def _back_to_back_ms(step, steps: int, sync, clock) -> float:
    sync()
    t0 = clock()
    for _ in range(steps):
        step()
    sync()
    return (clock() - t0) * 1e3 / steps


def _profile(step, steps: int, top: int, sync, clock) -> str:
    prof = cProfile.Profile(clock)
    sync()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    sync()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def measure(name: str, compiler: str, device: torch.device, args) -> dict:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    amp = torch.bfloat16 if device.type == "cuda" else None
    clock = CLOCKS[args.clock]
    parts = KilnParts(clock) if compiler == "kiln" and args.parts else None
    if parts is not None:
        parts.listen()
    t0 = time.perf_counter()
    step, fn = make_step(name, compiler, device, amp)
    step()
    sync()
    row = {"workload": name, "compiler": compiler, "first_step_s": round(time.perf_counter() - t0, 2)}
    settled(compiler)
    for _ in range(args.warmup):
        step()
    row["host_ms"], row["step_ms"] = (round(v, 3) for v in _times(step, args.steps, sync, clock))
    row["back_to_back_ms"] = round(_back_to_back_ms(step, args.steps, sync, clock), 3)
    if device.type == "cuda":  # a wait for the GPU inside the step makes its host and GPU times add up
        places = _synchronizing_calls(step)
        row["syncs_per_step"], row["sync_places"] = len(places), places[:10]
    if parts is not None:
        parts.stop_listening()
        parts.install(fn)
        parts.seconds.clear()
        for _ in range(args.steps):
            step()
        sync()
        row["kiln_parts_us"] = {k: round(v / args.steps * 1e6, 1) for k, v in sorted(parts.seconds.items())}
    if args.profile and compiler != "eager":
        row["cprofile"] = _profile(step, 5, args.profile, sync, clock)
    return row


def _gpu_name() -> str:
    """The GPU's model as results are named by ("h100" for "NVIDIA H100 80GB HBM3")."""
    words = torch.cuda.get_device_name().split()
    return next((w for w in words if w[0].isalpha() and any(c.isdigit() for c in w)), words[-1]).lower()


def _reset() -> None:
    import kiln

    torch._dynamo.reset()
    kiln.reset()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--compilers", default="eager,torch,kiln")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--clock", choices=CLOCKS, default="wall")
    p.add_argument("--parts", action="store_true", help="kiln: time its guards and wrappers per step")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile's top N functions (kiln, torch)")
    p.add_argument("--out", default=None)
    p.add_argument("--save", action="store_true", help="write to results/host_time/<date>_<device>_<commit>.json")
    args = p.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    device = torch.device(args.device)
    machine = _gpu_name() if device.type == "cuda" else "cpu"
    rows = []
    for name in args.workloads.split(","):
        for compiler in args.compilers.split(","):
            row = measure(name, compiler, device, args)
            shown = {k: v for k, v in row.items() if k != "cprofile"}
            print(json.dumps(shown), flush=True)
            if "cprofile" in row:
                print(row["cprofile"], flush=True)
            rows.append(row)
            _reset()
    write_json(result_path("host_time", machine) if args.save else args.out,
               {"device": machine, "clock": args.clock, "torch": torch.__version__, "rows": rows})


if __name__ == "__main__":
    main()
