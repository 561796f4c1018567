"""Lets mesh-tensorflow 0.1.21 import on the TensorFlow this project pins (2.21), which has no Estimator.

mesh-tensorflow's last release was written against TF 1.15-2.15. On TF 2.21 it needs four names put back
before its first import; `models/__init__.py` installs them, and every module of this project reaches
mesh-tensorflow through the `models` package:

* `ops.register_tensor_conversion_function`, which TF 2.13 moved to `tensor_conversion_registry`;
* `tensorflow.compat.v1.estimator`, gone since TF 2.16: mesh-tensorflow reads `ModeKeys` (mode strings),
  subclasses `SessionRunHook` and `CheckpointSaverListener` for its restore/save hooks, and gin's TF
  utilities subclass `tf.estimator.SessionRunHook`. The session-hook classes live on as
  `tf.compat.v1.train.*`; the stand-in module holds those and the mode strings, nothing else;
* `tensorflow.python.tpu.tpu_estimator` and `tpu_config`, imported (never used here) by
  `mesh_tensorflow.transformer.utils` for its own Estimator helpers. Their stand-ins raise on any use.

This project's own code never uses any of these names: it trains through train/loop.py.

TensorFlow itself is loaded by console/tensorflow_import.py (Keras held back, triton loaded first); the
modules mesh_tensorflow.transformer imports and this project never uses are deferred here (`lazy_module`).
"""
import importlib
import importlib.util
import sys
import types
import warnings

from console.tensorflow_import import import_tensorflow

# mesh_tensorflow.transformer.utils imports pkg_resources, whose deprecation UserWarning (setuptools 80) would
# reach every command's console; it tells users nothing they can act on (requirements.txt pins setuptools 80).
warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)

class _Deferred(types.ModuleType):
    """Stands in sys.modules for a module until an attribute of it is read; then imports it and hands over."""

    def __getattr__(self, attribute):  # only for attributes the stand-in lacks (its __spec__ it has)
        module = sys.modules.get(self.__name__)
        if module is self or module is None:
            del sys.modules[self.__name__]
            parent = sys.modules.get(self.__name__.rpartition(".")[0])
            if parent is not None and getattr(parent, self.__name__.rpartition(".")[2], None) is self:
                delattr(parent, self.__name__.rpartition(".")[2])
            module = importlib.import_module(self.__name__)
        return getattr(module, attribute)


def lazy_module(name: str) -> None:
    """`name` in sys.modules as a stand-in that imports the module on the first read of an attribute of it:
    for modules that mesh_tensorflow.transformer imports at its top but uses only in functions this project never
    calls (tensorflow_datasets, gin.tf with distutils, pkg_resources: 1.5, 0.7 and 0.3 s of the start-up's
    imports under load). importlib.util.LazyLoader does not serve: Python 3.11's `import` statement reads the
    module's __spec__, which loads it. A module already imported, or not installed, is left alone."""
    if name in sys.modules:
        return
    parent, _, child = name.rpartition(".")
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return
    if spec is None:
        return
    module = _Deferred(name)
    module.__spec__, module.__file__ = spec, spec.origin
    if spec.submodule_search_locations is not None:
        module.__path__ = list(spec.submodule_search_locations)
    sys.modules[name] = module
    if parent:
        setattr(sys.modules[parent], child, module)


_tf = import_tensorflow()
for _name in ("tensorflow_datasets", "gin.tf", "pkg_resources"):
    lazy_module(_name)

try:  # TensorFlow's internals, which mesh-tensorflow itself imports: without them it cannot load at all
    from tensorflow.python.framework import ops as _ops  # noqa: E402
    if not hasattr(_ops, "register_tensor_conversion_function"):
        from tensorflow.python.framework import tensor_conversion_registry as _registry  # noqa: E402
        _ops.register_tensor_conversion_function = _registry.register_tensor_conversion_function
except ImportError as _missing:
    raise ImportError(f"mesh-tensorflow 0.1.21 needs TensorFlow's tensorflow.python.framework.ops."
                      f"register_tensor_conversion_function, which TensorFlow {_tf.__version__} lacks ({_missing}): "
                      f"install the TensorFlow requirements.txt pins") from _missing


class ModeKeys:
    """The Estimator's mode strings, which mesh-tensorflow's layers compare against."""
    TRAIN = "train"
    EVAL = "eval"
    PREDICT = "infer"


def _estimator_stand_in() -> types.ModuleType:
    module = types.ModuleType("tensorflow.compat.v1.estimator",
                              "Stand-in for the removed Estimator module: the names mesh-tensorflow imports.")
    module.ModeKeys = ModeKeys
    module.SessionRunHook = _tf.compat.v1.train.SessionRunHook
    module.SessionRunArgs = _tf.compat.v1.train.SessionRunArgs
    module.CheckpointSaverListener = _tf.compat.v1.train.CheckpointSaverListener
    return module


class _Removed(types.ModuleType):
    """A module TensorFlow no longer ships, imported by a mesh-tensorflow file this project does not use."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise ImportError(f"{self.__name__}.{name} was removed from TensorFlow; this project does not use it")


def _install() -> None:
    v1 = _tf.compat.v1
    estimator = _estimator_stand_in()
    sys.modules["tensorflow.compat.v1.estimator"] = estimator
    v1.estimator = estimator
    if "estimator" not in dir(_tf):  # gin.tf.utils: class GinConfigSaverHook(tf.estimator.SessionRunHook)
        _tf.estimator = estimator
    for name in ("tpu_estimator", "tpu_config"):
        full = f"tensorflow.python.tpu.{name}"
        if full not in sys.modules:
            if "tensorflow.python.tpu" not in sys.modules:  # a TensorFlow without it: the folder stood in too
                sys.modules["tensorflow.python.tpu"] = types.ModuleType("tensorflow.python.tpu")
            sys.modules[full] = _Removed(full)
            setattr(sys.modules["tensorflow.python.tpu"], name, sys.modules[full])


_install()
