"""models/compat.py's start-up cuts: Keras held back while TensorFlow loads, mesh_tensorflow.transformer's unused
imports made lazy. Checked in a fresh interpreter: this test process has imported everything already."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = """
import sys, types
import models
import mesh_tensorflow.transformer.attention
print("keras" in sys.modules)
print(type(sys.modules["tensorflow_datasets"]).__name__, type(sys.modules["gin.tf"]).__name__)
import tensorflow as tf
print(tf.keras.layers.Dense.__name__)  # tf.keras still loads Keras on first use
import gin.tf
print(gin.tf.GinConfigSaverHook.__name__)  # a lazy module loads on its first attribute read
"""


def test_keras_is_not_imported_and_the_unused_imports_load_only_on_use():
    """The bugs this catches: `import tensorflow` in place of `import_tensorflow()` in models/compat.py (Keras and
    scikit-learn loaded: 5.0 of TensorFlow's 12.5 CPU s here), or the lazy_module loop removed (tensorflow_datasets,
    gin.tf loaded for nothing)."""
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:4] == ["False", "_Deferred _Deferred", "Dense", "GinConfigSaverHook"]
