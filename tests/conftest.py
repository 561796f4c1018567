"""Shared test setup.

TensorFlow can split the CPU into logical devices only before it starts, and pytest runs every test in one
process, so the split happens here, once, at import: four CPU devices serve meshes of 1, 2 and 4.

Session fixtures (made once, shared by every test that asks; read them, never write them):
    trained_workspace    a workspace (tests/workspace.py) whose model is trained to step 2, checkpoints at 1 and
                         2; workspace.copy_workspace gives a test its own copy to change.

Function fixtures:
    autograph_conversions  the functions AutoGraph converts during the test, by name (a list the test reads)
"""
import os
import signal
import sys
import warnings

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", category=UserWarning)
TESTS = os.path.dirname(os.path.abspath(__file__))
# pytest.ini's --import-mode=importlib puts no test folder on sys.path and names each test file by its path
# (tests.models.test_sampling): the project's packages come from the repository root, the helpers beside this file
# (tiny.py, workspace.py, corpus.py, ...) from tests/, and a test file takes another's helpers by that dotted name.
# tests/data/, tests/models/, ... have no __init__.py, so they never shadow the packages they mirror.
sys.path[:0] = [os.path.dirname(TESTS), TESTS]
# `from conftest import CPU_DEVICES` (tiny.py, ...) gets this module, not a second one that would split the CPU again
sys.modules.setdefault("conftest", sys.modules[__name__])

# A suite started in the background by a script (`pytest &`, nohup) inherits SIGINT ignored, and so would every
# process it starts; the Ctrl-C tests check what a user at a terminal gets, so Python's own handler comes back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# XLA's compiled kernels go to one folder on disk for the whole run: the controller of `pytest -n 2` sets it before
# its workers start, and they and every main.py they start inherit it. The suite's trainings compile the same
# tiny kernels again and again (once per device of a mesh, per session, per process): a 4-device training's first
# step took 17 CPU s with a cold cache, 6 with a warm one (2-core AVX2 EPYC). The executables are the same.
# The product keeps one in ~/.cache by default (console/environment.py); the run's own, named here before
# runtime_defaults runs, takes its place, so the tests neither read nor write the user's.
def _run_folder(prefix: str) -> str:
    """A folder of this run's, removed when the process that made it (the controller of `pytest -n 2`) exits."""
    import atexit
    import shutil
    import tempfile
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


if "--tf_xla_persistent_cache_directory" not in os.environ.get("TF_XLA_FLAGS", ""):
    os.environ["TF_XLA_FLAGS"] = " ".join(filter(None, [
        os.environ.get("TF_XLA_FLAGS", ""), f"--tf_xla_persistent_cache_directory={_run_folder('tests-xla-cache-')}"]))

# XLA compiles the suite's kernels with LLVM at -O0: the suite's models are tiny, so compiling is most of what XLA
# costs it and running the kernels little (a cold 2-device tiny training: 5.3-6.1 -> 4.3-5.0 CPU s, 2-core Zen 4
# EPYC, 2026-12-07). XLA's own passes and fusions are the same; the machine code is unoptimised (its last bits
# may differ where -O3 would fuse a multiply and an add), and every test compares within its tolerance or between
# two programs of the run. Users, the benches, selfcheck and the quick start get XLA's default. A run whose
# XLA_FLAGS name a level keeps it.
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS", ""),
                                                     "--xla_backend_optimization_level=0"]))

# lm-eval's index of its own tasks (evals/task_index.py) likewise goes to a folder of the run's, not the user's.
if "GPT_NEO_TASK_INDEX_CACHE" not in os.environ:
    os.environ["GPT_NEO_TASK_INDEX_CACHE"] = _run_folder("tests-task-index-")

from console.environment import runtime_defaults  # noqa: E402

runtime_defaults()  # TensorFlow's kernels as every entry point sets them up (oneDNN on x86-64), before it loads

import models  # noqa: E402,F401  (compatibility alias before mesh_tensorflow)
from devices.placement import configure, cpu_devices  # noqa: E402

CPU_DEVICES = configure(cpu_devices(4))

import tensorflow.compat.v1 as tf  # noqa: E402

tf.get_logger().setLevel("ERROR")

pytest_plugins = ["cpu_durations"]  # `--cpu-durations=N`: the tests and files that cost the most CPU seconds


# Files that run first, in this order (their paths under tests/): the largest (GPT-Neo 125M's real shape peaks at
# ~8 GB) while both workers of `pytest -n 2` are fresh (a long-lived worker holds GBs of graphs the other's big test
# would find missing), then every other file of about 12 CPU seconds and more, longest first, so that no long file
# starts last and runs alone while the other worker idles. The order follows CI's own figures (`.ci/run` ends with
# every file's CPU seconds: tests/cpu_durations.py) from a fresh clone's run on a 2-core Zen 4 EPYC (2026-12-06,
# f7d66de: the fine-tune 70, sampling 67, the loop 47, the real ladder 40, training options 38, preemption 33,
# compiled decoding 33 (30 since its oracle steps in a loop, ~41 with the loaded-program process: moved up), the cluster
# 59 since its lost-task tests (2026-12-07), HF conversions 32, model options 30, the selfcheck 30, the bf16 oracle 29, precision 27,
# attention kernels 25, the TPU pods 23, the input pipeline 23, the decoder's stored traces ~18, multi-host 21, checkpoint safety 20,
# run_experiment 20, the ladder's fits 18, bad inputs 17, the harness 17, the dry run 15, predict
# and export 15, the harness model 14, infer's runner 14, the optimizers 14, the ladder's worker 14, the model 13,
# decode kernels 13, GPT-Neo's configs 12); the files not named here are smaller and run after them.
# `--no-loadscope-reorder` keeps this order.
FIRST_FILES = ("scenarios/test_finetune.py", "models/test_sampling.py", "train/test_loop.py", "devices/test_cluster.py",
               "ladder/test_run.py",
               "models/test_compiled_decoding.py", "train/test_training_options.py", "execution/test_preemption.py",
               "tools/test_hf.py", "models/test_model_options.py", "selfcheck/test_job.py",
               "train/test_bf16_training.py", "devices/test_precision.py", "models/kernels/test_attention.py",
               "devices/test_tpu.py", "data/test_inputs.py", "models/kernels/test_traces.py",
               "scenarios/test_multihost.py",
               "scenarios/test_checkpoint_safety.py", "test_run_experiment.py",
               "ladder/test_fit.py", "scenarios/test_bad_inputs.py", "evals/test_harness.py", "plan/test_dry_run.py",
               "scenarios/test_predict_export.py", "evals/test_harness_model.py", "infer/test_run.py",
               "models/test_optimizers.py", "ladder/test_worker.py", "models/test_gpt.py",
               "models/kernels/test_decode.py", "scenarios/test_gpt_neo_configs.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(FIRST_FILES)}
    items.sort(key=lambda item: rank.get(os.path.relpath(item.path, TESTS), len(FIRST_FILES)))  # stable


@pytest.fixture(scope="session")
def trained_workspace(tmp_path_factory):
    """A workspace (workspace.make_workspace's tiny model: 2 layers, global and local attention) trained on
    random tokens to step 2 with a checkpoint at each step (model.ckpt-1, model.ckpt-2), and the record of its
    data's tokenizer that main.py's training writes (model_path/tokenizer_id.json). Shared by the whole session:
    copy it (workspace.copy_workspace) before running anything that writes."""
    from config import load_config
    from modelpath import checkpoints, tokenizer_record
    from tiny import random_tokens, train
    from workspace import make_workspace

    root = tmp_path_factory.mktemp("trained_workspace")
    cfg = load_config(make_workspace(root, train_steps=2, steps_per_checkpoint=1, keep_checkpoint_max=5))
    train(cfg, random_tokens([8, cfg.n_ctx + 1], vocab=cfg.n_vocab, seed=4))
    assert checkpoints.steps(cfg.model_path) == [1, 2]
    tokenizer_record.record(cfg)  # as training by main.py does: its jobs warn about a model_path without one
    return root


@pytest.fixture
def autograph_conversions(monkeypatch):
    """The names of the functions AutoGraph rewrites during the test: the one place it converts
    (autograph.impl.api._convert_actual) records each entity, then converts it as before. A function wrapped in
    do_not_convert never reaches it."""
    from tensorflow.python.autograph.impl import api as autograph_api
    converted = []
    convert = autograph_api._convert_actual
    monkeypatch.setattr(autograph_api, "_convert_actual", lambda entity, program_ctx: converted.append(
        getattr(entity, "__qualname__", repr(entity))) or convert(entity, program_ctx))
    return converted
