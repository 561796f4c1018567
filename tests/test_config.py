"""Configs are read once into a typed object; every bad input is a one-line error that names the fix."""
import glob
import gzip
import json
import os

import pytest

from config import config_from_dict, load_config
from schema import CONFIG_DIR, ConfigError
from models.layout import tensor_dim_sizes

TINY = dict(n_layer=2, n_embd=32, n_head=4, n_vocab=64, n_ctx=16, attention_types=[[["global", "local"], 1]])


def error_of(**changes):
    values = {**TINY, **changes}
    with pytest.raises(ConfigError) as info:
        config_from_dict({k: v for k, v in values.items() if v is not None}, "test.json")
    message = str(info.value)
    assert "\n" not in message
    return message


def test_unknown_key_names_it_and_suggests_the_closest():
    message = error_of(n_embed=32)
    assert "'n_embed'" in message and "'n_embd'" in message


def test_wrong_types_and_impossible_values():
    assert "n_layer must be a whole number" in error_of(n_layer="2")
    assert "divisible by n_head" in error_of(n_embd=30)
    assert "n_layer is 3" in error_of(n_layer=3)
    assert "attention type 'globl'" in error_of(attention_types=[[["globl"], 2]])
    assert "'global'" in error_of(attention_types=[[["globl"], 2]])  # suggestion
    assert "lr_decay" in error_of(lr_decay="exponential")
    assert "activation_function" in error_of(activation_function="gelux")
    assert "embed_dropout" in error_of(embed_dropout=1.5)
    assert "lacks 'n_head'" in error_of(n_head=None)


def test_mesh_and_layout_errors():
    assert "does not have" in error_of(mesh_shape="x:2", layout="batch:y")
    assert "does not divide it evenly" in error_of(mesh_shape="x:3", layout="heads:x")
    assert "same mesh dimension" in error_of(mesh_shape="x:2,y:2", layout="embd:y,heads:y")
    assert "malformed" in error_of(mesh_shape="x=2")
    assert "not a dimension of this model" in error_of(mesh_shape="x:2", layout="batchh:x")
    # Local attention cuts n_ctx 256 into 2 blocks of 128: a 4-way split of 'sequence' cannot divide them,
    # though 4 divides 256; global-only models split it freely.
    assert "2 blocks" in error_of(n_ctx=256, local_attention_radius=4, mesh_shape="x:4", layout="sequence:x")
    config_from_dict(dict(TINY, n_ctx=256, attention_types=[[["global"], 2]], mesh_shape="x:4", layout="sequence:x"))
    config_from_dict(dict(TINY, n_ctx=256, local_attention_radius=4, mesh_shape="x:2", layout="sequence:x"))


def write_dataset(tmp_path, dataset_id, **values):
    folder = tmp_path / "configs" / "dataset_configs"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{dataset_id}.json").write_text(json.dumps(values))
    return str(folder)


def test_datasets_resolve_and_are_checked_against_the_model(tmp_path):
    folder = write_dataset(tmp_path, "small", n_vocab=50, path="data/small_*.tfrecords",
                           tokenizer_path="tok.json", eos_id=0, padding_id=1)
    cfg = config_from_dict(dict(TINY, datasets=[["small", 4, "documents_random", 1.0]]), dataset_config_dir=folder)
    use = cfg.datasets[0]
    assert use.stitch == 4 and use.dataset.n_vocab == 50 and cfg.eos_id == 0 and cfg.padding_id == 1
    assert use.dataset.path == str(tmp_path / "data" / "small_*.tfrecords")  # relative to the folder of configs/

    write_dataset(tmp_path, "big", n_vocab=100, path="x")
    with pytest.raises(ConfigError, match="set n_vocab >= 100"):
        config_from_dict(dict(TINY, datasets=[["big", 1, "documents_random", 1.0]]), dataset_config_dir=folder)
    with pytest.raises(ConfigError, match="has no config"):
        config_from_dict(dict(TINY, datasets=[["missing", 1, "documents_random", 1.0]]), dataset_config_dir=folder)
    with pytest.raises(ConfigError, match="sampling mode"):
        config_from_dict(dict(TINY, datasets=[["small", 1, "random", 1.0]]), dataset_config_dir=folder)
    with pytest.raises(ConfigError, match="old"):
        config_from_dict(dict(TINY, datasets=[["a*.tfrecords", "", 1, "documents_random", 1.0]]),
                         dataset_config_dir=folder)
    write_dataset(tmp_path, "typo", n_vocab=10, path="x", tokeniser_path="t.json")
    with pytest.raises(ConfigError, match="did you mean 'tokenizer_path'"):
        config_from_dict(dict(TINY, datasets=[["typo", 1, "documents_random", 1.0]]), dataset_config_dir=folder)


def test_sizes_are_checked_before_attention_types_expand():
    for n_layer in (-1, 0):
        for attention_types in (None, [[["global", "local"], 1]], [[["global"], n_layer]]):
            message = error_of(n_layer=n_layer, attention_types=attention_types)
            assert message == f"n_layer must be at least 1, got {n_layer}", message
    assert error_of(n_embd=-32) == "n_embd must be at least 1, got -32"


def test_model_config_by_name_path_and_overrides(tmp_path):
    assert load_config("default").n_layer == 4
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(TINY))
    cfg = load_config(str(path), {"mesh_shape": "x:2", "layout": "batch:x"})
    assert cfg.n_devices == 2 and cfg.layout_rules == [("batch", "x")]
    with pytest.raises(ConfigError, match="not found"):
        load_config("no_such_model")
    path.write_text("{ not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config(str(path))
    path.write_bytes(gzip.compress(json.dumps(TINY).encode()))  # a binary file: one line, not a UnicodeDecodeError
    with pytest.raises(ConfigError, match="is not text .* pass the .json file of the config, not a binary file"):
        load_config(str(path))
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(TINY).encode())  # UTF-8 with a byte order mark reads as JSON
    assert load_config(str(path)).n_layer == TINY["n_layer"]


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(CONFIG_DIR, "*.json"))))
def test_every_shipped_config_loads_with_an_even_layout(path):
    cfg = load_config(path)
    mesh = dict(cfg.mesh_dims)
    sizes = tensor_dim_sizes(cfg)
    for tensor_dim, mesh_dim in cfg.layout_rules:
        assert sizes[tensor_dim] % mesh[mesh_dim] == 0


def test_shipped_gpt3_family_has_the_published_shapes():
    shapes = {name: (c.n_layer, c.n_embd) for name, c in
              ((n, load_config(n)) for n in ("gpt3_small", "gpt3_medium", "gpt3_large", "gpt3_XL", "gpt3_2-7B",
                                             "gpt3_6-7B", "gpt3_13B", "colab_XL"))}
    assert shapes == {"gpt3_small": (12, 768), "gpt3_medium": (24, 1024), "gpt3_large": (24, 1536),
                      "gpt3_XL": (24, 2048), "gpt3_2-7B": (32, 2560), "gpt3_6-7B": (32, 4096),
                      "gpt3_13B": (40, 5120), "colab_XL": (24, 2048)}
    assert load_config("colab_XL").n_devices == 1 and load_config("colab_XL").n_ctx == 2048


@pytest.mark.parametrize("change", [
    dict(opt_name="adamw"), dict(lr_decay="step"), dict(activation_function="swish2"),
    dict(attention_types=("global", "sparse")), dict(moe_layers=(1,), moe_params={"moe_experts": 4}),
    dict(eval_tasks=("lambada",)), dict(input_fn="generic"), dict(mesh_shape="x:2", layout="nonsense:x"),
    dict(mesh_shape="x:3", layout="heads:x"), dict(lr=0.0),
], ids=lambda change: ",".join(change))
def test_replace_is_checked_as_a_config_read_from_disk(change):
    """A changed copy (training's precision, export's one device, the planner's layouts) passes every check a
    config read from disk passes, with the same error line: the registries' names, an entry's own checks, the
    layout against the model's dimensions, the checks between fields. Bug caught: replace running only the
    schema's checks (validate), as GPTConfig.replace did."""
    from config import replace
    read = error_of(**{key: list(value) if isinstance(value, tuple) else value for key, value in change.items()})
    with pytest.raises(ConfigError) as info:
        replace(config_from_dict(TINY), **change)
    assert str(info.value) == read


def test_nothing_below_the_command_line_imports_cli():
    """cli/ is main.py's flag groups; configs are read and checked below the jobs (config.py), so the
    jobs, the runtime, the models, the data and the loading need nothing of it. Bug caught: a module below the
    command line importing cli/ (to get a config, as tests/tiny.py, tools/hf.py and plan/ did)."""
    import ast
    root = os.path.dirname(CONFIG_DIR)
    command_lines = {"main.py", "run_experiment.py", "cli", "tools", "bench", "tests"}
    importers = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_")) and not (folder == root and d in command_lines)]
        for name in files:
            if not name.endswith(".py") or (folder == root and name in command_lines):
                continue
            tree = ast.parse(open(os.path.join(folder, name), encoding="utf-8").read())
            imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
            imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
            if any(module == "cli" or module.startswith("cli.") for module in imported):
                importers.append(os.path.relpath(os.path.join(folder, name), root))
    assert importers == []
