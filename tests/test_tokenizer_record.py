"""runtime/tokenizer_record.py: a model_path records which tokenizer encoded the data its checkpoints trained on
(tokenizer_id.json), so a model trained from scratch, whose config names no tokenizer of its own, cannot be
resumed, evaluated or sampled with another tokenizer's data; and the end-of-text id is part of what is compared
(config/schema.py's TokenizerId.matches and check_tokenizer_ids)."""
import dataclasses
import json
import os
import shutil

import pytest

import corpus
from loading.config import load_config
from config.schema import ConfigError, parse_tokenizer_id
from data.create_tfrecords import create_tfrecords, write_dataset_config
from data.tokenizer import load_tokenizer
from runtime import checkpoints, tokenizer_record
from workspace import TOKENIZER, copy_workspace, run_main_in_process as run_main

STDLIB = load_tokenizer(TOKENIZER).tokenizer_id  # the workspace's data's tokenizer (end-of-text 0)


def record_the_workspace_tokenizer(root) -> None:
    """The workspace's dataset config as create_tfrecords writes one today: with the record of its tokenizer."""
    path = root / "configs" / "dataset_configs" / "tiny.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "tokenizer_id": STDLIB.to_json()}))


def another_tokenizers_dataset(root) -> str:
    """The workspace's training text encoded with another tokenizer (the stdlib one with its first two merges
    swapped: the same vocabulary, another tokenization), registered as dataset 'other'. Returns its file."""
    tokenizer = json.loads(open(TOKENIZER, encoding="utf-8").read())
    merges = tokenizer["model"]["merges"]
    merges[0], merges[1] = merges[1], merges[0]
    path = root / "other-bpe.json"
    path.write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    corpus.write_documents(root / "other_text", "train")
    create_tfrecords(input_dir=str(root / "other_text"), output_dir=str(root / "other"), name="other",
                     encoder_path=str(path), minimum_size=40, show_progress=False)
    write_dataset_config("other", str(root / "other"), "other", load_tokenizer(str(path)), "train",
                         str(root / "configs" / "dataset_configs"), note_missing_split=False)
    return str(path)


def test_a_model_trained_from_scratch_refuses_data_of_another_tokenizer(trained_workspace, tmp_path):
    """Trained from scratch (no tokenizer in its config), the model_path records its data's tokenizer; the config
    pointed at data of another tokenizer is then refused by training, --eval, --predict and --check_dataset in
    one error line naming both, leaving the checkpoints and the record as they were; its own data passes, but
    --predict with its dataset's tokenizer_path pointed at the other tokenizer's file is refused.
    Bugs caught: tokenizer_record.record not called when training starts (no record: everything ran); check
    not called by main.py (training went on to step 2 on the other data); load_for_config not comparing the
    tokenizer file with the dataset's record (prompts encoded with the other tokenizer)."""
    config, model_path = copy_workspace(trained_workspace, tmp_path, train_steps=1)
    shutil.rmtree(model_path)
    record_the_workspace_tokenizer(tmp_path)
    first = run_main("--model", config)
    assert first.returncode == 0, first.stderr
    record_path = os.path.join(model_path, tokenizer_record.RECORD)
    written = json.loads(open(record_path).read())
    assert parse_tokenizer_id(written, record_path) == STDLIB and written["eos_id"] == STDLIB.eos_id == 0
    assert tokenizer_record.RECORD not in first.stderr  # no warning on a model_path it trained itself

    other_path = another_tokenizers_dataset(tmp_path)
    other = load_tokenizer(other_path).tokenizer_id
    assert other.sha256 != STDLIB.sha256 and other.size == STDLIB.size
    model = json.loads(open(config).read())
    other_config = tmp_path / "configs" / "other.json"
    other_config.write_text(json.dumps({**model, "train_steps": 2, "datasets": [["other", 4, "documents_random", 1.0]]}))
    for job in ([], ["--eval"], ["--predict"], ["--check_dataset"]):
        refused = run_main("--model", str(other_config), *job)
        assert refused.returncode == 1, (job, refused.stdout, refused.stderr)
        assert refused.stderr.count("\n") == 1, (job, refused.stderr)
        assert refused.stderr.startswith(f"error: {model_path} was trained on data encoded with tokenizer "
                                         f"{STDLIB.sha256[:12]}"), job
        assert f"the config's tokenizer is {other.sha256[:12]}" in refused.stderr, job
        assert f"--encoder_path {TOKENIZER} ...)" in refused.stderr, job  # the fix: encode with the model's
    assert checkpoints.steps(model_path) == [1] and json.loads(open(record_path).read()) == written
    tokenizer_record.check(load_config(config))  # its own data still passes (test_an_old_model_path_... resumes)

    entry = tmp_path / "configs" / "dataset_configs" / "tiny.json"  # the right record, another tokenizer's file
    entry.write_text(json.dumps({**json.loads(entry.read_text()), "tokenizer_path": other_path}))
    sampled = run_main("--model", config, "--predict")
    assert sampled.returncode == 1 and sampled.stderr.count("\n") == 1, sampled.stderr
    assert sampled.stderr.startswith(f"error: tiny's tokenizer_path {other_path} is tokenizer {other.sha256[:12]}")


def test_an_old_model_path_warns_then_training_records_its_tokenizer(trained_workspace, tmp_path, capsys):
    """A model_path trained before the record (the session's workspace) now given data that records its
    tokenizer: one warning that it cannot be checked, training resumes and records the tokenizer, and the next
    job finds the record (no warning).
    Bug caught: record() writing only into a model_path without checkpoints (an old one warned forever and was
    never protected)."""
    config, model_path = copy_workspace(trained_workspace, tmp_path, train_steps=3)
    record_the_workspace_tokenizer(tmp_path)
    resumed = run_main("--model", config)
    assert resumed.returncode == 0, resumed.stderr
    warnings = [line for line in resumed.stderr.splitlines() if tokenizer_record.RECORD in line]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {model_path} has checkpoints but no "
                                                         f"{tokenizer_record.RECORD}"), resumed.stderr
    assert checkpoints.steps(model_path)[-1] == 3
    assert tokenizer_record.read(model_path) == STDLIB

    tokenizer_record.check(load_config(config))
    assert capsys.readouterr().err == ""


def test_an_end_of_text_id_that_disagrees_is_refused(tmp_path):
    """The same vocabulary with another end-of-text id is another tokenizer: a dataset whose eos_id is not its
    tokenizer's, a config whose eos_id is not its data's tokenizer's, and a model_path trained under end-of-text
    0 given data whose end-of-text is 5 (recorded, or only the config's eos_id beside a record without it) are
    each refused; the model_path's record is never rewritten; a record without the id is compared on the rest.
    Bugs caught: TokenizerId.matches ignoring eos_id; check_tokenizer_ids not comparing a dataset's eos_id with
    its record, or the config's with its model's tokenizer's; data_tokenizer not taking the config's eos_id when
    the data's record lacks one."""
    registry = tmp_path / "configs" / "dataset_configs"
    registry.mkdir(parents=True)
    model_path = tmp_path / "run"
    config = tmp_path / "configs" / "model.json"
    model = dict(n_layer=1, n_embd=32, n_head=4, n_vocab=4096, n_ctx=16, datasets=[["d"]], model_path=str(model_path))

    def configured(record, eos_id, model_eos_id=None):
        (registry / "d.json").write_text(json.dumps({"n_vocab": 4096, "path": "x_*.tfrecords", "tokenizer_path": TOKENIZER,
                                                     "eos_id": eos_id, "tokenizer_id": record}))
        config.write_text(json.dumps(model if model_eos_id is None else {**model, "eos_id": model_eos_id}))
        return load_config(str(config))

    with pytest.raises(ConfigError, match=r"^dataset 'd' sets eos_id 5, but the tokenizer that encoded it \(250c64ee799c "
                                          r"\(4096 tokens, end-of-text 0.*\) ends a document with 0: set eos_id 0"):
        configured(STDLIB.to_json(), 5)
    with pytest.raises(ConfigError, match=r"^model.json has eos_id 5, but dataset 'd' .* end-of-text 0.*: set eos_id to 0"):
        configured(STDLIB.to_json(), 0, model_eos_id=5)

    trained = configured(STDLIB.to_json(), 0)
    assert tokenizer_record.record(trained) == str(model_path / tokenizer_record.RECORD)
    assert tokenizer_record.record(trained) is None  # resumed on the same data: the record stands
    tokenizer_record.check(trained)
    written = (model_path / tokenizer_record.RECORD).read_text()
    same_vocabulary_eos_5 = dataclasses.replace(STDLIB, eos_id=5).to_json()
    without_eos = {"sha256": STDLIB.sha256, "size": STDLIB.size}
    for record in (same_vocabulary_eos_5, without_eos):
        cfg = configured(record, 5)
        for refuses in (tokenizer_record.check, tokenizer_record.record):
            with pytest.raises(ConfigError, match=r"was trained on data encoded with tokenizer 250c64ee799c "
                                                  r"\(4096 tokens, end-of-text 0.*the config's tokenizer is "
                                                  r"250c64ee799c \(4096 tokens, end-of-text 5"):
                refuses(cfg)
    assert (model_path / tokenizer_record.RECORD).read_text() == written

    (model_path / tokenizer_record.RECORD).write_text(json.dumps(without_eos))  # a record without the id
    tokenizer_record.check(configured(same_vocabulary_eos_5, 5))
