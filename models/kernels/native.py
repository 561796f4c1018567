"""Kernels written in C++ (matvec.cc), compiled on this machine, loaded into the process and called from XLA:CPU
programs as custom calls: the decoding step's matrix-vector products (models/compiled_decoding.py).

XLA:CPU reads bf16 weights no faster than fp32 ones and runs a While body's kernels on one core; a token's
products at batch 1 are its weights' bytes over the memory bandwidth, so reading bf16 weights as stored, on every
core, is most of what a faster token needs (docs/speed.md, "Decoding's products in C++").

The library is built once per machine with the C++ compiler ($CXX, else g++ or c++) into the XLA compile cache's
folder, which is keyed by TensorFlow's version and the CPU's flags (console/environment.py sets it in
TF_XLA_FLAGS), so `-march=native` code never meets another CPU; without that folder, into a temporary one for
the process. Where it cannot be built or registered (no compiler, a TensorFlow that does not export XLA's
custom-call registry) or GPT_NEO_NATIVE_KERNELS is off, `library()` is None, one note says why, and the
decoder keeps XLA's own products: the same values up to the order of the sums.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from typing import Optional

from console.environment import switched_off, xla_cache_in_use

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "matvec.cc")
SWITCH = "GPT_NEO_NATIVE_KERNELS"  # "off" (or 0, no, false): XLA's own products
MAX_ROWS = 16  # products of more rows than this are XLA's (a matrix product's compute, not the weights' reads)
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-pthread")
# The registry's two functions in TensorFlow's library (xla::CustomCallTargetRegistry::Global and ::Register)
REGISTRY_SYMBOLS = ("_ZN3xla24CustomCallTargetRegistry6GlobalEv",
                    "_ZN3xla24CustomCallTargetRegistry8RegisterERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"
                    "PvS8_")

_lock = threading.Lock()
_loaded: Optional[ctypes.CDLL] = None
_why_not: Optional[str] = None
_noted = False


def enabled(environ=os.environ) -> bool:
    return not switched_off(environ.get(SWITCH))


def library() -> Optional[ctypes.CDLL]:
    """The built, loaded and registered library, or None (then `why_not()` says why). Built once per process at
    most; a failure is noted once on stderr."""
    global _loaded, _why_not, _noted
    if not enabled():
        return None
    with _lock:
        if _loaded is None and _why_not is None:
            try:
                path, temporary = _build()
                try:
                    _loaded = _load(path)
                finally:
                    if temporary:  # loaded (mapped) or not, the process's own copy is not kept
                        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
            except NativeUnavailable as e:
                _why_not = str(e)
            except OSError as e:  # a cache folder that cannot be written after all, a full disk
                _why_not = f"cannot build the library: {e.strerror or e}"
        if _why_not is not None and not _noted:
            _noted = True
            print(f"note: decoding's matrix-vector products run as XLA's ({_why_not})", file=sys.stderr)
    return _loaded


def why_not() -> Optional[str]:
    """Why `library()` is None, if it is."""
    if not enabled():
        return f"{SWITCH} is off"
    return _why_not


class NativeUnavailable(RuntimeError):
    pass


def compiler(environ=os.environ) -> str:
    """The C++ compiler's path: $CXX, else g++, else c++."""
    for name in filter(None, [environ.get("CXX"), "g++", "c++"]):
        path = shutil.which(name)
        if path:
            return path
        if name == environ.get("CXX"):
            raise NativeUnavailable(f"CXX={name} is not a command; set CXX to a C++ compiler, or "
                                    f"{SWITCH}=off")
    raise NativeUnavailable(f"no C++ compiler (g++ or c++) on PATH; install one, or set {SWITCH}=off")


def _build() -> tuple[str, bool]:
    """(the library's path, whether its folder is this process's own): compiled now unless the cache folder holds
    it for this source, compiler and flags."""
    cxx = compiler()
    with open(SOURCE, "rb") as f:
        source = f.read()
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeUnavailable(f"{cxx} --version failed: {e}")
    key = hashlib.sha256(source + version.encode() + " ".join(FLAGS).encode()).hexdigest()[:16]
    folder, temporary = xla_cache_in_use(), False
    if folder is not None:
        folder = os.path.join(folder, "native")
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError:
            folder = None
    if folder is None:
        folder, temporary = tempfile.mkdtemp(prefix="gpt-neo-native-"), True
    path = os.path.join(folder, f"matvec-{key}.so")
    if os.path.exists(path):
        return path, temporary
    print(f"compiling the decoding kernels ({os.path.basename(SOURCE)}, once per machine) ...", file=sys.stderr,
          flush=True)
    # written beside and renamed into place: a process reading the folder sees a whole library or none
    fd, partial = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(fd)
    try:
        done = subprocess.run([cxx, *FLAGS, SOURCE, "-o", partial], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:200])
            raise NativeUnavailable(f"{os.path.basename(cxx)} failed on {os.path.basename(SOURCE)}: {first}")
        os.replace(partial, path)
    except subprocess.SubprocessError as e:
        raise NativeUnavailable(f"{os.path.basename(cxx)} failed on {os.path.basename(SOURCE)}: {e}")
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path, temporary


def _load(path: str) -> ctypes.CDLL:
    """Loads the library and registers its targets with the XLA:CPU of the TensorFlow in this process."""
    import tensorflow as tf
    tensorflow_cc = os.path.join(os.path.dirname(tf.__file__), "libtensorflow_cc.so.2")
    try:
        registry = ctypes.CDLL(tensorflow_cc)
        addresses = [ctypes.cast(getattr(registry, symbol), ctypes.c_void_p) for symbol in REGISTRY_SYMBOLS]
    except (OSError, AttributeError) as e:
        raise NativeUnavailable(f"this TensorFlow does not export XLA's custom-call registry ({e})")
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise NativeUnavailable(f"cannot load {path}: {e}")
    lib.neo_register.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.neo_register.restype = None
    lib.neo_register(*addresses)
    return lib


def product(x, w, transposed: bool = False):
    """x [rows, k] fp32 @ w [k, n] (or w [n, k] transposed) -> [rows, n] fp32, as the custom call; w fp32 or bf16.
    Only inside an XLA:CPU program, and only after `library()` returned the library."""
    import tensorflow.compat.v1 as tf
    from tensorflow.compiler.tf2xla.ops import gen_xla_ops
    rows, k = x.shape.as_list()
    n = w.shape[0] if transposed else w.shape[1]
    if w.dtype not in (tf.float32, tf.bfloat16):
        raise ValueError(f"native products read float32 or bfloat16 weights, not {w.dtype.name}")
    target = "neo_matvec_bf16" if w.dtype == tf.bfloat16 else "neo_matvec_f32"
    return gen_xla_ops.xla_custom_call_v2(
        operands=[tf.cast(x, tf.float32), w], call_target_name=target,
        backend_config=f"{rows} {k} {n} {int(transposed)}", has_side_effect=False,
        result_dtypes=[tf.float32], result_shapes=[[rows, n]])[0]
