"""The data tools as a user meets them: create_tfrecords writes a dataset config that main.py uses, and
every data error main.py can hit (at config load, at pipeline build time inside the runner's graph,
or while training reads the data) is one `error:` line on stderr with exit code 1, not a traceback."""
import json
import os

import pytest
import tensorflow as tf

from data import create_tfrecords as ct
from data.create_tfrecords import output_file_name
from workspace import run_main_in_process

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZER = os.path.join(REPO, "data", "tokenizers", "stdlib-bpe-4096.json")


def unrecorded(line: str) -> bool:
    """The warning for a dataset that records no tokenizer (schema.py's warn_unrecorded_tokenizers): the
    hand-made files here have no manifest, and their configs no tokenizer; once a dataset and process."""
    return line.startswith("warning: dataset ") and " records no tokenizer (" in line


def write_records(path, documents):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for tokens in documents:
            feature = tf.train.Feature(int64_list=tf.train.Int64List(value=tokens))
            writer.write(tf.train.Example(features=tf.train.Features(feature={"text": feature})).SerializeToString())


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """configs/ with dataset configs written by create_tfrecords (train and eval splits) and model configs."""
    root = tmp_path_factory.mktemp("datacli")
    registry = root / "configs" / "dataset_configs"
    for split, count in (("train", 12), ("eval", 4)):
        text = root / f"{split}_text"
        text.mkdir()
        for index in range(count):
            body = "".join(f"def {split}_{index}_{line}(x):\n    return x * {line}\n" for line in range(4 + index))
            (text / f"doc_{index:02d}.txt").write_text(body, encoding="utf-8")
        assert ct.main(["--input_dir", str(text), "--name", split, "--output_dir", str(root / split),
                        "--encoder_path", TOKENIZER, "--minimum_size", "20", "--quiet", "--split", split,
                        "--write_dataset_config", "tiny", "--dataset_config_dir", str(registry)]) == 0
    # A registry entry that under-states the vocabulary, so the model's n_vocab (64) passes the config check.
    entry = json.loads((registry / "tiny.json").read_text())
    (registry / "small_vocab.json").write_text(json.dumps(dict(entry, n_vocab=64)))
    # Ids in range in the first file (all the build-time check reads), beyond n_vocab in the second.
    (root / "late").mkdir()
    write_records(root / "late" / output_file_name("late", 0, 8), [[2 + (d + p) % 60 for p in range(40)] for d in range(8)])
    write_records(root / "late" / output_file_name("late", 1, 64), [[100] * 40] * 64)
    (registry / "late.json").write_text(json.dumps({"n_vocab": 64, "path": str(root / "late" / "late_*.tfrecords")}))
    # A record whose payload (not its length) is damaged, in the file after the one checked at build time.
    (root / "flip").mkdir()
    write_records(root / "flip" / output_file_name("flip", 0, 8), [[2 + (d + p) % 60 for p in range(40)] for d in range(8)])
    damaged = root / "flip" / output_file_name("flip", 1, 64)
    write_records(damaged, [[7] * 40] * 64)
    data = bytearray(damaged.read_bytes())
    record = len(data) // 64  # all records have the same size: 12-byte header, payload, 4-byte checksum
    data[32 * record + 12 + 5] ^= 0xFF  # inside the payload of record 32: the lengths stay right
    damaged.write_bytes(bytes(data))
    (registry / "flip.json").write_text(json.dumps({"n_vocab": 64, "path": str(root / "flip" / "flip_*.tfrecords")}))
    # A truncated file.
    (root / "cut").mkdir()
    cut = root / "cut" / output_file_name("cut", 0, 8)
    write_records(cut, [[5] * 50] * 8)
    with open(cut, "r+b") as handle:
        handle.truncate(os.path.getsize(cut) - 30)
    (registry / "cut.json").write_text(json.dumps({"n_vocab": 4096, "path": str(root / "cut" / "cut_*.tfrecords")}))
    return root


def model_config(workspace, name, **changes):
    model = dict(n_layer=1, n_embd=16, n_head=2, n_vocab=4096, n_ctx=16, train_batch_size=4, train_steps=2,
                 steps_per_checkpoint=10, lr=1e-3, datasets=[["tiny", 2, "documents_random", 1.0]],
                 model_path=str(workspace / f"run_{name}"))
    model.update(changes)
    path = workspace / "configs" / f"{name}.json"
    path.write_text(json.dumps(model))
    return str(path)


def main_in_process(capsys, *args):
    """main.py's main() in this process (TensorFlow is already started, so this is fast); (code, stdout, stderr)."""
    import main
    code = main.main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_written_dataset_config_serves_check_dataset(workspace, capsys):
    config = json.loads((workspace / "configs" / "dataset_configs" / "tiny.json").read_text())
    # relative to the folder holding configs/, which is what models/config.py resolves them against
    assert (config["path"], config["eval_path"]) == ("train/train_*.tfrecords", "eval/eval_*.tfrecords")
    code, out, err = main_in_process(capsys, "--model", model_config(workspace, "ok"), "--check_dataset")
    assert code == 0, err
    assert "tiny (train)" in out and "tiny (eval)" in out
    assert "token ids" in out and "decoded sample: 'def train_0_0" in out


@pytest.mark.parametrize("name, changes, extra, expected", [
    ("no_config", dict(datasets=[["nowhere", 2, "documents_random", 1.0]]), [], "dataset 'nowhere' has no config at"),
    ("stitch", dict(n_ctx=512, datasets=[["tiny", 1, "documents_random", 1.0]]), [], "stitch 1 * shortest document"),
    ("vocab_at_build", dict(n_vocab=64, datasets=[["small_vocab", 2, "documents_random", 1.0]]), [],
     "outside the model's vocabulary (0 <= id < n_vocab = 64)"),
    ("truncated", dict(datasets=[["cut", 1, "documents_random", 1.0]]), ["--check_dataset"], "corrupt tfrecords file"),
    ("truncated_in_training", dict(datasets=[["cut", 1, "documents_random", 1.0]]), [], "corrupt tfrecords file"),
    ("damaged_check", dict(n_vocab=64, datasets=[["flip", 1, "documents_fixed", 1.0]]), ["--check_dataset"],
     "corrupt tfrecords file"),  # found while training reads it: see test_data_inputs (same except clause as below)
])
def test_data_errors_are_one_line_with_exit_code_1(workspace, capsys, name, changes, extra, expected):
    code, out, err = main_in_process(capsys, "--model", model_config(workspace, name, **changes), *extra)
    lines = [line for line in err.splitlines() if line.strip() and not unrecorded(line)]
    assert code == 1, (out, err)
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], err
    if name != "truncated_in_training":  # refused before training starts: no model_path made (the stitch error
        assert not (workspace / f"run_{name}").exists()  # left an empty one)


def test_bad_ids_found_while_training_are_one_line_from_the_real_cli(workspace):
    """The first file passes the build-time check; a batch from the second fails the in-graph one."""
    config = model_config(workspace, "late", n_vocab=64, train_steps=200, train_batch_size=16,
                          datasets=[["late", 1, "documents_fixed", 1.0]])
    result = run_main_in_process("--model", config, "--log_every", "1000")
    lines = [line for line in result.stderr.splitlines() if line.strip() and not unrecorded(line)]
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: a batch from ") and "outside the model's vocabulary" in lines[0]
