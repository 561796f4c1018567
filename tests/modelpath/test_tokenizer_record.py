"""modelpath/tokenizer_record.py: a model_path records which tokenizer encoded the data its checkpoints trained on
(tokenizer_id.json), so a model trained from scratch, whose config names no tokenizer of its own, cannot be
resumed, evaluated or sampled with another tokenizer's data; and the end-of-text id is part of what is compared
(schema.py's TokenizerId.matches and check_tokenizer_ids)."""
import dataclasses
import json
import os
import shutil

import pytest

import corpus
from config import load_config
from schema import ConfigError, parse_tokenizer_id
from data.create_tfrecords import create_tfrecords, write_dataset_config
from data.tokenizer import load_tokenizer
from modelpath import checkpoints, tokenizer_record
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


@pytest.mark.slow
def test_a_model_trained_from_scratch_refuses_data_of_another_tokenizer(trained_workspace, tmp_path):
    """Trained from scratch (no tokenizer in its config), the model_path records its data's tokenizer; the config
    pointed at data of another tokenizer is then refused by training, --eval, --predict and --check_dataset in
    one error line naming both, leaving the checkpoints and the record as they were; its own data passes, but
    --predict with its dataset's tokenizer_path pointed at the other tokenizer's file is refused (twice over: the
    dataset's records disagree when the config is read, and load_for_config compares the file it loads).
    Bugs caught: tokenizer_record.record not called when training starts (no record: everything ran); check
    not called by main.py (training went on to step 2 on the other data)."""
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


@pytest.mark.slow
def test_an_old_model_path_warns_then_training_records_its_tokenizer(trained_workspace, tmp_path, capsys):
    """A model_path trained before the record (a copy of the session's workspace without it) given data that
    records its tokenizer: one warning that it cannot be checked, training resumes and records the tokenizer, and
    the next job finds the record (no warning).
    Bug caught: record() writing only into a model_path without checkpoints (an old one warned forever and was
    never protected)."""
    config, model_path = copy_workspace(trained_workspace, tmp_path, train_steps=3)
    os.remove(os.path.join(model_path, tokenizer_record.RECORD))  # trained before the record
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
        # the key alone records the tokenizer (a tokenizer_path, read, would disagree with a key of end-of-text 5)
        (registry / "d.json").write_text(json.dumps({"n_vocab": 4096, "path": "x_*.tfrecords", "eos_id": eos_id,
                                                     "tokenizer_id": record}))
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


def hand_written_dataset(root, dataset_id: str, tokenizer_path: str, **entry) -> str:
    """tests/corpus.py's train and eval text encoded by create_tfrecords with the tokenizer json at tokenizer_path
    (its manifests beside the files record the tokenizer), registered by a dataset config written by hand in
    GPT-Neo's format: n_vocab, path, eval_path, tokenizer_path, eos_id, padding_id, no tokenizer_id. `entry`
    changes its keys (None drops one). Returns the dataset config's path."""
    tokenizer = load_tokenizer(tokenizer_path)
    for split in ("train", "eval"):
        corpus.write_documents(root / f"{dataset_id}_text" / split, split)
        create_tfrecords(input_dir=str(root / f"{dataset_id}_text" / split), output_dir=str(root / dataset_id / split),
                         name=split, encoder_path=tokenizer_path, minimum_size=40, show_progress=False)
    config = {"n_vocab": tokenizer.vocab_size, "path": f"{dataset_id}/train/train_*.tfrecords",
              "eval_path": f"{dataset_id}/eval/eval_*.tfrecords", "tokenizer_path": tokenizer_path,
              "eos_id": tokenizer.eos_id, "padding_id": tokenizer.padding_id, **entry}
    path = root / "configs" / "dataset_configs" / f"{dataset_id}.json"
    path.write_text(json.dumps({key: value for key, value in config.items() if value is not None}))
    return str(path)


def a_512_token_tokenizer(root) -> str:
    """Another byte-level BPE than the stdlib one, of 512 ids, trained here on tests/corpus.py's text (end-of-text
    0 in both). Returns its json's path."""
    from data.train_tokenizer import train_tokenizer
    corpus.write_documents(root / "tokenizer_text", "train")
    path = str(root / "bpe-512.json")
    train_tokenizer(str(root / "tokenizer_text"), path, 512, show_progress=False)
    return path


def with_datasets(config, path, datasets, **changes) -> str:
    """A copy of the model config at `config` reading `datasets`, written to `path`."""
    path.write_text(json.dumps({**json.loads(open(config).read()), "datasets": datasets, **changes}))
    return str(path)


@pytest.mark.slow
def test_hand_written_dataset_configs_record_the_tokenizer_their_files_and_tokenizer_path_name(trained_workspace,
                                                                                              tmp_path):
    """The issue's case: a dataset config in GPT-Neo's format written by hand (no tokenizer_id) over tfrecords that
    create_tfrecords wrote. A model trained 4 steps on it records its tokenizer in model_path; pointed at another
    such dataset encoded by a 512-id tokenizer, resumed training, --eval, --predict and --check_dataset are each
    refused in one error line naming both tokenizers and the fix, leaving the checkpoints and the record as they
    were. Either record alone refuses it too: the manifests beside the files (no tokenizer_path) and the
    tokenizer_path (no manifest).
    Bugs caught: load_dataset_config taking the tokenizer from the tokenizer_id key only (`tokenizer_id=` the
    key's: no record written, all four jobs ran, as in the issue; first seen as a warning that nothing records
    it); the manifests not read (`for glob in ()`); the tokenizer_path not read (`read = None`: the record has no
    tokenizer file to name in the fix)."""
    config, model_path = copy_workspace(trained_workspace, tmp_path, train_steps=4)
    shutil.rmtree(model_path)
    trained = run_main("--model", config)
    assert trained.returncode == 0, trained.stderr
    assert "warning" not in trained.stderr
    record_path = os.path.join(model_path, tokenizer_record.RECORD)
    written = json.loads(open(record_path).read())
    assert parse_tokenizer_id(written, record_path) == STDLIB and written["eos_id"] == STDLIB.eos_id
    steps = checkpoints.steps(model_path)
    assert steps[-1] == 4

    other_tokenizer = a_512_token_tokenizer(tmp_path)
    other = load_tokenizer(other_tokenizer).tokenizer_id
    assert other.size == 512 and other.sha256 != STDLIB.sha256
    entry = hand_written_dataset(tmp_path, "other", other_tokenizer)
    other_config = with_datasets(config, tmp_path / "configs" / "other.json", [["other", 4, "documents_random", 1.0]],
                                 train_steps=6)
    for job in ([], ["--eval"], ["--predict"], ["--check_dataset"]):
        refused = run_main("--model", other_config, *job)
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1, (job, refused.stdout, refused.stderr)
        assert refused.stderr.startswith(f"error: {model_path} was trained on data encoded with tokenizer "
                                         f"{STDLIB.sha256[:12]} (4096 tokens"), (job, refused.stderr)
        assert f"the config's tokenizer is {other.sha256[:12]} (512 tokens" in refused.stderr, job
        assert f"--encoder_path {TOKENIZER} ...)" in refused.stderr, job  # the fix: encode with the model's
    assert checkpoints.steps(model_path) == steps and json.loads(open(record_path).read()) == written

    registered = json.loads(open(entry).read())
    manifests = [tmp_path / "other" / split / f"{split}.manifest.json" for split in ("train", "eval")]
    kept = [path.read_text() for path in manifests]
    for only in ("manifest", "tokenizer_path"):
        if only == "manifest":
            open(entry, "w").write(json.dumps({k: v for k, v in registered.items() if k != "tokenizer_path"}))
        else:
            open(entry, "w").write(json.dumps(registered))
            for path in manifests:
                path.unlink()
        cfg = load_config(other_config)
        assert {record.kind for record in cfg.datasets[0].dataset.tokenizer_records} == {only}
        with pytest.raises(ConfigError, match=f"was trained on data encoded with tokenizer {STDLIB.sha256[:12]}.*the "
                                              f"config's tokenizer is {other.sha256[:12]}"):
            tokenizer_record.check(cfg)
    for path, text in zip(manifests, kept):
        path.write_text(text)


def test_data_that_records_no_tokenizer_gets_one_warning_naming_what_is_unchecked(trained_workspace, tmp_path):
    """A hand-written dataset config with no tokenizer_id key or tokenizer_path, over tfrecords without a
    create_tfrecords manifest: --check_dataset passes with one warning naming what is missing, whether or not a
    model_path records a tokenizer to compare with (then naming it), and training records nothing.
    Bug caught: the warning only when the model's tokenizer is known (`if reference is None: return`, the old
    rule: no word at all for a model trained from scratch)."""
    for name, recorded in (("fresh", False), ("trained", True)):
        config, model_path = copy_workspace(trained_workspace, tmp_path / name)
        assert tokenizer_record.read(model_path) == STDLIB  # the workspace's data recorded its tokenizer
        if not recorded:
            os.remove(os.path.join(model_path, tokenizer_record.RECORD))
        entry = tmp_path / name / "configs" / "dataset_configs" / "tiny.json"
        entry.write_text(json.dumps({key: value for key, value in json.loads(entry.read_text()).items()
                                     if key != "tokenizer_path"}))
        for split in ("train", "eval"):
            os.remove(tmp_path / name / split / f"{split}.manifest.json")
        checked = run_main("--model", config, "--check_dataset")
        assert checked.returncode == 0 and "dataset check passed" in checked.stdout, checked.stderr
        lines = checked.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            "warning: dataset 'tiny' records no tokenizer (no tokenizer_id key, no create_tfrecords manifest beside "
            "its files, no tokenizer_path), so its tokens are not checked against"), checked.stderr
        assert (f"{model_path} was trained on data encoded with {STDLIB.sha256[:12]}" in lines[0]) == recorded
        if not recorded:
            assert tokenizer_record.record(load_config(config)) is None  # nothing to record
            assert not os.path.exists(os.path.join(model_path, tokenizer_record.RECORD))


def test_records_of_a_datasets_tokenizer_that_disagree_are_refused_when_the_config_is_read(tmp_path):
    """A dataset's tokenizer_path holding another tokenizer than its manifests record, its tokenizer_id key
    another than its manifests, its train and eval files of two tokenizers: each is one error line naming both,
    from main.py before anything is written.
    Bug caught: check_tokenizer_ids not running check_tokenizer_records (all three read, and trained)."""
    from workspace import make_workspace
    config = make_workspace(tmp_path / "ws", train_steps=1)
    root = tmp_path / "ws"
    other_tokenizer = a_512_token_tokenizer(tmp_path)
    other = load_tokenizer(other_tokenizer).tokenizer_id
    entry = root / "configs" / "dataset_configs" / "tiny.json"
    registered = json.loads(entry.read_text())
    hand_written_dataset(root, "mixed", TOKENIZER)  # its eval split encoded again, by the other tokenizer:
    shutil.rmtree(root / "mixed" / "eval")
    create_tfrecords(input_dir=str(root / "mixed_text" / "eval"), output_dir=str(root / "mixed" / "eval"),
                     name="eval", encoder_path=other_tokenizer, minimum_size=40, show_progress=False)
    cases = [
        ({**registered, "tokenizer_path": other_tokenizer},
         f"error: tiny's tokenizer_path {other_tokenizer} is tokenizer {other.sha256[:12]} (512 tokens, end-of-text 0"
         f", {other_tokenizer}), but the create_tfrecords manifest beside its files records that "
         f"{STDLIB.sha256[:12]} (4096 tokens, {root / 'train' / 'train.manifest.json'}) encoded it: point "
         f"tokenizer_path at the tokenizer that encoded it, or encode the text again\n"),
        ({**registered, "tokenizer_path": None, "tokenizer_id": other.to_json()},
         f"error: dataset 'tiny''s config records that tokenizer {other.sha256[:12]} (512 tokens, end-of-text 0, "
         f"{other_tokenizer}) encoded it, but the create_tfrecords manifest beside its files records "
         f"{STDLIB.sha256[:12]} (4096 tokens, {root / 'train' / 'train.manifest.json'}): correct or delete its "
         f"tokenizer_id key in {entry}, or encode the text again with the key's tokenizer\n"),
        (None, f"error: dataset 'mixed' holds files of two tokenizers: {STDLIB.sha256[:12]} (4096 tokens, "
               f"{root / 'mixed' / 'train' / 'train.manifest.json'}) and {other.sha256[:12]} (512 tokens, "
               f"{root / 'mixed' / 'eval' / 'eval.manifest.json'}), as their create_tfrecords manifests record"),
    ]
    for changed, expected in cases:
        model = config
        if changed is not None:
            entry.write_text(json.dumps({key: value for key, value in changed.items() if value is not None}))
        else:
            entry.write_text(json.dumps(registered))
            model = with_datasets(config, root / "configs" / "mixed.json", [["mixed", 4, "documents_random", 1.0]])
        refused = run_main("--model", model)
        assert refused.returncode == 1 and refused.stderr.startswith(expected), (refused.stderr, expected)
        assert refused.stderr.count("\n") == 1 and not os.path.exists(root / "run")
