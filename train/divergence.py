"""A run whose numbers stop being numbers: training stops with one line, and no checkpoint holds inf or NaN.

Two checks, both off the step's critical path:
- every step, on the scalars the loop fetches anyway (train/step.py's outputs): a non-finite loss, objective
  or gradient norm stops the run at that step (`problem`). Checking fetched scalars costs nothing; a check in
  the graph would have to gate the update (a select over every weight per step, as float16's AssignIf does)
  only to stop the run a few microseconds later anyway. float16's loss scaling is left to do its job: a step
  whose gradients overflowed at a scale above 1 updated nothing and halved the scale (train/loss_scale.py); at
  a scale of 1 halving cannot help, and the run stops.
- at every save, on the weights themselves (execution/mesh_session.py refuses to write a checkpoint holding inf
  or NaN: one pass over the variables per checkpoint, beside the save's own write of them): an update can
  make the weights non-finite while its loss and gradient norm were finite (an lr that overflows float32),
  and the step that would show it comes after the save.

Either way `Diverged` names the step, what was not finite, the newest checkpoint (the last one written, all of
it finite) and what to change; nothing after it is saved, so running again after the change resumes there.
"""
from __future__ import annotations

import math
from typing import Optional

from schema import ConfigError, GPTConfig
from modelpath import checkpoints

CHECKED = ("loss", "objective", "grad_norm")  # train/step.py's outputs that must be finite


def problem(values: dict) -> Optional[str]:
    """What is not finite in one step's fetched scalars ("loss nan, grad_norm inf"), or None. A float16 step
    whose only non-finite number is the gradient norm, at a loss scale above 1, is loss scaling's skipped step."""
    bad = [name for name in CHECKED if name in values and not math.isfinite(float(values[name]))]
    if "loss" in bad and "objective" in bad:  # the objective is the loss plus its terms: named once
        bad.remove("objective")
    scale = float(values["loss_scale"]) if "loss_scale" in values else None  # float16 only
    skipped = bad == ["grad_norm"] and scale is not None and scale > 1.0  # loss scaling skipped the update
    if not bad or skipped:
        return None
    found = ", ".join(f"{name} {float(values[name])}" for name in bad)
    if "grad_norm" in bad and scale is not None and scale <= 1.0:
        found += " at loss scale 1 (the float16 gradients overflow unscaled)"
    return found


class Diverged(ConfigError):
    """Training stopped at `step`: a non-finite loss or gradient norm, or weights that hold inf or NaN at a save.
    One line: the step, what was not finite, the newest checkpoint (finite) and what to change."""

    def __init__(self, cfg: GPTConfig, step: int, what: str, from_newest: bool = True):
        """`from_newest`: `what` was computed from the weights the step started from (a loss, a gradient)."""
        self.step = step
        newest = checkpoints.latest(cfg.model_path)
        if newest is None:
            kept = "nothing was saved"
            resume = "run again (the run starts from scratch)"
        else:
            saved = checkpoints.step_of(newest)
            kept = f"nothing after step {saved} was saved"
            if from_newest and saved == step - 1:  # finite, but they gave this step's numbers
                before = [s for s in checkpoints.steps(cfg.model_path) if s < saved]
                older = f"; {checkpoints.PREFIX}-{before[-1]} is the one before" if before else ""
                kept += f" ({checkpoints.PREFIX}-{saved} holds the weights this step started from{older})"
            resume = f"run again to resume from {checkpoints.PREFIX}-{saved}"
        super().__init__(f"training diverged at step {step}: {what}; {kept}: {', '.join(remedies(cfg))}, then "
                         f"{resume}")


def remedies(cfg: GPTConfig) -> list[str]:
    """What to change in the config, for this one."""
    tries = [f"lower lr (now {cfg.lr:g})"]
    if not cfg.warmup_steps:
        tries.append("add warmup_steps")
    if not cfg.gradient_clipping:
        tries.append("set gradient_clipping (e.g. 1.0)")
    if cfg.precision == "float16":
        tries.append("train in bfloat16 or float32 precision")
    elif cfg.precision == "bfloat16":
        tries.append("train in float32 precision")
    return tries


def weights_problem(error: checkpoints.NonFiniteWeights) -> str:
    """What a save refused for non-finite weights found, as Diverged's `what`."""
    more = f" and {len(error.names) - 1} more variables" if len(error.names) > 1 else ""
    return f"the weights hold inf or NaN ({error.names[0]}{more}) while every loss and gradient norm was finite"
