"""Lets mesh-tensorflow 0.1.21 import on TensorFlow 2.15.

mesh-tensorflow's last release calls `tensorflow.python.framework.ops.register_tensor_conversion_function`,
which TF 2.13 moved to `tensor_conversion_registry`. This module puts the old name back. It must be
imported before the first `import mesh_tensorflow`; `models/__init__.py` does that, and every module of
this project reaches mesh-tensorflow through the `models` package.
"""
from tensorflow.python.framework import ops as _ops
from tensorflow.python.framework import tensor_conversion_registry as _registry

if not hasattr(_ops, "register_tensor_conversion_function"):
    _ops.register_tensor_conversion_function = _registry.register_tensor_conversion_function
