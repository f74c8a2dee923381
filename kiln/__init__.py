"""kiln: a just-in-time compiler for unmodified PyTorch programs."""
# ruff: noqa: E402  (torch's switches are read before the imports below import torch)
from kiln.torch_switches import claim_torch_logs as _claim_torch_logs

_claim_torch_logs()  # before torch is imported: torch raises on a TORCH_LOGS name it does not know

from kiln import compiled_autograd, optim
from kiln.api import compile, disable, graph_break, mark_dynamic, mark_static, maybe_mark_dynamic, reset
from kiln.backends import list_backends, register_backend
from kiln.capture.entry import BackendCompilerFailed, FullGraphError
from kiln.config import config, list_mode_options, list_options
from kiln.debug.explain import explain
from kiln.debug.logs import configure_from_environment as _configure_logs
from kiln.fallbacks import KilnFallbackWarning, KilnStrictError
from kiln.pipeline import inductor
from kiln.runtime.artifacts import load_cache_artifacts, save_cache_artifacts
from kiln.runtime.cudagraphs import cudagraph_mark_step_begin

_configure_logs()

__all__ = ["compile", "mark_dynamic", "maybe_mark_dynamic", "mark_static", "disable", "graph_break", "reset",
           "list_backends", "register_backend", "config", "list_options", "list_mode_options", "explain", "inductor",
           "FullGraphError", "BackendCompilerFailed", "cudagraph_mark_step_begin", "KilnStrictError",
           "KilnFallbackWarning", "save_cache_artifacts", "load_cache_artifacts", "compiled_autograd", "optim"]
