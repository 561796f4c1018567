"""`main.py --predict` and `main.py --export`: sampling from, and exporting, model_path's newest checkpoint
that can be read (infer/predict.py, infer/export.py)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

from config.schema import GPTConfig
from data.tokenizer import load_for_config
from infer.export import export_saved_model
from infer.predict import PredictOptions, predict, read_prompts
from runtime import checkpoints
from runtime.devices import Placement


@dataclass(frozen=True)
class ExportOptions:
    export_dir: Optional[str] = None  # default: model_path/export/STEP


def run_prediction(cfg: GPTConfig, placement: Placement, options: PredictOptions) -> int:
    """Samples every prompt; a bad prompt file is reported before the checkpoint is looked for."""
    read_prompts(options.prompt_files, options.prompt_per_line)
    step = checkpoints.step_of(checkpoints.require_checkpoint(cfg.model_path))
    return predict(cfg, placement, options, step, load_for_config(cfg))


def run_export(cfg: GPTConfig, options: ExportOptions) -> int:
    """Writes the SavedModel (signatures generate and logits) of the newest checkpoint."""
    checkpoint = checkpoints.require_checkpoint(cfg.model_path)
    step = checkpoints.step_of(checkpoint)
    path = export_saved_model(cfg, checkpoint, options.export_dir or os.path.join(cfg.model_path, "export", str(step)))
    print(f"exported step {step} to {path} (signatures: serving_default/generate, logits; "
          f"batch {cfg.predict_batch_size}, n_ctx {cfg.n_ctx})")
    return 0
