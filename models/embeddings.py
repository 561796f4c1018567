"""Position information: learned (`wpe`, GPT-Neo's default), axial (`axial_pos_emb`) or rotary (`rotary_emb`).

Learned and axial embeddings are tables added to the token embeddings; rotary embeddings add nothing to
the residual stream and instead rotate each attention layer's queries and keys by their position.
"""
from __future__ import annotations

import math
from typing import Optional

import mesh_tensorflow as mtf
import tensorflow.compat.v1 as tf

from schema import GPTConfig
from models.layers import variable


def position_table(mesh: mtf.Mesh, cfg: GPTConfig, embed_sequence: mtf.Dimension, embd: mtf.Dimension,
                   dtype: mtf.VariableDType) -> Optional[mtf.Tensor]:
    """The table [positions, embd] that `gather` reads position embeddings from; None with rotary positions.

    Call inside the model's top scope: the variables are `wpe`, or `axial_wpe_1` and `axial_wpe_2`.
    """
    if cfg.rotary_emb:
        return None
    if cfg.axial_pos_emb:
        return axial_position_table(mesh, cfg, embd, dtype)
    return variable(mesh, "wpe", [embed_sequence, embd], dtype, stddev=0.01, seed=cfg.seed)


def axial_position_table(mesh: mtf.Mesh, cfg: GPTConfig, embd: mtf.Dimension,
                         dtype: mtf.VariableDType) -> mtf.Tensor:
    """Axial positional embedding (Ho et al. 2019, arXiv:1912.12180), as GPT-Neo: with axial_pos_emb [a, b],
    position p = i*b + j gets (axial_wpe_1[i] + axial_wpe_2[j]) / 2, so (a + b) rows of parameters stand in
    for a*b >= n_ctx rows of a learned table."""
    rows, cols = cfg.axial_pos_emb
    row_dim, col_dim = mtf.Dimension("axial_dim_0", rows), mtf.Dimension("axial_dim_1", cols)
    first = variable(mesh, "axial_wpe_1", [row_dim, embd], dtype, stddev=0.01, seed=cfg.seed)
    second = variable(mesh, "axial_wpe_2", [col_dim, embd], dtype, stddev=0.01, seed=cfg.seed)
    grid = mtf.Shape([row_dim, col_dim, embd])
    table = (mtf.broadcast(first, grid) + mtf.broadcast(second, grid)) / 2
    return mtf.reshape(table, [mtf.Dimension("axial_dim", rows * cols), embd])


def rotary(x: mtf.Tensor, sequence: mtf.Dimension, features: mtf.Dimension, base: float = 10000.0) -> mtf.Tensor:
    """Rotary position embedding (Su et al. 2021, arXiv:2104.09864) of queries or keys x [..., sequence, ...,
    features]: feature i of the first half and feature i of the second half form a pair (GPT-NeoX's layout),
    rotated by the angle position * base**(-2i / features). Dot products of rotated queries and keys then
    depend on positions only through their difference.

    The halves are a reshape into [rotary_pair=2, rotary_frequency] and the rotation a 2x2 einsum, not a
    slice, so it works whatever dimension a layout splits.
    """
    mesh = x.mesh
    half = features.size // 2
    pair = mtf.Dimension("rotary_pair", 2)
    frequency = mtf.Dimension("rotary_frequency", half)
    inv_freq = mtf.exp(mtf.range(mesh, frequency, tf.float32) * (-2.0 * math.log(base) / features.size))
    angle = mtf.range(mesh, sequence, tf.float32) * inv_freq  # [sequence, rotary_frequency]
    cos, sin = mtf.cast(mtf.cos(angle), x.dtype), mtf.cast(mtf.sin(angle), x.dtype)

    pairs = mtf.replace_dimensions(x, features, [pair, frequency])
    # (first, second) -> (-second, first): swap the two members of each pair and negate the new first one.
    other = mtf.Dimension("rotary_pair_other", 2)
    member = mtf.range(mesh, pair, tf.int32)
    swap = mtf.one_hot(1 - member, other, dtype=x.dtype)                        # [pair, other]: 1 where other = 1 - pair
    sign = mtf.cast(mtf.range(mesh, other, tf.int32) * 2 - 1, x.dtype)         # -1 for the first, +1 for the second
    turned = mtf.einsum([pairs, swap * sign], output_shape=pairs.shape.rename_dimension(pair.name, other.name))
    turned = mtf.rename_dimension(turned, other.name, pair.name)
    rotated = pairs * cos + turned * sin
    return mtf.replace_dimensions(rotated, [pair, frequency], features)
