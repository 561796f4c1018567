"""evals/harness.py: lm-evaluation-harness tasks on our checkpoints, offline: checked before anything runs (an
unknown task, missing local data, a folder that is not there, a checkpoint of another model, lm-eval missing, an
entmax model asked for log-likelihoods), and run after each checkpoint of a training run, their results appended,
written to TensorBoard and the harness's JSON. (The harness's model itself, against lm-eval's `hf` backend:
tests/evals/test_harness_model.py.)"""
import json
import os

import pytest

lm_eval = pytest.importorskip("lm_eval")

from tests.evals.test_harness_model import TASKS, checkpoint_at_order_one_weights, checkpoint_lm, instances  # noqa: E402
from workspace import make_workspace  # noqa: E402


@pytest.fixture(scope="module")
def checkpoint_run(tmp_path_factory):
    """The harness model's checkpoint of weights of order one (tests/evals/test_harness_model.py's), without its HF
    folder, which none of these tests reads (to_hf takes longer than the rest)."""
    root = tmp_path_factory.mktemp("harness")
    return root, checkpoint_at_order_one_weights(root)


def error_lines(capsys):
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_training_runs_the_harness_after_each_checkpoint_and_checks_tasks_first(tmp_path, capsys):
    """harness_tasks in the config: a task folder that is not there is one error line before any step is trained
    (nothing written); with the right one the task runs after each checkpoint, its metrics appended to
    eval_results.jsonl, written to TensorBoard and the harness's results JSON.
    Bugs caught: the tasks checked only after training, training's chunks not stopping at checkpoints for
    harness tasks alone, results not appended with the checkpoint's step, lm-eval's environment report (torch's
    collect_env, `pip list`) run at each checkpoint."""
    import main
    config = make_workspace(tmp_path, train_steps=2, steps_per_checkpoint=1, harness_tasks=["tiny_lambada"],
                            harness_include_path=TASKS + "_typo", harness_limit=2)
    assert main.main(["--model", config]) == 1
    errors = error_lines(capsys)
    assert len(errors) == 1 and "harness_tasks_typo is not a folder" in errors[0]
    assert not os.path.exists(tmp_path / "run" / "checkpoint")

    assert main.main(["--model", config, "--harness_include_path", TASKS]) == 0
    out = capsys.readouterr().out
    assert "harness tiny_lambada at step 2: perplexity" in out
    records = [json.loads(line) for line in open(tmp_path / "run" / "eval_results.jsonl")]
    assert [(r["task"], r["step"]) for r in records] == [("harness/tiny_lambada", 1), ("harness/tiny_lambada", 2)]
    assert records[1]["acc"] in (0.0, 0.5, 1.0) and records[1]["perplexity"] > 1
    results = json.loads((tmp_path / "run" / "harness" / "results_2.json").read_text())
    assert results["results"]["tiny_lambada"]["acc,none"] == records[1]["acc"] and results["gpt_neo"]["step"] == 2
    assert results["pretty_env_info"].startswith("TensorFlow ")  # ours, not torch's (PyTorch, pip list)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path / "run" / "eval"))
    events.Reload()
    assert "harness/tiny_lambada/acc" in events.Tags()["scalars"]


@pytest.mark.slow
def test_bad_harness_input_is_one_error_line(checkpoint_run, tmp_path, capsys, monkeypatch):
    """An unknown task (the closest known name suggested), a task whose local data file is missing, a folder of
    tasks that is not there, a checkpoint of another model, and lm-eval not installed: each one `error:` line
    naming the fix, exit 1.
    Bugs caught: a missing data file found by `datasets` as a traceback (or read from the working directory),
    lm-eval's ImportError as a traceback."""
    import main
    root, cfg = checkpoint_run
    config = str(root / "configs" / "tiny.json")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "gone.yaml").write_text(open(os.path.join(TASKS, "tiny_lambada.yaml")).read()
                                     .replace("task: tiny_lambada", "task: gone")
                                     .replace("test: tiny_lambada.jsonl", "test: missing.jsonl"))
    cases = [
        (["--harness_tasks", "tiny_lambda", "--harness_include_path", TASKS],
         "'tiny_lambda' is not known (not among lm-eval's tasks or in" ),
        (["--harness_tasks", "gone", "--harness_include_path", str(tasks)], f"reads {tasks / 'missing.jsonl'}, which is not there"),
        (["--harness_tasks", "gone", "--harness_include_path", str(tmp_path / "nowhere")], "is not a folder"),
        (["--harness_tasks", "tiny_lambada", "--harness_include_path", TASKS, "--model",
          str(root / "configs" / "wide.json")], "is another model than the config's"),
    ]
    wide = json.loads(open(config).read())
    wide["n_embd"] = 64
    (root / "configs" / "wide.json").write_text(json.dumps(wide))
    for flags, message in cases:
        argv = ["--model", config, "--eval", *flags] if "--model" not in flags else ["--eval", *flags]
        assert main.main(argv) == 1, flags
        errors = error_lines(capsys)
        assert len(errors) == 1 and message in errors[0], (flags, errors)

    monkeypatch.setitem(__import__("sys").modules, "lm_eval", None)  # import lm_eval raises ImportError
    assert main.main(["--model", config, "--eval", "--harness_tasks", "tiny_lambada"]) == 1
    errors = error_lines(capsys)
    assert len(errors) == 1 and "pip install -r requirements-eval.txt" in errors[0]


@pytest.mark.slow
def test_an_entmax_model_is_refused_log_likelihood_requests_with_one_line(checkpoint_run, capsys):
    """A model trained with entmax_loss has no softmax log-likelihoods: `--eval` with a task that asks for them is
    one `error:` line before anything runs or is written; the model itself refuses such requests (multiple
    choice, loglikelihood, rolling) from Python too; generation tasks still run.
    Bugs caught: the early check gone (`check_fits_model` returning at once: --eval runs the validation loss and
    writes its row before the harness fails), the model's own refusal gone (entmax models scored with softmax
    log-likelihoods)."""
    import main
    from data.errors import DataError
    root, cfg = checkpoint_run
    entmax = json.loads((root / "configs" / "tiny.json").read_text())
    entmax.update(entmax_loss=True, eval_results_path=str(root / "entmax_results.jsonl"))
    (root / "configs" / "entmax.json").write_text(json.dumps(entmax))
    assert main.main(["--model", str(root / "configs" / "entmax.json"), "--eval", "--harness_tasks",
                      "tiny_generate,tiny_choice", "--harness_include_path", TASKS]) == 1
    errors = error_lines(capsys)
    assert len(errors) == 1 and "harness task tiny_choice scores log-likelihoods" in errors[0], errors
    assert "entmax_loss" in errors[0] and not os.path.exists(root / "entmax_results.jsonl")

    with checkpoint_lm(cfg, entmax_loss=True) as lm:
        for kind, arguments in (("loglikelihood", [("def f(", "x)")]), ("loglikelihood_rolling", [("import os\n",)])):
            with pytest.raises(DataError, match="entmax_loss has no softmax log-likelihoods"):
                getattr(lm, kind)(instances(kind, arguments))
        generated = lm.generate_until(instances("generate_until", [("def f(", {"until": [")"], "max_gen_toks": 3})]))
    assert isinstance(generated[0], str)
