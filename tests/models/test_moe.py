"""models/moe.py: the mixture-of-experts defaults against mesh-tensorflow's, the checks of `moe_params`, and the
name-seeded initializers that give mesh-tensorflow's MoE variables the same start on every build."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from schema import ConfigError
from models.moe import MOE_DEFAULT_EXPERTS, name_seeded_initializers
from tiny import tiny_config


def test_the_schema_moe_defaults_are_mesh_tensorflows():
    from mesh_tensorflow.transformer import moe as mtf_moe
    assert MOE_DEFAULT_EXPERTS == vars(mtf_moe.MoE1D()._hparams)["moe_num_experts"]


@pytest.mark.parametrize("key", ["moe_num_experts", "moe_hidden_size", "moe_group_size"])
def test_moe_sizes_must_be_positive_whole_numbers_and_keys_mesh_tensorflows(key):
    """Zero experts, a hidden width of -1 or 2.5, or `true` get one line naming the key, not an error from deep
    inside mesh-tensorflow's MoE layer at graph build; a misspelt key is named with the closest one. Bug it
    guards: the size check `value < 1` written `value < 0` (0 accepted)."""
    for value in (0, -1, 2.5, True):
        with pytest.raises(ConfigError) as info:
            tiny_config(moe_layers=[1], moe_params={key: value})
        assert str(info.value) == f"moe_params {key} must be a positive whole number, got {value!r}"
    assert dict(tiny_config(moe_layers=[1], moe_params={key: 1}).moe_params) == {key: 1}
    with pytest.raises(ConfigError, match=f"moe_params key '{key}s' is not a mesh-tensorflow MoE hyperparameter "
                                          rf"\(did you mean '{key}'\?\)"):
        tiny_config(moe_layers=[1], moe_params={key + "s": 2})


def test_unseeded_initializers_are_seeded_by_the_variables_name():
    """mesh-tensorflow's MoE layer creates its variables with unseeded initializers; under the custom getter two
    builds give a variable the same start (so every layout and every run does), and two names different ones.
    Bug it guards: the getter passing the initializer on unchanged (`kwargs["initializer"]` not replaced): each
    build draws other weights."""
    def build(seed):
        with tf.Graph().as_default(), tf.Session() as session:
            with tf.variable_scope("h1/moe", custom_getter=name_seeded_initializers(seed)):
                made = [tf.get_variable(name, [64, 8], initializer=tf.random_normal_initializer(stddev=1.0))
                        for name in ("wi", "wo")]
            session.run(tf.global_variables_initializer())
            return session.run(made)

    wi, wo = build(seed=1)
    again_wi, again_wo = build(seed=1)
    np.testing.assert_array_equal(wi, again_wi)
    np.testing.assert_array_equal(wo, again_wo)
    assert not np.allclose(wi, wo)
    assert not np.allclose(wi, build(seed=2)[0])  # and the config's seed changes them
    assert 0.8 < wi.std() < 1.2  # the initializer's own distribution is kept: only its seed is set
