"""tools/hf.py: our checkpoints <-> HF transformers' GPTNeoForCausalLM folders, both ways, on small random models."""
import glob
import json
import os
import shutil
import sys

import numpy as np
import pytest
import tensorflow.compat.v1 as tf

import main
from data.tokenizer import load_tokenizer
from config import load_config, replace
from models import gpt
from modelpath import checkpoints
from tiny import checkpoint_of_order_one_weights, compute_logits, devices_for, random_tokens, tiny_config, train
from tools import hf
from train import loss_scale
from workspace import REPO, TOKENIZER, make_workspace, run_python

torch = pytest.importorskip("torch")
from transformers import AutoTokenizer, GPTNeoConfig, GPTNeoForCausalLM  # noqa: E402
from transformers.models.gpt_neo.modeling_gpt_neo import load_tf_weights_in_gpt_neo  # noqa: E402


def hf_logits(model, tokens):
    model.eval()
    with torch.no_grad():
        return model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()


def parameters(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_logits_equal_transformers_at_weights_of_order_one(tmp_path):
    """The model's forward pass against HF's GPTNeoForCausalLM (transformers' own reader of mesh-tensorflow
    checkpoints), relative tolerance, at weights that make every nonlinearity matter.
    Bugs caught: a wrong GELU constant (0.03 for 0.044715 moves the logits by ~2e-3 relative), a LayerNorm
    epsilon, a norm or bias left out, an attention scale GPT-Neo does not have."""
    cfg = tiny_config()
    checkpoint = checkpoint_of_order_one_weights(cfg, str(tmp_path / "model.ckpt-1"))
    model = GPTNeoForCausalLM(GPTNeoConfig(
        vocab_size=cfg.n_vocab, max_position_embeddings=cfg.n_ctx, hidden_size=cfg.n_embd, num_layers=cfg.n_layer,
        attention_types=[[["global", "local"], 1]], num_heads=cfg.n_head, window_size=cfg.local_attention_radius,
        activation_function="gelu_new", layer_norm_epsilon=1e-5, embed_dropout=0.0, attention_dropout=0.0,
        resid_dropout=0.0))
    load_tf_weights_in_gpt_neo(model, model.config, checkpoint)
    tokens = random_tokens([3, cfg.n_ctx], vocab=cfg.n_vocab, seed=7)
    ours, theirs = compute_logits(cfg, tokens, devices_for(cfg), checkpoint), hf_logits(model, tokens)
    assert np.abs(theirs).std() > 1  # logits of order 1 and more: the weights were read
    error = np.abs(ours - theirs).max() / np.abs(theirs).max()
    assert error < 1e-5, f"largest difference, relative to the largest logit: {error:.2e}"  # ~2e-7 here


@pytest.mark.slow
def test_our_checkpoint_becomes_a_folder_transformers_loads_with_equal_logits(tmp_path):
    registry = tmp_path / "configs" / "dataset_configs"
    registry.mkdir(parents=True)
    (registry / "tok.json").write_text(json.dumps({"n_vocab": 4096, "path": "unused_*.tfrecords",
                                                   "tokenizer_path": TOKENIZER, "eos_id": 0, "padding_id": 1}))
    (tmp_path / "configs" / "model.json").write_text(json.dumps(dict(
        n_layer=4, n_embd=32, n_head=4, n_vocab=4096, n_ctx=16, attention_types=[[["global", "local"], 2]],
        local_attention_radius=4, scale_by_depth=True, train_batch_size=4, train_steps=2, steps_per_checkpoint=2,
        lr=3e-3, datasets=[["tok"]], model_path=str(tmp_path / "run"), mesh_shape="all:1", layout="")))
    cfg = load_config(str(tmp_path / "configs" / "model.json"))
    train(cfg, random_tokens([8, cfg.n_ctx + 1], vocab=cfg.n_vocab, seed=4))
    checkpoint = tf.train.latest_checkpoint(cfg.model_path)

    out = tmp_path / "hf"
    hf.to_hf(cfg, cfg.model_path, str(out))
    written = json.loads((out / "config.json").read_text())
    assert written["attention_layers"] == ["global", "local"] * 2 and written["window_size"] == 4
    assert written["activation_function"] == "gelu_new" and written["max_position_embeddings"] == 16

    model = GPTNeoForCausalLM.from_pretrained(str(out))
    tokens = random_tokens([3, cfg.n_ctx], vocab=cfg.n_vocab, seed=5)
    ours = compute_logits(cfg, tokens, devices_for(cfg), checkpoint)
    assert np.abs(ours).max() > 0.1
    np.testing.assert_allclose(hf_logits(model, tokens), ours, atol=1e-4, rtol=0)

    # transformers' own reader of mesh-tf checkpoints puts exactly the same numbers in the same places.
    oracle = GPTNeoForCausalLM(model.config)
    load_tf_weights_in_gpt_neo(oracle, model.config, checkpoint)
    ours_params, oracle_params = parameters(model), parameters(oracle)
    assert ours_params.keys() == oracle_params.keys()
    for name, value in ours_params.items():
        assert torch.equal(value, oracle_params[name]), name

    # The tokenizer loaders read the folder and encode as our tokenizer does.
    text = "import json\nclass Foo(object):\n    pass\n"
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert tokenizer.encode(text) == load_tokenizer(TOKENIZER).encode(text)
    assert tokenizer.eos_token_id == 0 and tokenizer.pad_token_id == 1

    with pytest.raises(hf.ConversionError, match="attention types"):
        hf.check_convertible(replace(cfg, attention_types=("global", "local", "global", "none")))


@pytest.mark.slow
def test_hf_folder_becomes_a_checkpoint_that_main_trains_and_predicts_from(tmp_path, capsys):
    """main.py runs in this process: TensorFlow starts once (as two main.py processes the test took 25 s here,
    62 s on CI; now ~10 s).
    Bugs caught: a variable mapped to the wrong HF name or not transposed, a norm or bias dropped, a converted
    config main.py cannot train or predict from, training that starts from fresh weights instead of HF's."""
    config = make_workspace(tmp_path, lr=1e-3)
    torch.manual_seed(0)
    hf_config = GPTNeoConfig(vocab_size=4096, max_position_embeddings=32, hidden_size=32, num_layers=2,
                             attention_types=[[["local", "global"], 1]], num_heads=4, window_size=8,
                             activation_function="gelu_new", embed_dropout=0.0, attention_dropout=0.0,
                             resid_dropout=0.0, bos_token_id=0, eos_token_id=0)
    source = GPTNeoForCausalLM(hf_config)
    with torch.no_grad():  # non-trivial norms and biases, so every mapping is checked
        for name, value in source.named_parameters():
            if value.dim() == 1:
                value.add_(0.1 * torch.randn_like(value))
    source.save_pretrained(str(tmp_path / "neo"))

    converted = hf.main(["from_hf", str(tmp_path / "neo"), "--config", str(tmp_path / "configs" / "neo.json"),
                         "--model_path", str(tmp_path / "neo_run"), "--base_config", config])
    assert converted == 0
    cfg = load_config(str(tmp_path / "configs" / "neo.json"))
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_ctx, cfg.local_attention_radius) == (2, 32, 4, 32, 8)
    assert cfg.attention_types == ("local", "global") and cfg.activation_function == "gelu"
    assert cfg.model_path == str(tmp_path / "neo_run") and cfg.datasets[0].dataset.id == "tiny"

    tokens = random_tokens([2, cfg.n_ctx], vocab=cfg.n_vocab, seed=6)
    imported = compute_logits(cfg, tokens, devices_for(cfg), cfg.model_path)
    np.testing.assert_allclose(imported, hf_logits(source, tokens), atol=1e-4, rtol=0)

    # Round trip: back to HF gives the very same weights.
    hf.to_hf(cfg, cfg.model_path, str(tmp_path / "back"))
    back = parameters(GPTNeoForCausalLM.from_pretrained(str(tmp_path / "back")))
    for name, value in parameters(source).items():
        assert torch.equal(back[name], value), name

    before = {n: tf.train.load_variable(cfg.model_path, n) for n in ("gpt2/wte", "gpt2/h1/attn/q")}
    capsys.readouterr()
    assert main.main(["--model", str(tmp_path / "configs" / "neo.json"), "--log_every", "1", "--peak_tflops", "1"]) == 0
    trained = capsys.readouterr().out
    assert "steps 0 -> 2" in trained and "step      2/2" in trained
    step2 = tf.train.latest_checkpoint(cfg.model_path)
    assert step2.endswith("model.ckpt-2")
    for name, value in before.items():
        # Training started from the imported weights and moved them a little: mesh-tensorflow's Adam has no bias
        # correction, so an early step moves a weight by up to ~(1 - beta1) / sqrt(1 - beta2) ~ 3-5 lr. Two
        # independent initialisations differ by ~0.1 somewhere, so this bound tells the two apart.
        change = np.abs(tf.train.load_variable(step2, name) - value).max()
        assert 0 < change < 10 * 2 * cfg.lr, (name, change)

    assert main.main(["--model", str(tmp_path / "configs" / "neo.json"), "--predict", "--max_new_tokens", "3"]) == 0
    records = [json.loads(line) for line in open(tmp_path / "neo_run" / "predictions_2.jsonl")]
    assert len(records) == cfg.predict_batch_size and all(r["step"] == 2 for r in records)


# Runs tools.hf with `import torch` failing, as on an install from requirements.txt (which has no PyTorch).
WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None  # import torch raises ImportError; transformers finds no PyTorch
from tools import hf
from train import loss_scale
for command in sys.argv[1:]:
    code = hf.main(command.split("\\t"))
    if code:
        sys.exit(code)
assert "torch" not in [name.split(".")[0] for name, module in sys.modules.items() if module is not None]
"""


@pytest.mark.slow
def test_models_trained_from_each_gpt3_config_convert_both_ways_without_pytorch(tmp_path):
    """Each shipped gpt3 config, shrunk (its other keys kept: bfloat16, recompute_grad,
    tokens_per_mb_per_replica, its optimizer settings), trains a step and converts to a folder that
    transformers loads with exactly the weights its own TF-checkpoint reader finds; one converts back.
    Shrunk, the configs differ in their lr alone (each size's peak), which changes the weights' values but no
    variable's name, shape or dtype: configs that differ from an earlier one only there convert the model that
    one trained (into their own folders), so that a step is trained per distinct set of training settings."""
    registry = tmp_path / "configs" / "dataset_configs"
    registry.mkdir(parents=True)
    (registry / "tok.json").write_text(json.dumps({"n_vocab": 4096, "path": "unused_*.tfrecords",
                                                   "tokenizer_path": TOKENIZER, "eos_id": 0, "padding_id": 1}))
    names = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(REPO, "configs", "gpt3_*.json")))
    assert len(names) >= 6
    commands, runs = [], {}  # runs: the shrunk config but its lr -> the model_path trained for it
    for name in names:
        raw = json.loads(open(os.path.join(REPO, "configs", name + ".json")).read())
        assert raw["tokens_per_mb_per_replica"] and raw["precision"] == "bfloat16"
        raw.update(n_layer=2, n_embd=32, n_head=4, n_vocab=4096, n_ctx=16, attention_types=[[["global", "local"], 1]],
                   train_batch_size=2, train_steps=1, mesh_shape="all:1", layout="", datasets=[["tok"]])
        settings = json.dumps({key: value for key, value in raw.items() if key not in ("lr", "model_path")},
                              sort_keys=True)
        trains = settings not in runs
        raw["model_path"] = runs.setdefault(settings, str(tmp_path / "runs" / name))
        (tmp_path / "configs" / f"{name}.json").write_text(json.dumps(raw))
        cfg = load_config(str(tmp_path / "configs" / f"{name}.json"))
        assert cfg.model_options() == []  # its training settings change how it trains, not the model
        if trains:
            train(cfg, random_tokens([2, cfg.n_ctx + 1], vocab=cfg.n_vocab, seed=len(runs)))
        commands.append(f"to_hf\t--model\t{tmp_path / 'configs' / name}.json\t--out\t{tmp_path / 'hf' / name}")
    commands.append(f"from_hf\t{tmp_path / 'hf' / names[0]}\t--config\t{tmp_path / 'configs' / 'back.json'}\t"
                    f"--model_path\t{tmp_path / 'back'}\t--base_config\t{tmp_path / 'configs' / names[0]}.json")
    converted = run_python(WITHOUT_TORCH, *commands)
    assert converted.returncode == 0, converted.stderr

    for name in names:
        model = GPTNeoForCausalLM.from_pretrained(str(tmp_path / "hf" / name))
        oracle = GPTNeoForCausalLM(model.config)
        trained = load_config(str(tmp_path / "configs" / f"{name}.json")).model_path
        load_tf_weights_in_gpt_neo(oracle, model.config, tf.train.latest_checkpoint(trained))
        ours, theirs = parameters(model), parameters(oracle)
        assert ours.keys() == theirs.keys()
        for key, value in ours.items():
            assert torch.equal(value, theirs[key]), (name, key)
    first = tf.train.latest_checkpoint(str(tmp_path / "runs" / names[0]))
    back = tf.train.latest_checkpoint(str(tmp_path / "back"))
    assert back.endswith("model.ckpt-0")
    for variable in ("gpt2/wte", "gpt2/h0/attn/q", "gpt2/h1/mlp/conv1d_main/c_fc/kernel", "gpt2/ln_f/b"):
        np.testing.assert_array_equal(tf.train.load_variable(back, variable), tf.train.load_variable(first, variable))


# ----------------------------------------------------------------------------------------------------
# The step-0 checkpoint from_hf and from_neo write (hf.write_checkpoint), made from the training step's graph
# without lowering it: exactly what a training checkpoint of the config holds.


def stored(checkpoint: str) -> dict:
    """name -> (shape, dtype) of every variable in a checkpoint, as TensorFlow's reader lists them."""
    reader = tf.train.load_checkpoint(checkpoint)
    dtypes = reader.get_variable_to_dtype_map()
    return {name: (list(shape), dtypes[name]) for name, shape in reader.get_variable_to_shape_map().items()}


# float16 with Adam (loss-scale state and Adam's slots) stays in the fast tier: it fails with either bug below.
@pytest.mark.parametrize("precision,opt_name", [pytest.param("float32", "adam", marks=pytest.mark.slow),
                                                ("float16", "adam"),
                                                pytest.param("bfloat16", "adafactor", marks=pytest.mark.slow)])
def test_imported_checkpoint_holds_exactly_the_variables_a_training_checkpoint_holds(tmp_path, precision, opt_name):
    """write_checkpoint against the checkpoint one training step saves for the same config: the same variable
    names, shapes and dtypes (float32 masters under bfloat16 and float16, the optimizer's slots, global_step,
    float16's loss-scale state), the weights given, every other variable at its initial value. (Training resumes
    from it: test_hf_folder_becomes_a_checkpoint_that_main_trains_and_predicts_from, tests/scenarios/test_finetune.py.)
    Bugs caught: write_checkpoint saving tf.trainable_variables() instead of tf.global_variables() (no slots,
    no global_step), or building the step at float32 whatever the config's precision (float16's loss-scale state
    missing)."""
    cfg = tiny_config(precision=precision, opt_name=opt_name, model_path=str(tmp_path / "trained"))
    data = random_tokens([8, cfg.n_ctx + 1], vocab=cfg.n_vocab, seed=3)
    train(cfg, data, 1)
    trained = checkpoints.latest(cfg.model_path)
    weights = {name: tf.train.load_variable(trained, name) for name in gpt.variable_shapes(cfg)}
    imported = replace(cfg, model_path=str(tmp_path / "imported"))
    written = hf.write_checkpoint(imported, weights)
    assert written == checkpoints.prefix_of(imported.model_path, 0)
    assert stored(written) == stored(trained)
    for name in stored(written):
        value = tf.train.load_variable(written, name)
        if name in weights:
            np.testing.assert_array_equal(value, weights[name])
        elif name == loss_scale.SCALE:
            assert value == cfg.initial_loss_scale
        else:  # optimizer slots, global_step, the loss scale's count of good steps
            assert not np.any(value), name


def test_write_checkpoint_refuses_weights_that_are_not_the_configs_and_writes_nothing(tmp_path):
    """Missing, unknown and misshapen weights are one ConversionError each, and weights holding NaN a
    NonFiniteWeights, all before anything is written in model_path.
    Bug caught: write_checkpoint dropping the finiteness check (a model_path whose step 0 is NaN)."""
    cfg = tiny_config(model_path=str(tmp_path / "run"))
    weights = {name: np.zeros(shape, np.float32) for name, shape in gpt.variable_shapes(cfg).items()}
    with pytest.raises(hf.ConversionError, match=r"no weights for \['gpt2/wpe'\]"):
        hf.write_checkpoint(cfg, {name: value for name, value in weights.items() if name != "gpt2/wpe"})
    with pytest.raises(hf.ConversionError, match="the training graph has no variable gpt2/extra"):
        hf.write_checkpoint(cfg, {**weights, "gpt2/extra": np.zeros([3], np.float32)})
    with pytest.raises(hf.ConversionError, match=r"gpt2/wpe is \[8, 32\] in the HF model but \[16, 32\] here"):
        hf.write_checkpoint(cfg, {**weights, "gpt2/wpe": np.zeros([8, 32], np.float32)})
    broken = dict(weights)
    broken["gpt2/ln_f/g"] = np.full(broken["gpt2/ln_f/g"].shape, np.nan, np.float32)
    with pytest.raises(checkpoints.NonFiniteWeights, match="gpt2/ln_f/g hold inf or NaN"):
        hf.write_checkpoint(cfg, broken)
    assert not os.path.exists(cfg.model_path) or not os.listdir(cfg.model_path)


# ----------------------------------------------------------------------------------------------------
# One export per folder (issue 29): to_hf replaces an earlier export whole and asks before writing among other
# files; from_hf refuses weights files that disagree with their index or with each other, and damaged files.
# None of these needs PyTorch or a TF graph: the checkpoints are written directly (tiny.py).

TINY_HF = dict(n_layer=2, n_embd=32, n_head=4, n_vocab=64, n_ctx=16, attention_types=[[["global", "local"], 1]],
               local_attention_radius=4)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """A config file, two checkpoints of its model (different weights; model.ckpt-1 of seeds 1 and 2) and
    folders to_hf wrote of the first: as written (config.json, model.safetensors) and sharded."""
    root = tmp_path_factory.mktemp("exports")
    config = root / "model.json"
    config.write_text(json.dumps({**TINY_HF, "model_path": str(root / "run")}))
    cfg = load_config(str(config))
    old, new = (checkpoint_of_order_one_weights(cfg, str(root / f"seed{seed}" / "model.ckpt-1"), seed) for seed in (1, 2))
    hf.to_hf(cfg, old, str(root / "single"))
    hf.to_hf(cfg, old, str(root / "sharded"))
    shard(root / "sharded")
    return dict(root=root, config=str(config), cfg=cfg, old=old, new=new)


def shard(folder):
    """The export in `folder` made sharded, as transformers' save_pretrained(max_shard_size=...) lays it out: two
    shards and the index mapping each tensor to its shard."""
    from safetensors.numpy import load_file, save_file
    state = load_file(str(folder / hf.SAFETENSORS))
    (folder / hf.SAFETENSORS).unlink()
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[:len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for name, names in shards.items():
        save_file({key: state[key] for key in names}, str(folder / name), metadata={"format": "pt"})
    (folder / hf.SAFETENSORS_INDEX).write_text(json.dumps(
        {"metadata": {}, "weight_map": {key: name for name, names in shards.items() for key in names}}))


def copy_export(exports, tmp_path, which):
    out = tmp_path / which
    shutil.copytree(exports["root"] / which, out)
    return out


def assert_holds(folder, cfg, checkpoint):
    """The HF weights in `folder` (as from_hf reads them) are exactly the checkpoint's."""
    expected, found = hf.hf_state_dict(cfg, checkpoint), hf.read_hf_weights(str(folder))
    assert found.keys() == expected.keys()
    for key, value in expected.items():
        np.testing.assert_array_equal(found[key], value, err_msg=key)


def test_to_hf_over_an_earlier_sharded_export_leaves_exactly_the_new_one(exports, tmp_path):
    """Bug caught (issue 29): the new config.json and model.safetensors written beside the old index, shards and
    pytorch_model.bin, exit 0, and from_hf then reading the old step's weights through the index."""
    out = copy_export(exports, tmp_path, "sharded")
    (out / "pytorch_model.bin").write_bytes(b"an older export's weights")
    assert hf.main(["to_hf", "--model", exports["config"], "--checkpoint", exports["new"], "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["config.json", hf.SAFETENSORS]
    assert_holds(out, exports["cfg"], exports["new"])


class Terminal:
    """sys.stdin as a terminal (`tty`) or not, answering `answer` to input()."""

    def __init__(self, monkeypatch, tty, answer=None):
        self.asked = []
        monkeypatch.setattr(sys, "stdin", self)
        monkeypatch.setattr("builtins.input", lambda question: self.asked.append(question) or answer)
        self.tty = tty

    def isatty(self):
        return self.tty


def test_to_hf_into_a_folder_of_other_files_asks_first_and_keeps_them(exports, tmp_path, capsys, monkeypatch):
    """Without a terminal: one error line naming a file and --yes, nothing written; at a terminal: a question,
    "n" writes nothing, "y" writes the export among the files; --yes writes without asking. The user's files
    stay; an earlier export's index there goes. Bugs caught: writing among the user's files unasked; a "no"
    that writes all the same; a stale index left beside the new model.safetensors."""
    out = tmp_path / "project"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / hf.SAFETENSORS_INDEX).write_text("{}")
    command = ["to_hf", "--model", exports["config"], "--checkpoint", exports["new"], "--out", str(out)]
    Terminal(monkeypatch, tty=False)
    assert hf.main(command) == 1
    line = error_line(capsys.readouterr().err)
    assert "notes.txt" in line and "--yes" in line and f"--out {out}" in line, line
    assert sorted(os.listdir(out)) == [hf.SAFETENSORS_INDEX, "notes.txt"]
    terminal = Terminal(monkeypatch, tty=True, answer="n")
    assert hf.main(command) == 1 and "nothing was written" in capsys.readouterr().out
    assert "notes.txt" in terminal.asked[0] and sorted(os.listdir(out)) == [hf.SAFETENSORS_INDEX, "notes.txt"]
    Terminal(monkeypatch, tty=True, answer="y")
    assert hf.main(command) == 0
    assert sorted(os.listdir(out)) == ["config.json", hf.SAFETENSORS, "notes.txt"]
    assert (out / "notes.txt").read_text() == "mine"
    assert_holds(out, exports["cfg"], exports["new"])
    (out / "config.json").unlink()
    terminal = Terminal(monkeypatch, tty=False)
    assert hf.main(command + ["--yes"]) == 0 and not terminal.asked
    assert sorted(os.listdir(out)) == ["config.json", hf.SAFETENSORS, "notes.txt"]


def error_line(stderr):
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def add_single_file(folder):
    """A model.safetensors beside the index and its shards, as an unsharded export over a sharded one leaves it."""
    from safetensors.numpy import load_file, save_file
    state = {}
    for shard_file in folder.glob("model-*.safetensors"):
        state.update(load_file(str(shard_file)))
    save_file(state, str(folder / hf.SAFETENSORS))


def add_unlisted_shard(folder):
    shutil.copy(folder / "model-00002-of-00002.safetensors", folder / "model-00003-of-00003.safetensors")


def move_a_key_in_the_index(folder):
    index = json.loads((folder / hf.SAFETENSORS_INDEX).read_text())
    key = sorted(k for k, v in index["weight_map"].items() if v == "model-00001-of-00002.safetensors")[0]
    index["weight_map"][key] = "model-00002-of-00002.safetensors"
    (folder / hf.SAFETENSORS_INDEX).write_text(json.dumps(index))


def cut_in_half(path):
    os.truncate(path, os.path.getsize(path) // 2)


# (which export, the damage, what the error line says)
DAMAGES = {
    "single file beside an index": ("sharded", add_single_file, "holds both model.safetensors and"),
    "shard the index does not list": ("sharded", add_unlisted_shard, "model-00003-of-00003.safetensors, which"),
    "shard missing": ("sharded", lambda f: (f / "model-00002-of-00002.safetensors").unlink(),
                      "lists model-00002-of-00002.safetensors, which is missing"),
    "index maps a key to the wrong shard": ("sharded", move_a_key_in_the_index, "which model.safetensors.index"),
    "index cut short": ("sharded", lambda f: cut_in_half(f / hf.SAFETENSORS_INDEX), "is not valid JSON"),
    "model.safetensors cut short": ("single", lambda f: cut_in_half(f / hf.SAFETENSORS), "cut short or damaged"),
    "config.json cut short": ("single", lambda f: cut_in_half(f / "config.json"), "config.json is not valid JSON"),
}


@pytest.mark.parametrize("case", DAMAGES)
def test_from_hf_refuses_a_folder_whose_files_disagree_or_are_damaged_in_one_line(exports, tmp_path, capsys, case):
    """Each is one error line naming the file and exit 1, before anything is written (no config, no model_path).
    Bugs caught: reading the index first and ignoring a model.safetensors beside it (or the reverse), a shard
    of another export taken in, a tensor read from a shard the index does not send it to; tracebacks
    (SafetensorError, OSError) for a cut-short weights file or config.json."""
    which, damage, message = DAMAGES[case]
    folder = copy_export(exports, tmp_path, which)
    damage(folder)
    config, model_path = tmp_path / "configs" / "neo.json", tmp_path / "neo_run"
    assert hf.main(["from_hf", str(folder), "--config", str(config), "--model_path", str(model_path)]) == 1
    line = error_line(capsys.readouterr().err)
    assert message in line and str(folder) in line, line
    assert not config.exists() and not model_path.exists()


def test_to_hf_on_a_full_disk_is_one_line_and_leaves_the_earlier_export(exports, tmp_path, capsys, monkeypatch):
    """The files are written beside --out first: a write that fails there (ENOSPC) is one error line, and --out
    still holds the earlier export, whole. Bug caught: an OSError traceback, or the old files removed first."""
    import errno
    import safetensors.numpy
    out = copy_export(exports, tmp_path, "single")
    before = {name: (out / name).read_bytes() for name in os.listdir(out)}

    def disk_full(state, path, metadata=None):
        open(path, "wb").write(b"\0" * 10)  # a part written, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(safetensors.numpy, "save_file", disk_full)
    assert hf.main(["to_hf", "--model", exports["config"], "--checkpoint", exports["new"], "--out", str(out)]) == 1
    line = error_line(capsys.readouterr().err)
    assert "No space left on device" in line and f"{out} was not touched" in line, line
    assert {name: (out / name).read_bytes() for name in os.listdir(out)} == before
    assert sorted(os.listdir(tmp_path)) == ["single"]  # no staging folder left beside it
