"""Local attention costs its window, not the context: in the training graph (forward and backward) at GPT-Neo's
window of 256, a local layer's attention tensors and einsum FLOPs grow 4x from context 512 to 2048 (linear),
where a global layer's grow about 16x (quadratic). Counted from the graph's shapes, not timed."""
import math

import mesh_tensorflow as mtf
import pytest

from plan import model_graph
from tiny import tiny_config


def attention_cost(kind: str, n_ctx: int) -> tuple[int, int]:
    """(elements of every tensor the attention core makes, einsum FLOPs) over the training graph of one `kind`
    layer at context `n_ctx`, window 256, batch 1: the ops under the layer's attn/attention scope, their
    gradients included (the q/k/v/o projections outside it are linear in the context either way)."""
    cfg = tiny_config(n_layer=1, n_ctx=n_ctx, local_attention_radius=256, attention_types=[[[kind], 1]],
                      train_batch_size=1)
    ops = [op for op in model_graph.build(cfg).graph.operations if "/attn/attention/" in op.name]
    assert any("softmax" in op.name for op in ops), "the attention core was not found under its scope"
    elements = sum(t.shape.size for op in ops for t in op.outputs)
    flops = 0
    for op in ops:
        if isinstance(op, mtf.EinsumOperation):
            dims = {d for t in list(op.inputs) + list(op.outputs) for d in t.shape.dims}
            flops += 2 * math.prod(d.size for d in dims)
    return elements, flops


def test_a_local_layer_grows_linearly_with_the_context_at_gpt_neos_window():
    short, long = attention_cost("local", 512), attention_cost("local", 2048)
    assert long[0] / short[0] == pytest.approx(4)   # memory: its tensors' elements
    assert long[1] / short[1] == pytest.approx(4)   # compute: its einsums' FLOPs


def test_a_global_layer_grows_quadratically_so_the_count_tells_them_apart():
    short, long = attention_cost("global", 512), attention_cost("global", 2048)
    assert 12 < long[0] / short[0] <= 16 and 12 < long[1] / short[1] <= 16  # the [query, memory] logits dominate
