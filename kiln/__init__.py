"""kiln: a just-in-time compiler for unmodified PyTorch programs."""
from kiln.backends import list_backends, register_backend
from kiln.config import config, list_mode_options, list_options
