"""The per-size rules: from a shape's N, the batch in tokens, the learning rate and warmup, Adam's beta2 and the
duration, and the size's config (the base config with the shape and these set). Pure arithmetic: the devices,
micro-batches and gradient accumulation are the planner's (ladder/plan.py). Sources: docs/ladder.md, "The rules".
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from schema import GPTConfig
from schema import read_json, resolve_config_path

from ladder import shapes
from ladder.spec import LadderSpec, short_count

REFERENCE_PARAMS = 108e6  # the N that Porian et al. 2024's batch and lr rules are anchored at


@dataclass(frozen=True)
class SizeRun:
    """One run of the ladder: a size at a Chinchilla multiple."""
    name: str
    target: float                 # the spec's non-embedding target
    multiple: float
    shape: shapes.Shape
    batch_sequences: int          # train_batch_size
    batch_tokens: int
    lr: float
    warmup_steps: int
    beta2: float
    steps: int                    # train_steps: the duration in whole batches
    eval_every: int               # steps_per_checkpoint: an evaluation after each checkpoint
    model_path: str
    config_path: str

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_tokens

    def changes(self, base: GPTConfig) -> dict:
        """The config keys this run sets on the base config."""
        return {"n_layer": self.shape.n_layer, "n_embd": self.shape.n_embd, "n_head": self.shape.n_head,
                "attention_types": shapes.attention_types_for(base, self.shape.n_layer), "lr": self.lr,
                "warmup_steps": self.warmup_steps, "beta2": self.beta2, "train_batch_size": self.batch_sequences,
                "train_steps": self.steps, "steps_per_checkpoint": self.eval_every, "model_path": self.model_path}


def run_name(target: float, multiple: float) -> str:
    """n25K at multiple 1, n25K-x0.25 at another: adding a multiple to a spec renames no run that exists."""
    name = f"n{short_count(target)}"
    return name if multiple == 1 else f"{name}-x{multiple:g}"


def batch_sequences(n: float, spec: LadderSpec, n_ctx: int) -> int:
    """Porian et al.'s batch in tokens, in whole sequences, a multiple of the device count (at least one each)."""
    tokens = spec.rules.batch_tokens_at_108M * (n / REFERENCE_PARAMS) ** spec.rules.batch_exponent
    count = spec.devices.count
    return max(count, round(tokens / n_ctx / count) * count)


def size_runs(spec: LadderSpec, base: GPTConfig) -> list[SizeRun]:
    """Every (size, multiple) of the spec, smallest compute first."""
    rules, runs = spec.rules, []
    for target in spec.sizes:
        shape = shapes.shape_for(base, target, rules)
        n = shape.non_embedding
        sequences = batch_sequences(n, spec, base.n_ctx)
        batch_tokens = sequences * base.n_ctx
        lr = rules.lr_at_108M * (n / REFERENCE_PARAMS) ** rules.lr_exponent
        warmup = round(rules.warmup_tokens_per_param * n / batch_tokens)
        beta2 = rules.small_batch_beta2 if batch_tokens < rules.small_batch_tokens else base.beta2
        for multiple in spec.multiples:
            steps = max(1, round(rules.tokens_per_param * n * multiple / batch_tokens))
            name = run_name(target, multiple)
            runs.append(SizeRun(name, target, multiple, shape, sequences, batch_tokens, float(f"{lr:.4g}"), warmup,
                                beta2, steps, math.ceil(steps / spec.eval_points), os.path.join(spec.out, name),
                                os.path.join(spec.out, "configs", name + ".json")))
    return sorted(runs, key=lambda r: (r.shape.non_embedding * r.tokens, r.name))


def base_raw(spec: LadderSpec) -> dict:
    """The base config's JSON with the spec's overrides."""
    raw = read_json(resolve_config_path(spec.base), "model config")
    raw.update(spec.overrides)
    return raw
