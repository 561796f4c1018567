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


def scheduled_rates(cfg: GPTConfig, steps: range) -> list:
    """models/optimizers.learning_rate of the update from each global step in `steps`."""
    import tensorflow.compat.v1 as tf
    from models.optimizers import learning_rate
    with tf.Graph().as_default(), tf.Session() as session:
        return [float(r) for r in session.run(learning_rate(cfg, tf.constant(list(steps), tf.int64)))]


@pytest.mark.parametrize("train_steps, decay_end, share", [(100, None, 0.2), (13, None, 0.2), (100, 40, 0.5),
                                                           (10, None, 0.3), (7, None, 1.0)])
def test_a_wsd_warmup_may_end_at_the_last_step_at_the_peak_and_no_later(train_steps, decay_end, share):
    """A "wsd" run whose warmup runs past its last step at the peak lr never holds the peak and has its decay cut
    short (at worst skipped: never annealed). The boundary comes from the schedule itself: the largest warmup after
    which the schedule still reaches lr is accepted, its lr falls after the decay start down to the floor, and one
    step more is refused in one line naming the keys. (Bugs: the check comparing warmup_steps >= the last peak step,
    so the largest good warmup is refused; or > the last peak step + 1, so a warmup that never reaches the peak is
    accepted; or not run.)"""
    values = dict(TINY, lr=1e-3, lr_decay="wsd", lr_decay_share=share, train_steps=train_steps,
                  **({"lr_decay_end": decay_end} if decay_end else {}))
    end = decay_end or train_steps
    at_peak = [s for s, rate in enumerate(scheduled_rates(config_from_dict(values), range(end + 1)))
               if rate == pytest.approx(1e-3, rel=1e-6)]  # without warmup: the steps the decay holds lr at
    largest = max(at_peak)
    assert at_peak == list(range(largest + 1))

    cfg = config_from_dict(dict(values, warmup_steps=largest))  # accepted
    rates = scheduled_rates(cfg, range(end + 1))
    assert rates[largest] == pytest.approx(1e-3, rel=1e-6)  # the warmup reaches the peak...
    assert all(b < a for a, b in zip(rates[largest:], rates[largest + 1:]))  # ...and from there lr falls each step
    assert rates[end] == pytest.approx(1e-4, rel=1e-5)  # to the floor: annealed

    one_more = dict(values, warmup_steps=largest + 1)
    too_long = dataclasses.replace(cfg, warmup_steps=largest + 1)  # the schedule of the config refused
    assert max(scheduled_rates(too_long, range(end + 1))) < 1e-3 * (1 - 1e-6)  # it never reaches lr
    assert error_of(**one_more) == (
        f"warmup_steps ({largest + 1}) runs past step {largest}, where lr_decay \"wsd\" starts its decay (the last "
        f"lr_decay_share {share:g} of {end} steps), so the run would never hold its peak lr and its decay would be "
        f"cut short: set warmup_steps to at most {largest}, or raise lr_decay_end (default train_steps) or lower "
        f"lr_decay_share")
    for decay in ("cosine", "linear"):  # their decays start at step 0: GPT-Neo's warmup overlaps them, as before
        assert config_from_dict(dict(one_more, lr_decay=decay)).warmup_steps == largest + 1
