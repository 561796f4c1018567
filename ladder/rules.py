"""The per-size rules: from a shape's N, the batch in tokens, the learning rate and warmup, Adam's beta2 and the
duration, and the size's config (the base config with the shape and these set). Pure arithmetic: the devices,
micro-batches and gradient accumulation are the planner's (ladder/plan.py). Sources: docs/ladder.md, "The rules".
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

from schema import ConfigError, GPTConfig, check_decay_after_warmup, wsd_last_peak_step
from schema import read_json, resolve_config_path

from ladder import shapes
from ladder.spec import LadderError, LadderSpec, short_count

REFERENCE_PARAMS = 108e6  # the N that Porian et al. 2024's batch and lr rules are anchored at


@dataclass(frozen=True)
class SizeRun:
    """One run of the ladder: a size trained to a Chinchilla multiple. Under the WSD schedule a size has one trunk
    (the longest multiple), checkpointed at each branch's start and kept there, and branches: runs of their own
    length that start from the trunk's checkpoint at their decay's start, so each is exactly a WSD run of that
    length that shares the trunk's stable phase. Under the base schedule every run starts from step 0."""
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
    kind: str = "run"             # "trunk", "branch" (WSD) or "run" (the base schedule)
    trunk: Optional[str] = None   # a branch's trunk (its name)
    start: int = 0                # the step a branch starts from: the trunk's checkpoint there
    keep_steps: tuple = ()        # a trunk's checkpoints kept for its branches
    decay_share: Optional[float] = None  # WSD: the share of the run its lr decays over; None: the base's schedule
    repeat: int = 0               # 0, or the k-th repeat on another data order (the base's seed + k)
    seed: Optional[int] = None    # the data order's and initialisation's seed of a repeat; None: the base's

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_tokens

    @property
    def size(self) -> str:
        """The size's name (n25K), shared by all its runs: `fit --hold_out` takes it."""
        return size_name(self.target)

    @property
    def lineage(self) -> str:
        """The runs sharing an initialisation and data order: a trunk and its branches (fit's bootstrap resamples
        lineages, not points)."""
        return self.trunk or self.name

    @property
    def trained_steps(self) -> int:
        return self.steps - self.start

    def changes(self, base: GPTConfig) -> dict:
        """The config keys this run sets on the base config."""
        changes = {"n_layer": self.shape.n_layer, "n_embd": self.shape.n_embd, "n_head": self.shape.n_head,
                   "attention_types": shapes.attention_types_for(base, self.shape.n_layer), "lr": self.lr,
                   "warmup_steps": self.warmup_steps, "beta2": self.beta2, "train_batch_size": self.batch_sequences,
                   "train_steps": self.steps, "steps_per_checkpoint": self.eval_every, "model_path": self.model_path}
        if self.decay_share is not None:
            changes.update(lr_decay="wsd", lr_decay_share=self.decay_share, lr_decay_end=None)
        if self.keep_steps:
            changes["keep_checkpoint_steps"] = list(self.keep_steps)
        if self.seed is not None:
            changes["seed"] = self.seed
        return changes


def size_name(target: float) -> str:
    return f"n{short_count(target)}"


def run_name(target: float, multiple: float, repeat: int = 0) -> str:
    """n25K at multiple 1, n25K-x0.25 at another, n25K-r1 on the first repeat's data order: adding a multiple or a
    repeat to a spec renames no run that exists."""
    name = size_name(target)
    name = name if multiple == 1 else f"{name}-x{multiple:g}"
    return f"{name}-r{repeat}" if repeat else name


def branch_start(steps: int, decay_share: float) -> int:
    """Where a branch of `steps` starts from its trunk: the last step of a WSD run of that length whose update
    (the one from global step s, models/optimizers.py's "wsd") is still at the peak, since the peak holds while
    step / steps <= 1 - decay_share. The checkpoint at s holds the updates of global steps 0 .. s - 1, all at the
    peak in the trunk and in a run of `steps` alike (strictly inside the stable phase, clear of float rounding), so
    the branch has had exactly its own schedule's updates; its own first is the last at the peak."""
    return wsd_last_peak_step(steps, decay_share)


def _check_decay_after_warmup(run: SizeRun, rules) -> None:
    """The config's check (schema.check_decay_after_warmup) on a run, in the ladder's words: a warmup past the
    branch start would cut into the decay or skip it, and a short branch trained exactly as its trunk would be
    fitted as an annealed point."""
    try:
        check_decay_after_warmup(run.warmup_steps, run.steps, rules.decay_share)
    except ConfigError:
        raise LadderError(f"run {run.name} would start its decay at step {branch_start(run.steps, rules.decay_share)}, "
                          f"inside its {run.warmup_steps}-step warmup, and never anneal: raise "
                          f"\"chinchilla_multiples\" or lower \"rules\".warmup_tokens_per_param (now "
                          f"{rules.warmup_tokens_per_param:g})") from None


def batch_sequences(n: float, spec: LadderSpec, n_ctx: int) -> int:
    """Porian et al.'s batch in tokens, in whole sequences, a multiple of the device count (at least one each)."""
    tokens = spec.rules.batch_tokens_at_108M * (n / REFERENCE_PARAMS) ** spec.rules.batch_exponent
    count = spec.devices.count
    return max(count, round(tokens / n_ctx / count) * count)


def size_runs(spec: LadderSpec, base: GPTConfig) -> list[SizeRun]:
    """Every run of the spec: per size and data order, under WSD its trunk then its branches (shortest first), under
    the base schedule one run per multiple; sizes smallest first, a size's repeats after it."""
    rules, runs = spec.rules, []
    for target in spec.sizes:
        shape = shapes.shape_for(base, target, rules)
        n = shape.non_embedding
        sequences = batch_sequences(n, spec, base.n_ctx)
        batch_tokens = sequences * base.n_ctx
        lr = float(f"{rules.lr_at_108M * (n / REFERENCE_PARAMS) ** rules.lr_exponent:.4g}")
        warmup = round(rules.warmup_tokens_per_param * n / batch_tokens)
        beta2 = rules.small_batch_beta2 if batch_tokens < rules.small_batch_tokens else base.beta2

        def steps_at(multiple):
            return max(1, round(rules.tokens_per_param * n * multiple / batch_tokens))

        def make(multiple, repeat, **kind):
            name = run_name(target, multiple, repeat)
            steps = steps_at(multiple)
            # a branch is evaluated at its end only (a checkpoint every `steps` from its start: at its last step)
            every = steps if kind.get("kind") == "branch" else math.ceil(steps / spec.eval_points)
            return SizeRun(name, target, multiple, shape, sequences, batch_tokens, lr, warmup, beta2, steps, every,
                           os.path.join(spec.out, name), os.path.join(spec.out, "configs", name + ".json"),
                           repeat=repeat, seed=base.seed + repeat if repeat else None, **kind)

        repeats = [0] + ([1] if target in spec.repeats else [])
        for repeat in repeats:
            if spec.schedule == "base":
                runs += [make(m, repeat) for m in spec.multiples]
                continue
            longest = max(spec.multiples)
            ends, seen = [], {steps_at(longest)}
            for m in sorted(set(spec.multiples) | {longest * f for f in rules.branch_fractions}):
                if steps_at(m) not in seen:  # two ends of one step count are one run
                    seen.add(steps_at(m))
                    ends.append(m)
            trunk = run_name(target, longest, repeat)
            branches = [make(m, repeat, kind="branch", trunk=trunk, start=branch_start(steps_at(m), rules.decay_share),
                             decay_share=rules.decay_share) for m in ends]
            keep = tuple(sorted({b.start for b in branches if b.start > 0}))
            trunk_run = make(longest, repeat, kind="trunk", keep_steps=keep, decay_share=rules.decay_share)
            for run in [trunk_run] + branches:
                _check_decay_after_warmup(run, rules)
            runs.append(trunk_run)
            runs += branches
    return runs


def base_raw(spec: LadderSpec) -> dict:
    """The base config's JSON with the spec's overrides."""
    raw = read_json(resolve_config_path(spec.base), "model config")
    raw.update(spec.overrides)
    return raw
