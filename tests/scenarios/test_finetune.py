"""Fine-tuning a released GPT-Neo on your own text (docs/finetune.md): the model folder imported with its
tokenizer, the text encoded with that tokenizer, eval and samples before and after, the export back to HF; and
the tokenizer records that refuse data encoded with another tokenizer than the model's.

The released folders are made here, nothing is downloaded: a GPT-2-style byte-level BPE tokenizer trained on
generated text (tests/corpus.py) and saved as GPT-2's files are (vocab.json, merges.txt, <|endoftext|> the last
id), beside random weights that transformers itself saves (GPTNeoForCausalLM.save_pretrained): a small model, and
one of GPT-Neo 125M's real config."""
import json
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow.compat.v1 as tf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

import corpus
import main
from config import load_config
from schema import ConfigError, TokenizerId
from data.create_tfrecords import create_tfrecords
from data.tokenizer import load_tokenizer
from tools import hf
from workspace import REPO, TOKENIZER

torch = pytest.importorskip("torch")  # transformers writes the released folders with PyTorch
from transformers import GPTNeoConfig, GPTNeoForCausalLM  # noqa: E402

EOS = "<|endoftext|>"

# EleutherAI/gpt-neo-125M's config.json, as released.
NEO_125M = {
    "activation_function": "gelu_new", "architectures": ["GPTNeoForCausalLM"], "attention_dropout": 0,
    "attention_layers": ["global", "local"] * 6, "attention_types": [[["global", "local"], 6]],
    "bos_token_id": 50256, "embed_dropout": 0, "eos_token_id": 50256, "gradient_checkpointing": False,
    "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": None, "layer_norm_epsilon": 1e-05,
    "max_position_embeddings": 2048, "model_type": "gpt_neo", "num_heads": 12, "num_layers": 12,
    "resid_dropout": 0, "summary_activation": None, "summary_first_dropout": 0.1, "summary_proj_to_labels": True,
    "summary_type": "cls_index", "summary_use_proj": True, "transformers_version": "4.9.0.dev0", "use_cache": True,
    "vocab_size": 50257, "window_size": 256}


def write_gpt2_style_tokenizer(folder, vocab_size: int) -> None:
    """A byte-level BPE (GPT-2's scheme) trained on generated text, saved as GPT-2's tokenizer files are in a
    released GPT-Neo folder: vocab.json with <|endoftext|> as the last id, merges.txt, special_tokens_map.json and
    tokenizer_config.json naming GPT2Tokenizer."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 1, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    backend.train_from_iterator(corpus.documents("train") + corpus.documents("eval"), trainer)
    os.makedirs(folder, exist_ok=True)
    backend.model.save(str(folder))
    vocab = json.loads(open(os.path.join(folder, "vocab.json"), encoding="utf-8").read())
    vocab[EOS] = len(vocab)
    assert len(vocab) == vocab_size
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    special = {"bos_token": EOS, "eos_token": EOS, "unk_token": EOS}
    with open(os.path.join(folder, "special_tokens_map.json"), "w") as f:
        json.dump(special, f)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({**special, "add_prefix_space": False, "model_max_length": 2048, "tokenizer_class": "GPT2Tokenizer"}, f)


def write_released_model(folder, config: dict, seed: int = 0) -> None:
    """Random weights of the GPT-Neo `config` (an HF config.json's keys), saved by transformers."""
    torch.manual_seed(seed)
    GPTNeoForCausalLM(GPTNeoConfig(**config)).save_pretrained(str(folder))


SMALL = dict(vocab_size=512, max_position_embeddings=64, hidden_size=64, num_layers=2, num_heads=4,
             attention_types=[[["global", "local"], 1]], window_size=16, activation_function="gelu_new",
             embed_dropout=0.0, attention_dropout=0.0, resid_dropout=0.0, bos_token_id=511, eos_token_id=511)


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A small released model folder (weights and a 512-token GPT-2-style tokenizer), and text to fine-tune on."""
    root = tmp_path_factory.mktemp("released")
    write_gpt2_style_tokenizer(root / "neo", 512)
    write_released_model(root / "neo", SMALL)
    corpus.write_documents(root / "my_text", "eval_large")  # 5 documents: 4 train, 1 held out
    return root


def workspace(tmp_path, **base_changes) -> str:
    """tmp_path/configs with a dataset registry of its own and a base config: configs/finetune.json, as shipped,
    but for `base_changes`. Returns the base config's path."""
    (tmp_path / "configs" / "dataset_configs").mkdir(parents=True)
    base = json.loads(open(os.path.join(REPO, "configs", "finetune.json")).read())
    base.update(base_changes)
    path = tmp_path / "configs" / "base.json"
    path.write_text(json.dumps(base))
    return str(path)


def eval_line(output: str) -> dict:
    """loss, perplexity and bits per byte of --eval's line."""
    match = re.search(r"eval at step (\d+): loss ([\d.]+) \| perplexity ([\d.]+) \| bits per byte ([\d.]+)", output)
    assert match, output
    return dict(step=int(match.group(1)), loss=float(match.group(2)), perplexity=float(match.group(3)),
                bits_per_byte=float(match.group(4)))


# ----------------------------------------------------------------------------------------------------
# The tokenizer's identity


def test_tokenizer_id_is_the_vocabulary_and_merges_whichever_files_hold_them(released, tmp_path):
    """The same tokenizer read from vocab.json + merges.txt, from the tokenizer.json transformers saves, and
    from to_hf's export has one tokenizer_id; a vocabulary with two merges swapped has another.
    Bug caught: a hash of the tokenizer's JSON text (what the manifest kept), which differs between the files."""
    from transformers import GPT2TokenizerFast
    from data.tokenizer import vocabulary_sha256
    folder = released / "neo"
    original = load_tokenizer(str(folder), pretrained=True)
    GPT2TokenizerFast.from_pretrained(str(folder)).save_pretrained(str(tmp_path / "resaved"))
    (tmp_path / "whole").mkdir()
    os.replace(tmp_path / "resaved" / "tokenizer.json", tmp_path / "whole" / "tokenizer.json")  # that file alone
    whole = load_tokenizer(str(tmp_path / "whole"), pretrained=True)
    direct = Tokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt")))
    direct.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    direct.decoder = decoders.ByteLevel()
    direct.add_special_tokens([EOS])
    direct.save(str(tmp_path / "ours.json"))  # as data/train_tokenizer.py writes one
    ours = load_tokenizer(str(tmp_path / "ours.json"))
    assert original.backend.to_str() != ours.backend.to_str()  # the JSON differs ...
    assert original.tokenizer_id == whole.tokenizer_id == ours.tokenizer_id  # ... the tokenizer does not
    assert original.tokenizer_id.size == 512 and original.eos_id == 511

    merges = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
    first = 1 if merges[0].startswith("#") else 0
    merges[first], merges[first + 1] = merges[first + 1], merges[first]
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    (swapped / "merges.txt").write_text("\n".join(merges) + "\n", encoding="utf-8")
    (swapped / "vocab.json").write_bytes((folder / "vocab.json").read_bytes())
    assert vocabulary_sha256(load_tokenizer(str(swapped), pretrained=True).backend) != original.tokenizer_id.sha256


def test_a_dataset_of_another_tokenizer_is_refused_by_every_job(released, tmp_path, capsys):
    """The issue's case: a model imported with its tokenizer, trained on data encoded with the stdlib tokenizer.
    Training, --eval, --predict and --check_dataset each refuse it in one error line naming both tokenizers, and
    from_hf refuses to write such a config at all.
    Bug caught: check_tokenizer_ids not called when a config is read (training ran; --check_dataset passed)."""
    base = workspace(tmp_path, train_steps=1)
    registry = tmp_path / "configs" / "dataset_configs"
    (registry / "stdlib.json").write_text(open(os.path.join(REPO, "configs", "dataset_configs", "stdlib.json")).read())
    config = str(tmp_path / "configs" / "neo.json")
    assert hf.main(["from_hf", str(released / "neo"), "--config", config, "--model_path", str(tmp_path / "run"),
                    "--base_config", base]) == 1
    err = capsys.readouterr().err
    neo_id = str(load_tokenizer(str(released / "neo"), pretrained=True).tokenizer_id)[:12]
    assert err.count("\n") == 1 and err.startswith("error: dataset 'stdlib' was encoded with tokenizer 250c64ee799c")
    assert neo_id in err and "--tokenizer_from" in err
    assert not os.path.exists(config) and not os.path.exists(tmp_path / "run" / "checkpoint")

    raw = json.loads(open(base).read())
    raw.update(tokenizer_id=load_tokenizer(str(released / "neo"), pretrained=True).tokenizer_id.to_json(),
               model_path=str(tmp_path / "run"))
    (tmp_path / "configs" / "neo.json").write_text(json.dumps(raw))  # written by hand, say
    for job in ([], ["--eval"], ["--predict"], ["--check_dataset"]):
        assert main.main(["--model", config] + job) == 1, job
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "dataset 'stdlib' was encoded with tokenizer 250c64ee799c" in err, job
        assert f"neo.json's model uses tokenizer {neo_id}" in err, job


def test_a_dataset_config_that_records_no_tokenizer_warns_once(tmp_path, capsys):
    """A dataset config with nothing that records its tokenizer (no tokenizer_id key, no tokenizer_path, no
    create_tfrecords manifest beside its files) cannot be checked: one warning per dataset and process, naming
    the model's tokenizer when it is known; none for a dataset whose tokenizer_path says it.
    Bug caught: the warning on every config read (three lines here)."""
    from schema import warn_unrecorded_tokenizers
    registry = tmp_path / "configs" / "dataset_configs"
    registry.mkdir(parents=True)
    (registry / "old.json").write_text(json.dumps({"n_vocab": 4096, "path": str(tmp_path / "x_*.tfrecords")}))
    (registry / "read.json").write_text(json.dumps({"n_vocab": 4096, "path": str(tmp_path / "y_*.tfrecords"),
                                                    "tokenizer_path": TOKENIZER}))
    model = dict(n_layer=1, n_embd=32, n_head=4, n_vocab=4096, n_ctx=16, datasets=[["read"], ["old"]],
                 model_path=str(tmp_path), tokenizer_id=load_tokenizer(TOKENIZER).tokenizer_id.to_json())
    (tmp_path / "configs" / "model.json").write_text(json.dumps(model))
    for _ in range(3):
        warn_unrecorded_tokenizers(load_config(str(tmp_path / "configs" / "model.json")))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning: dataset 'old' records no tokenizer (no tokenizer_id key, "
                                                   "no create_tfrecords manifest beside its files, no tokenizer_path)")
    assert "not checked against the model's (the config's model uses tokenizer 250c64ee799c" in err


def test_check_dataset_fails_when_the_tokenizer_file_is_not_the_one_that_encoded_the_data(released, tmp_path, capsys):
    """A dataset config whose tokenizer_path was pointed at another tokenizer after encoding: --check_dataset
    decodes with the file, so it fails, naming the file's tokenizer and the recorded one.
    Bug caught: --check_dataset passing beside a garbled sample."""
    base = workspace(tmp_path)
    registry = tmp_path / "configs" / "dataset_configs"
    create_tfrecords(input_dir=str(released / "my_text"), output_dir=str(tmp_path / "data"), name="mine",
                     tokenizer=load_tokenizer(str(released / "neo"), pretrained=True), minimum_size=1,
                     show_progress=False)
    from data.create_tfrecords import write_dataset_config
    write_dataset_config("mine", str(tmp_path / "data"), "mine", load_tokenizer(str(released / "neo"), pretrained=True),
                         "train", str(registry), note_missing_split=False)
    raw = json.loads(open(base).read())
    (tmp_path / "configs" / "model.json").write_text(json.dumps(
        {**raw, "n_vocab": 4096, "datasets": [["mine", 16, "documents_random", 1.0]], "model_path": str(tmp_path / "r")}))
    assert main.main(["--model", str(tmp_path / "configs" / "model.json"), "--check_dataset"]) == 0
    assert "dataset check passed" in capsys.readouterr().out

    entry = json.loads((registry / "mine.json").read_text())
    (registry / "mine.json").write_text(json.dumps({**entry, "tokenizer_path": TOKENIZER, "tokenizer_is_pretrained": False}))
    assert main.main(["--model", str(tmp_path / "configs" / "model.json"), "--check_dataset"]) == 1
    out, err = capsys.readouterr()
    assert "dataset check passed" not in out
    assert err.startswith(f"error: mine's tokenizer_path {TOKENIZER} is tokenizer 250c64ee799c") and err.count("\n") == 1


def test_from_hf_refuses_tfrecords_encoded_with_another_tokenizer(released, tmp_path, capsys):
    """--tokenizer_dataset registers tfrecords as the HF folder's tokenizer's: the create_tfrecords manifest
    beside them says what encoded them, and another tokenizer is one error line; nothing is registered.
    Bug caught: the issue's from_hf, which registered stdlib-encoded data as the model's."""
    base = workspace(tmp_path)
    create_tfrecords(input_dir=str(released / "my_text"), output_dir=str(tmp_path / "data"), name="mine",
                     encoder_path=TOKENIZER, minimum_size=1, show_progress=False)
    command = ["from_hf", str(released / "neo"), "--config", str(tmp_path / "configs" / "neo.json"), "--model_path",
               str(tmp_path / "run"), "--base_config", base, "--tokenizer_dataset", "mine", "--data_path",
               str(tmp_path / "data" / "mine_*.tfrecords")]
    assert hf.main(command) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was encoded with tokenizer 250c64ee799c (4096 tokens)" in err
    assert not os.listdir(tmp_path / "configs" / "dataset_configs") and not (tmp_path / "configs" / "neo.json").exists()


def test_from_hf_refuses_a_model_whose_end_of_text_is_not_its_tokenizers(released, tmp_path, capsys):
    """A folder whose config.json ends texts with another id than its tokenizer's <|endoftext|>: samples would
    not stop where the encoded documents end. One error line naming both ids; nothing is written.
    Bug caught: imported_config not comparing them (the config was written, and refused on every later read)."""
    folder = tmp_path / "neo"
    shutil.copytree(released / "neo", folder)
    hf_config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**hf_config, "eos_token_id": 3}))
    base = workspace(tmp_path)
    config = tmp_path / "configs" / "neo.json"
    assert hf.main(["from_hf", str(folder), "--config", str(config), "--model_path", str(tmp_path / "run"),
                    "--base_config", base, "--text_dir", str(released / "my_text")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: the model's end-of-text id is 3, but its tokenizer's")
    assert "is 511:" in err
    assert not config.exists() and not (tmp_path / "run").exists()


def count_variable_shapes(monkeypatch) -> list:
    """gpt.variable_shapes counted: the list of the configs it was called with (each call builds the model's graph)."""
    from models import gpt
    calls, read = [], gpt.variable_shapes
    monkeypatch.setattr(gpt, "variable_shapes", lambda cfg: calls.append(cfg) or read(cfg))
    return calls


# ----------------------------------------------------------------------------------------------------
# The path end to end


@pytest.mark.slow
def test_a_fine_tune_lowers_eval_loss_on_the_new_text(released, tmp_path, capsys):
    """docs/finetune.md's commands on a small released model: from_hf --text_dir encodes the text with the
    folder's tokenizer (held-out file apart) into a dataset read as the base config's entry is; --eval and
    --predict before; the fine-tune with --train_steps and --lr (recorded in run_info.json); --eval after, lower;
    --predict after; to_hf back, with the folder's tokenizer.
    Bugs caught: the HF weights not in the step-0 checkpoint, the base entry's stitch and mode replaced by a
    bare id, absolute paths in the dataset config, --lr not applied."""
    base = workspace(tmp_path, eval_batch_size=4, eval_steps=5, train_batch_size=4, max_new_tokens=8)
    config = str(tmp_path / "configs" / "mine.json")
    assert hf.main(["from_hf", str(released / "neo"), "--config", config, "--model_path", str(tmp_path / "run"),
                    "--base_config", base, "--text_dir", str(released / "my_text")]) == 0
    out = capsys.readouterr().out
    assert "held out (1 files)" in out
    cfg = load_config(config)
    tokenizer = load_tokenizer(str(released / "neo"), pretrained=True)
    assert cfg.tokenizer_id == tokenizer.tokenizer_id and cfg.datasets[0].dataset.tokenizer_id == tokenizer.tokenizer_id
    use = cfg.datasets[0]
    assert (use.dataset.id, use.stitch, use.sampling_mode, use.weight) == ("mine", 16, "documents_random", 1.0)
    registered = json.loads((tmp_path / "configs" / "dataset_configs" / "mine.json").read_text())
    assert registered["path"] == os.path.join("data", "mine", "train", "mine_*.tfrecords")  # relative: movable
    assert registered["tokenizer_path"] == str(released / "neo")  # outside the folder of configs/: absolute

    from safetensors.numpy import load_file
    np.testing.assert_array_equal(tf.train.load_variable(str(tmp_path / "run"), "gpt2/wte"),
                                  load_file(str(released / "neo" / "model.safetensors"))["transformer.wte.weight"])

    prompt = tmp_path / "prompt.txt"
    prompt.write_text(corpus.documents("eval_large")[-1][:40])
    assert main.main(["--model", config, "--eval"]) == 0
    before = eval_line(capsys.readouterr().out)
    assert before["step"] == 0 and abs(before["loss"] - np.log(512)) < 0.3  # the random HF model's: near uniform
    assert main.main(["--model", config, "--predict", "--prompt", str(prompt), "--temperature", "0"]) == 0
    assert "sample 0 (step 0)" in capsys.readouterr().out

    assert main.main(["--model", config, "--train_steps", "40", "--lr", "0.003", "--log_every", "40"]) == 0
    info = json.loads((tmp_path / "run" / "run_info.json").read_text())
    assert (info["train_steps"], info["lr"], info["warmup_steps"]) == (40, 0.003, 20)
    assert info["starts"][-1]["lr"] == 0.003
    capsys.readouterr()
    assert main.main(["--model", config, "--eval"]) == 0
    after = eval_line(capsys.readouterr().out)
    assert after["step"] == 40
    assert after["loss"] < before["loss"] - 0.5, (before, after)  # measured here: 6.25 -> ~5.0
    assert after["bits_per_byte"] < before["bits_per_byte"] and after["perplexity"] < before["perplexity"]
    assert main.main(["--model", config, "--predict", "--prompt", str(prompt), "--temperature", "0"]) == 0
    assert "sample 0 (step 40)" in capsys.readouterr().out

    assert hf.main(["to_hf", "--model", config, "--out", str(tmp_path / "hf")]) == 0
    exported = load_tokenizer(str(tmp_path / "hf"), pretrained=True)
    assert exported.tokenizer_id == tokenizer.tokenizer_id
    model = GPTNeoForCausalLM.from_pretrained(str(tmp_path / "hf"))
    wte = tf.train.load_variable(str(tmp_path / "run"), "gpt2/wte")
    np.testing.assert_array_equal(model.transformer.wte.weight.detach().numpy(), wte)


@pytest.mark.slow
def test_gpt_neo_125m_imports_encodes_fine_tunes_a_step_and_exports(released, tmp_path, capfd, monkeypatch):
    """GPT-Neo 125M's real shape and config (random weights, saved by transformers) beside a GPT-2-style tokenizer
    folder: from_hf --text_dir with configs/finetune.json's settings, one training step at its full context
    (2048), and to_hf back to a folder transformers loads, with the config as released. One import, one step.
    No 'tokenizer class' warning line anywhere. The import builds the model's graph for its variable shapes once
    (~4 CPU s a build at this size).
    Bugs caught: a wrong mapping at this shape (12 layers alternating global/local, window 256), a context or
    vocabulary not taken from the folder, a tokenizer not recorded; write_checkpoint reading the shapes again
    (`shapes = gpt.variable_shapes(cfg)`)."""
    folder = tmp_path / "gpt-neo-125M"
    folder.mkdir()
    for name in ("vocab.json", "merges.txt", "special_tokens_map.json", "tokenizer_config.json"):
        (folder / name).write_bytes((released / "neo" / name).read_bytes())  # the GPT-2-style tokenizer, 512 tokens
    # The stand-in tokenizer ends a text with its id 511, not GPT-2's 50256: the model's must agree
    released_config = {**NEO_125M, "bos_token_id": 511, "eos_token_id": 511}
    config = GPTNeoConfig(**released_config)
    torch.manual_seed(0)
    GPTNeoForCausalLM(config).save_pretrained(str(folder))
    assert json.loads((folder / "config.json").read_text())["window_size"] == 256
    corpus.write_documents(tmp_path / "my_text", "eval_large")
    base = workspace(tmp_path, train_batch_size=1, eval_steps=0, steps_per_checkpoint=1)
    neo = str(tmp_path / "configs" / "neo125.json")
    shape_reads = count_variable_shapes(monkeypatch)
    assert hf.main(["from_hf", str(folder), "--config", neo, "--model_path", str(tmp_path / "run"),
                    "--base_config", base, "--text_dir", str(tmp_path / "my_text")]) == 0
    assert len(shape_reads) == 1
    cfg = load_config(neo)
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_vocab, cfg.n_ctx, cfg.local_attention_radius) == (
        12, 768, 12, 50257, 2048, 256)
    assert cfg.attention_types == ("global", "local") * 6 and cfg.eos_id == 511
    assert cfg.tokenizer_id == TokenizerId(load_tokenizer(str(folder), pretrained=True).tokenizer_id.sha256, 512)

    assert main.main(["--model", neo, "--train_steps", "1", "--peak_tflops", "1"]) == 0  # MFU's peak not measured
    assert tf.train.latest_checkpoint(str(tmp_path / "run")).endswith("model.ckpt-1")
    assert hf.main(["to_hf", "--model", neo, "--out", str(tmp_path / "hf")]) == 0
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    for key in ("attention_layers", "vocab_size", "max_position_embeddings", "hidden_size", "num_layers",
                "num_heads", "window_size", "activation_function", "eos_token_id"):
        assert written[key] == released_config[key], key
    exported = GPTNeoForCausalLM.from_pretrained(str(tmp_path / "hf"))
    q = tf.train.load_variable(str(tmp_path / "run"), "gpt2/h11/attn/q")
    np.testing.assert_array_equal(exported.transformer.h[11].attn.attention.q_proj.weight.detach().numpy(), q.T)
    assert load_tokenizer(str(tmp_path / "hf"), pretrained=True).tokenizer_id == cfg.tokenizer_id
    out, err = capfd.readouterr()
    assert "tokenizer class" not in out + err


# ----------------------------------------------------------------------------------------------------
# GPT-Neo's own release


def write_neo_release(folder, release: dict, seed: int = 0) -> dict:
    """A mesh-tensorflow release as GPT-Neo's training left it: its config.json, and a checkpoint of bfloat16
    weights (precision bfloat16) with Adam's slots and global_step. Returns the weights, as float32."""
    from models import gpt
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(release))
    shapes = gpt.variable_shapes(hf.config_from_dict({**release, "datasets": [], "model_path": "", "mesh_shape": "all:1",
                                                      "layout": ""}))
    rng = np.random.default_rng(seed)
    weights = {name: rng.normal(0, 0.1, shape).astype(np.float32) for name, shape in shapes.items()}
    graph = tf.Graph()
    with graph.as_default():
        stored = [tf.Variable(tf.cast(value, tf.bfloat16), name=name) for name, value in weights.items()]
        stored += [tf.Variable(tf.zeros(value.shape), name=f"{name}/adam_m") for name, value in weights.items()]
        stored.append(tf.Variable(tf.constant(362000, tf.int64), name="global_step"))
        with tf.Session(graph=graph) as session:
            session.run(tf.global_variables_initializer())
            tf.train.Saver(stored).save(session, str(folder / "model.ckpt"), global_step=362000)
            rounded = {name: session.run(tf.cast(v, tf.float32)) for name, v in zip(weights, stored)}
    return rounded


def test_from_neo_imports_a_mesh_tensorflow_release_in_bfloat16(released, tmp_path, capsys, monkeypatch):
    """GPT-Neo's own release (config.json in GPT-Neo's format, naming its Pile dataset and a gs:// model_path; a
    bfloat16 checkpoint with optimizer slots) becomes our config, with the release's model and the base's
    training settings, and a step-0 float32 checkpoint of exactly its weights, with --tokenizer_from's tokenizer
    recorded and --text_dir encoded with it.
    The model's graph is built once for its variable shapes.
    Bugs caught: the release's training keys, mesh or gs:// path kept, a release value dropped (scale_by_depth,
    the local window); write_checkpoint reading the shapes again (`shapes = gpt.variable_shapes(cfg)`)."""
    release = {"n_head": 4, "n_vocab": 512, "embed_dropout": 0, "lr": 0.0002, "lr_decay": "cosine",
               "warmup_steps": 3000, "beta1": 0.9, "beta2": 0.95, "epsilon": 1e-8, "opt_name": "adam",
               "weight_decay": 0, "train_batch_size": 512, "attn_dropout": 0, "train_steps": 400000,
               "eval_steps": 0, "predict_steps": 1, "res_dropout": 0, "eval_batch_size": 128, "predict_batch_size": 1,
               "iterations": 2500, "n_embd": 64, "datasets": [["pile", None, None, None]],
               "model_path": "gs://neo-models/GPT3_tiny", "n_ctx": 64, "n_layer": 2, "scale_by_depth": False,
               "scale_by_in": False, "attention_types": [[["global", "local"], 1]], "window_size": 16,
               "activation_function": "gelu", "recompute_grad": True, "gradient_clipping": 1.0,
               "tokens_per_mb_per_replica": 2048, "precision": "bfloat16", "padding_id": 511, "eos_id": 511,
               "mesh_shape": "x:64,y:4", "layout": "batch:x,memory_length:y,embd:y"}
    weights = write_neo_release(tmp_path / "GPT3_tiny", release)
    base = workspace(tmp_path)
    config = str(tmp_path / "configs" / "tiny.json")
    shape_reads = count_variable_shapes(monkeypatch)
    assert hf.main(["from_neo", str(tmp_path / "GPT3_tiny"), "--tokenizer_from", str(released / "neo"),
                    "--config", config, "--model_path", str(tmp_path / "run"), "--base_config", base,
                    "--text_dir", str(released / "my_text")]) == 0
    assert len(shape_reads) == 1
    cfg = load_config(config)
    shipped = json.loads(open(base).read())
    assert (cfg.n_layer, cfg.n_embd, cfg.n_ctx, cfg.local_attention_radius, cfg.scale_by_depth) == (2, 64, 64, 16, False)
    assert (cfg.lr, cfg.train_batch_size, cfg.mesh_shape, cfg.model_path, cfg.precision) == (
        shipped["lr"], shipped["train_batch_size"], "all:1", str(tmp_path / "run"), "auto")
    assert cfg.tokenizer_id == load_tokenizer(str(released / "neo"), pretrained=True).tokenizer_id
    checkpoint = tf.train.latest_checkpoint(str(tmp_path / "run"))
    assert checkpoint.endswith("model.ckpt-0")
    for name, value in weights.items():
        np.testing.assert_array_equal(tf.train.load_variable(checkpoint, name), value)
    assert tf.train.load_variable(checkpoint, "gpt2/wte").dtype == np.float32

    with pytest.raises(ConfigError):  # not a release: an HF folder
        hf.from_neo(str(released / "neo"), str(tmp_path / "configs" / "x.json"), str(tmp_path / "x"),
                    str(released / "neo"), base)
