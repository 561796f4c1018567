"""The training job of `main.py`: the config's datasets mixed into one stream of batches, trained by
train/loop.py to train_steps, with the validation loss, the eval tasks and the harness's tasks after each
checkpoint when the config asks for them (eval_steps, eval_tasks, harness_tasks)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from schema import ConfigError, GPTConfig
from data.inputs import DatasetSource, check_train_sources, train_dataset
from data.mlm import mask_dataset
from evals import harness
from evals.at_checkpoints import Evaluations
from models import flops, gpt
from devices import gpus, precision
from devices.peaks import Peak
from devices.placement import Placement
from execution.callbacks import Callback, Run
from execution.op_listing import PlacementListing
from modelpath import checkpoints, run_info, tokenizer_record
from modelpath.lock import TrainerLock
from models.optimizers import slot_patterns
from train import loop
from train.progress import Progress
from train.trackers import TensorBoard, WandB, check_wandb


@dataclass(frozen=True)
class TrainOptions:
    """This run's own settings (cli/train_flags.py fills them from --peak_tflops and --log_every); the rest is
    the config's."""
    peak_tflops: Optional[float] = None  # one device's peak for MFU; default: datasheet or measured (devices/peaks)
    log_every: Optional[int] = None      # progress line every N steps; default: min(iterations, 50)
    checkpoint_minutes: Optional[float] = None  # also save whenever this many minutes passed since the last save
    sacred_id: Optional[str] = None      # the Sacred run training for run_experiment.py, recorded in run_info.json


def run_description(cfg: GPTConfig) -> dict:
    """What model_path/run_info.json records of a run (modelpath/run_info.py keeps the file): the model's shape,
    tokens per step and model FLOPs per token (models/flops.py), and what it trained with."""
    return {
        "n_layer": cfg.n_layer, "n_embd": cfg.n_embd, "n_head": cfg.n_head, "n_ctx": cfg.n_ctx,
        "n_vocab": cfg.n_vocab, "attention_types": list(cfg.attention_types),
        "train_batch_size": cfg.train_batch_size, "tokens_per_step": cfg.train_batch_size * cfg.n_ctx,
        "flops_per_token": flops.training_flops_per_token(cfg), "parameters": flops.parameter_count(cfg)["total"],
        "precision": cfg.precision, "train_steps": cfg.train_steps, "lr": cfg.lr, "warmup_steps": cfg.warmup_steps,
    }


def dataset_sources(cfg: GPTConfig) -> list[DatasetSource]:
    """The input pipeline's sources for the config's datasets (each a glob, its sampling mode and weight)."""
    return [DatasetSource(use.dataset.path, use.stitch, use.sampling_mode, use.weight,
                          shuffle_files=cfg.shuffle_input_filenames) for use in cfg.datasets]


def _check_datasets_and_writable(cfg: GPTConfig) -> None:
    """Training's refusals that need no data and no checkpoint: a config without datasets, a model_path this
    process cannot write in."""
    if not cfg.datasets:
        raise ConfigError("the config has no datasets to train on: add \"datasets\": [[\"ID\", stitch, mode, weight]]")
    checkpoints.check_writable(cfg.model_path, "make it writable, or set model_path to a folder you can write in")


@dataclass(frozen=True)
class Checked:
    """What check_training found, for run_training: the harness's tasks, prepared (None without them)."""
    prepared: Optional[harness.Prepared]


def check_training(cfg: GPTConfig, harness_options: Optional[harness.HarnessOptions] = None) -> Checked:
    """Every refusal of training that needs no checkpoint, writing nothing: a config without datasets, a
    model_path that cannot be written, the data's (data/inputs.py's build-time checks: files that are there
    and whole, documents that `stitch` makes into windows of n_ctx+1 tokens, ids below n_vocab) and the
    harness's tasks (known, their local data there). main.py runs it before --new deletes model_path and hands
    its result to run_training; training itself meets the data's when it builds its input pipeline."""
    _check_datasets_and_writable(cfg)
    check_wandb(cfg)
    check_train_sources(dataset_sources(cfg), cfg.n_ctx, cfg.train_batch_size, cfg.seed, n_vocab=cfg.n_vocab)
    return _prepare_harness(cfg, harness_options or harness.HarnessOptions.from_config(cfg))


def _prepare_harness(cfg: GPTConfig, harness_options: harness.HarnessOptions) -> Checked:
    """The harness's tasks checked before the first step, not found wrong after the first checkpoint. Once a run:
    for lm-eval's own tasks it indexes every task file the harness ships (21 CPU s on a 2-core AMD EPYC VM)."""
    return Checked(harness.prepare(harness_options, cfg) if harness_options.tasks else None)


class RunRecord(Callback):
    """What later jobs and tools read of the run, written once the checkpoint is found to fit the config (nothing of
    another model's model_path is touched): the data's tokenizer (modelpath/tokenizer_record.py, which later jobs
    on model_path are checked against) and run_info.json's start (tokens/step and FLOPs/token for
    tools/plot_runs.py, the Sacred run that trained it)."""

    def __init__(self, sacred_id: Optional[int] = None):
        self.sacred_id = sacred_id

    def on_open(self, run: Run) -> None:
        tokenizer_record.record(run.cfg)
        run_info.write(run.cfg.model_path, run_description(run.cfg), run.start, self.sacred_id)


def run_training(cfg: GPTConfig, placement: Placement, options: TrainOptions = TrainOptions(),
                 harness_options: Optional[harness.HarnessOptions] = None, checked: Optional[Checked] = None) -> int:
    """Trains model_path to train_steps (resuming at its latest checkpoint) in one session, with the validation
    loss, eval tasks and harness tasks after each steps_per_checkpoint checkpoint when the config asks for them.
    Returns the step reached. `checked`: check_training's result (main.py's training job checked before it ran);
    without it, the refusals that read no data are made here (the data's come when the input pipeline is built).

    Which checkpoint training starts from is decided here, once (the newest that can be read). SIGINT or SIGTERM
    (on a multi-host run: to any of its tasks) stops after the current step with a checkpoint (loop.Interrupted)."""
    harness_options = harness_options or harness.HarnessOptions.from_config(cfg)
    if checked is None:
        _check_datasets_and_writable(cfg)
        check_wandb(cfg)
        checked = _prepare_harness(cfg, harness_options)
    with TrainerLock(cfg.model_path):  # one trainer per model_path (modelpath/lock.py)
        return _train_locked(cfg, placement, options, harness_options, checked.prepared)


def _train_locked(cfg: GPTConfig, placement: Placement, options: TrainOptions,
                  harness_options: harness.HarnessOptions, prepared: Optional[harness.Prepared]) -> int:
    restored = checkpoints.restorable(cfg.model_path)
    start = checkpoints.step_of(restored) if restored else 0
    if start >= cfg.train_steps:
        # A checkpoint of another model is refused here as it is when there are steps left (loop.train)
        if restored:
            checkpoints.check_fits(restored, gpt.variable_shapes(cfg), slot_patterns=slot_patterns())
        print(f"{cfg.model_path} is already at step {start} of train_steps {cfg.train_steps}; nothing to train "
              f"(raise train_steps or pass --new)")
        return start
    # "auto" becomes this device's precision (bfloat16 only on CPUs with bf16 matrix units); an explicit one stays.
    # The evaluations after each checkpoint are handed this config (their precision: devices/precision.py).
    cfg, note = precision.for_training(cfg, placement)
    sources = dataset_sources(cfg)
    log_every = options.log_every or max(1, min(cfg.iterations, 50))
    print(f"training {cfg.n_layer} layers x {cfg.n_embd} wide on mesh {cfg.mesh_shape} "
          f"({placement.describe()}) in {cfg.precision}, steps {start} -> {cfg.train_steps}, "
          f"checkpoints every {cfg.steps_per_checkpoint} in {cfg.model_path}", flush=True)
    if note:
        print(note, flush=True)
    # MFU's denominator is one device's peak: the progress line divides the mesh's FLOP/s by cfg.n_devices.
    # Measured after the line above, which says what starts.
    peak = (Peak(options.peak_tflops * 1e12, "--peak_tflops") if options.peak_tflops else
            placement.peak(cfg.precision))
    if peak.flops:
        print(f"MFU against {peak.flops / 1e12:.3g} TFLOP/s per device ({peak.source})", flush=True)
    else:
        print(f"MFU not shown: one device's peak is {peak.source}", flush=True)

    def batches(first: int):  # the stream from step `first` on: exactly what an uninterrupted run reads there
        stream = train_dataset(sources, cfg.n_ctx, cfg.train_batch_size, cfg.seed, start_step=first,
                               n_vocab=cfg.n_vocab)
        return mask_dataset(stream, cfg, first_step=first)  # MLM masking; unchanged for language modelling

    validate = bool(cfg.eval_steps and cfg.tokenizer_dataset and cfg.tokenizer_dataset.eval_path)
    # The step's graph takes seconds to build (2 s at the default's 4 layers on 2 cores, more with the model)
    print(f"building the training graph, {checkpoints.weights_origin(restored)} ...", flush=True)
    # One program and one session train to train_steps; the evaluations run after each steps_per_checkpoint save,
    # their programs built at the first and kept (evals/at_checkpoints.py).
    with Evaluations(cfg, placement, validate, harness_options, prepared) as evaluations:
        return loop.train(cfg, placement, batches, training_callbacks(cfg, placement, options, log_every, peak,
                                                                      evaluations), checkpoint=restored)


def training_callbacks(cfg: GPTConfig, placement: Placement, options: TrainOptions, log_every: int, peak: Peak,
                       evaluations: Optional[Callback] = None) -> list[Callback]:
    """A training run's callbacks, in the order they run (train/loop.py adds the placement's signal watcher
    first): the run's record, the placement listing on GPUs, the progress line, the evaluations at checkpoints
    (before the trackers, which log their results), the trackers, the clock's checkpoints."""
    progress = Progress(cfg, log_every, peak.flops)
    callbacks: list[Callback] = [RunRecord(options.sacred_id)]
    if gpus.uses_gpus(placement):
        callbacks.append(PlacementListing(shown=True))
    callbacks.append(progress)
    if evaluations:
        callbacks.append(evaluations)
    callbacks.append(TensorBoard(progress))
    if cfg.wandb_project:
        callbacks.append(WandB(progress, run_description(cfg)))
    if options.checkpoint_minutes:
        callbacks.append(loop.CheckpointOnTheClock(options.checkpoint_minutes))
    return callbacks
