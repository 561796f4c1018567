"""main.py end to end, as a user runs it: train, resume, eval, predict, check a dataset, and each error. main()
runs in this process (TensorFlow starts once); tests/console/test_stderr_filter.py runs main.py as a process of its
own."""
import json
import os

import pytest

from workspace import make_workspace, run_main_in_process as run_main


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A folder with configs/tiny.json, its dataset config and tokenized text (tests/corpus.py's train split,
    and its larger eval split)."""
    root = tmp_path_factory.mktemp("cli")
    make_workspace(root, eval_split="eval_large", train_steps=6, steps_per_checkpoint=3, max_new_tokens=5, top_k=10,
                   predict_batch_size=2)
    return root


def config_path(workspace, **changes):
    path = workspace / "configs" / "tiny.json"
    if changes:
        model = json.loads(path.read_text())
        model.update(changes)
        path = workspace / "configs" / f"tiny_{abs(hash(json.dumps(changes, sort_keys=True)))}.json"
        path.write_text(json.dumps(model))
    return str(path)


def scalar_tags(model_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(model_path))
    events.Reload()
    return set(events.Tags()["scalars"])


@pytest.mark.slow
def test_train_resume_eval_predict(workspace):
    cfg = config_path(workspace, train_steps=3)
    first = run_main("--model", cfg, "--log_every", "1")
    assert first.returncode == 0, first.stderr
    assert "step      3/3 | loss" in first.stdout and "tok/s" in first.stdout and "lr" in first.stdout
    assert os.path.exists(workspace / "run" / "model.ckpt-3.index")
    # what the start-up's waits are (the graph's build, the session's first call), said before each
    lines = first.stdout.splitlines()
    order = [next(i for i, line in enumerate(lines) if line.startswith(start)) for start in (
        "training 2 layers", "building the training graph, initialising the weights ...",
        "running step 1, the session's first: ", "step      1/3 | loss")]
    assert order == sorted(order), lines[:8]

    again = run_main("--model", config_path(workspace), "--log_every", "1")  # train_steps 6: resumes at 3
    assert again.returncode == 0, again.stderr
    assert "steps 3 -> 6" in again.stdout and "step      6/6" in again.stdout
    assert "building the training graph, restoring model.ckpt-3 ..." in again.stdout
    assert "running step 4, the session's first: " in again.stdout
    assert "step      1/" not in again.stdout
    assert os.path.exists(workspace / "run" / "model.ckpt-6.index")
    assert {"loss", "learning_rate", "grad_norm", "tokens_per_sec", "model_flops_per_sec", "mfu"} <= \
        scalar_tags(workspace / "run")

    evaluation = run_main("--model", config_path(workspace), "--eval")
    assert evaluation.returncode == 0, evaluation.stderr
    line = next(l for l in evaluation.stdout.splitlines() if l.startswith("eval at step 6"))
    loss = float(line.split("loss ")[1].split()[0])
    perplexity = float(line.split("perplexity ")[1].split()[0])
    assert abs(perplexity - 2.718281828 ** loss) < 0.01 * perplexity

    prompt = workspace / "prompt.txt"
    prompt.write_text("import json\n")
    prediction = run_main("--model", config_path(workspace), "--predict", "--prompt", str(prompt))
    assert prediction.returncode == 0, prediction.stderr
    assert prediction.stdout.count("======== sample") == 2
    written = (workspace / "run" / "predictions_6.txt").read_text()
    assert written.count("import json\n") == 2  # each sample starts with the prompt


def test_check_dataset_reports_ids_and_catches_ids_beyond_n_vocab(workspace):
    ok = run_main("--model", config_path(workspace), "--check_dataset")
    assert ok.returncode == 0, ok.stderr
    assert "token ids" in ok.stdout and "decoded sample" in ok.stdout and "dataset check passed" in ok.stdout
    # A registry entry that claims a 64-token vocabulary for data encoded with 4096 tokens.
    registry = workspace / "configs" / "dataset_configs"
    entry = json.loads((registry / "tiny.json").read_text())
    (registry / "small_vocab.json").write_text(json.dumps(dict(entry, n_vocab=64)))
    for model_vocab, expected in ((4096, "its registered n_vocab 64"), (64, "the model's n_vocab 64")):
        bad = run_main("--model", config_path(workspace, n_vocab=model_vocab,
                                              datasets=[["small_vocab", 4, "documents_random", 1.0]]),
                       "--check_dataset")
        assert bad.returncode == 1, bad.stdout
        assert bad.stderr.startswith("error: ") and expected in bad.stderr


def test_bad_inputs_exit_non_zero_with_one_line(workspace):
    cases = [
        (["--model", config_path(workspace, n_embed=32)], "unknown key 'n_embed'"),
        (["--model", config_path(workspace), "--mesh_shape", "x:2", "--gpu_ids", "device:CPU:0"],
         "has 2 devices but 1 were given"),
        (["--model", config_path(workspace), "--gpu_ids", "device:GPU:3"], "device:GPU:3 not found"),
        (["--model", "no_such_config"], "not found"),
        (["--model", config_path(workspace), "--predict", "--prompt", str(workspace / "missing.txt")],
         "prompt file"),
        (["--model", config_path(workspace), "--eval", "--new", "--yes"], "--new goes with training"),
    ]
    for args, expected in cases:
        result = run_main(*args)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        lines = [l for l in result.stderr.splitlines() if l.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], (args, result.stderr)


@pytest.mark.slow
def test_new_asks_before_deleting(workspace):
    victim = workspace / "victim"
    victim.mkdir()
    (victim / "model.ckpt-1.index").write_text("x")
    cfg = config_path(workspace, model_path=str(victim), train_steps=1)
    refused = run_main("--model", cfg, "--new")  # no terminal to ask on, no --yes
    assert refused.returncode == 1 and "--yes" in refused.stderr and victim.exists()
    accepted = run_main("--model", cfg, "--new", "--yes", "--log_every", "1")
    assert accepted.returncode == 0, accepted.stderr
    assert "deleted" in accepted.stdout and os.path.exists(victim / "model.ckpt-1.index")
    assert "step      1/1" in accepted.stdout
