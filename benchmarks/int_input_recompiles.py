"""How often kiln and torch.compile compile a function called with an int input that changes, by where the int goes.

torch.compile specializes an int input on its first value and, once a second value comes (automatic dynamic),
makes it a symbol, so every later value reuses one graph; kiln does the same (docs/capture.md). Each row calls
the function with four values (backend "eager" for both) and prints the frames each compiled.

    python benchmarks/int_input_recompiles.py
"""
from __future__ import annotations

import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter

import kiln
from kiln.api import context_of

CASES = {
    "x + n": lambda x, n: x + n,
    "x[:n]": lambda x, n: x[:n] * 2,
    "x[1:n]": lambda x, n: x[1:n] * 2,
    "x[::n]": lambda x, n: x[::n] * 2,
    "x[n]": lambda x, n: x[n] * 2,
    "x.narrow(0, 0, n)": lambda x, n: x.narrow(0, 0, n) * 2,
    "torch.arange(n)": lambda x, n: torch.arange(n) * 2,
    "x.reshape(n, -1)": lambda x, n: x.reshape(n, -1) * 2,
}
VALUES = {"x.reshape(n, -1)": (2, 5, 10, 20)}


def frames(fn, values) -> tuple[int, int]:
    x = torch.randn(20, 4)
    kiln.reset()
    torch._dynamo.reset()
    compiled, counter = kiln.compile(fn, backend="eager"), CompileCounter()
    reference = torch.compile(fn, backend=counter)
    for n in values:
        torch.testing.assert_close(compiled(x, n), fn(x, n))
        reference(x, n)
    return len(context_of(compiled).records), counter.frame_count


def main() -> None:
    print("| int input used as | values | kiln frames | torch.compile frames |")
    print("|---|---|---|---|")
    for name, fn in CASES.items():
        values = VALUES.get(name, (2, 3, 4, 5))
        ours, theirs = frames(fn, values)
        print(f"| `{name}` | {', '.join(map(str, values))} | {ours} | {theirs} |")


if __name__ == "__main__":
    main()
