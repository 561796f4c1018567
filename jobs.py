"""The jobs `main.py` runs, one interface: `check(placement)` makes every refusal the job would make, writing and
deleting nothing, then `run(placement)` does it. main.py reads the config, picks one job from the flags, starts
the devices when the job uses them, asks the job to check, asks --new's question, and runs it: so a bad config,
dataset, tokenizer, memory estimate or harness task is one `error:` line before anything in model_path changes.

    Training       python main.py --model M [--new]   train/job.py
    Evaluation     --eval                              evals/job.py
    Prediction     --predict                           infer/job.py
    Export         --export                            infer/job.py
    DatasetCheck   --check_dataset                     data/check.py
    DryRun         --dry_run                           plan/dry_run.py
    AutoLayout     --auto_layout[_and_mesh_shape]      plan/auto_layout.py
    SelfCheck      --selfcheck                         selfcheck/job.py

A new job is one class here and one line in main.py's `job_for`. The jobs' own modules are imported in the
methods: main.py's parser imports nothing heavy, and `--help` does not wait for TensorFlow.
"""
from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from typing import Any, Optional

from schema import ConfigError, GPTConfig, warn_unrecorded_tokenizers


class Job:
    """One thing main.py does with a config."""
    uses_devices = True  # main.py starts the placement (a TPU, a cluster, GPUs, this CPU) before check()

    def check(self, placement) -> None:
        """Raises ConfigError (or DataError, DeviceError, CheckpointError) for anything the job would refuse;
        writes and deletes nothing."""

    def run(self, placement) -> int:
        """Does the job, once check() passed; returns the exit code."""
        raise NotImplementedError


@dataclass
class _OnModelPath(Job):
    """A job on model_path's checkpoints, with the memory check of its kind (plan/memory_check.py)."""
    cfg: GPTConfig
    name: str                     # the config as the user named it (--model), for the memory check's line
    memory_check: bool = True     # False: --ignore_memory_check

    def _check_model_path(self, recorded: bool = True, reads_data: bool = True) -> None:
        from modelpath import checkpoints, tokenizer_record
        checkpoints.check_model_path(self.cfg.model_path)
        if recorded:
            tokenizer_record.check(self.cfg)  # the tokenizer model_path's checkpoints were trained on
        if reads_data:
            warn_unrecorded_tokenizers(self.cfg)  # the data's tokens are read: say what cannot be checked

    def _check_inference_memory(self, placement, kind: str) -> None:
        if self.memory_check:
            from plan import memory_check
            memory_check.check_inference(self.cfg, placement, self.name, kind)


@dataclass
class Training(_OnModelPath):
    """Trains model_path to train_steps (train/job.py), resuming; with `new`, model_path is deleted first (main.py
    asked). Every check comes before the deletion: a trainer running there, the memory estimate, the data, the
    harness's tasks."""
    options: Any = None           # train/job.TrainOptions
    harness_options: Any = None   # evals/harness.HarnessOptions
    new: bool = False             # --new: delete model_path, then train from step 0
    checked: Any = None           # train/job.Checked, from check()

    def check(self, placement) -> None:
        from modelpath.lock import check_free
        from train.job import check_training
        if os.path.isdir(self.cfg.model_path or ""):
            check_free(self.cfg.model_path)  # one trainer per model_path: refused before anything else
        self._check_model_path(recorded=not self.new)  # --new deletes the checkpoints the record speaks for
        if self.memory_check:
            from plan import memory_check
            memory_check.check_training(self.cfg, placement, self.name)
        # no datasets, a model_path that cannot be written, data that cannot give windows, unknown harness tasks
        self.checked = check_training(self.cfg, self.harness_options)

    def run(self, placement) -> int:
        from train.job import run_training
        if self.new:
            delete_model_path(self.cfg.model_path)
        run_training(self.cfg, placement, self.options, harness_options=self.harness_options, checked=self.checked)
        return 0


def delete_model_path(model_path: str) -> None:
    """--new, confirmed and every check passed: deletes model_path, holding its lock meanwhile (a trainer that
    started since the question is refused in one error line naming it)."""
    if not os.path.exists(model_path):
        return
    from modelpath.lock import TrainerLock
    with TrainerLock(model_path):
        shutil.rmtree(model_path)
    print(f"deleted {model_path}")


@dataclass
class Evaluation(_OnModelPath):
    """`--eval`: the validation loss, eval tasks and harness tasks of the newest checkpoint (evals/job.py)."""
    harness_options: Any = None
    checked: Any = None           # evals/job.Checked, from check()

    def check(self, placement) -> None:
        from evals.job import check_evaluation
        self._check_model_path()
        self._check_inference_memory(placement, "eval")
        self.checked = check_evaluation(self.cfg, self.harness_options)

    def run(self, placement) -> int:
        from evals.job import run_evaluation
        return run_evaluation(self.cfg, placement, self.harness_options, self.checked)


@dataclass
class Prediction(_OnModelPath):
    """`--predict`: samples continuing the prompts, from the newest checkpoint (infer/job.py)."""
    options: Any = None           # infer/predict.PredictOptions

    def check(self, placement) -> None:
        from infer.job import check_prediction
        self._check_model_path()
        self._check_inference_memory(placement, "predict")
        check_prediction(self.cfg, self.options)

    def run(self, placement) -> int:
        from infer.job import run_prediction
        return run_prediction(self.cfg, placement, self.options)


@dataclass
class Export(_OnModelPath):
    """`--export`: a SavedModel of the newest checkpoint (infer/job.py). It reads no data: no tokenizer check."""
    options: Any = None           # infer/job.ExportOptions

    def check(self, placement) -> None:
        from modelpath import checkpoints
        self._check_model_path(recorded=False, reads_data=False)
        checkpoints.require_checkpoint(self.cfg.model_path)

    def run(self, placement) -> int:
        from infer.job import run_export
        return run_export(self.cfg, placement, self.options)


@dataclass
class DatasetCheck(Job):
    """`--check_dataset`: each dataset's token id range and a decoded sample (data/check.py)."""
    cfg: GPTConfig
    uses_devices = False

    def check(self, placement) -> None:
        from modelpath import tokenizer_record
        tokenizer_record.check(self.cfg)  # the tokenizer model_path's checkpoints were trained on

    def run(self, placement) -> int:
        from data import check
        return check.run(self.cfg)


@dataclass
class DryRun(Job):
    """`--dry_run`: parameters, FLOPs, memory per device and the smallest mesh that fits, without devices."""
    cfg: GPTConfig
    name: str
    device_memory: Optional[str] = None  # --device_memory: the devices' memory to plan for
    uses_devices = False

    def run(self, placement) -> int:
        from plan import dry_run
        start = time.perf_counter()
        print(dry_run.describe(dry_run.make_plan(self.cfg, self.device_memory), self.name))
        print(f"(planned in {time.perf_counter() - start:.1f} s)")
        return 0


@dataclass
class AutoLayout(Job):
    """`--auto_layout` (the layout for the config's mesh) or `--auto_layout_and_mesh_shape` (both, for
    `n_devices`), by mesh-tensorflow's auto_mtf; `write_config` writes a config with them."""
    cfg: GPTConfig
    name: str
    n_devices: Optional[int] = None       # None: --auto_layout, the config's own mesh
    write_config: Optional[str] = None
    uses_devices = False

    def run(self, placement) -> int:
        from config import resolve_config_path
        from plan import auto_layout
        if self.n_devices is None:
            result = auto_layout.auto_layout(self.cfg)
        else:
            result = auto_layout.auto_layout_and_mesh_shape(self.cfg, self.n_devices)
        print(auto_layout.describe(result, self.name, with_mesh=self.n_devices is not None))
        if self.write_config:
            path = auto_layout.write_config(resolve_config_path(self.name), result, self.write_config)
            print(f"wrote {path}: train with python main.py --model {path}")
        return 0


@dataclass
class SelfCheck(Job):
    """`--selfcheck [DTYPE]`: a tiny model trained on the devices asked for against this host's CPU
    (selfcheck/job.py), in a temporary folder: no config or model_path of the user's is used. It places its own
    devices (in the precision under test)."""
    request: Any                  # devices/placement.DeviceRequest
    dtype: str
    uses_devices = False

    def run(self, placement) -> int:
        import tempfile
        from config import config_from_dict
        from devices import kinds
        from selfcheck import job
        placement = kinds.place(self.request, precision=self.dtype)
        reference = job.REFERENCE.start_up(self.request.plain_kernels, self.request.xla)
        with tempfile.TemporaryDirectory(prefix="gpt-neo-selfcheck-") as root:
            on_devices, on_cpu = job.model_settings(placement.n_devices, self.dtype, root)
            return job.run(config_from_dict(on_devices, "the selfcheck model"),
                           config_from_dict(on_cpu, "the selfcheck model"), placement, reference)


def refuse_new_with(job: Job) -> None:
    """--new deletes model_path before training; with any other job it would delete a model to then use it."""
    if not isinstance(job, Training):
        raise ConfigError("--new goes with training (it deletes model_path, then trains from step 0): drop --new, "
                          "or drop --eval/--predict/--export/--check_dataset/--dry_run/--auto_layout")
