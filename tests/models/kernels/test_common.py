"""models/kernels/common.py: the kernel paths (XLA-compiled and plain TF ops) and the bf16 conversions the fused
kernels use; and the helpers every kernel's tests share: `run` (a graph lowered on a mesh of CPU devices),
`reference` (mesh-tensorflow's graphs, run once per case), the `kernel_path` fixture, `LAYOUTS`, `dims`."""
import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from tiny import cpu_mesh_impl
from models.kernels import common

LAYOUTS = [("all:1", ""), ("x:2", "batch:x"), ("x:2,y:2", "batch:x,embd:y"), ("x:2,y:2", "sequence:x,batch:y")]


@pytest.fixture(params=["xla", "plain"])
def kernel_path(request):
    """The kernels that XLA-compile (cross-entropy, softmax gradient, GELU, LayerNorm) on both of their paths:
    XLA (the default) and plain TF ops (where XLA:GPU cannot compile, or GPT_NEO_PLAIN_KERNELS=1)."""
    with common.kernels(request.param):
        yield request.param


def run(build, mesh_shape, layout):
    """build(mesh) -> (outputs, [(mtf tensor, tf variable-backed input)]) ; returns numpy outputs."""
    graph = tf.Graph()
    with graph.as_default():
        mtf_graph = mtf.Graph()
        mesh = mtf.Mesh(mtf_graph, "m")
        impl = cpu_mesh_impl(mesh_shape, layout)
        outputs = build(mesh)
        lowering = mtf.Lowering(mtf_graph, {mesh: impl})
        tf_outputs = [lowering.export_to_tf_tensor(t) for t in outputs]
        with tf.Session(config=tf.ConfigProto(device_count={"CPU": 4})) as session:
            return session.run(tf_outputs)


@pytest.fixture(scope="module")
def reference():
    """`reference(key, build)`: `run(build, "all:1", "")`, run the first time `key` is asked for and kept for the
    module. For mesh-tensorflow's own graphs, which a test compares every layout and both kernel paths with: they
    depend on neither, so each is built once per case (key: what its values depend on), not once per layout."""
    results = {}

    def get(key, build):
        if key not in results:
            results[key] = run(build, "all:1", "")
        return results[key]
    return get


def dims(b=4, s=6, v=11, e=8):
    return (mtf.Dimension("batch", b), mtf.Dimension("sequence", s), mtf.Dimension("vocab", v),
            mtf.Dimension("embd", e))


def test_bfloat16_widened_and_stored_are_tf_casts():
    """The fused kernels' integer conversions to and from bf16 (common.widened, common.stored) give tf.cast's
    values: every bf16 bit pattern widened, and fp32 values rounded to nearest even (ties both ways, values that
    round to infinity, infinities, NaN of any payload kept NaN). The bugs they guard: a rounding that truncates
    or breaks ties away from even, and a NaN whose payload carries into the sign bit (stored as +0: a diverged
    gradient hidden)."""
    patterns = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    ties = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x3F807FFF, 0x3F808001, 0x7F7FFFFF, 0x7F7F8000, 0xFF7FFFFF,
                     0x7F800000, 0xFF800000, 0x7FC00000, 0xFFFFFFFF, 0x7F800001, 0x7FFFFFFF, 0x00000001, 0x80008000],
                    np.uint32)
    values = np.concatenate([ties, np.random.RandomState(4).randint(0, 1 << 32, 100000, dtype=np.uint32)])
    with tf.Graph().as_default(), tf.Session() as session:
        bf16 = tf.bitcast(tf.constant(patterns), tf.bfloat16)
        f32 = tf.bitcast(tf.constant(values), tf.float32)
        widened, widened_cast, stored, stored_cast = session.run(
            [tf.bitcast(t, tf.uint32) if t.dtype == tf.float32 else tf.bitcast(t, tf.uint16)
             for t in (common.widened(bf16), tf.cast(bf16, tf.float32), common.stored(f32, tf.bfloat16),
                       tf.cast(f32, tf.bfloat16))])
    np.testing.assert_array_equal(widened, widened_cast)
    nan = (stored_cast & 0x7F80 == 0x7F80) & (stored_cast & 0x7F != 0)
    assert nan[:16].sum() == 4 and ((stored & 0x7F80 == 0x7F80) & (stored & 0x7F != 0) == nan).all()
    np.testing.assert_array_equal(stored[~nan], stored_cast[~nan])


def _jit_kernel_names(scale: float, built_before: int) -> list[str]:
    """The names of the jit_compile functions in a new graph that first builds `built_before` other ops (what
    a process built earlier), then calls a compiled kernel `x * scale + 1` (a new tf.function, as each graph of a
    process traces the project's kernels anew)."""
    kernel = tf.function(lambda x: x * scale + 1.0, jit_compile=True)
    with tf.Graph().as_default() as graph:
        for _ in range(built_before):
            tf.constant(0.0)
        kernel(tf.ones([3]))
    return [f.signature.name for f in graph.as_graph_def().library.function
            if f.attr["_XlaMustCompile"].b]


def test_compiled_kernels_are_named_after_their_body():
    """XLA's compile caches know a kernel by its function's name (and its arguments' shapes): the same kernel
    traced in another graph, after other ops, gets the same name, so TensorFlow's persistent compile cache finds
    the executable compiled before (in this process or an earlier one) instead of compiling it again; another
    body gets another name. The bug it guards: TensorFlow's own names (`_<uid>`, a counter of everything built
    in the process before), under which the persistent cache missed every kernel traced after anything else."""
    first, after_others, other_body = (_jit_kernel_names(2.0, 0), _jit_kernel_names(2.0, 50),
                                       _jit_kernel_names(3.0, 0))
    assert len(first) == 1 and first == after_others
    assert other_body != first


def test_the_kernels_are_traced_without_autograph(monkeypatch):
    """Building a training step traces the fused kernels (cross-entropy, the softmax gradient, Adam's update) as
    plain Python: autograph converts none of the project's functions (parsing and rewriting their source cost
    every process ~1.5 CPU s before its first step, for a graph that came out the same). The bug it guards:
    `common.xla_function` without `autograph=False` (the kernels converted again)."""
    from tensorflow.python.autograph.impl import api
    from devices.placement import Placement
    from execution.runner import fixed_batches
    from tiny import random_tokens, tiny_config
    from train.loop import training_program

    converted = []
    convert = api._convert_actual
    monkeypatch.setattr(api, "_convert_actual", lambda entity, *a: converted.append(entity) or convert(entity, *a))
    cfg = tiny_config()
    program = training_program(cfg, Placement(devices=("/device:CPU:0",)), fixed_batches(random_tokens([4, 17]), 4),
                               0)
    kernels = [f.signature.name for f in program.graph.as_graph_def().library.function
               if f.attr["_XlaMustCompile"].b]
    assert any("_adam_compiled" in name for name in kernels) and any("_xent_forward" in name for name in kernels)
    assert [f"{e.__module__}.{e.__qualname__}" for e in converted] == []
