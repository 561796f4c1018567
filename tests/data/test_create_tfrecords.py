"""create_tfrecords: formats, naming, filtering, resume, bad input and the dataset config."""

import json
import os
import signal

import lm_dataformat
import pytest
import tensorflow as tf

from data import create_tfrecords as ct
from data.errors import DataError
from data.tokenizer import load_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZER_PATH = os.path.join(REPO, "data", "tokenizers", "stdlib-bpe-4096.json")
TOKENIZER = load_tokenizer(TOKENIZER_PATH)


def make_text(index: int, lines: int) -> str:
    return "".join(f"def f{index}_{line}(x):\n    return x + {line}\n" for line in range(lines))


def write_txt_folder(folder, sizes):
    """One .txt document per size; returns the texts in the sorted order the tool reads them."""
    folder.mkdir(parents=True, exist_ok=True)
    texts = []
    for index, lines in enumerate(sizes):
        text = make_text(index, lines)
        (folder / f"doc_{index:03d}.txt").write_text(text, encoding="utf-8")
        texts.append(text)
    return texts


def read_records(path):
    return [list(tf.train.Example.FromString(r).features.feature["text"].int64_list.value) for r in tf.compat.v1.io.tf_record_iterator(str(path))]


def outputs(folder):
    return sorted((name for name in os.listdir(folder) if name.endswith(".tfrecords")), key=ct_natural)


def assert_same_files(folder, other):
    """The same output files, record for record."""
    assert outputs(folder) == outputs(other)
    for name in outputs(folder):
        assert read_records(folder / name) == read_records(other / name)


def ct_natural(name):
    return [int(part) for part in name.rsplit(".", 1)[0].split("_")[1:]]


def run(input_dir, output_dir, **overrides):
    arguments = dict(input_dir=str(input_dir), output_dir=str(output_dir), name="set", encoder_path=TOKENIZER_PATH,
                     minimum_size=1, files_per=3, show_progress=False)
    arguments.update(overrides)
    return ct.create_tfrecords(**arguments)


def test_documents_mode_writes_counted_files_with_separator(tmp_path):
    texts = write_txt_folder(tmp_path / "in", [3, 4, 5, 6, 7, 8, 9])
    summary = run(tmp_path / "in", tmp_path / "out")
    expected = [TOKENIZER.encode(text) + [TOKENIZER.eos_id] for text in texts]
    names = outputs(tmp_path / "out")
    assert names == [ct.output_file_name("set", i, n) for i, n in enumerate([3, 3, 1])]
    written = [tokens for name in names for tokens in read_records(tmp_path / "out" / name)]
    assert written == expected
    assert summary.documents_read == summary.documents_written == summary.examples_written == len(texts)
    assert summary.tokens_written == sum(map(len, expected))
    assert summary.files_written == 3 and "documents read 7" in summary.line()


def test_custom_separator_and_minimum_size(tmp_path):
    texts = write_txt_folder(tmp_path / "in", [1, 10, 2, 12, 1, 15])
    lengths = [len(TOKENIZER.encode(text)) for text in texts]
    minimum = sorted(lengths)[3]  # keeps the longest three
    summary = run(tmp_path / "in", tmp_path / "out", separator=[1, 2], minimum_size=minimum, files_per=100)
    kept = [TOKENIZER.encode(text) + [1, 2] for text, length in zip(texts, lengths) if length >= minimum]
    (name,) = outputs(tmp_path / "out")
    assert read_records(tmp_path / "out" / name) == kept
    assert summary.discarded_short == len(texts) - len(kept)
    assert name == ct.output_file_name("set", 0, len(kept))


def test_jsonl_zst_archive_and_txt_together(tmp_path):
    folder = tmp_path / "in"
    texts = write_txt_folder(folder, [3, 4])
    archive = lm_dataformat.Archive(str(folder / "archive"))
    archived = [make_text(100 + i, 2 + i) for i in range(4)]
    for text in archived:
        archive.add_data(text)
    archive.commit()
    summary = run(folder, tmp_path / "out", files_per=100)
    (name,) = outputs(tmp_path / "out")
    # files are read in sorted path order: "in/archive/..." comes before "in/doc_000.txt"
    expected = [TOKENIZER.encode(t) + [0] for t in archived + texts]
    assert read_records(tmp_path / "out" / name) == expected
    assert summary.documents_read == 6


def test_explicit_glob_reads_other_files_as_plain_text(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.py").write_text(make_text(1, 3), encoding="utf-8")
    (folder / "b.txt").write_text(make_text(2, 3), encoding="utf-8")
    run(folder, tmp_path / "out", glob="*.py")
    (name,) = outputs(tmp_path / "out")
    assert read_records(tmp_path / "out" / name) == [TOKENIZER.encode(make_text(1, 3)) + [0]]


def test_chunks_mode_cuts_each_file_into_windows(tmp_path):
    texts = write_txt_folder(tmp_path / "in", [5, 6, 7, 8])
    n_ctx = 15
    summary = run(tmp_path / "in", tmp_path / "out", mode="chunks", n_ctx=n_ctx, files_per=2)
    for index, name in enumerate(outputs(tmp_path / "out")):
        stream = [t for text in texts[2 * index:2 * index + 2] for t in TOKENIZER.encode(text) + [0]]
        expected = [stream[i:i + n_ctx + 1] for i in range(0, len(stream) - n_ctx, n_ctx + 1)]
        assert read_records(tmp_path / "out" / name) == expected
    assert summary.tokens_written + summary.chunk_tail_tokens_dropped == sum(len(TOKENIZER.encode(t)) + 1 for t in texts)


def test_processes_give_the_same_files(tmp_path):
    write_txt_folder(tmp_path / "in", [3, 4, 5, 6, 7, 8, 9])
    run(tmp_path / "in", tmp_path / "one")
    run(tmp_path / "in", tmp_path / "two", processes=2)
    assert_same_files(tmp_path / "one", tmp_path / "two")


def test_workers_are_forked_with_tensorflow_loaded(tmp_path, monkeypatch):
    """The workers write with TensorFlow: the parent imports it before forking them, so a run pays one
    import (~6 CPU s) instead of one per worker (tests/scenarios/test_bad_inputs.py's killed runs: 13 -> 7 CPU s
    each). Guards that import removed: the workers are made before anything imports TensorFlow."""
    from console import tensorflow_import
    loaded = []

    class Forked(Exception):
        """Stands in for the workers: how often TensorFlow was imported before they were made."""

    def workers(*args, **kwargs):
        raise Forked(len(loaded))

    write_txt_folder(tmp_path / "in", [3, 3, 3, 3])
    monkeypatch.setattr(ct, "Workers", workers)
    monkeypatch.setattr(tensorflow_import, "import_tensorflow", lambda: loaded.append(1))
    with pytest.raises(Forked) as raised:
        run(tmp_path / "in", tmp_path / "out", processes=2)
    assert raised.value.args[0] == 1


def test_resume_keeps_finished_files_and_redoes_the_rest(tmp_path, monkeypatch):
    write_txt_folder(tmp_path / "in", [3, 4, 5, 6, 7, 8, 9])
    out = tmp_path / "out"
    real_write = ct._write_examples

    def crash_on_second_file(examples, output_dir, name, index):
        if index == 1:
            open(ct._temporary_path(output_dir, name, index), "wb").write(b"half-written")
            raise KeyboardInterrupt("simulated crash")
        return real_write(examples, output_dir, name, index)

    monkeypatch.setattr(ct, "_write_examples", crash_on_second_file)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "in", out)
    assert outputs(out) == [ct.output_file_name("set", 0, 3)]
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]  # cleaned on the way out
    first_stat = os.stat(out / outputs(out)[0])

    # a crash that could not clean up (kill -9) leaves the temporary file behind
    open(ct._temporary_path(str(out), "set", 1), "wb").write(b"half-written")
    monkeypatch.setattr(ct, "_write_examples", real_write)
    summary = run(tmp_path / "in", out)
    assert summary.files_kept == 1 and summary.files_written == 2
    assert os.stat(out / outputs(out)[0]).st_mtime_ns == first_stat.st_mtime_ns
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]
    run(tmp_path / "in", tmp_path / "fresh")
    assert_same_files(out, tmp_path / "fresh")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux), where every write fails with ENOSPC")
@pytest.mark.parametrize("processes", [1, 2])
def test_a_full_disk_is_one_line_keeps_the_finished_files_and_resumes(tmp_path, capsys, monkeypatch, processes):
    """The disk fills while the second file is written: TF's own writer, writing through a link to /dev/full,
    gets ENOSPC from the system. One error line naming the folder and the fix, exit 1; the first file stays,
    finished, and nothing else (no temporary, no file under a finished name); a rerun resumes and gives the
    files an uninterrupted run writes. Bug caught (issue 29): a ResourceExhaustedError traceback, also from a
    worker process."""
    write_txt_folder(tmp_path / "in", [3, 4, 5, 6, 7, 8])
    out = tmp_path / "out"
    real_path = ct._temporary_path

    def full_from_the_second_file(output_dir, name, index):
        path = real_path(output_dir, name, index)
        if index >= 1:
            os.symlink("/dev/full", path)
        return path

    monkeypatch.setattr(ct, "_temporary_path", full_from_the_second_file)
    command = ["--input_dir", str(tmp_path / "in"), "--output_dir", str(out), "--name", "set", "--encoder_path",
               TOKENIZER_PATH, "--minimum_size", "1", "--files_per", "2", "--processes", str(processes), "--quiet"]
    assert ct.main(command) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {out}: No space left on device") and "rerun" in lines[0]
    assert sorted(os.listdir(out)) == ["set.manifest.json", ct.output_file_name("set", 0, 2)]
    monkeypatch.setattr(ct, "_temporary_path", real_path)
    assert ct.main(command) == 0
    run(tmp_path / "in", tmp_path / "fresh", files_per=2)
    assert_same_files(out, tmp_path / "fresh")


@pytest.mark.timeout(120)
def test_a_worker_killed_by_the_system_is_one_line_keeps_the_finished_files_and_resumes(tmp_path, capsys, monkeypatch):
    """The system kills a worker (out of memory) while it encodes the third group: one error line naming how it
    ended and the way on, exit 1, the finished files kept, no temporary left; a rerun resumes to the files an
    uninterrupted run writes. Bug caught: the run waited forever (multiprocessing.Pool's lost task)."""
    write_txt_folder(tmp_path / "in", [3, 4, 5, 6, 7, 8])
    out = tmp_path / "out"
    real_work = ct._work_on_group

    def killed_on_the_third_group(item):
        if item[0] == 2:
            open(ct._temporary_path(str(out), "set", 2), "wb").write(b"half-written")
            os.kill(os.getpid(), signal.SIGKILL)
        return real_work(item)

    monkeypatch.setattr(ct, "_work_on_group", killed_on_the_third_group)
    command = ["--input_dir", str(tmp_path / "in"), "--output_dir", str(out), "--name", "set", "--encoder_path",
               TOKENIZER_PATH, "--minimum_size", "1", "--files_per", "2", "--processes", "2", "--quiet"]
    assert ct.main(command) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: a worker process ended") and "SIGKILL" in lines[0], lines
    assert "rerun" in lines[0] and "--processes" in lines[0]
    assert not [name for name in os.listdir(out) if name.endswith(ct.TEMPORARY_SUFFIX)]
    assert set(outputs(out)) <= {ct.output_file_name("set", 0, 2), ct.output_file_name("set", 1, 2)}
    monkeypatch.setattr(ct, "_work_on_group", real_work)
    assert ct.main(command) == 0
    run(tmp_path / "in", tmp_path / "fresh", files_per=2)
    assert_same_files(out, tmp_path / "fresh")


def test_resume_with_other_settings_is_refused(tmp_path):
    write_txt_folder(tmp_path / "in", [3, 4, 5])
    run(tmp_path / "in", tmp_path / "out")
    with pytest.raises(DataError, match="other settings"):
        run(tmp_path / "in", tmp_path / "out", files_per=2)


def assert_no_output(folder):
    assert not os.path.exists(folder) or os.listdir(folder) == []


@pytest.mark.parametrize("case, message", [
    ("missing_folder", "input folder not found"),
    ("empty_folder", "input folder is empty"),
    ("glob_matches_nothing", "matched no files"),
    ("all_too_short", "shorter than --minimum_size"),
    ("all_undecodable", "undecodable"),
    ("missing_tokenizer", "tokenizer file not found"),
])
def test_bad_input_is_one_clear_error_and_leaves_nothing(tmp_path, case, message):
    folder = tmp_path / "in"
    overrides = {}
    if case == "empty_folder":
        folder.mkdir()
    elif case == "glob_matches_nothing":
        write_txt_folder(folder, [3])
        overrides["glob"] = "*.jsonl"
    elif case == "all_too_short":
        write_txt_folder(folder, [1, 1])
        overrides["minimum_size"] = 10_000
    elif case == "all_undecodable":
        folder.mkdir()
        (folder / "a.txt").write_bytes(b"\xff\xfe bad \xc3")
        (folder / "b.txt").write_bytes(b"\x80\x81")
    elif case == "missing_tokenizer":
        write_txt_folder(folder, [3])
        overrides["encoder_path"] = str(tmp_path / "missing.json")
    with pytest.raises(DataError, match=message) as error:
        run(folder, tmp_path / "out", **overrides)
    assert "\n" not in str(error.value)
    assert_no_output(tmp_path / "out")


def test_some_undecodable_documents_are_counted_not_dropped_silently(tmp_path, capsys):
    texts = write_txt_folder(tmp_path / "in", [3, 4])
    (tmp_path / "in" / "zz_bad.txt").write_bytes(b"\xff\xfe")
    summary = run(tmp_path / "in", tmp_path / "out", files_per=100)
    assert summary.undecodable == 1 and summary.documents_written == len(texts)
    assert "undecodable 1" in summary.line()
    assert "zz_bad.txt" in capsys.readouterr().err


def test_cli_success_writes_dataset_config_with_both_paths(tmp_path, capsys):
    write_txt_folder(tmp_path / "train", [3, 4, 5])
    write_txt_folder(tmp_path / "eval", [6])
    common = ["--encoder_path", TOKENIZER_PATH, "--minimum_size", "1", "--quiet", "--write_dataset_config", "tiny",
              "--dataset_config_dir", str(tmp_path / "configs" / "dataset_configs")]
    assert ct.main(["--input_dir", str(tmp_path / "train"), "--name", "tiny", "--output_dir", str(tmp_path / "t")] + common) == 0
    assert "documents read 3 / discarded (too short) 0 / undecodable 0 / written 3" in capsys.readouterr().out
    assert ct.main(["--input_dir", str(tmp_path / "eval"), "--name", "tiny_eval", "--output_dir", str(tmp_path / "e"), "--split", "eval"] + common) == 0
    config = json.loads((tmp_path / "configs" / "dataset_configs" / "tiny.json").read_text())
    assert config == {  # paths relative to the folder holding configs/, as models/config.py resolves them
        "n_vocab": TOKENIZER.vocab_size,
        "path": os.path.join("t", "tiny_*.tfrecords"),
        "eval_path": os.path.join("e", "tiny_eval_*.tfrecords"),
        "tokenizer_is_pretrained": False,
        "tokenizer_path": TOKENIZER_PATH,  # outside the folder holding configs/: absolute
        "eos_id": TOKENIZER.eos_id,
        "padding_id": TOKENIZER.padding_id,
        "tokenizer_id": {"sha256": TOKENIZER.tokenizer_id.sha256, "size": TOKENIZER.vocab_size,
                         "eos_id": TOKENIZER.eos_id, "from": TOKENIZER_PATH},
    }
    dataset = loaded("tiny", tmp_path / "configs" / "dataset_configs")
    assert dataset.tokenizer_id == TOKENIZER.tokenizer_id
    assert tf.io.gfile.glob(dataset.path) and tf.io.gfile.glob(dataset.eval_path)


def write_split(tmp_path, split, name, registry, dataset_id="ds"):
    """Encode a small split into tmp_path/name and register it under ``dataset_id``; returns its glob."""
    folder = tmp_path / f"{name}_text"
    if not folder.exists():
        write_txt_folder(folder, [3, 4])
    run(folder, tmp_path / name, name=name)
    ct.write_dataset_config(dataset_id, str(tmp_path / name), name, TOKENIZER, split, str(registry))
    return str(tmp_path / name / f"{name}_*.tfrecords")


def loaded(dataset_id, registry):
    from config import load_dataset_config
    return load_dataset_config(dataset_id, str(registry))


def test_dataset_config_train_then_eval_keeps_the_train_path_and_loads(tmp_path, capsys):
    """The bug: train then --split eval left path = the eval glob. And every written config must load."""
    registry = tmp_path / "configs" / "dataset_configs"
    train = write_split(tmp_path, "train", "stdlib", registry)
    assert "eval_path is null until the eval split is written" in capsys.readouterr().err
    after_train = loaded("ds", registry)
    assert (after_train.path, after_train.eval_path) == (train, None)
    evaluation = write_split(tmp_path, "eval", "stdlib_eval", registry)
    after_eval = loaded("ds", registry)
    assert (after_eval.path, after_eval.eval_path) == (train, evaluation)
    write_split(tmp_path, "train", "stdlib", registry)  # a rerun of the train split keeps the eval split
    assert (loaded("ds", registry).path, loaded("ds", registry).eval_path) == (train, evaluation)
    assert set(json.loads((registry / "ds.json").read_text())) == {
        "n_vocab", "path", "eval_path", "tokenizer_is_pretrained", "tokenizer_path", "eos_id", "padding_id",
        "tokenizer_id"}
    assert loaded("ds", registry).tokenizer_path == TOKENIZER_PATH and os.path.isfile(loaded("ds", registry).tokenizer_path)


def test_dataset_config_eval_then_train(tmp_path):
    registry = tmp_path / "configs" / "dataset_configs"
    evaluation = write_split(tmp_path, "eval", "held_out", registry)
    assert (loaded("ds", registry).path, loaded("ds", registry).eval_path) == (None, evaluation)
    train = write_split(tmp_path, "train", "main", registry)
    assert (loaded("ds", registry).path, loaded("ds", registry).eval_path) == (train, evaluation)


def test_dataset_config_paths_are_relative_to_the_folder_holding_configs(tmp_path):
    project = tmp_path / "project"
    registry = project / "configs" / "dataset_configs"
    write_txt_folder(tmp_path / "in", [3])
    run(tmp_path / "in", project / "data" / "x", name="x")
    ct.write_dataset_config("x", str(project / "data" / "x"), "x", TOKENIZER, "train", str(registry))
    written = json.loads((registry / "x.json").read_text())
    assert written["path"] == os.path.join("data", "x", "x_*.tfrecords")
    assert written["tokenizer_path"] == TOKENIZER_PATH  # not under project/: absolute
    assert tf.io.gfile.glob(loaded("x", registry).path)
    # for the repository's own configs/dataset_configs the base is the repository root
    assert ct._config_base(ct.DEFAULT_DATASET_CONFIG_DIR) == REPO
    assert ct._portable_path(TOKENIZER_PATH, REPO) == os.path.join("data", "tokenizers", "stdlib-bpe-4096.json")


def test_dataset_config_from_an_earlier_version_with_placeholders_is_repaired(tmp_path):
    registry = tmp_path / "configs" / "dataset_configs"
    train = write_split(tmp_path, "train", "a", registry)
    config = json.loads((registry / "ds.json").read_text())
    config.update(eval_path=config["path"], _placeholders=["eval_path"])
    (registry / "ds.json").write_text(json.dumps(config))
    evaluation = write_split(tmp_path, "eval", "a_eval", registry)
    assert (loaded("ds", registry).path, loaded("ds", registry).eval_path) == (train, evaluation)


def test_dataset_config_refuses_train_and_eval_globs_sharing_files(tmp_path):
    registry = tmp_path / "configs" / "dataset_configs"
    write_txt_folder(tmp_path / "in", [3, 4])
    run(tmp_path / "in", tmp_path / "out", name="x")
    ct.write_dataset_config("ds", str(tmp_path / "out"), "x", TOKENIZER, "train", str(registry))
    run(tmp_path / "in", tmp_path / "out", name="x_eval")  # same folder: x_*.tfrecords matches x_eval_* too
    before = (registry / "ds.json").read_text()
    with pytest.raises(DataError, match="both match 1 files .*own --output_dir") as error:
        ct.write_dataset_config("ds", str(tmp_path / "out"), "x_eval", TOKENIZER, "eval", str(registry))
    assert "\n" not in str(error.value) and (registry / "ds.json").read_text() == before


def test_dataset_config_refuses_another_tokenizer(tmp_path, monkeypatch):
    registry = tmp_path / "configs" / "dataset_configs"
    write_split(tmp_path, "train", "a", registry)
    other = tmp_path / "other.json"
    other.write_text(open(TOKENIZER_PATH).read())
    with pytest.raises(DataError, match="was written for tokenizer"):
        ct.write_dataset_config("ds", str(tmp_path / "a"), "a", load_tokenizer(str(other)), "eval", str(registry))


@pytest.mark.parametrize("case, message", [
    ("missing_folder", "input folder not found"),
    ("empty_folder", "input folder is empty"),
    ("glob_matches_nothing", "matched no files"),
    ("all_too_short", "shorter than --minimum_size"),
    ("all_undecodable", "undecodable"),
    ("missing_tokenizer", "tokenizer file not found"),
    ("bad_dataset_id", "dataset config id must be a plain name"),
    ("bad_separator", "--separator must be a non-empty JSON list"),
    ("truncated_archive", "b.jsonl.zst is truncated (its zstd stream ends inside a frame)"),
])
def test_cli_bad_input_exits_1_with_one_line_and_writes_nothing(tmp_path, capsys, case, message):
    """Bug caught (truncated_archive: a .jsonl.zst cut where a zstd block ends, beside a whole .txt):
    `check_whole(files)` dropped from `create_tfrecords` (the run wrote the documents before the cut and exited 0)."""
    folder = tmp_path / "in"
    args = ["--input_dir", str(folder), "--name", "x", "--output_dir", str(tmp_path / "out"), "--encoder_path", TOKENIZER_PATH,
            "--minimum_size", "1", "--quiet", "--write_dataset_config", "x", "--dataset_config_dir", str(tmp_path / "configs")]
    if case != "missing_folder":
        folder.mkdir()
    if case in ("glob_matches_nothing", "all_too_short", "missing_tokenizer", "bad_dataset_id", "bad_separator"):
        write_txt_folder(folder, [1, 2])
    extra = {
        "glob_matches_nothing": ["--glob", "*.jsonl"], "all_too_short": ["--minimum_size", "10000"],
        "missing_tokenizer": ["--encoder_path", str(tmp_path / "nope.json")], "bad_dataset_id": ["--write_dataset_config", "../x"],
        "bad_separator": ["--separator", "0"],
    }.get(case, [])
    if case == "all_undecodable":
        (folder / "a.txt").write_bytes(b"\xff\xfe bad \xc3")
    if case == "truncated_archive":
        from tests.data.test_documents import zstd_blocks
        write_txt_folder(folder, [2])
        whole, block_ends = zstd_blocks([make_text(index, 2) for index in range(4)])
        (folder / "b.jsonl.zst").write_bytes(whole[:block_ends[1]])
    code = ct.main(args + extra)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], captured.err
    assert_no_output(tmp_path / "out")
    assert not os.path.exists(tmp_path / "configs")


def test_cli_error_is_one_line_and_exit_code_1(tmp_path, capsys):
    code = ct.main(["--input_dir", str(tmp_path / "nowhere"), "--name", "x", "--output_dir", str(tmp_path / "o"),
                    "--encoder_path", TOKENIZER_PATH, "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.startswith("error: input folder not found") and "\n" not in err
    code = ct.main(["--input_dir", str(tmp_path), "--name", "x", "--output_dir", str(tmp_path / "o"),
                    "--encoder_path", TOKENIZER_PATH, "--separator", "[0, 99999]", "--quiet"])
    assert code == 1 and "outside the tokenizer's vocabulary" in capsys.readouterr().err


def test_a_manifests_temporary_left_by_a_killed_writer_is_cleared_by_the_next_run(tmp_path, monkeypatch):
    """The manifest is written through modelpath.files.write_atomically; a writer killed between writing its
    temporary and renaming it (kill -9: no clean-up) leaves `<manifest>.<pid>-<hex>.tmp`, which the next run
    removes, as it removes the fixed `<manifest>.tmp` of earlier versions. Bug caught: the leftover pattern out of
    step with the temporary's name (the temporary stays forever)."""
    import modelpath.files as files
    write_txt_folder(tmp_path / "in", [3, 4, 5])
    out = tmp_path / "out"

    def killed(source, target):
        raise KeyboardInterrupt("killed")
    monkeypatch.setattr(files, "rename", killed)
    monkeypatch.setattr(files, "remove", lambda path: None)  # no clean-up after kill -9
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "in", out)
    (left,) = [n for n in os.listdir(out) if n.endswith(".tmp")]
    assert left.startswith("set.manifest.json.")
    (out / "set.manifest.json.tmp").write_text("{")  # as versions before write_atomically named it
    monkeypatch.undo()
    run(tmp_path / "in", out)
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]
