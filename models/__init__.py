"""GPT models in mesh-tensorflow. Importing this package first puts back the names mesh-tensorflow 0.1.21 needs on
TensorFlow 2.21 (models/compat.py)."""
from models import compat as _compat  # noqa: F401  (must run before mesh_tensorflow is imported)
