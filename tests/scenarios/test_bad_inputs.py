"""Bad inputs and damaged files, each one `error:` line (argparse's own errors too) or a warning, a non-zero exit and
nothing written.

Found by a sweep of the command lines: flags of the wrong type, --log_every 0, to_hf's --out on a file and a
missing checkpoint, an empty prompt file, create_tfrecords' refusals, a text file named .tfrecords; and
--predict keeping each run's samples. (A checkpoint of another shape with no steps left: tests/train/test_job.py.)

Small bad inputs that each get their own one-line error: a steps_per_checkpoint or n_layer below 1 given to
main.py, a binary prompt file, a corrupt create_tfrecords manifest, an output folder that is a file, and a
create_tfrecords run killed while its worker processes are busy.

Files the project reads back from a model_path, damaged or empty (issue 22): run_info.json and the trainer's
lock file never block a resume; a warning says what was done, and the damaged run_info.json is kept beside."""
import gzip
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import tensorflow.compat.v1 as tf

import main
from data import create_tfrecords as ct
from data.errors import DataError
from data.inputs import token_stats
from infer.predict import read_prompts, unused_prefix
from modelpath import checkpoints, run_info
from modelpath.lock import LOCK
from modelpath.run_info import RUN_INFO
from tiny import tiny_config
from tools import hf
from train.job import run_description
from workspace import REPO, TOKENIZER, make_workspace, run_main_in_process, run_main_in_process as run_main

TINY = dict(n_layer=2, n_embd=32, n_head=4, n_vocab=4096, n_ctx=16, attention_types=[[["global", "local"], 1]],
            local_attention_radius=4, train_batch_size=4, train_steps=1, steps_per_checkpoint=1, mesh_shape="all:1",
            layout="", datasets=[["tok"]])


def write_config(tmp_path, name="model", **changes) -> str:
    """A tiny config in tmp_path/configs (its dataset registry holds `tok`, data never read)."""
    registry = tmp_path / "configs" / "dataset_configs"
    registry.mkdir(parents=True, exist_ok=True)
    (registry / "tok.json").write_text(json.dumps({"n_vocab": 4096, "path": str(tmp_path / "unused_*.tfrecords"),
                                                   "tokenizer_path": TOKENIZER, "eos_id": 0, "padding_id": 1}))
    path = tmp_path / "configs" / f"{name}.json"
    path.write_text(json.dumps({**TINY, "model_path": str(tmp_path / "run"), **changes}))
    return str(path)


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def test_flags_of_the_wrong_type_and_log_every_0_are_one_error_line_naming_the_fix():
    for flags, expected in ((["--steps_per_checkpoint", "ten"], "--steps_per_checkpoint: invalid int value: 'ten'"),
                            (["--log_every", "0"], "--log_every: must be at least 1, got 0"),
                            (["--no_such_flag"], "unrecognized arguments: --no_such_flag")):
        result = run_main_in_process("--model", "default", *flags, "--dry_run")
        assert result.returncode == 2, (flags, result.stdout, result.stderr)
        line = error_line(result.stderr)
        assert expected in line and "python main.py --help" in line, line


def test_create_tfrecords_flag_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exited:
        ct.main(["--input_dir", "x", "--name", "x", "--output_dir", "y", "--processes", "two"])
    assert exited.value.code == 2
    assert "--processes: invalid int value: 'two'" in error_line(capsys.readouterr().err)


@pytest.mark.slow
def test_to_hf_refuses_an_out_that_is_a_file_in_one_line_without_warnings(tmp_path):
    target = tmp_path / "hf"
    target.write_text("a file")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-m", "tools.hf", "to_hf", "--model", write_config(tmp_path),
                             "--out", str(target)], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert result.returncode == 1, (result.stdout, result.stderr)
    line = error_line(result.stderr)  # also: no pkg_resources UserWarning on the console
    assert f"--out {target} is a file" in line and "choose another --out" in line
    assert "wrote" not in result.stdout and target.read_text() == "a file"


def test_to_hf_without_a_checkpoint_is_one_line(tmp_path, capsys):
    config = write_config(tmp_path)
    assert hf.main(["to_hf", "--model", config, "--out", str(tmp_path / "hf")]) == 1
    assert f"no checkpoint at {tmp_path / 'run'}" in error_line(capsys.readouterr().err)
    (tmp_path / "run").mkdir()
    assert hf.main(["to_hf", "--model", config, "--out", str(tmp_path / "hf")]) == 1
    assert f"no checkpoint in {tmp_path / 'run'}: train the model first" in error_line(capsys.readouterr().err)
    assert not (tmp_path / "hf").exists()


def test_an_empty_prompt_file_is_an_error(tmp_path):
    good, empty = tmp_path / "good.txt", tmp_path / "empty.txt"
    good.write_text("import json\n")
    for content in ("", "\n \n"):
        empty.write_text(content)
        for per_line in (False, True):
            with pytest.raises(DataError, match=f"prompt file {empty} is empty"):
                read_prompts([str(good), str(empty)], per_line)
    assert read_prompts([str(good)], False) == ["import json\n"]


def test_a_prompt_that_is_a_folder_says_so_and_what_to_pass(tmp_path):
    """It said "not found" of a folder that is there."""
    with pytest.raises(DataError) as info:
        read_prompts([str(tmp_path)], False)
    assert str(info.value) == (f"prompt file {tmp_path} is a folder: pass the text files in it (--prompt "
                               f"{tmp_path / '*.txt'}) or one text file to --prompt")


def test_create_tfrecords_refusals_leave_no_empty_output_dir(tmp_path):
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "short.txt").write_text("too short")
    output = tmp_path / "new" / "out"
    with pytest.raises(DataError, match="shorter than"):
        ct.create_tfrecords(input_dir=str(tmp_path / "text"), output_dir=str(output), name="x",
                            encoder_path=TOKENIZER, minimum_size=1000, show_progress=False)
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()  # a folder that was there before stays, empty or not
    with pytest.raises(DataError):
        ct.create_tfrecords(input_dir=str(tmp_path / "text"), output_dir=str(tmp_path / "kept"), name="x",
                            encoder_path=TOKENIZER, minimum_size=1000, show_progress=False)
    assert (tmp_path / "kept").is_dir()


def test_a_text_file_named_tfrecords_is_not_a_tfrecord_file_and_a_cut_one_is_truncated(tmp_path):
    text = tmp_path / "text.tfrecords"
    text.write_text("hello world, this is text\n" * 3)
    with pytest.raises(DataError, match=f"{text} is not a TFRecord file"):
        token_stats(str(text))
    real = tmp_path / "real.tfrecords"
    with tf.io.TFRecordWriter(str(real)) as writer:
        writer.write(b"x" * 100)
    cut = tmp_path / "cut.tfrecords"
    cut.write_bytes(real.read_bytes()[:50])
    with pytest.raises(DataError, match="truncated"):
        token_stats(str(cut))


def test_predictions_of_each_run_are_kept(tmp_path):
    assert unused_prefix(str(tmp_path), 6) == str(tmp_path / "predictions_6")
    (tmp_path / "predictions_6.jsonl").write_text("{}\n")
    assert unused_prefix(str(tmp_path), 6) == str(tmp_path / "predictions_6_2")
    (tmp_path / "predictions_6_2.txt").write_text("")
    assert unused_prefix(str(tmp_path), 6) == str(tmp_path / "predictions_6_3")
    assert unused_prefix(str(tmp_path), 7) == str(tmp_path / "predictions_7")

# ----------------------------------------------------------------------- small bad inputs, each its own one-line error


BARE = dict(n_layer=2, n_embd=32, n_head=4, n_vocab=64, n_ctx=16, attention_types=[[["global", "local"], 1]])
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89"


def one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), \
        (result.returncode, result.stdout, result.stderr)
    return lines[0]


def write_bare_config(tmp_path, **changes) -> str:
    path = tmp_path / f"model_{len(os.listdir(tmp_path))}.json"
    path.write_text(json.dumps({**BARE, "model_path": str(tmp_path / "run"), **changes}))
    return str(path)


# ----------------------------------------------------------------------------- main.py (main() in this process)


def test_main_refuses_steps_per_checkpoint_below_1_from_the_flag_and_the_config(tmp_path):
    flag = run_main("--model", write_bare_config(tmp_path), "--steps_per_checkpoint", "0", "--dry_run")
    assert "steps_per_checkpoint must be at least 1, got 0" in one_error_line(flag)
    key = run_main("--model", write_bare_config(tmp_path, steps_per_checkpoint=-2), "--dry_run")
    assert "steps_per_checkpoint must be at least 1, got -2" in one_error_line(key)
    assert not os.path.exists(tmp_path / "run")


def test_main_says_n_layer_below_1_rather_than_an_attention_types_mismatch(tmp_path):
    result = run_main("--model", write_bare_config(tmp_path, n_layer=-1), "--dry_run")
    assert one_error_line(result) == "error: n_layer must be at least 1, got -1"


def test_main_names_a_binary_prompt_file_and_a_model_path_that_is_a_file(tmp_path):
    prompt = tmp_path / "prompt.gz"
    prompt.write_bytes(gzip.compress(b"hello world\n" * 10))
    result = run_main("--model", write_bare_config(tmp_path), "--predict", "--prompt", str(prompt))
    line = one_error_line(result)
    assert str(prompt) in line and "UTF-8" in line, line

    (tmp_path / "run").write_text("not a folder")
    result = run_main("--model", write_bare_config(tmp_path), "--steps_per_checkpoint", "1")
    line = one_error_line(result)
    assert str(tmp_path / "run") in line and "is a file" in line, line
    assert (tmp_path / "run").read_text() == "not a folder"


# mtime=0: the same gzip bytes in every process, so that pytest-xdist's workers collect the same test ids
@pytest.mark.parametrize("content", [PNG, gzip.compress(b"text\n", mtime=0), b"caf\xe9 au lait\n",
                                     "hi\n".encode("utf-16-le")])
@pytest.mark.parametrize("per_line", [False, True])
def test_a_prompt_file_that_is_not_utf8_text_is_one_line_naming_it(tmp_path, content, per_line):
    good = tmp_path / "good.txt"
    good.write_text("def f(x):\n")
    bad = tmp_path / "picture.png"
    bad.write_bytes(content)
    with pytest.raises(DataError) as error:
        read_prompts([str(good), str(bad)], per_line)
    message = str(error.value)
    assert "\n" not in message and str(bad) in message and "UTF-8" in message, message


# ----------------------------------------------------------------------------- create_tfrecords


def make_inputs(folder, count, lines=3):
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(count):
        (folder / f"doc_{index:04d}.txt").write_text(
            "".join(f"def f{index}_{line}(x):\n    return x + {line}\n" for line in range(lines)), encoding="utf-8")


def run_tool(input_dir, output_dir, **overrides):
    arguments = dict(input_dir=str(input_dir), output_dir=str(output_dir), name="set", encoder_path=TOKENIZER,
                     minimum_size=1, files_per=2, show_progress=False)
    arguments.update(overrides)
    return ct.create_tfrecords(**arguments)


def snapshot(folder):
    return {name: (folder / name).read_bytes() for name in sorted(os.listdir(folder))}


@pytest.mark.parametrize("manifest", [
    b'{"settings": {"mode": "documents", "sepa',  # truncated by a full disk or a crash of another tool
    b"",
    b"[1, 2, 3]",
    b'{"settings": 5, "tokenizer_sha256": [], "inputs_sha256": null}',
    b"\xff\xfe\x00garbage",
])
def test_a_corrupt_manifest_is_one_line_saying_what_to_do_and_changes_nothing(tmp_path, capsys, manifest):
    make_inputs(tmp_path / "in", 5)
    run_tool(tmp_path / "in", tmp_path / "out")
    path = tmp_path / "out" / "set.manifest.json"
    path.write_bytes(manifest)
    before = snapshot(tmp_path / "out")
    with pytest.raises(DataError) as error:
        run_tool(tmp_path / "in", tmp_path / "out")
    message = str(error.value)
    assert "\n" not in message and str(path) in message and "is corrupt" in message and "delete" in message, message
    assert snapshot(tmp_path / "out") == before

    code = ct.main(["--input_dir", str(tmp_path / "in"), "--name", "set", "--output_dir", str(tmp_path / "out"),
                    "--encoder_path", TOKENIZER, "--minimum_size", "1", "--files_per", "2", "--quiet"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1 and len(err) == 1 and err[0].startswith("error: ") and str(path) in err[0], err
    assert snapshot(tmp_path / "out") == before


def test_a_corrupt_manifest_without_finished_files_is_replaced(tmp_path):
    make_inputs(tmp_path / "in", 5)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "set.manifest.json").write_text('{"settings": {"mo')
    summary = run_tool(tmp_path / "in", tmp_path / "out")
    assert summary.files_written == 3
    assert json.loads((tmp_path / "out" / "set.manifest.json").read_text())["settings"]["files_per"] == 2


@pytest.mark.parametrize("where", ["output_dir", "parent"])
def test_an_output_dir_that_is_a_file_is_one_line(tmp_path, capsys, where):
    make_inputs(tmp_path / "in", 3)
    blocker = tmp_path / "taken"
    blocker.write_text("keep me")
    output_dir = blocker if where == "output_dir" else blocker / "out"
    with pytest.raises(DataError) as error:
        run_tool(tmp_path / "in", output_dir)
    message = str(error.value)
    assert "\n" not in message and str(blocker) in message and "not a folder" in message, message
    code = ct.main(["--input_dir", str(tmp_path / "in"), "--name", "set", "--output_dir", str(output_dir),
                    "--encoder_path", TOKENIZER, "--minimum_size", "1", "--quiet"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 1 and len(err) == 1 and err[0].startswith("error: ") and str(blocker) in err[0], err
    assert blocker.read_text() == "keep me"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["ctrl_c", "sigterm"])
def test_a_killed_run_stops_quietly_and_leaves_resumable_state(tmp_path, how):
    """Ctrl-C in a terminal sends SIGINT to the parent and every worker; a service manager's SIGTERM reaches
    the parent only. Either way: no worker tracebacks, one line, a non-zero exit, and only complete files."""
    make_inputs(tmp_path / "in", 400, lines=60)
    out = tmp_path / "out"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    process = subprocess.Popen(
        [sys.executable, os.path.join(REPO, "data", "create_tfrecords.py"), "--input_dir", str(tmp_path / "in"),
         "--name", "set", "--output_dir", str(out), "--encoder_path", TOKENIZER, "--minimum_size", "1",
         "--files_per", "4", "--processes", "2", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO, start_new_session=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and process.poll() is None:  # wait until the workers have written a file
            if os.path.isdir(out) and any(name.endswith(".tfrecords") for name in os.listdir(out)):
                break
            time.sleep(0.02)
        assert process.poll() is None, "the run finished before it could be interrupted: give it more input"
        if how == "ctrl_c":
            os.killpg(process.pid, signal.SIGINT)
        else:
            process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    time.sleep(0.5)  # a worker that outlived its parent would print after the parent's exit
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr and "Error" not in stderr, stderr
    assert process.returncode == (130 if how == "ctrl_c" else 143), (process.returncode, stderr)
    assert len(lines) == 1 and lines[0].startswith("interrupted") and "rerun" in lines[0], stderr
    names = os.listdir(out)
    assert not [name for name in names if name.endswith(ct.TEMPORARY_SUFFIX)], names
    finished = [name for name in names if name.endswith(".tfrecords")]
    assert finished and "set.manifest.json" in names and len(finished) < 100
    for name in finished:  # each kept file is complete: its name counts the examples it holds
        records = list(tf.io.tf_record_iterator(str(out / name)))
        assert len(records) == int(name.rsplit(".", 1)[0].split("_")[-1]) == 4


# --------------------------------------------------------------------------------------- damaged files in a model_path


@pytest.mark.parametrize("damage", ["", "{\"n_layer\": 2, \"starts\": [{\"st", "\x00\x81garbage", "[1, 2]", "null"],
                         ids=["empty", "cut short", "garbage", "a list", "null"])
def test_a_damaged_run_info_is_kept_aside_and_rebuilt(tmp_path, capsys, damage):
    cfg = tiny_config(model_path=str(tmp_path / "run"))
    os.makedirs(cfg.model_path)
    path = os.path.join(cfg.model_path, RUN_INFO)
    with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(damage)
    assert run_info.read(cfg.model_path) is None
    assert "damaged" in capsys.readouterr().err
    run_info.write(cfg.model_path, run_description(cfg), 7)
    info = json.loads(open(path).read())
    assert info["n_layer"] == 2 and [s["step"] for s in info["starts"]] == [7]
    assert open(path + ".damaged", encoding="utf-8", errors="surrogateescape").read() == damage
    err = capsys.readouterr().err
    assert "run_info.json.damaged" in err and err.count("warning:") == 2, err
    run_info.write(cfg.model_path, run_description(cfg), 9)  # the rebuilt file is read back as usual
    assert [s["step"] for s in run_info.read(cfg.model_path)["starts"]] == [7, 9]


@pytest.mark.slow
def test_training_resumes_over_a_damaged_run_info_and_lock_file(tmp_path, capsys):
    config = make_workspace(tmp_path, n_layer=1, attention_types=[[["global"], 1]], train_steps=1,
                            steps_per_checkpoint=1)
    model_path = str(tmp_path / "run")
    assert main.main(["--model", config, "--peak_tflops", "1"]) == 0
    open(os.path.join(model_path, RUN_INFO), "w").close()  # a disk that filled up as it was written
    open(os.path.join(model_path, LOCK), "w").close()  # a trainer killed as it took the lock
    old = time.time() - 3600
    os.utime(os.path.join(model_path, LOCK), (old, old))
    model = json.loads(open(config).read())
    model["train_steps"] = 2
    open(config, "w").write(json.dumps(model))
    capsys.readouterr()
    assert main.main(["--model", config, "--peak_tflops", "1"]) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "run_info.json" in err and "lock" in err, err
    assert checkpoints.steps(model_path) == [1, 2]
    assert [s["step"] for s in run_info.read(model_path)["starts"]] == [1]
    assert not os.path.exists(os.path.join(model_path, LOCK))
