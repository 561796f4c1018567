"""GPT models in mesh-tensorflow. Importing this package installs the TF 2.15 compatibility alias."""
from models import compat as _compat  # noqa: F401  (must run before mesh_tensorflow is imported)
