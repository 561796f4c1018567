"""The private TensorFlow APIs the product relies on (docs/repository.md, "Private TensorFlow APIs we rely on and
why"). Each is guarded where it is used, so that a TensorFlow without it still runs, slower or with more memory;
this file is what fails, loudly and naming the API, on such a TensorFlow (.ci/run runs it on 2.20 as well).
Bug each test catches: its guard's import or attribute name misspelled, so the product silently runs the
degraded path on every TensorFlow."""
import re

import numpy as np
import tensorflow.compat.v1 as tf

from data import inputs
from execution import mesh_session, meshes, runner
from models.kernels import common

GONE = "TensorFlow {} has no {}: {}. Find its new place, or update docs/repository.md's list and this test"


def test_xla_kernels_are_named_by_their_content():
    """models/kernels/common.py wraps atomic_function.from_func_graph so that a jit_compile function's name is a
    digest of its body: the same kernel traced in two graphs, after other ops, gets one name (XLA's persistent
    compile cache is keyed by it)."""
    assert common.atomic_function is not None and getattr(
        common.atomic_function.from_func_graph, "named_by_content", False), GONE.format(
        tf.__version__, "tensorflow.python.eager.polymorphic_function.atomic_function.from_func_graph",
        "the fused kernels get counter names again and the persistent XLA cache misses them")

    @tf.function(jit_compile=True)
    def doubled(x):
        return x * 2.0

    names = []
    for ops_before in (0, 5):
        with tf.Graph().as_default() as graph:
            for i in range(ops_before):
                tf.constant(float(i))
            doubled(tf.constant([1.0, 2.0]))
        names.append([f.signature.name for f in graph.as_graph_def().library.function])
    assert names[0] == names[1] and len(names[0]) == 1, names
    assert re.fullmatch(r"__inference_doubled_[0-9a-f]{20}", names[0][0]), names


def test_a_finalized_graph_takes_a_program_built_into_it():
    """execution/runner.py's `unfinalized` (Graph._unsafe_unfinalize): a Predictor's later programs are built
    into the graph its open session finalized; without it each program keeps a copy of the weights of its own."""
    assert runner.GRAPHS_REOPEN, GONE.format(tf.__version__, "tf.Graph._unsafe_unfinalize",
                                             "a Predictor's programs each hold a copy of the weights")
    graph = tf.Graph()
    graph.finalize()
    with runner.unfinalized(graph), graph.as_default():
        added = tf.constant(3.0, name="added")
    assert graph.finalized and graph.get_tensor_by_name("added:0") is added


def test_an_initializer_runs_through_a_callable_released_after(monkeypatch):
    """execution/mesh_session.py's `run_once` (Session._make_callable_from_options, config_pb2.CallableOptions),
    not Session.run: without them the executor of the variables' initialisation, its folded zeros included, stays
    in memory."""
    runs = []
    session_run = tf.Session.run
    monkeypatch.setattr(tf.Session, "run", lambda self, *a, **k: runs.append(a) or session_run(self, *a, **k))
    with tf.Graph().as_default():
        variable = tf.get_variable("v", initializer=np.arange(3, dtype=np.float32))
        with tf.Session() as session:
            mesh_session.run_once(session, variable.initializer)
            assert runs == [], GONE.format(
                tf.__version__, "tf.Session._make_callable_from_options or tensorflow.core.protobuf.config_pb2",
                "each session keeps its initialisation's executor (a weight-sized copy per Adam slot)")
            np.testing.assert_array_equal(session.run(variable), np.arange(3))


def test_the_devices_slices_are_made_without_initializers():
    """execution/meshes.py makes mesh-tensorflow's slice variables as resource_variable_ops.UninitializedVariable:
    without it each slice keeps an initializer that is never run (its constant in the graph)."""
    assert meshes.UninitializedVariable is not None, GONE.format(
        tf.__version__, "tensorflow.python.ops.resource_variable_ops.UninitializedVariable",
        "the slices keep mesh-tensorflow's unused initializers")


def test_the_record_readers_deprecation_warning_is_silenced():
    """data/inputs.py quiets tf_record_iterator's deprecation warning (tensorflow.python.util.deprecation.silence)."""
    assert inputs.silenced_deprecation is not None, GONE.format(
        tf.__version__, "tensorflow.python.util.deprecation.silence", "reading records prints a deprecation warning")


def test_mesh_tensorflow_finds_its_tensor_conversion_registration():
    """models/compat.py gives mesh-tensorflow 0.1.21 `ops.register_tensor_conversion_function` back (moved in TF
    2.13); without it mesh-tensorflow cannot be imported at all (compat.py's error line says so)."""
    from tensorflow.python.framework import ops
    assert callable(getattr(ops, "register_tensor_conversion_function", None)), GONE.format(
        tf.__version__, "tensorflow.python.framework.ops.register_tensor_conversion_function",
        "mesh-tensorflow cannot be imported")


def test_xla_cpu_calls_a_host_target_registered_through_the_exported_registry():
    """models/kernels/native.py registers its C++ products with XLA's custom-call registry through two functions
    libtensorflow_cc.so.2 exports (xla::CustomCallTargetRegistry::Global and ::Register) and calls them with the
    XlaCustomCallV2 op (tensorflow.compiler.tf2xla.ops.gen_xla_ops), whose custom call passes the status-returning
    signature. A product inside an XLA program gives NumPy's value."""
    import pytest

    from models.kernels import native
    from tests.models.kernels.test_native import compiler_found
    if not compiler_found():
        pytest.skip("no C++ compiler here: the native kernels cannot be built")
    assert native.library() is not None, GONE.format(tf.__version__, "XLA's custom-call registry or XlaCustomCallV2",
                                                     native.why_not())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    with tf.Graph().as_default(), tf.Session() as session:
        program = tf.function(lambda x, w: native.product(x, w), jit_compile=True, autograph=False)
        np.testing.assert_array_equal(session.run(program(tf.constant(x), tf.constant(w))), x @ w)


def test_a_stored_trace_is_called_through_the_call_ops_tf_function_makes(tmp_path, monkeypatch):
    """models/kernels/traces.py reads a tf.function's FunctionDefs back and calls them with gen_functional_ops'
    (Stateful)PartitionedCall, marked for XLA with `_XlaMustCompile` as tf.function marks its own call: a program
    with a While over a variable, stored in one graph and read back in another, gives the same values and runs
    compiled."""
    from models.kernels import traces
    assert traces.CALLS, GONE.format(tf.__version__, "tensorflow.python.ops.gen_functional_ops",
                                     "every build of the compiled decoder traces it again")
    monkeypatch.setenv("TF_XLA_FLAGS", f"--tf_xla_persistent_cache_directory={tmp_path}")
    made = []

    def program():
        made.append(1)
        return tf.function(lambda v, n: tf.while_loop(lambda i, x: i < n, lambda i, x: (i + 1, x * 1.5),
                                                      [0, v.read_value()])[1:], jit_compile=True, autograph=False)

    values = []
    for _ in range(2):
        with tf.Graph().as_default(), tf.Session() as session:
            v = tf.Variable(np.arange(4, dtype=np.float32), use_resource=True)
            n = tf.placeholder(tf.int32, [])
            (out,) = traces.call(program, [v, n], "the test's program")
            session.run(v.initializer)
            values.append(session.run(out, {n: 3}))
            assert out.op.type == "StatefulPartitionedCall" and out.op.get_attr("_XlaMustCompile")
    assert len(made) == 1
    np.testing.assert_allclose(values[1], values[0])
    np.testing.assert_allclose(values[0], np.arange(4) * 1.5 ** 3)


def test_a_graph_tells_the_while_loop_an_op_is_made_in():
    """models/kernels/attention._shared_mask keys the blocked attention's masks by `Graph._get_control_flow_context`
    (None outside a TF 1 while loop, the loop's context inside): without it each layer makes its own masks."""
    graph = tf.Graph()
    assert callable(getattr(graph, "_get_control_flow_context", None)), GONE.format(
        tf.__version__, "tf.Graph._get_control_flow_context", "every layer makes its own attention masks")
    seen = []
    before = tf.control_flow_v2_enabled()
    tf.disable_control_flow_v2()
    try:
        with graph.as_default():
            seen.append(graph._get_control_flow_context())
            tf.while_loop(lambda i: i < 2, lambda i: seen.append(graph._get_control_flow_context()) or i + 1, [0])
    finally:
        if before:
            tf.enable_control_flow_v2()
    assert seen[0] is None and seen[1] is not None
