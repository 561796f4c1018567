"""Small bad inputs that each get their own one-line error: a steps_per_checkpoint or n_layer below 1 given to
main.py, a binary prompt file, a corrupt create_tfrecords manifest, an output folder that is a file, and a
create_tfrecords run killed while its worker processes are busy."""
import gzip
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from data import create_tfrecords as ct
from data.errors import DataError
from infer.predict import read_prompts
from workspace import REPO, TOKENIZER, run_main_in_process as run_main

TINY = dict(n_layer=2, n_embd=32, n_head=4, n_vocab=64, n_ctx=16, attention_types=[[["global", "local"], 1]])
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89"


def one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), \
        (result.returncode, result.stdout, result.stderr)
    return lines[0]


def write_config(tmp_path, **changes) -> str:
    path = tmp_path / f"model_{len(os.listdir(tmp_path))}.json"
    path.write_text(json.dumps({**TINY, "model_path": str(tmp_path / "run"), **changes}))
    return str(path)


# ----------------------------------------------------------------------------- main.py (main() in this process)


def test_main_refuses_steps_per_checkpoint_below_1_from_the_flag_and_the_config(tmp_path):
    flag = run_main("--model", write_config(tmp_path), "--steps_per_checkpoint", "0", "--dry_run")
    assert "steps_per_checkpoint must be at least 1, got 0" in one_error_line(flag)
    key = run_main("--model", write_config(tmp_path, steps_per_checkpoint=-2), "--dry_run")
    assert "steps_per_checkpoint must be at least 1, got -2" in one_error_line(key)
    assert not os.path.exists(tmp_path / "run")


def test_main_says_n_layer_below_1_rather_than_an_attention_types_mismatch(tmp_path):
    result = run_main("--model", write_config(tmp_path, n_layer=-1), "--dry_run")
    assert one_error_line(result) == "error: n_layer must be at least 1, got -1"


def test_main_names_a_binary_prompt_file_and_a_model_path_that_is_a_file(tmp_path):
    prompt = tmp_path / "prompt.gz"
    prompt.write_bytes(gzip.compress(b"hello world\n" * 10))
    result = run_main("--model", write_config(tmp_path), "--predict", "--prompt", str(prompt))
    line = one_error_line(result)
    assert str(prompt) in line and "UTF-8" in line, line

    (tmp_path / "run").write_text("not a folder")
    result = run_main("--model", write_config(tmp_path), "--steps_per_checkpoint", "1")
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
        records = list(tf.compat.v1.io.tf_record_iterator(str(out / name)))
        assert len(records) == int(name.rsplit(".", 1)[0].split("_")[-1]) == 4
