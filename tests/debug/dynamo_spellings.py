"""A script written for torch.compile, using torch's own spellings; test_cli runs it under `python -m kiln run`."""
import torch
import torch._dynamo


@torch.compiler.disable
def describe(x):
    return x.abs()


def step(x):
    y = x.sin() if torch.compiler.is_compiling() else x
    torch._dynamo.graph_break()
    return describe(y) + 1


def scale(x):
    return x * x.shape[0]


compiled_step, compiled_scale = torch.compile(step, backend="eager"), torch.compile(scale, backend="eager")
x = torch.randn(4)
for _ in range(3):
    print("step matches torch.compile:", torch.allclose(compiled_step(x), x.sin().abs() + 1))
for n in (4, 6, 9):
    x = torch.randn(n)
    torch._dynamo.mark_dynamic(x, 0)
    print("scale matches eager:", torch.allclose(compiled_scale(x), x * n))
