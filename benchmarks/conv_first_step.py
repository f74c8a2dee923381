"""Where a convolutional training workload's first step goes: its convolution calls, with cuDNN's algorithm search.

    PYTHONPATH=. python benchmarks/conv_first_step.py WORKLOAD eager|eager_cl|kiln OUTDIR

One zoo workload (benchmarks/zoo/workloads.py, with the zoo's switches: `cudnn.benchmark` on) in a fresh process:
eager as the zoo runs it (NCHW), eager with the model and inputs channels-last (`eager_cl`), or kiln (which runs
convolutions channels-last where kiln/lower/conv_layout.py says they are faster). The first step (for kiln its
compile too) runs under torch.profiler, recording shapes and strides; the convolution ops' CPU time, where cuDNN's
search runs, is summed per op and per configuration (a kiln run also counts the compile's calls on fake tensors,
which take no time). Writes OUTDIR/<workload>_<how>.json (every configuration: op, sizes, strides, dtypes, calls,
seconds) and prints the first and second steps' seconds and the costliest ops.
"""
from __future__ import annotations

import collections
import json
import os
import sys
import time

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "zoo")]

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from workloads import WORKLOADS, gpu_settings, make_step, without_dropout  # noqa: E402


def main() -> None:
    name, how, outdir = sys.argv[1:4]
    workload = WORKLOADS[name]
    gpu_settings()
    torch.manual_seed(0)
    model, make_inputs = workload.build(workload.batch, torch.device("cuda"), True)
    without_dropout(model)
    model.train(True)
    inputs = make_inputs(torch.Generator().manual_seed(1))
    if how == "eager_cl":
        model = model.to(memory_format=torch.channels_last)
        inputs = tuple(x.to(memory_format=torch.channels_last) if x.dim() == 4 else x for x in inputs)
    fn = model
    if how == "kiln":
        import kiln
        fn = kiln.compile(model)
    step = make_step(workload, fn, model)
    torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step(inputs)
        torch.cuda.synchronize()
    first = time.perf_counter() - start
    start = time.perf_counter()
    step(inputs)
    torch.cuda.synchronize()
    second = time.perf_counter() - start
    trace = os.path.join(outdir, f"{name}_{how}.trace.json")
    prof.export_chrome_trace(trace)
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    os.remove(trace)
    configs = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        if "conv" in e.get("name", "").lower() and e.get("ph") == "X":
            a = e.get("args", {})
            key = (e["name"], str(a.get("Input Dims")), str(a.get("Input Strides")), str(a.get("Input type")))
            configs[key][0] += 1
            configs[key][1] += e.get("dur", 0) / 1e6
    with open(os.path.join(outdir, f"{name}_{how}.json"), "w") as f:
        json.dump({"workload": name, "how": how, "first_step_s": first, "second_step_s": second,
                   "configs": [list(k) + v for k, v in sorted(configs.items(), key=lambda kv: -kv[1][1])]}, f)
    by_op = collections.defaultdict(lambda: [0, 0, 0.0])
    for (op, *_), (calls, seconds) in configs.items():
        by_op[op][0] += 1
        by_op[op][1] += calls
        by_op[op][2] += seconds
    print(name, how, "first step", round(first, 2), "s, second", round(second, 3), "s")
    for op, (count, calls, seconds) in sorted(by_op.items(), key=lambda kv: -kv[1][2])[:8]:
        print(f"   {op:50s} configurations {count:4d} calls {calls:4d} {seconds:7.2f} s")


if __name__ == "__main__":
    main()
