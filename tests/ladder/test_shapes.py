"""ladder/shapes.py: the size rule gives GPT-3's shapes for GPT-3's sizes and hits its targets within 5% from 10K to
100B non-embedding parameters."""
from __future__ import annotations

import numpy as np
import pytest

from tests.ladder.test_spec import SMALL_RULES

from config import load_config
from ladder import shapes
from ladder.spec import LadderError, Rules


@pytest.mark.parametrize("config, n_layer, n_embd", [("gpt3_small", 12, 768), ("gpt3_large", 24, 1536)])
def test_size_rule_gives_gpt3s_shape_for_gpt3s_size(config, n_layer, n_embd):
    """The anchor: 3% above GPT-3 Small's and Large's non-embedding counts, the default rules (aspect ratio 64, heads
    64 wide) give their shapes. (Bug: preferring the shape nearest the target to the one nearest the aspect ratio.)"""
    base = load_config(config)
    target = 1.03 * shapes.non_embedding(base, n_layer, n_embd)
    shape = shapes.shape_for(base, target, Rules())
    assert (shape.n_layer, shape.n_embd, shape.n_head) == (n_layer, n_embd, n_embd // 64)


def test_size_rule_hits_its_targets_within_5_percent_across_the_range():
    """Targets from 10K to 100B non-embedding parameters (the CPU ladder's rules below 1M, the defaults above) all
    get a shape within 5% whose heads are head_width wide; the count is models/flops.py's and the training graph's.
    (Bug: the tolerance compared with the signed miss, so any shape below the target passes.)"""
    base = load_config("default")
    for target, rules in [(t, Rules(**SMALL_RULES)) for t in np.logspace(4, 6, 9)] + \
                         [(t, Rules()) for t in np.logspace(6, 11, 11)]:
        shape = shapes.shape_for(base, float(target), rules)
        assert abs(shape.non_embedding / target - 1) <= 0.05, (target, shape)
        assert shape.n_embd == shape.n_head * rules.head_width
    with pytest.raises(LadderError, match="head_width"):
        shapes.shape_for(base, 2000.0, Rules())  # one 64-wide head is already 50K parameters


def test_the_count_of_a_shape_is_flops_closed_form_of_the_base_at_that_shape():
    """shapes.non_embedding counts without building the config (models/flops.non_embedding_count): the same number
    as flops.parameter_count of the base at that depth and width, for bases with and without options, shallow and
    deep, narrow and wide. (Bug: the depth and the width swapped, `non_embedding_count(n_embd, n_layer)`.)"""
    import dataclasses
    from models import flops
    for name in ("default", "gpt3_small"):
        base = load_config(name)
        for n_layer, n_embd in [(1, 8), (2, 64), (12, 768), (40, 5120), (96, 12288)]:
            resized = dataclasses.replace(base, n_layer=n_layer, n_embd=n_embd)
            assert shapes.non_embedding(base, n_layer, n_embd) == flops.parameter_count(resized)["non_embedding"], (
                name, n_layer, n_embd)
