"""GPT-Neo's own configs as they are: bare-string dataset ids and `input_fn`, the other keys GPT-Neo's code
read (each built, or mapped to this project's setting: docs/configs.md, "Parameter reference"), and every config of
GPT-Neo's configs/ folder, unchanged, through --dry_run."""
import argparse
import glob
import json
import math
import os
import socket

import numpy as np
import pytest

import main
from cli import predict_flags
from config import config_from_dict, load_config
from schema import ConfigError
from data.inputs import DatasetSource
from models import moe
from models.activations import ACTIVATIONS
from plan import model_graph
from execution.callbacks import EachStep
from train import loop
from train.job import dataset_sources
from train import trackers
from train.progress import Progress
from tiny import fixed_batches, placement_for, random_tokens, tiny_config

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "gpt_neo_configs")
GPT_NEO_CONFIGS = sorted(glob.glob(os.path.join(FIXTURES, "*.json")))
TINY = dict(n_layer=2, n_embd=32, n_head=4, n_vocab=64, n_ctx=16)


@pytest.fixture
def registry(tmp_path):
    """A dataset registry with ids `owt` and `docs`."""
    folder = tmp_path / "configs" / "dataset_configs"
    folder.mkdir(parents=True)
    for dataset_id in ("owt", "docs"):
        (folder / f"{dataset_id}.json").write_text(json.dumps(dict(n_vocab=50, path=f"/data/{dataset_id}_*.tfrecords")))
    return str(folder)


def load(registry, **values):
    return config_from_dict({**TINY, **values}, "test.json", dataset_config_dir=registry)


def error_of(registry, **values):
    with pytest.raises(ConfigError) as info:
        load(registry, **values)
    assert "\n" not in str(info.value)
    return str(info.value)


def modes(cfg):
    return [(use.dataset.id, use.stitch, use.sampling_mode, use.weight) for use in cfg.datasets]


def test_a_bare_dataset_id_reads_pre_chunked_records_in_file_order(registry):
    cfg = load(registry, datasets=["owt"])  # GPT-Neo's gpt2_small.json form
    assert modes(cfg) == [("owt", 1, "sequential", 1.0)]
    assert dataset_sources(cfg) == [DatasetSource("/data/owt_*.tfrecords", 1, "sequential", 1.0, shuffle_files=True)]
    unshuffled = load(registry, datasets=["owt"], shuffle_input_filenames=False)
    assert dataset_sources(unshuffled)[0].shuffle_files is False
    # Lists keep today's meaning; a bare id and a list mix.
    assert modes(load(registry, datasets=[["docs", 3]])) == [("docs", 3, "documents_random", 1.0)]
    assert modes(load(registry, datasets=["owt", ["docs", 4, "documents_fixed", 2.0]])) == [
        ("owt", 1, "sequential", 1.0), ("docs", 4, "documents_fixed", 2.0)]
    assert modes(load(registry, datasets=[["owt", 1, "sequential", 3.0]])) == [("owt", 1, "sequential", 3.0)]


def test_input_fn_chooses_how_entries_without_a_mode_are_read_and_refuses_modes_it_does_not_read(registry):
    assert modes(load(registry, datasets=["owt"], input_fn="sequential_input")) == [("owt", 1, "sequential", 1.0)]
    assert modes(load(registry, datasets=[["owt"]], input_fn="sequential_input")) == [("owt", 1, "sequential", 1.0)]
    assert modes(load(registry, datasets=["owt"], input_fn="generic_text")) == [("owt", 1, "documents_random", 1.0)]
    assert modes(load(registry, datasets=[["docs", 25, "documents_random", 1.0]], input_fn="generic_text")) == [
        ("docs", 25, "documents_random", 1.0)]
    message = error_of(registry, datasets=[["docs", 25, "documents_random", 1.0]], input_fn="sequential_input")
    assert "'docs'" in message and "documents_random" in message and "input_fn" in message
    message = error_of(registry, datasets=[["owt", 1, "sequential", 1.0]], input_fn="generic_text")
    assert "'owt'" in message and "sequential" in message and "input_fn" in message
    assert "did you mean 'generic_text'" in error_of(registry, datasets=["owt"], input_fn="generic")
    assert "input_fn must be a string" in error_of(registry, datasets=["owt"], input_fn=1)
    message = error_of(registry, datasets=[5])
    assert "dataset_id" in message and '"ID"' in message  # names both forms
    assert "did you mean 'owt'" in error_of(registry, datasets=["owtt"])


def test_gpt_neo_sampling_keys_map_to_this_projects_settings(registry, tmp_path):
    # slow_sampling: GPT-Neo's sampler without the key/value cache.
    assert load(registry, slow_sampling=True).kv_cache is False
    assert load(registry, slow_sampling=False).kv_cache is True
    assert load(registry, slow_sampling=True, kv_cache=False).kv_cache is False
    assert "slow_sampling" in error_of(registry, slow_sampling=True, kv_cache=True)
    assert "slow_sampling must be true or false" in error_of(registry, slow_sampling="yes")
    # predict_max_steps: GPT-Neo's cap on new tokens; 0 or null was no cap.
    assert load(registry, predict_max_steps=5).max_new_tokens == 5
    assert load(registry, predict_max_steps=0).max_new_tokens is None
    assert load(registry, predict_max_steps=None).max_new_tokens is None
    assert load(registry, predict_max_steps=5, max_new_tokens=5).max_new_tokens == 5
    assert "predict_max_steps" in error_of(registry, predict_max_steps=5, max_new_tokens=7)
    assert "predict_max_steps must be a whole number" in error_of(registry, predict_max_steps=2.5)
    # A flag overrides the config's key under either name (main.py's --max_new_tokens, --no_kv_cache).
    path = tmp_path / "neo.json"
    path.write_text(json.dumps(dict(TINY, predict_max_steps=50, slow_sampling=False)))
    cfg = load_config(str(path), {"max_new_tokens": 10, "kv_cache": False})
    assert cfg.max_new_tokens == 10 and cfg.kv_cache is False
    # An alias given together with its key is refused rather than one of them silently winning.
    assert "n_heads" in error_of(registry, n_heads=8)


def test_entmax_log_grads_and_moe_activation_keys_are_checked(registry):
    cfg = load(registry, sampling_use_entmax=True, entmax_loss=True, log_grads=True)
    assert cfg.sampling_use_entmax and cfg.entmax_loss and cfg.log_grads and cfg.entmax_alpha == 1.3
    assert load(registry, entmax_alpha=1.5).entmax_alpha == 1.5
    for alpha in (1.0, 2.0, 0.5):
        assert "entmax_alpha must be in (1, 2)" in error_of(registry, entmax_alpha=alpha)
    assert "entmax_loss must be true or false" in error_of(registry, entmax_loss=1)
    moe_cfg = load(registry, moe_layers=[1], moe_activation="relu")
    assert moe_cfg.moe_activation == "relu" and "moe_activation='relu'" in moe_cfg.model_options()
    assert "moe_layers is empty" in error_of(registry, moe_activation="relu")
    assert "did you mean 'relu'" in error_of(registry, moe_layers=[1], moe_activation="relux")
    assert load(registry).moe_activation is None  # the experts use activation_function, as before
    # GPT-Neo's --entmax_sampling flag sets sampling_use_entmax for the run.
    parser = argparse.ArgumentParser()
    predict_flags.add_arguments(parser)
    assert predict_flags.config_overrides(parser.parse_args(["--entmax_sampling"])) == {"sampling_use_entmax": True}
    assert "sampling_use_entmax" not in predict_flags.config_overrides(parser.parse_args([]))


@pytest.mark.parametrize("changes, expected", [(dict(), "gelu"), (dict(moe_activation="relu"), "relu"),
                                               (dict(activation_function="selu"), "selu")])
def test_the_experts_use_moe_activation(monkeypatch, changes, expected):
    seen = []
    original = moe.mtf_moe.transformer_moe_layer_v1

    def spy(*args, **kwargs):
        seen.append(kwargs["activation"])
        return original(*args, **kwargs)

    monkeypatch.setattr(moe.mtf_moe, "transformer_moe_layer_v1", spy)
    model_graph.build(tiny_config(moe_layers=[1], **changes))
    assert seen and all(activation is ACTIVATIONS[expected] for activation in seen)


def test_log_grads_logs_every_variables_gradient_norm(tmp_path):
    cfg = tiny_config(log_grads=True, gradient_clipping=None, model_path=str(tmp_path / "run"), train_steps=1)
    steps = []
    loop.train(cfg, placement_for(cfg), fixed_batches(random_tokens([4, cfg.n_ctx + 1]), 4),
               callbacks=[EachStep(lambda step, values: steps.append(values))])
    values = steps[0]
    norms = {k: float(v) for k, v in values.items() if k.startswith("grad_norm/")}
    assert "grad_norm/gpt2/wte" in norms and "grad_norm/gpt2/h0/attn/q" in norms and len(norms) > 10
    # Computed without gradient clipping too (otherwise logged as 0), and the per-variable norms add up to it.
    assert values["grad_norm"] > 0
    assert math.isclose(math.sqrt(sum(n * n for n in norms.values())), float(values["grad_norm"]), rel_tol=1e-4)

    class Tags(trackers.Tracker):  # what every tracker (TensorBoard, W&B) records of a step
        def record(self, step, scalars):
            self.tags = set(scalars)

    progress = Progress(cfg, 1, 0.0, print_fn=lambda *a, **k: None)
    tags = Tags(progress)
    progress.step(1, values, 0.0)
    tags.on_step(None, 1, values)
    assert "grad_norm/gpt2/wte" in tags.tags and "grad_norm" in tags.tags


def test_the_fixtures_are_gpt_neos_whole_configs_folder():
    names = sorted(os.path.basename(p) for p in GPT_NEO_CONFIGS)
    assert names == ["gpt2_small.json", "gpt3_13B_256.json", "gpt3_13B_256_Pile.json", "gpt3_2-7B_256.json",
                     "gpt3_6-7B_256.json", "gpt3_PAR_small_256.json", "gpt3_XL_256_Pile.json",
                     "gpt3_large_256.json", "gpt3_medium_256.json", "gpt3_small_256.json"]
    assert load_config(os.path.join(FIXTURES, "gpt2_small.json")).datasets[0].sampling_mode == "sequential"


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection (a tokenizer or a gs:// file fetched) fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("a config load or dry run tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.mark.parametrize("path", GPT_NEO_CONFIGS, ids=lambda p: os.path.basename(p)[:-5])
def test_every_gpt_neo_config_passes_dry_run_unchanged(path, no_network, capsys):
    cfg = load_config(path)  # its dataset_configs/ beside it is the registry
    assert cfg.datasets and cfg.tokenizer_dataset.tokenizer_path == "gpt2"
    assert main.main(["--model", path, "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert "parameters" in out and "FLOPs/token" in out
