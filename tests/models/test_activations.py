"""models/activations.py: every activation of ACTIVATIONS against its formula in NumPy, the parametric ones at
their initial parameters."""
import mesh_tensorflow as mtf
import numpy as np
import tensorflow.compat.v1 as tf

from models.activations import ACTIVATIONS
from tiny import run_mtf


def test_activations_match_their_formulas():
    x = np.linspace(-3, 3, 13).astype(np.float32)
    sigmoid = 1 / (1 + np.exp(-x))
    softplus = np.log1p(np.exp(x))
    gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    selu = 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * (np.exp(x) - 1))
    expected = {
        "gelu": gelu, "relu": np.maximum(x, 0), "selu": selu, "elu": np.where(x > 0, x, np.exp(x) - 1),
        "swish": x * sigmoid, "silu": x * sigmoid, "sigmoid": sigmoid, "tanh": np.tanh(x), "softplus": softplus,
        "abs": np.abs(x), "sin": np.sin(x), "cos": np.cos(x), "sign": np.sign(x),
        "lrelu001": np.where(x > 0, x, 0.01 * x), "lrelu020": np.where(x > 0, x, 0.2 * x), "id": x,
        "triangle_relax": np.sin(x) - np.sin(3 * x) / 9 + np.sin(5 * x) / 25 - np.sin(7 * x) / 49,
        "square_relax": np.cos(x) - np.cos(3 * x) / 3 + np.cos(5 * x) / 5 - np.cos(7 * x) / 7,
        "spike": 1 / (1 + x ** 2), "spike2": np.exp(-x ** 2), "tanhshrink": x - np.tanh(x),
        "softsign": x / (np.abs(x) + 1), "softmax": np.exp(x) / np.exp(x).sum(),
        "logsoftmax": x - np.log(np.exp(x).sum()), "bipolarsigmoid": 2 * sigmoid - 1,
        "rrelu": np.where(x > 0, x, (1 / 8 + 1 / 3) / 2 * x),
        "elish": np.where(x > 0, x * sigmoid, (np.exp(x) - 1) * sigmoid), "arcsinh": np.arcsinh(x),
        # The parametric ones at their initial parameters.
        "aria": x * (0 + 1 / (np.log(2) + 1 * np.exp(-x)) ** (1 / (np.log(2) + 1))),
        "prelu": np.where(x > 0, x, 0.2 * x), "parcsinh": np.arcsinh(x * (np.log(2) + 1)),
        "psoftplus": softplus, "proottanh": (x ** 2 + np.log(2) + 1) ** (1 / (np.log(2) + 3)) * np.tanh(x),
        "maxsig": np.maximum(x, sigmoid), "cosid": np.cos(x) - x, "minsin": np.minimum(x, np.sin(x)),
        "maxtanh": np.maximum(x, np.tanh(x)), "mish": x * np.tanh(softplus), "tanhexp": x * np.tanh(np.exp(x)),
        "lisht": x * np.tanh(x), "seagull": np.log(1 + x ** 2), "snake": x + np.sin(x) ** 2,
        "roottanh": (x ** 2 + 1) ** (1 / 3) * np.tanh(x), "softplusmone": softplus - 1,
    }
    assert set(expected) == set(ACTIVATIONS)
    dim = mtf.Dimension("intermediate_expanded", x.size)

    def build(mesh, x):
        outputs = {}
        for name, fn in ACTIVATIONS.items():
            with tf.variable_scope(name):
                outputs[name] = fn(x)
        return outputs

    results, _ = run_mtf(build, {"x": x}, {"x": [dim]})
    for name, value in expected.items():
        np.testing.assert_allclose(results[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
