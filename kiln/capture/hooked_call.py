"""`Module.__call__` for a module with forward hooks or pre-hooks, written as plain Python for kiln to capture.

torch.compile traces `Module._call_impl`, so a compiled module's hooks land in its graph. kiln compiles this
function in place of `forward` when the module has forward hooks: capture inlines the hook loops and the
forward like any Python code, guards on the hook dicts it reads (adding or removing a hook recompiles), and a
graph break inside `forward` resumes here, after the call, with the remaining hooks still captured. It
follows torch's `_call_impl` for forward hooks; backward and global hooks are not handled here (callers run
such modules through torch's own `__call__`).
"""
from __future__ import annotations

from torch import nn


def call_module_with_hooks(module: nn.Module, *args, **kwargs):
    """`module(*args, **kwargs)` with its forward pre-hooks and forward hooks, in torch's order."""
    for hook_id, hook in module._forward_pre_hooks.items():
        if hook_id in module._forward_pre_hooks_with_kwargs:
            result = hook(module, args, kwargs)
            if result is not None:
                if not (isinstance(result, tuple) and len(result) == 2):
                    raise RuntimeError("forward pre-hook must return None or a tuple of (new_args, new_kwargs), "
                                       f"but got {result}.")
                args, kwargs = result
        else:
            result = hook(module, args)
            if result is not None:
                args = result if isinstance(result, tuple) else (result,)
    output = type(module).forward(module, *args, **kwargs)
    for hook_id, hook in module._forward_hooks.items():
        if hook_id in module._forward_hooks_with_kwargs:
            result = hook(module, args, kwargs, output)
        else:
            result = hook(module, args, output)
        if result is not None:
            output = result
    return output


def has_only_forward_hooks(module: nn.Module) -> bool:
    """True when `module` has forward hooks or pre-hooks and no backward hooks (global ones are checked apart)."""
    return bool((module._forward_hooks or module._forward_pre_hooks)
                and not (module._backward_hooks or module._backward_pre_hooks))
