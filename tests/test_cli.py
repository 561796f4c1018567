"""main.py end to end, as a user runs it: train, resume, eval, predict, check a dataset, and each error."""
import json
import os
import subprocess
import sys

import pytest

import corpus
from data.create_tfrecords import create_tfrecords

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(REPO, "data", "tokenizers", "stdlib-bpe-4096.json")


def run_main(*args, stdin=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, os.path.join(REPO, "main.py"), *args], capture_output=True, text=True,
                          env=env, cwd=REPO, input=stdin, timeout=600)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A folder with configs/tiny.json, its dataset config and tokenized text (tests/corpus.py's train split,
    and its larger eval split)."""
    root = tmp_path_factory.mktemp("cli")
    for split, text in (("train", "train"), ("eval", "eval_large")):
        text_dir = root / f"{split}_text"
        corpus.write_documents(text_dir, text)
        create_tfrecords(input_dir=str(text_dir), output_dir=str(root / split), name=split, mode="documents",
                         encoder_path=TOKENIZER, use_gpt2_tokenizer=False, gpt2_tokenizer_path=None,
                         separator=None, minimum_size=40, show_progress=False)
    configs = root / "configs"
    (configs / "dataset_configs").mkdir(parents=True)
    (configs / "dataset_configs" / "tiny.json").write_text(json.dumps({
        "n_vocab": 4096, "path": "train/train_*.tfrecords", "eval_path": "eval/eval_*.tfrecords",
        "tokenizer_path": TOKENIZER, "eos_id": 0, "padding_id": 1}))
    model = dict(n_layer=2, n_embd=32, n_head=4, n_vocab=4096, n_ctx=32, attention_types=[[["global", "local"], 1]],
                 local_attention_radius=8, train_batch_size=4, eval_batch_size=4, eval_steps=0, train_steps=6,
                 steps_per_checkpoint=3, lr=3e-3, datasets=[["tiny", 4, "documents_random", 1.0]],
                 model_path=str(root / "run"), max_new_tokens=5, top_k=10, predict_batch_size=2)
    (configs / "tiny.json").write_text(json.dumps(model))
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


def test_train_resume_eval_predict(workspace):
    cfg = config_path(workspace, train_steps=3)
    first = run_main("--model", cfg, "--log_every", "1")
    assert first.returncode == 0, first.stderr
    assert "step      3/3 | loss" in first.stdout and "tok/s" in first.stdout and "lr" in first.stdout
    assert os.path.exists(workspace / "run" / "model.ckpt-3.index")

    again = run_main("--model", config_path(workspace), "--log_every", "1")  # train_steps 6: resumes at 3
    assert again.returncode == 0, again.stderr
    assert "steps 3 -> 6" in again.stdout and "step      6/6" in again.stdout
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
    ]
    for args, expected in cases:
        result = run_main(*args)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        lines = [l for l in result.stderr.splitlines() if l.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], (args, result.stderr)


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
