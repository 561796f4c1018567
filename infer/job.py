"""`main.py --predict` and `main.py --export`: sampling from, and exporting, model_path's newest checkpoint
that can be read (infer/predict.py, infer/export.py), in the precision of the evaluations (devices/precision.py's
`for_inference`: training's on the placement's devices, or float32 with `eval_precision`), which the samples'
records and the export's gpt_config.json name."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Optional

from schema import GPTConfig
from data.tokenizer import load_for_config
from infer.export import export_saved_model
from infer.predict import PredictOptions, predict, read_prompts
from modelpath import checkpoints
from devices import precision
from devices.placement import Placement


@dataclass(frozen=True)
class ExportOptions:
    export_dir: Optional[str] = None  # default: model_path/export/STEP


def check_prediction(cfg: GPTConfig, options: PredictOptions) -> None:
    """--predict's refusals, writing nothing: a bad prompt file (reported before the checkpoint is looked for),
    no checkpoint."""
    read_prompts(options.prompt_files, options.prompt_per_line)
    checkpoints.require_checkpoint(cfg.model_path)


def run_prediction(cfg: GPTConfig, placement: Placement, options: PredictOptions) -> int:
    """Samples every prompt (check_prediction's refusals first), on `sampling_placement`'s kernels."""
    check_prediction(cfg, options)
    step = checkpoints.step_of(checkpoints.require_checkpoint(cfg.model_path))
    return predict(precision.for_inference(cfg, placement), sampling_placement(placement), options, step,
                   load_for_config(cfg))


def sampling_placement(placement: Placement) -> Placement:
    """--predict's placement: on CPU devices, the fused kernels as plain TF ops. A --predict process samples
    once, and XLA compiled the sampler's kernels into 99 programs (the prefill's and every decoding step's, per
    layer) before its first token: 61-63 of the 66 CPU seconds of the first session call of the default model
    (4 x 128, 96 new tokens; the call itself 1.8 with plain kernels), against 0.25 s saved per 96 tokens once
    compiled (2026-11-28, 2-core AMD EPYC, load 9-11). Other devices keep theirs (a GPU's XLA is the check's)."""
    if getattr(placement, "device_kind", None) == "CPU" and placement.kernels == "xla":
        return dataclasses.replace(placement, kernels="plain")
    return placement


def run_export(cfg: GPTConfig, placement: Placement, options: ExportOptions) -> int:
    """Writes the SavedModel (signatures generate and logits) of the newest checkpoint, in the precision the
    placement's devices run the model in (the SavedModel itself runs on one device wherever it is loaded)."""
    checkpoint = checkpoints.require_checkpoint(cfg.model_path)
    step = checkpoints.step_of(checkpoint)
    cfg = precision.for_inference(cfg, placement)
    path = export_saved_model(cfg, checkpoint, options.export_dir or os.path.join(cfg.model_path, "export", str(step)))
    print(f"exported step {step} to {path} (signatures: serving_default/generate, logits; "
          f"batch {cfg.predict_batch_size}, n_ctx {cfg.n_ctx}, {precision.running(cfg)})")
    return 0
