"""train/optimizer.py: the clipping's global norm (sum_of_squares per gradient, all-reduced where a layout
splits it) and the factor it clips by."""
import mesh_tensorflow as mtf
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from tiny import cpu_mesh_impl
from train.optimizer import clipping_scale


@pytest.mark.parametrize("mesh_shape,layout", [("all:1", ""), ("x:2", "cols:x"), ("x:2,y:2", "rows:x,cols:y"),
                                               ("x:4", "")])
def test_the_clipping_norm_is_the_global_norm_on_whole_and_split_layouts(mesh_shape, layout):
    """The global norm of a matrix and a vector (in float32, as train/optimizer.apply_gradients hands them) is
    float64 NumPy's on every layout, and the factor is clip / norm above the clip, 1 below. Bugs caught: a
    slice's sum not all-reduced over the mesh axes that split it (`axes = []` in SumOfSquares.lower: the x:2 and
    x:2,y:2 norms are one slice's), L2Loss taken as the sum of squares (it is half of it: the norm 1/sqrt(2) of
    the true one)."""
    rng = np.random.RandomState(0)
    values = {"g": rng.randn(8, 6).astype(np.float32), "b": rng.randn(6).astype(np.float32)}
    expected = np.sqrt(sum(np.sum(np.square(v.astype(np.float64))) for v in values.values()))
    graph = tf.Graph()
    with graph.as_default():
        mesh = mtf.Mesh(mtf.Graph(), "m")
        impl = cpu_mesh_impl(mesh_shape, layout)
        rows, cols = mtf.Dimension("rows", 8), mtf.Dimension("cols", 6)
        grads = [mtf.import_tf_tensor(mesh, tf.constant(values["g"]), mtf.Shape([rows, cols])),
                 mtf.import_tf_tensor(mesh, tf.constant(values["b"]), mtf.Shape([cols]))]
        results = []
        for clip in (expected / 2, expected * 2):
            scale, norm = clipping_scale(grads, clip)
            results += [scale, norm]
        lowering = mtf.Lowering(mesh.graph, {mesh: impl})
        outputs = [lowering.export_to_tf_tensor(t) for t in results]
        with tf.Session(config=tf.ConfigProto(device_count={"CPU": 4})) as session:
            low_scale, low_norm, high_scale, high_norm = session.run(outputs)
    np.testing.assert_allclose([low_norm, high_norm], [expected, expected], rtol=1e-6)
    np.testing.assert_allclose([low_scale, high_scale], [0.5, 1.0], rtol=1e-6)
