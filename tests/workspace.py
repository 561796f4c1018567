"""A small on-disk workspace for tests that run main.py or read a config from disk: tokenized text
(tests/corpus.py's generated train and eval splits, the same on every Python version), a dataset registry
entry using the committed stdlib tokenizer, and configs/tiny.json.

The corpus is tokenized once per test process (`tokenized_corpus`) and each workspace gets its own copy of the
tfrecords, so a test may damage or add files in its workspace without touching another's."""
from __future__ import annotations

import atexit
import contextlib
import functools
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

import corpus

from ladder.worker import system_exit_code

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = os.path.join(REPO, "data", "tokenizers", "stdlib-bpe-4096.json")


@functools.cache
def tokenized_corpus(eval_split: str = "eval") -> str:
    """A folder holding train/ and eval/: tests/corpus.py's train split and `eval_split` ("eval" or the larger
    "eval_large") tokenized by create_tfrecords, made on first use in this process and removed when it exits.
    Read it, never write it: make_workspace copies it."""
    from data.create_tfrecords import create_tfrecords

    root = tempfile.mkdtemp(prefix="tests-corpus-")
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    for split, text in (("train", "train"), ("eval", eval_split)):
        text_dir = os.path.join(root, f"{split}_text")
        corpus.write_documents(text_dir, text)
        create_tfrecords(input_dir=text_dir, output_dir=os.path.join(root, split), name=split, mode="documents",
                         encoder_path=TOKENIZER, use_gpt2_tokenizer=False, gpt2_tokenizer_path=None,
                         separator=None, minimum_size=40, show_progress=False)
    return root


def make_workspace(root, eval_split: str = "eval", **model_changes) -> str:
    """Writes the workspace under root; returns the path of configs/tiny.json (model_changes override it).
    `eval_split`: the corpus split tokenized as the eval data (tokenized_corpus)."""
    root = str(root)
    for split in ("train", "eval"):
        shutil.copytree(os.path.join(tokenized_corpus(eval_split), split), os.path.join(root, split))
    registry = os.path.join(root, "configs", "dataset_configs")
    os.makedirs(registry, exist_ok=True)
    with open(os.path.join(registry, "tiny.json"), "w") as f:
        json.dump({"n_vocab": 4096, "path": "train/train_*.tfrecords", "eval_path": "eval/eval_*.tfrecords",
                   "tokenizer_path": TOKENIZER, "eos_id": 0, "padding_id": 1}, f)
    model = dict(n_layer=2, n_embd=32, n_head=4, n_vocab=4096, n_ctx=32, attention_types=[[["global", "local"], 1]],
                 local_attention_radius=8, train_batch_size=4, eval_batch_size=4, eval_steps=0, train_steps=2,
                 steps_per_checkpoint=2, lr=3e-3, z_loss=0.0, datasets=[["tiny", 4, "documents_random", 1.0]],
                 model_path=os.path.join(root, "run"), max_new_tokens=6, predict_batch_size=4)
    model.update(model_changes)
    path = os.path.join(root, "configs", "tiny.json")
    with open(path, "w") as f:
        json.dump(model, f)
    return path


def copy_workspace(trained, dest, **model_changes) -> tuple[str, str]:
    """A test's own copy of a workspace (the session's `trained_workspace`, conftest.py) under dest: its data,
    configs and model_path, with configs/tiny.json pointing at the copy's model_path and `model_changes` applied.
    Returns (config path, model_path)."""
    dest = str(dest)
    shutil.copytree(str(trained), dest, dirs_exist_ok=True)
    path = os.path.join(dest, "configs", "tiny.json")
    with open(path) as f:
        model = json.load(f)
    model.update(model_changes, model_path=os.path.join(dest, "run"))
    with open(path, "w") as f:
        json.dump(model, f)
    return path, model["model_path"]


def run_main_in_process(*args) -> subprocess.CompletedProcess:
    """main.py's main() in this process, as run_main runs it in another: (returncode, stdout, stderr) of a
    CompletedProcess, without starting TensorFlow again. For tests of what main.py does and prints, not of the
    process itself (signals, an exit through sys.exit, the console filter, a fresh TensorFlow). TensorFlow's
    state is this process's: the CPU split into 4 devices in conftest.py, and what earlier tests left."""
    import main
    out, err = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, [os.path.join(REPO, "main.py"), *map(str, args)]  # the program name in messages
    stdin, sys.stdin = sys.stdin, io.StringIO()  # no terminal to ask on, as run_main's process under pytest
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main.main(sys.argv[1:])
            except SystemExit as e:  # argparse's errors and --help, as the process would exit
                code = system_exit_code(e)
    finally:
        sys.argv, sys.stdin = argv, stdin
    return subprocess.CompletedProcess(sys.argv[:1] + list(args), code, out.getvalue(), err.getvalue())


def run_main(*args, timeout=600):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, os.path.join(REPO, "main.py"), *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=timeout)


def start_main(*args, env=None, merge_stderr=False):
    """main.py started in a subprocess and not waited for, its output unbuffered: stdout, and stderr apart or
    merged into stdout, as text pipes. `env`: the environment to start from (default: this process's)."""
    env = dict(os.environ if env is None else env, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, os.path.join(REPO, "main.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, text=True, cwd=REPO, env=env)


def wait_for_line(process, pattern, timeout=240):
    """Reads the process's stdout until a line matches; returns what it read."""
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if re.search(pattern, line):
            return "".join(seen)
    process.kill()
    pytest.fail(f"no line matching {pattern!r}; output:\n{''.join(seen)[-3000:]}\n{process.stderr.read()[-3000:]}")


def run_python(code: str, *args, timeout=600):
    """Runs `code` in a fresh Python process (no state shared with the test process)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=timeout)
