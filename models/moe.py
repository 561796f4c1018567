"""Mixture-of-experts feed-forward layers (`moe_layers`, `moe_params`) through mesh-tensorflow's own
`transformer_moe_layer_v1` (Shazeer et al. 2017, arXiv:1701.06538; top-2 gating by default).

The layer returns a load-balancing loss that the training objective adds (train/objective.py) and the
training loop logs as `moe_loss`. Its variables follow GPT-Neo: mesh-tensorflow's names (`wi/kernel`,
`wo/kernel`, `top_2_gating/...`) inside the block's scope.
"""
from __future__ import annotations

import zlib

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf
from mesh_tensorflow.transformer import moe as mtf_moe

from models.activations import activation_for
from schema import ConfigError, GPTConfig, closest

# mesh-tensorflow MoE1D's default expert count (tests/models/test_moe.py checks it against mesh-tensorflow).
MOE_DEFAULT_EXPERTS = 16

# Groups of the MoE layers' dimensions that appear together in one tensor (models/layout.py).
MOE_CO_OCCURRING_DIMS = (("experts", "embd", "expert_hidden"),)


def moe_num_experts(cfg: GPTConfig) -> int:
    return dict(cfg.moe_params).get("moe_num_experts", MOE_DEFAULT_EXPERTS)


def moe_hidden_size(cfg: GPTConfig) -> int:
    """The experts' hidden width: 4 * n_embd like a dense MLP (mesh-tensorflow's 4096 is a large model's)."""
    return dict(cfg.moe_params).get("moe_hidden_size", 4 * cfg.n_embd)


def moe_group_size(cfg: GPTConfig) -> int:
    """Routing groups are whole sequences (or equal parts of one, at most 1024 tokens), so they, the expert
    capacity and the result do not depend on how a layout or micro-batching splits the batch."""
    return dict(cfg.moe_params).get("moe_group_size", min(cfg.n_ctx, 1024))


def moe_layout_dims(cfg: GPTConfig) -> dict[str, int]:
    """The dimensions MoE layers add that a layout may split (none without moe_layers)."""
    return {"experts": moe_num_experts(cfg), "expert_hidden": moe_hidden_size(cfg)} if cfg.moe_layers else {}


def check_moe_params(cfg: GPTConfig) -> None:
    """moe_params names mesh-tensorflow MoE hyperparameters, and the sizes among them are positive."""
    if not cfg.moe_params:
        return
    known = default_moe_params(cfg)  # mesh-tensorflow's MoE defines which keys exist
    for key, value in cfg.moe_params:
        if key not in known:
            raise ConfigError(f"moe_params key {key!r} is not a mesh-tensorflow MoE hyperparameter"
                              f"{closest(key, known)}")
        if key in ("moe_num_experts", "moe_hidden_size", "moe_group_size") and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"moe_params {key} must be a positive whole number, got {value!r}")


def default_moe_params(cfg: GPTConfig) -> dict:
    """Every hyperparameter mesh-tensorflow's MoE functions read, with this project's defaults.

    mesh-tensorflow keeps the complete list only in `MoE1D`'s constructor (`set_default_moe_hparams` misses
    keys that `transformer_moe_layer_v1` reads), so it is taken from there. Changed from its defaults:
    * `moe_hidden_size` 4 * n_embd (mesh-tensorflow's 4096 is a large model's), like a dense MLP;
    * `moe_group_size` n_ctx (at most 1024): routing groups are then whole sequences (or equal parts of one),
      so they, the expert capacity and the result do not depend on how a layout or micro-batching splits
      the batch;
    * `moe_second_policy_train/_eval` "threshold": mesh-tensorflow's "random" draws its noise from Python's
      random module at graph build, so no two runs or layouts would route alike.
    """
    params = dict(vars(mtf_moe.MoE1D()._hparams))  # noqa: SLF001  (see the docstring)
    params.update(moe_num_experts=moe_num_experts(cfg), moe_hidden_size=moe_hidden_size(cfg),
                  moe_group_size=moe_group_size(cfg),  # the functions above, so the layout checks agree
                  moe_second_policy_train="threshold", moe_second_policy_eval="threshold")
    return params


def moe_hparams(cfg: GPTConfig) -> mtf_moe.HParams:
    params = default_moe_params(cfg)
    params.update(dict(cfg.moe_params))
    return mtf_moe.HParams(**params)


def moe_feed_forward(x: mtf.Tensor, cfg: GPTConfig, dtype: mtf.VariableDType, train: bool,
                     num_microbatches: int = 1) -> tuple[mtf.Tensor, mtf.Tensor]:
    """x [batch, sequence, embd] -> (output like x, load-balancing loss scalar, already times moe_loss_coef
    and divided by num_microbatches)."""
    # Every position is routed (mesh-tensorflow's training statistics need a "nonpadding" tensor).
    every_position = mtf.ones(x.mesh, x.shape.dims[:-1], dtype=x.dtype)
    activation = activation_for(cfg.moe_activation or cfg.activation_function, x.dtype)
    with tf.variable_scope(tf.get_variable_scope(), custom_getter=name_seeded_initializers(cfg.seed)):
        out, loss = mtf_moe.transformer_moe_layer_v1(
            x, x.shape[-1], moe_hparams(cfg), train, dtype, layout=cfg.layout, mesh_shape=cfg.mesh_shape,
            nonpadding=every_position, activation=activation,
            num_microbatches=num_microbatches)
    return out, mtf.cast(loss, tf.float32)


def name_seeded_initializers(seed: int):
    """A variable-scope custom getter that re-seeds unseeded random initializers by the variable's name.

    mesh-tensorflow's own layers create their variables with unseeded initializers; seeded by name, as
    `models.layers.seeded_normal` does for ours, they start identical on every layout and every run.
    """
    def seeded_getter(getter, name, *args, **kwargs):  # TF calls custom getters with keyword arguments
        initializer = kwargs.get("initializer")
        if initializer is not None and getattr(initializer, "seed", 0) is None:
            config = dict(initializer.get_config(), seed=(zlib.crc32(name.encode()) + seed) % (2 ** 31))
            config.pop("dtype", None)
            kwargs["initializer"] = type(initializer).from_config(config)
        return getter(name, *args, **kwargs)
    return seeded_getter
