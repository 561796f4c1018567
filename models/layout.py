"""The model's tensor dimensions that a layout may split, and the checks a mesh_shape and layout must pass
against them: each named dimension exists, its mesh dimension divides it evenly, and no two dimensions of one
tensor share a mesh dimension. (That the rules name mesh_shape's dimensions, each tensor dimension once, is
schema.py's check.)

Each part of the model declares its own dimensions: the trunk (embeddings, feed-forward, output) here,
self-attention and every attention type in models/attention.py's registry (a type's entry also carries its
own checks of a layout, such as local attention's blocks), mixture-of-experts layers in models/moe.py.
config.py's check runs `check_layout` on every config it reads and every copy `replace` makes, a
config moved to another mesh or layout in code (--auto_layout, --dry_run's candidates, tests) among them.
"""
from __future__ import annotations

from schema import ConfigError, GPTConfig, closest
from models.attention import ATTENTION, SELF_ATTENTION_CO_OCCURRING_DIMS, self_attention_dims
from models.moe import MOE_CO_OCCURRING_DIMS, moe_layout_dims

# Groups of the trunk's dimensions that appear together in one tensor.
TRUNK_CO_OCCURRING_DIMS = (
    ("embd", "intermediate_expanded"), ("vocab", "embd"), ("embed_sequence", "embd"), ("batch", "sequence", "embd"),
    ("batch", "sequence", "vocab"), ("batch", "sequence", "intermediate_expanded"),
)


def _attention_types(cfg: GPTConfig) -> list:
    return [ATTENTION[kind] for kind in dict.fromkeys(cfg.attention_types) if kind in ATTENTION]


def tensor_dim_sizes(cfg: GPTConfig) -> dict[str, int]:
    """Sizes of the named dimensions of this model that a layout may split."""
    sizes = {"batch": cfg.train_batch_size, "sequence": cfg.n_ctx, "embed_sequence": cfg.n_ctx, "embd": cfg.n_embd,
             "vocab": cfg.n_vocab, "intermediate_expanded": 4 * cfg.n_embd}
    types = _attention_types(cfg)
    if any(kind.has_attention for kind in types):
        sizes.update(self_attention_dims(cfg))
    for kind in types:
        sizes.update(kind.layout_dims(cfg))
    sizes.update(moe_layout_dims(cfg))
    return sizes


def co_occurring_dims(cfg: GPTConfig) -> tuple:
    """Groups of dimensions that appear together in one tensor of this model: two of a group may not share a
    mesh dimension."""
    groups = TRUNK_CO_OCCURRING_DIMS + SELF_ATTENTION_CO_OCCURRING_DIMS + MOE_CO_OCCURRING_DIMS
    for kind in _attention_types(cfg):
        groups += kind.co_occurring_dims
    return groups


def check_layout(cfg: GPTConfig) -> GPTConfig:
    """cfg's layout against the model's tensor dimensions, and each attention type's own layout checks. Raises
    ConfigError naming the fix; returns cfg."""
    mesh = dict(cfg.mesh_dims)
    rules = cfg.layout_rules
    sizes = tensor_dim_sizes(cfg)
    for tensor_dim, mesh_dim in rules:
        if tensor_dim not in sizes:
            raise ConfigError(f"layout names {tensor_dim!r}, which is not a dimension of this model: choose from "
                              f"{', '.join(sizes)}{closest(tensor_dim, sizes)}")
        if sizes[tensor_dim] % mesh[mesh_dim]:
            raise ConfigError(f"layout splits {tensor_dim!r} (size {sizes[tensor_dim]}) over {mesh_dim!r} "
                              f"(size {mesh[mesh_dim]}), which does not divide it evenly")
    mapping = dict(rules)
    for group in co_occurring_dims(cfg):
        split = [(d, mapping[d]) for d in group if d in mapping]
        for i, (dim_a, mesh_a) in enumerate(split):
            for dim_b, mesh_b in split[i + 1:]:
                if mesh_a == mesh_b:
                    raise ConfigError(f"layout maps {dim_a!r} and {dim_b!r} to the same mesh dimension {mesh_a!r}, "
                                      f"but one tensor has both: split one of them over another mesh dimension")
    for kind in _attention_types(cfg):
        kind.check_layout(cfg)
    return cfg

