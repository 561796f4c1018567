"""run_experiment.py (Sacred around main.py) and tools/plot_runs.py's command line, end to end on a 2-step tiny run
(plot_runs' figures: tests/tools/test_plot_runs.py)."""
import json
import os
import subprocess
import sys

import pytest

import corpus
from data.create_tfrecords import create_tfrecords

pytestmark = pytest.mark.slow  # main.py through Sacred, and the plot command line, as processes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(REPO, "data", "tokenizers", "stdlib-bpe-4096.json")


def run_experiment(*args, cwd):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, os.path.join(REPO, "run_experiment.py"), *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A tiny config on tokenized text (tests/corpus.py's train split), trained for 2 steps through
    run_experiment.py."""
    root = tmp_path_factory.mktemp("sacred")
    text_dir = root / "text"
    corpus.write_documents(text_dir, "train")
    create_tfrecords(input_dir=str(text_dir), output_dir=str(root / "train"), name="train", mode="documents",
                     encoder_path=TOKENIZER, use_gpt2_tokenizer=False, gpt2_tokenizer_path=None, separator=None,
                     minimum_size=40, show_progress=False)
    configs = root / "configs"
    (configs / "dataset_configs").mkdir(parents=True)
    (configs / "dataset_configs" / "tiny.json").write_text(json.dumps({
        "n_vocab": 4096, "path": "train/train_*.tfrecords", "tokenizer_path": TOKENIZER, "eos_id": 0,
        "padding_id": 1}))
    model = dict(n_layer=2, n_embd=32, n_head=4, n_vocab=4096, n_ctx=32, attention_types=[[["global", "local"], 1]],
                 local_attention_radius=8, train_batch_size=4, train_steps=2, steps_per_checkpoint=2, lr=3e-3,
                 datasets=[["tiny", 4, "documents_random", 1.0]], model_path=str(root / "run"))
    (configs / "tiny.json").write_text(json.dumps(model))
    result = run_experiment("--model", str(configs / "tiny.json"), "--sacred_dir", str(root / "sacred"),
                            "--poll_seconds", "1", "--log_every", "1", "--peak_tflops", "0.1", cwd=str(root))
    return root, model, result


def test_run_experiment_records_config_metrics_and_output(tracked):
    root, model, result = tracked
    assert result.returncode == 0, result.stdout + result.stderr
    console = result.stdout + result.stderr  # Sacred's INFO lines and setuptools' pkg_resources warning stay off
    assert "INFO - " not in console and "pkg_resources" not in console and "Warning" not in console, console
    run_dir = root / "sacred" / "1"
    assert {"config.json", "metrics.json", "cout.txt", "run.json"} <= set(os.listdir(run_dir))

    config = json.loads((run_dir / "config.json").read_text())
    assert config["params"]["n_layer"] == 2 and config["params"]["model_path"] == model["model_path"]
    assert "--log_every" in config["main_args"]

    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["loss"]["steps"] == [1, 2]
    assert all(5.0 < v < 10.0 for v in metrics["loss"]["values"])  # ~ln(4096) = 8.3 at the start
    assert {"learning_rate", "grad_norm", "tokens_per_sec", "mfu"} <= set(metrics)

    cout = (run_dir / "cout.txt").read_text()
    assert "step      2/2 | loss" in cout and "tok/s" in cout and "MFU" in cout
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "COMPLETED" and run["result"]["last_step"] == 2
    assert json.loads((run_dir / "info.json").read_text())["model_path"] == model["model_path"]

    info = json.loads((root / "run" / "run_info.json").read_text())  # main.py got --sacred_id
    assert info["starts"][-1]["sacred_id"] == "1" and info["tokens_per_step"] == 4 * 32
    assert info["precision"] in ("float32", "bfloat16")  # what trained: precision "auto" resolved, not "auto"


def test_plot_command_line_and_a_failing_run(tracked, tmp_path, capsys):
    root, model, _ = tracked
    from tools import plot_runs  # its main() in this process: what it prints and returns, not its start-up
    assert plot_runs.main([str(root / "run"), "--out", str(tmp_path / "plots")]) == 0
    assert "wrote" in capsys.readouterr().out and os.path.exists(tmp_path / "plots" / "loss_vs_compute.png")
    assert plot_runs.main([str(tmp_path)]) == 1
    assert capsys.readouterr().err.startswith("error: ")

    bad = dict(model, n_embed=32)  # a mistyped key: main.py fails, the Sacred run is FAILED with its output
    (root / "configs" / "bad.json").write_text(json.dumps(bad))
    failed = run_experiment("--model", str(root / "configs" / "bad.json"), "--sacred_dir", str(root / "sacred"),
                            cwd=str(root))
    assert failed.returncode == 1
    run_dir = max((root / "sacred").glob("[0-9]*"), key=lambda p: int(p.name))
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "FAILED"
    assert "unknown key 'n_embed'" in (run_dir / "cout.txt").read_text()


@pytest.mark.parametrize("where", ["file", "inside_a_file"])
def test_a_sacred_dir_that_cannot_be_a_folder_is_one_line_before_anything_runs(tmp_path, capsys, where):
    """--sacred_dir naming a file was Sacred's FileExistsError traceback, after the run had started."""
    import run_experiment as experiment
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    sacred_dir = taken if where == "file" else taken / "sacred"
    config = tmp_path / "model.json"  # never read by main.py: the refusal comes first
    config.write_text(json.dumps({"n_layer": 1, "n_embd": 8, "n_head": 1, "n_vocab": 64, "model_path": str(tmp_path)}))
    assert experiment.main(["--model", str(config), "--sacred_dir", str(sacred_dir)]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --sacred_dir ") and "is a file, not a folder" in lines[0]
    assert taken.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == ["model.json", "notes.txt"]


@pytest.mark.parametrize("flag, value", [("--poll_seconds", "0"), ("--poll_seconds", "nan"),
                                         ("--heartbeat_timeout", "-1"), ("--max_restarts", "-1")])
def test_run_experiment_flags_out_of_range_are_argparse_errors(capsys, flag, value):
    import run_experiment as experiment
    with pytest.raises(SystemExit) as exited:
        experiment.parse_args(["--model", "default", flag, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: argument {flag}: ") and err.count("\n") == 1, err
