"""Local attention costs its window, not the context: in the lowered training graph (forward and backward, the
TensorFlow ops each device runs) at GPT-Neo's window of 256, every further 512 positions add the same tensors
and matmul FLOPs to a local layer's attention (cost linear in the context), where a global layer's additions
grow with the context (quadratic). Counted from the graph's static shapes, not timed."""
import math
import re

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from execution import meshes
from devices.placement import Placement
from tiny import tiny_config
from train.step import training_step

CONTEXTS = (512, 1024, 1536, 2048)


def _einsum_flops(op) -> int:
    """2 x the product of every index's size in a TF Einsum's equation."""
    inputs, _ = op.get_attr("equation").decode().split("->")
    sizes = {}
    for letters, tensor in zip(inputs.split(","), op.inputs):
        sizes.update(zip(letters, tensor.shape.as_list()))
    return 2 * math.prod(sizes.values())


def _matmul_flops(op) -> int:
    """2 x batch x m x n x k of a TF (Batch)MatMul from its output and first input's static shapes."""
    out = op.outputs[0].shape.as_list()
    a = op.inputs[0].shape.as_list()
    transposed = op.get_attr("adj_x" if op.type.startswith("BatchMatMul") else "transpose_a")
    k = a[-2] if transposed else a[-1]
    return 2 * math.prod(out) * k


def attention_cost(kind: str, n_ctx: int) -> tuple[int, int]:
    """(elements of every tensor the attention core makes, matmul FLOPs) over the lowered training graph of one
    `kind` layer at context `n_ctx`, window 256, batch 1: the TF ops under the layer's attn/attention scope,
    their gradients included (the q/k/v/o projections outside it are linear in the context either way)."""
    cfg = tiny_config(n_layer=1, n_ctx=n_ctx, local_attention_radius=256, attention_types=[[[kind], 1]],
                      train_batch_size=1)
    graph = tf.Graph()
    placement = Placement(("/device:CPU:0",))
    with graph.as_default(), tf.device(placement.device_function()):
        tokens = tf.zeros([1, n_ctx], tf.int32)
        mesh, impl = meshes.placement_mesh(cfg, placement)
        training_step(cfg, mesh, impl, tokens, tokens)
    ops = [op for op in graph.get_operations() if "/attn/attention/" in op.name]
    assert any(re.search("softmax", op.name, re.I) for op in ops), "the attention core was not found under its scope"
    elements = sum(t.shape.num_elements() or 0 for op in ops for t in op.outputs)
    flops = sum(_einsum_flops(op) if op.type == "Einsum" else _matmul_flops(op) for op in ops
                if op.type in ("Einsum", "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"))
    assert flops > 0
    return elements, flops


@pytest.mark.slow
def test_a_local_layer_grows_linearly_with_the_context_at_gpt_neos_window():
    costs = np.array([attention_cost("local", n) for n in CONTEXTS])
    steps = np.diff(costs, axis=0)  # what each further 512 positions add: the same, for memory and compute
    assert (steps > 0).all() and (steps == steps[0]).all(), steps
    assert (costs[-1] / costs[0] < 5).all()  # 4x the context: the window's edge blocks aside, 4x the cost


@pytest.mark.slow
def test_a_global_layer_grows_quadratically_so_the_count_tells_them_apart():
    costs = np.array([attention_cost("global", n) for n in CONTEXTS])
    steps = np.diff(costs, axis=0)
    assert (np.diff(steps, axis=0) > 0).all(), steps  # each further 512 positions add more than the last
    assert (costs[-1] / costs[0] > 10).all()
