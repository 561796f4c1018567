"""A tf.function's trace kept on disk: the compiled decoder's program (models/compiled_decoding.py) is some 1,500
TF ops that Python takes 0.3-0.8 s to trace each time a process builds it (a `--predict`, each harness run with a
generation task), where reading the same functions back takes ~0.04 s; the fused Adam pass (models/optimizers.py)
costs every training build ~0.2 s for a tiny model and ~1.5 s at GPT-Neo 125M.

`call(make_function, args, parts)` is `make_function()(*args)` in the graph being built. The first time, it traces
and writes the function and the ones it calls (a While's body and condition, a switch's branches) as a
FunctionDefLibrary and calls them as stored; later, with the same key, it adds those functions to the graph and
calls them, tracing nothing: every process runs one program, so XLA's persistent cache compiles it once. A graph
reads and imports a file once: its later calls there (another device's) only add a call. The key is
a digest of `parts` (what the trace was made from: the config, the options, the argument shapes and dtypes), the
source of every module under models/ and of schema.py (so an edit to the code traces again), and TensorFlow's and
Python's versions. The files go to the XLA compile cache's folder (`traces/`), which is already keyed by
TensorFlow's version and the CPU (console/environment.py); with no cache folder in use (GPT_NEO_XLA_CACHE=off)
nothing is kept and every call traces. A file that cannot be read back is traced again and replaced; one that
cannot be written is left out, and the trace used as made.
"""
from __future__ import annotations

import functools
import hashlib
import os
import sys
import weakref
from typing import Callable, Optional, Sequence

import tensorflow.compat.v1 as tf
from tensorflow.core.framework import attr_value_pb2, function_pb2, graph_pb2

try:  # the call ops tf.function makes (private; docs/repository.md): without them, every build traces
    from tensorflow.python.ops import gen_functional_ops
except ImportError:  # pragma: no cover -- a TensorFlow that moved them (tests/test_tensorflow_internals.py)
    gen_functional_ops = None

from console.environment import xla_cache_in_use
from modelpath.files import write_atomically

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What a trace of the models' code is made of besides its arguments: the models package and the config schema
SOURCES = (os.path.join(ROOT, "models"), os.path.join(ROOT, "schema.py"))
# The call's attributes kept beside the functions: XLA's compile mark and the call's own settings
MARKS = ("_XlaMustCompile", "_read_only_resource_inputs")
CALL_ATTRS = MARKS + ("config_proto", "executor_type")
# graph -> {file: the GraphDef stored there, whose functions the graph holds}: a program called again in one graph
# (the fused Adam pass on each device of a mesh) is neither read nor imported again
_IMPORTED: "weakref.WeakKeyDictionary[tf.Graph, dict]" = weakref.WeakKeyDictionary()


@functools.lru_cache(maxsize=None)
def source_digest(sources: tuple = SOURCES) -> str:
    """A digest of the .py and .cc files of `sources` (files, or folders walked), by path and content."""
    digest = hashlib.sha256()
    for source in sources:
        walked = os.walk(source) if os.path.isdir(source) else [
            (os.path.dirname(source), [], [os.path.basename(source)])]
        for folder, dirs, files in sorted(walked):
            dirs.sort()
            for name in sorted(files):
                if name.endswith((".py", ".cc")):
                    path = os.path.join(folder, name)
                    digest.update(os.path.relpath(path, ROOT).encode() + b"\0")
                    with open(path, "rb") as f:
                        digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()


def key(parts, args: Sequence[tf.Tensor]) -> str:
    """The file name's digest for a trace made from `parts` over `args`."""
    signature = [(type(a).__name__, a.dtype.name, a.shape.as_list()) for a in args]
    described = repr((parts, signature, tf.__version__, sys.version_info[:3], source_digest()))
    return hashlib.sha256(described.encode()).hexdigest()[:32]


def folder() -> Optional[str]:
    """Where the traces are kept: `traces/` in the XLA compile cache's folder, or None when none is in use."""
    cache = xla_cache_in_use()
    return os.path.join(cache, "traces") if cache else None


def call(make_function: Callable[[], Callable], args: Sequence[tf.Tensor], parts) -> list:
    """make_function()(*args) (a tf.function) in the default graph, its trace read from disk when kept there."""
    where = folder()
    path = os.path.join(where, key(parts, args) + ".pb") if where else None
    known = _IMPORTED.get(tf.get_default_graph(), {}).get(path) if path else None
    if known is not None:
        outputs = _call_library(known, args, imported=True)
        if outputs is not None:
            return outputs
    if path and os.path.exists(path):
        outputs = _call_stored(path, args)
        if outputs is not None:
            return outputs
    function = make_function()
    outputs = list(function(*args))
    stored = _store(path, function.get_concrete_function(*args), outputs[0].op) if path else None
    if stored is not None:
        # called as later processes call it, under the stored names: XLA's persistent cache then keeps the
        # executable they load (the traced names' program, compiled, would be asked for by no later process, and
        # the next one would compile the stored names' again); the traced call is left unfetched, never run
        called = _call_library(stored, args)
        if called is not None:
            _remember(path, stored)
            return called
    return outputs


def _inputs(args: Sequence) -> list:
    """What the call takes for `args`: a variable's resource handle (the function reads it inside), a tensor as is."""
    return [a.handle if isinstance(a, tf.compat.v2.Variable) else a for a in args]


def _store(path: str, concrete, call_op: tf.Operation) -> Optional[graph_pb2.GraphDef]:
    """The concrete function, the functions it calls and its call's kind and attributes, written whole or not at
    all; returns what was written (None when nothing was)."""
    library = function_pb2.FunctionDefLibrary()
    library.function.extend(concrete.graph.as_graph_def().library.function)
    library.function.append(concrete.function_def)
    suffix = os.path.basename(path).split(".")[0][:16]
    _rename(library, suffix)
    stored = graph_pb2.GraphDef(library=library)
    node = stored.node.add(name=call_op.type, op=f"{concrete.function_def.signature.name}_{suffix}")
    for name in CALL_ATTRS:
        if name in call_op.node_def.attr:
            node.attr[name].CopyFrom(call_op.node_def.attr[name])
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomically(path, stored.SerializeToString(deterministic=True))
    except OSError:  # a read-only or full cache folder: the trace is used as made, and made again next time
        return None
    return stored


def _rename(library, suffix: str) -> None:
    """Every function of the library renamed after the file: TensorFlow names a While's body `while_body_<counter>`,
    a process-wide count, so two stored programs read into one graph would bring two different functions of one
    name, which the graph refuses; and the process that traced the program holds it under its first name (calling
    the functions' first names) when it calls the stored one."""
    names = {f.signature.name: f"{f.signature.name}_{suffix}" for f in library.function}
    for function in library.function:
        function.signature.name = names.get(function.signature.name, function.signature.name)
        for node in function.node_def:
            node.op = names.get(node.op, node.op)
            for value in node.attr.values():
                if value.HasField("func"):
                    value.func.name = names.get(value.func.name, value.func.name)
                for called in value.list.func:
                    called.name = names.get(called.name, called.name)


CALLS = {"PartitionedCall": gen_functional_ops.partitioned_call,
         "StatefulPartitionedCall": gen_functional_ops.stateful_partitioned_call} if gen_functional_ops else {}


def _call_stored(path: str, args: Sequence) -> Optional[list]:
    """The stored function called on `args` in the default graph, or None when the file does not hold one that
    takes them (damaged, or written by another program)."""
    try:
        with open(path, "rb") as f:
            stored = graph_pb2.GraphDef.FromString(f.read())
    except Exception:  # noqa: BLE001 -- any unreadable file is traced again and replaced
        return None
    outputs = _call_library(stored, args)
    if outputs is not None:
        _remember(path, stored)
    return outputs


def _remember(path: str, stored: graph_pb2.GraphDef) -> None:
    """The default graph holds `stored`'s functions, from the file at `path`: its next call there imports nothing."""
    _IMPORTED.setdefault(tf.get_default_graph(), {})[path] = stored


def _call_library(stored: graph_pb2.GraphDef, args: Sequence, imported: bool = False) -> Optional[list]:
    """The function `stored` holds (as `_store` writes it) called on `args` in the default graph, or None when it
    does not take them; `imported`: its functions are in the graph already."""
    inputs = _inputs(args)
    try:
        node = stored.node[0]
        signature = {f.signature.name: f for f in stored.library.function}[node.op].signature
        if [tf.as_dtype(a.type) for a in signature.input_arg] != [t.dtype for t in inputs] or node.name not in CALLS:
            return None
        if not imported:
            tf.import_graph_def(graph_pb2.GraphDef(library=stored.library), name="")
    except Exception:  # noqa: BLE001 -- a damaged file's library, as an unreadable one
        return None
    outputs = CALLS[node.name](
        inputs, Tout=[tf.as_dtype(a.type) for a in signature.output_arg], f=attr_value_pb2.NameAttrList(name=node.op),
        config_proto=node.attr["config_proto"].s, executor_type=node.attr["executor_type"].s)
    for name in MARKS:
        if name in node.attr:
            outputs[0].op._set_attr(name, node.attr[name])
    return list(outputs)
