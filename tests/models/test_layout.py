"""models/layout.py: the groups of dimensions that a layout may not split over one mesh dimension are the ones
the model's tensors hold together, read from the training step's own graph."""
import itertools

import pytest

from models.layout import co_occurring_dims, tensor_dim_sizes
from plan import model_graph
from tiny import tiny_config

@pytest.mark.parametrize("changes", [
    pytest.param(dict(attention_types=[[["linear", "local"], 1]], moe_layers=[1], moe_params={"moe_num_experts": 4}),
                 id="linear-local-moe"),
    pytest.param(dict(), id="global-local"),
])
def test_every_two_dimensions_one_tensor_holds_are_in_a_group_the_check_reads(changes):
    """Each tensor of the training step (forward, backward, optimizer), for each two of its dimensions that a
    layout may split: some group of `co_occurring_dims` holds both, so `check_layout` refuses a layout mapping
    them to one mesh dimension with one line (mesh-tensorflow would refuse it at lowering, with a traceback).
    Bugs it guards: a group left out of the trunk's, self-attention's or MoE's lists (`("vocab", "embd")`
    dropped from TRUNK_CO_OCCURRING_DIMS: "vocab:x,embd:x" passes the check; self-attention's group of k and v,
    `("batch", "heads", "memory_length", "features_per_head")`, dropped: "memory_length:x,features_per_head:x"
    passes the check and fails in mesh-tensorflow's lowering with a traceback)."""
    cfg = tiny_config(**changes)
    splittable = tensor_dim_sizes(cfg)
    groups = [set(group) for group in co_occurring_dims(cfg)]
    held = set()
    for operation in model_graph.build(cfg).graph.operations:
        for tensor in operation.outputs:
            names = sorted({dim.name for dim in tensor.shape.dims if dim.name in splittable})
            held.update(itertools.combinations(names, 2))
    assert len(held) > 10
    assert [pair for pair in sorted(held) if not any(set(pair) <= group for group in groups)] == []
