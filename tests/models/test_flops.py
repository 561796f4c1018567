"""models/flops.py: the closed-form parameter count against the variables the model builds, and the training
FLOPs per token: 6 per weight (the tied output projection counted, the embedding lookups not) plus each
attention layer's score and value products over the keys its queries see."""
import math

import numpy as np
import pytest

from models import flops, gpt
from tiny import tiny_config


@pytest.mark.parametrize("changes", [{}, dict(n_layer=3, n_embd=48, n_head=6, n_vocab=100, n_ctx=32,
                                              attention_types=[[["global"], 3]])])
def test_the_closed_form_counts_the_variables_the_model_builds(changes):
    """The count MFU and the ladder use, against the variables of the model's graph (the default architecture):
    in all, and split into the embeddings (token and position tables) and the rest. Bug it guards: a term left
    out or counted twice (one LayerNorm a block: `(2 * d) * 2` written `2 * d`)."""
    cfg = tiny_config(**changes)
    shapes = gpt.variable_shapes(cfg)
    tables = [name for name in shapes if name.rsplit("/", 1)[-1] in ("wte", "wpe")]
    assert len(tables) == 2
    count = flops.parameter_count(cfg)
    assert count["total"] == sum(math.prod(shape) for shape in shapes.values())
    assert count["embedding"] == sum(math.prod(shapes[name]) for name in tables)
    assert count["non_embedding"] == count["total"] - count["embedding"]


def test_training_flops_are_six_per_weight_and_token_plus_the_keys_each_query_sees():
    """6 FLOPs per weight and token (forward and backward) for the blocks and the output projection (the tied
    token table, used as a matrix there; the lookups are no products), and per attention layer 2 products of
    2 * n_embd FLOPs for each key a query sees, 3 times over with the backward pass: position t sees t + 1 keys
    in a global layer, min(t + 1, radius) in a local one (the masks' mean, which the count rounds to n_ctx / 2
    and the radius). Bugs it guards: the lookups counted (`params["total"]`), the output projection left out,
    a local layer counted as a global one or a global one over every key."""
    cfg = tiny_config(n_ctx=64, local_attention_radius=8)  # a global and a local layer
    t = np.arange(cfg.n_ctx)
    seen = {"global": (t + 1).mean(), "local": np.minimum(t + 1, cfg.local_attention_radius).mean()}
    weights = flops.parameter_count(cfg)["non_embedding"] + cfg.n_vocab * cfg.n_embd
    attention = sum(3 * 2 * 2 * cfg.n_embd * seen[kind] for kind in cfg.attention_types)
    assert flops.training_flops_per_token(cfg) == pytest.approx(6 * weights + attention, rel=1e-3)
