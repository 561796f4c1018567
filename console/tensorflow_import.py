"""`import_tensorflow()`: TensorFlow loaded the way every entry point wants it, whichever loads it first (models/
compat.py for the model's jobs, data/create_tfrecords.py for its record writers).

* Without Keras 3, which TensorFlow 2.21 imports eagerly at the end of its own import (`keras.src.optimizers`, for
  Keras' SavedModel registrations; it pulls in scikit-learn among others). That import cost 5.0 of TensorFlow's
  12.5 CPU seconds (2026-11-28, 2-core AMD EPYC): nothing in this project uses Keras, and `tf.keras`
  (TensorFlow's lazy loader) still imports it on first use.
* After triton, where it is installed: TF 2.20+ wheels load TensorFlow with RTLD_GLOBAL, which puts its LLVM in
  the global symbol table, and a later `import triton` (which CUDA builds of PyTorch do on their first use, e.g.
  in tools/hf.py and the HF parity tests) crashes on it (tensorflow/tensorflow#124205). Loading triton first
  avoids that (0.2 s).
"""
import importlib.abc
import importlib.machinery
import importlib.util
import sys


class _HoldBack(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """While TensorFlow's own import runs, `import keras` fails (TensorFlow catches it). The spec found is keras's
    own, so TensorFlow's `find_spec("keras")` still finds its folder for `tf.keras`."""

    def find_spec(self, name, path, target=None):
        if name != "keras":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None:
            spec.loader = self
        return spec

    def create_module(self, spec):
        raise ImportError("keras is not loaded with TensorFlow here (console/tensorflow_import.py); tf.keras loads "
                          "it on use")

    def exec_module(self, module):  # never reached: create_module refuses
        raise ImportError(module.__name__)


def import_tensorflow():
    """The `tensorflow` module, imported without Keras and after triton (above). A process that imported
    TensorFlow already keeps it as it is."""
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    if importlib.util.find_spec("triton") is not None:
        import triton  # noqa: F401  (before TensorFlow; see above)
    hold = _HoldBack()
    sys.meta_path.insert(0, hold)
    try:
        import tensorflow
    finally:
        sys.meta_path.remove(hold)
    return tensorflow
