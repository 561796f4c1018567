"""Bad inputs found by a sweep of the command lines, each one `error:` line (argparse's own errors too), a
non-zero exit and nothing written: flags of the wrong type, --log_every 0, to_hf's --out on a file and a
missing checkpoint, an empty prompt file, a checkpoint of another shape with no steps left, create_tfrecords'
refusals, a text file named .tfrecords; and --predict keeping each run's samples."""
import json
import os
import subprocess
import sys

import pytest
import tensorflow.compat.v1 as tf

from config import load_config
from data import create_tfrecords as ct
from data.errors import DataError
from data.inputs import token_stats
from infer.predict import read_prompts, unused_prefix
from modelpath.checkpoints import CheckpointError
from tiny import placement_for, random_tokens, train
from tools import hf
from train.job import run_training
from workspace import REPO, TOKENIZER, run_main_in_process

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


@pytest.mark.parametrize("flags, expected", [
    (["--peak_tflops", "-5"], "--peak_tflops: must be more than 0, got -5"),  # printed MFU -0.4%
    (["--peak_tflops", "0"], "--peak_tflops: must be more than 0, got 0"),
    (["--peak_tflops", "nan"], "--peak_tflops: takes a finite number, got 'nan'"),
    (["--gpu_memory", "1.5"], "--gpu_memory: takes 'growth' or a fraction of each GPU's memory in (0, 1]"),
    (["--gpu_memory", "0"], "--gpu_memory: takes 'growth' or a fraction of each GPU's memory in (0, 1]"),
    (["--tpu_timeout", "inf"], "--tpu_timeout: takes a finite number, got 'inf'"),
    (["--worker_timeout", "-1"], "--worker_timeout: must be more than 0, got -1"),
    (["--num_devices", "0"], "--num_devices: must be at least 1, got 0"),
    (["--task_index", "-1"], "--task_index: must be at least 0, got -1"),
])
def test_numbers_out_of_range_on_the_command_line_are_one_argparse_line(capsys, flags, expected):
    """Checked when the command line is read, also where nothing would look at them (--gpu_memory without GPUs)."""
    import main
    with pytest.raises(SystemExit) as exited:
        main.parse_args(["--model", "default", *flags])
    assert exited.value.code == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith(f"error: argument {expected}") and line.endswith("--help` lists the flags)"), line
    for accepted in (["--peak_tflops", "0.5"], ["--gpu_memory", "1"], ["--gpu_memory", "growth"], ["--task_index", "0"]):
        main.parse_args(["--model", "default", *accepted])


def test_checkpoint_minutes_must_be_finite(capsys):
    import main
    assert main.main(["--model", "default", "--checkpoint_minutes", "inf"]) == 1
    assert error_line(capsys.readouterr().err).startswith("error: --checkpoint_minutes must be more than 0 (a finite")


def test_a_checkpoint_of_another_shape_is_refused_when_nothing_is_left_to_train(tmp_path):
    trained = load_config(write_config(tmp_path))
    train(trained, random_tokens([4, trained.n_ctx + 1], vocab=trained.n_vocab))
    assert tf.train.latest_checkpoint(trained.model_path).endswith("model.ckpt-1")
    wider = load_config(write_config(tmp_path, "wider", n_embd=64))
    with pytest.raises(CheckpointError, match="is another model than the config's"):
        run_training(wider, placement_for(wider))
    assert run_training(trained, placement_for(trained)) == 1  # the same config: nothing to train, no error


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
