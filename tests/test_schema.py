"""schema.py: the config's fields, their defaults and checks (types, ranges, finite numbers, counts), the
mesh and layout helpers and the micro-batch count; nothing of the project imported."""
import dataclasses
import json
import math
import os

import pytest

from config import config_from_dict, load_config
from schema import FIELD_TYPES, ConfigError, GPTConfig, dimension_is_split, expand_attention_types, num_microbatches
from tests.test_config import TINY, error_of, write_dataset


def test_compact_attention_types_expand_to_one_per_layer():
    assert expand_attention_types([[["global", "local"], 2], [["global"], 1]], 5) == (
        "global", "local", "global", "local", "global")
    assert config_from_dict(dict(TINY, n_layer=4, attention_types=[[["local"], 4]])).attention_types == ("local",) * 4


def test_defaults_follow_the_reference():
    cfg = config_from_dict(dict(n_layer=2, n_embd=32, n_head=4, n_vocab=64))
    assert cfg.n_ctx == 2048 and cfg.local_attention_radius == 256 and cfg.activation_function == "gelu"
    assert cfg.attention_types == ("global", "global") and cfg.weight_decay == 0.01 and cfg.iterations == 500


FLOAT_FIELDS = [f.name for f in dataclasses.fields(GPTConfig) if FIELD_TYPES.get(str(f.type)) is float]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_every_float_field_refuses_nan_and_infinity_in_one_line(tmp_path, value):
    """JSON readers accept NaN and Infinity, and NaN passes every range check (its comparisons are all false):
    `"lr": NaN` trained to the end with loss nan when nothing checked for it."""
    assert len(FLOAT_FIELDS) >= 20 and "lr" in FLOAT_FIELDS and "gradient_clipping" in FLOAT_FIELDS
    for name in FLOAT_FIELDS:
        assert error_of(**{name: value}).startswith(f"{name} is {value}, not a finite number"), name
    path = tmp_path / "nan.json"  # as the issue found it: NaN written in the JSON text itself
    path.write_text(json.dumps(dict(TINY, lr=value)))
    assert ("NaN" if math.isnan(value) else "Infinity") in path.read_text()
    with pytest.raises(ConfigError, match=f"^lr is {value}, not a finite number"):
        load_config(str(path))
    path.write_text(json.dumps(TINY))
    with pytest.raises(ConfigError, match=f"^top_p is {value}, not a finite number"):
        load_config(str(path), {"top_p": value})  # main.py's --top_p nan
    # numbers inside a field: moe_params' values and the datasets' weights
    message = error_of(moe_layers=[1], moe_params={"moe_capacity_factor_train": value})
    assert message.startswith(f"moe_params.moe_capacity_factor_train is {value}, not a finite"), message
    folder = write_dataset(tmp_path, "small", n_vocab=50, path="x")
    with pytest.raises(ConfigError, match=rf"^datasets\[0\]\.weight is {abs(value)}, not a finite number"):
        config_from_dict(dict(TINY, datasets=[["small", 1, "documents_random", abs(value)]]),  # -inf: weight > 0
                         dataset_config_dir=folder)


@pytest.mark.parametrize("name, refused, accepted, expected", [
    ("train_steps", -5, 1, "train_steps must be at least 1, got -5"),
    ("train_steps", 0, 1, "train_steps must be at least 1, got 0"),
    ("lr_decay_end", 0, 1, "lr_decay_end must be at least 1, got 0"),
    ("warmup_steps", -1, 0, "warmup_steps must be at least 0, got -1"),
    ("eval_steps", -1, 0, "eval_steps must be at least 0, got -1"),
    ("predict_steps", -1, 0, "predict_steps must be at least 0, got -1"),
    ("seed", -1, 0, "seed must be at least 0, got -1"),
    ("beta1", 1.0, 0.0, "beta1 must be in [0, 1), got 1.0"),
    ("beta2", -0.5, 0.999, "beta2 must be in [0, 1), got -0.5"),
    ("epsilon", 0.0, 1e-12, "epsilon must be more than 0, got 0.0"),
    ("ada_epsilon1", 0.0, 1e-30, "ada_epsilon1 must be more than 0, got 0.0"),
    ("ada_epsilon2", -1e-3, 0.0, "ada_epsilon2 must be at least 0, got -0.001"),
    ("weight_decay", -0.01, 0.0, "weight_decay must be at least 0, got -0.01"),
    ("gradient_clipping", -1.0, 0.0, "gradient_clipping must be at least 0, got -1.0"),
    ("z_loss", -1e-4, 0.0, "z_loss must be at least 0, got -0.0001"),
    ("keep_checkpoint_every_n_hours", -2.0, 0.0, "keep_checkpoint_every_n_hours must be at least 0, got -2.0"),
])
def test_counts_and_optimizer_settings_out_of_range_are_refused_at_their_bounds(name, refused, accepted, expected):
    """`"train_steps": -5` built everything, then said there was nothing to train and exited 0."""
    assert error_of(**{name: refused}) == expected
    assert getattr(config_from_dict(dict(TINY, **{name: accepted})), name) == accepted


@pytest.mark.parametrize("value", [0, -5])
def test_steps_per_checkpoint_below_1_is_refused_from_the_config_and_as_an_override(tmp_path, value):
    assert error_of(steps_per_checkpoint=value) == f"steps_per_checkpoint must be at least 1, got {value}"
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(TINY))
    with pytest.raises(ConfigError, match=f"^steps_per_checkpoint must be at least 1, got {value}$"):
        load_config(str(path), {"steps_per_checkpoint": value})  # main.py's --steps_per_checkpoint


@pytest.mark.parametrize("batch,tokens,mesh_shape,layout", [
    (8, None, "all:1", ""), (8, 16, "all:1", ""), (8, 16, "x:2", "batch:x"), (8, 40, "x:2", "batch:x"),
    (12, 32, "x:4", "batch:x"), (6, 1000, "x:2", "batch:x"), (8, 16, "x:2,y:2", "batch:y,heads:x")])
def test_the_micro_batch_count_follows_mesh_tensorflow(batch, tokens, mesh_shape, layout):
    """schema.py computes it in pure Python; mesh-tensorflow's serialize_num_microbatches is the rule."""
    import mesh_tensorflow as mtf
    from mesh_tensorflow.transformer import utils as mtf_utils
    cfg = config_from_dict(dict(TINY, train_batch_size=batch, tokens_per_mb_per_replica=tokens, mesh_shape=mesh_shape,
                                layout=layout))
    expected = mtf_utils.serialize_num_microbatches(
        batch_dim=mtf.Dimension("batch", batch), sequence_length={"inputs": cfg.n_ctx},
        mesh_shape=mtf.convert_to_shape(mesh_shape), layout_rules=mtf.convert_to_layout_rules(layout),
        tokens_per_microbatch_per_replica=tokens)
    assert num_microbatches(cfg, batch) == expected


def test_split_vocab_is_detected():
    from tiny import tiny_config
    assert not dimension_is_split(tiny_config(), "vocab")
    assert not dimension_is_split(tiny_config(mesh_shape="x:2", layout="batch:x"), "vocab")
    assert dimension_is_split(tiny_config(mesh_shape="x:2", layout="vocab:x"), "vocab")


def test_the_schema_imports_nothing_of_the_project():
    import ast
    import schema
    tree = ast.parse(open(schema.__file__).read())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    root = os.path.dirname(os.path.abspath(schema.__file__))
    project = {name for name in os.listdir(root) if os.path.isdir(os.path.join(root, name)) or name.endswith(".py")}
    assert {"models", "devices", "config"} <= {p.removesuffix(".py") for p in project}
    assert not imported & {p.removesuffix(".py") for p in project}
