"""The autograd engine is process-wide: its compiled-autograd state is reset around each test."""
from support.compiled_autograd import fresh_compiled_autograd, one_thread  # noqa: F401
