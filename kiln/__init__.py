"""kiln: a just-in-time compiler for unmodified PyTorch programs."""
from kiln import compiled_autograd, optim
from kiln.api import compile, disable, graph_break, mark_dynamic, mark_static, maybe_mark_dynamic, reset
from kiln.backends import list_backends, register_backend
from kiln.capture.entry import BackendCompilerFailed, FullGraphError
from kiln.config import config, list_mode_options, list_options
from kiln.debug.explain import explain
from kiln.debug.logs import configure_from_environment as _configure_logs
from kiln.fallbacks import KilnFallbackWarning, KilnStrictError
from kiln.pipeline import inductor
from kiln.runtime.cudagraphs import cudagraph_mark_step_begin

_configure_logs()

__all__ = ["compile", "mark_dynamic", "maybe_mark_dynamic", "mark_static", "disable", "graph_break", "reset",
           "list_backends", "register_backend", "config", "list_options", "list_mode_options", "explain", "inductor",
           "FullGraphError", "BackendCompilerFailed", "cudagraph_mark_step_begin", "KilnStrictError",
           "KilnFallbackWarning", "compiled_autograd", "optim"]
