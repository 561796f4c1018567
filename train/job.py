"""The training job of `main.py`: the config's datasets mixed into one stream of batches, trained by
train/loop.py to train_steps, with the validation loss and the eval tasks after each checkpoint when the config
asks for them (eval_steps, eval_tasks)."""
from __future__ import annotations

from typing import Optional

from config.schema import ConfigError, GPTConfig
from data.inputs import DatasetSource, train_dataset
from data.mlm import mask_dataset
from data.tokenizer import load_for_config
from evals import tasks, validation
from runtime import checkpoints
from runtime.devices import Placement, measure_matmul_peak
from tools.runs import write_run_info
from train import loop
from runtime.summaries import summary_writer
from train.progress import TrainingLog


def run_training(cfg: GPTConfig, placement: Placement, peak_tflops: Optional[float] = None,
                 log_every: Optional[int] = None, sacred_id: Optional[str] = None) -> int:
    """Trains model_path to train_steps (resuming at its latest checkpoint), in chunks of steps_per_checkpoint
    with the validation loss and eval tasks after each when the config asks for them. Returns the step reached."""

    if not cfg.datasets:
        raise ConfigError("the config has no datasets to train on: add \"datasets\": [[\"ID\", stitch, mode, weight]]")
    start = checkpoints.latest_step(cfg.model_path)
    if start >= cfg.train_steps:
        print(f"{cfg.model_path} is already at step {start} of train_steps {cfg.train_steps}; nothing to train "
              f"(raise train_steps or pass --new)")
        return start
    sources = [DatasetSource(use.dataset.path, use.stitch, use.sampling_mode, use.weight) for use in cfg.datasets]
    peak = peak_tflops * 1e12 if peak_tflops else (0.0 if placement.use_tpu else measure_matmul_peak())
    log_every = log_every or max(1, min(cfg.iterations, 50))
    print(f"training {cfg.n_layer} layers x {cfg.n_embd} wide on mesh {cfg.mesh_shape} "
          f"({', '.join(placement.devices) or placement.tpu}), steps {start} -> {cfg.train_steps}, "
          f"checkpoints every {cfg.steps_per_checkpoint} in {cfg.model_path}", flush=True)
    write_run_info(cfg, start, sacred_id)  # tokens/step and FLOPs/token for tools/plot_runs.py
    writer = summary_writer(cfg.model_path)

    def batches(first: int):  # the stream from step `first` on: exactly what an uninterrupted run reads there
        stream = train_dataset(sources, cfg.n_ctx, cfg.train_batch_size, cfg.seed, start_step=first,
                               n_vocab=cfg.n_vocab)
        return mask_dataset(stream, cfg, first_step=first)  # MLM masking; unchanged for language modelling

    # Train in chunks of steps_per_checkpoint when evaluating, so that eval runs after each checkpoint.
    step = start
    while step < cfg.train_steps:
        evaluating = cfg.eval_steps or cfg.eval_tasks
        target = min(cfg.train_steps, step + cfg.steps_per_checkpoint) if evaluating else cfg.train_steps
        step = loop.train(cfg, placement, batches, until=target,
                          log=TrainingLog(cfg, log_every, peak, writer))
        if cfg.eval_steps and cfg.tokenizer_dataset and cfg.tokenizer_dataset.eval_path:
            validation.report(cfg, placement)
        if cfg.eval_tasks:
            tasks.run_eval_tasks(cfg, placement, load_for_config(cfg), step)
    return step
