"""`python main.py --selfcheck [DTYPE]` with the device flags (--gpu_ids ..., --tpu ..., CPU by default): does
training work on these devices, and how fast? The first command to run on new hardware.

A tiny GPT (2 layers, 32 wide) trains a few steps on the devices under test (a mesh over all of them, the batch
split across it) and the same steps, from the same seeded weights and batches, on this host's CPU as the
reference. The verdict (`judge`, a pure function of both runs) requires:
* the reference's loss to fall on the learnable data (so the comparison means something);
* the devices' losses to follow the reference's step by step, within the dtype's tolerance (the first step's
  loss is the forward pass on identical weights);
* every weight tensor after the first and after the last step to equal the reference's within a share of how
  far training moved it from the first step to the last, in norm (a wrong or missing gradient or update moves it
  elsewhere, by about as much as training did).
It also lists the ops of the training step that ran on another device than the one they were placed on (GPUs: no
kernel for their type and dtype; the devices' first step lists them, execution/op_listing.py's PlacementListing), measures one
device's peak (devices/peaks.py) and the step's MFU, and times start-up (graph, session, initialisation) and the
first step (compilation, and that listing: lost in it on two CPU devices) apart from the steady steps.

It prints one verdict line and a JSON report (stack versions, device facts, results) to attach to an issue;
the exit status is 0 when it passed.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import platform
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import tensorflow.compat.v1 as tf

from schema import GPTConfig
from models.flops import training_flops_per_token
from devices import gpus
from devices.placement import Placement
from execution import callbacks, runner
from execution.op_listing import PlacementListing
from train import loop

STEPS = 6
REFERENCE = Placement(devices=("/device:CPU:0",))


@dataclass(frozen=True)
class Tolerance:
    loss_rtol: float      # each step's loss, relative to the reference's
    weight_share: float   # each weight's largest difference, as a share of how far training moved it


# float32: summation order only (TF32 is switched off for the check); 16-bit: rounding of activations and
# gradients, which the CPU does differently (bf16 on CPUs is emulated in fp32 by XLA and TF's kernels).
TOLERANCES = {"float32": Tolerance(2e-3, 0.02), "bfloat16": Tolerance(3e-2, 0.35), "float16": Tolerance(2e-2, 0.35)}


@dataclass
class Run:
    """One training run of the check: each step's loss, the weights after the first and the last step, times."""
    losses: list
    first_weights: dict
    last_weights: dict
    startup_s: float
    first_step_s: float
    step_s: float          # median of the steps after the first
    placed_ops: Optional[list] = None  # (name, op type, requested, placed) of the first step's ops, when listed


def learnable_tokens(rows: int, n_ctx: int, n_vocab: int, seed: int = 0) -> np.ndarray:
    """Rows of counting sequences (each token the previous one plus 1, mod n_vocab) from random starts: trained
    on again and again, their loss falls within a few steps."""
    starts = np.random.RandomState(seed).randint(0, n_vocab, size=[rows, 1])
    return ((starts + np.arange(n_ctx + 1)[None, :]) % n_vocab).astype(np.int32)


def _weights(checkpoint: str) -> dict:
    reader = tf.train.load_checkpoint(checkpoint)
    names = [n for n, _ in tf.train.list_variables(checkpoint)
             if not re.search(r"(adam_[mv]|global_step|loss_scale|iterations_per_loop)", n)]
    return {n: np.asarray(reader.get_tensor(n), np.float64) for n in names}


def train_and_time(cfg: GPTConfig, placement: Placement, data: np.ndarray, list_placement: bool = False) -> Run:
    """Trains cfg (STEPS steps, a checkpoint after each) on `placement` from scratch; returns the Run.
    `list_placement`: the first step also lists where its ops ran (not on a TPU; the Run's placed_ops)."""
    from modelpath import checkpoints
    losses, stamps, opened, listed = [], [], [], []

    class Timing(callbacks.Callback):
        def on_open(self, run):
            opened.append(time.monotonic())

        def on_step(self, run, step, values):
            losses.append(float(values["loss"]))
            stamps.append(time.monotonic())

    watching = [Timing()]
    if list_placement:  # printed on GPUs, as training's first step prints it
        watching.append(PlacementListing(shown=gpus.uses_gpus(placement),
                                         then=lambda report: listed.append(report.ops)))
    start = time.monotonic()
    loop.train(cfg, placement, runner.fixed_batches(data, cfg.train_batch_size), watching)
    steps = np.diff([opened[0]] + stamps)
    return Run(losses, _weights(checkpoints.prefix_of(cfg.model_path, 1)),
               _weights(checkpoints.prefix_of(cfg.model_path, len(losses))), opened[0] - start, float(steps[0]),
               float(np.median(steps[1:])) if len(steps) > 1 else float(steps[0]), listed[0] if listed else None)


@dataclass
class Verdict:
    passed: bool
    problems: list = field(default_factory=list)
    loss_rdiff: float = 0.0          # the largest relative difference of a step's loss
    weight_share: float = 0.0        # the largest weight difference as a share of training's movement
    worst_weight: Optional[str] = None


def judge(device: Run, reference: Run, tolerance: Tolerance) -> Verdict:
    """Whether the devices trained as the CPU reference did (see the module's docstring)."""
    problems = []
    ref, got = np.array(reference.losses), np.array(device.losses)
    if not ref[-1] < 0.95 * ref[0]:
        problems.append(f"the CPU reference's loss did not fall ({ref[0]:.4f} -> {ref[-1]:.4f}): the check cannot "
                        f"tell a right device from a wrong one here")
    if len(got) != len(ref) or not np.all(np.isfinite(got)):
        problems.append(f"the devices' losses are {got.tolist()} (the reference's: {ref.tolist()})")
        return Verdict(False, problems)
    rdiff = np.abs(got - ref) / np.maximum(np.abs(ref), 1e-12)
    if rdiff.max() > tolerance.loss_rtol:
        step = int(rdiff.argmax()) + 1
        what = "the forward pass differs" if step == 1 else "the devices trained differently"
        problems.append(f"{what}: step {step}'s loss is {got[step - 1]:.6f} on the devices, {ref[step - 1]:.6f} on "
                        f"the CPU (relative difference {rdiff.max():.2g} > {tolerance.loss_rtol:g})")
    worst, worst_name, worst_step = 0.0, None, None
    for name, want in reference.last_weights.items():
        # Norms over the whole tensor: Adam turns rounding noise in a near-zero gradient into a full-size step of
        # either sign, so single elements may differ by as much as training moved them in 16 bits; a wrong
        # gradient or a missing update moves the whole tensor elsewhere.
        moved = max(float(np.linalg.norm(want - reference.first_weights[name])), 1e-12)
        for step, have, ref_weights in ((1, device.first_weights.get(name), reference.first_weights[name]),
                                        (len(ref), device.last_weights.get(name), want)):
            if have is None or have.shape != ref_weights.shape:
                problems.append(f"weight {name} is missing or has another shape on the devices")
                break
            share = float(np.linalg.norm(have - ref_weights) / moved)
            if share > worst:
                worst, worst_name, worst_step = share, name, step
    if worst > tolerance.weight_share:
        problems.append(f"the weights differ from the CPU's after step {worst_step}: {worst_name} by {worst:.2g} of "
                        f"how far training moved it from step 1 to {len(ref)} (> {tolerance.weight_share:g}): a wrong "
                        f"or missing gradient or update on the devices")
    return Verdict(not problems, problems, float(rdiff.max()), worst, worst_name)


def _kind_index(device: str) -> tuple:
    match = re.search(r"(?:^|/)(?:device:)?([A-Za-z_]+):(\d+)$", device or "")
    return (match.group(1).upper(), int(match.group(2))) if match else None


def off_device(ops: list, mesh_devices) -> list:
    """The ops placed on one of `mesh_devices` that ran on another device, from (name, op type, requested,
    placed) of each op (execution/op_listing.placed_ops)."""
    wanted = {_kind_index(d) for d in mesh_devices}
    return [op for op in ops if _kind_index(op[2]) in wanted and _kind_index(op[3]) != _kind_index(op[2])]


def stack_versions() -> dict:
    versions = {"python": platform.python_version()}
    for name in ("tensorflow", "tensorflow-tpu", "tensorflow-cpu", "libtpu", "mesh-tensorflow", "numpy",
                 "protobuf", "nvidia-cudnn-cu12", "nvidia-cuda-runtime-cu12", "nvidia-cuda-nvcc-cu12", "torch"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    try:
        build = tf.sysconfig.get_build_info()
        versions["tensorflow_build"] = {k: build[k] for k in ("cuda_version", "cudnn_version",
                                                              "cuda_compute_capabilities") if k in build}
    except Exception:  # noqa: BLE001 (a build without the info)
        pass
    return versions


def run(device_cfg: GPTConfig, reference_cfg: GPTConfig, placement: Placement, reference_placement=REFERENCE,
        out=None) -> int:
    """The check: `device_cfg` on `placement` against `reference_cfg` on `reference_placement` (the same model on
    one CPU device); prints the verdict line and the report; 0 when it passed."""
    out = out or sys.stdout
    precision = device_cfg.precision
    if precision == "float32":  # TF32 (Ampere and newer) would be a difference of its own
        tf.config.experimental.enable_tensor_float_32_execution(False)
    data = learnable_tokens(device_cfg.train_batch_size, device_cfg.n_ctx, device_cfg.n_vocab)  # one batch, repeated
    device = train_and_time(device_cfg, placement, data, list_placement=not placement.op_listing)
    reference = train_and_time(reference_cfg, reference_placement, data)
    verdict = judge(device, reference, TOLERANCES[precision])
    n_devices = device_cfg.n_devices
    if placement.op_listing:  # why the session cannot list them (a TPU's)
        elsewhere, placed = None, placement.op_listing
    else:  # listed by the devices' first step
        elsewhere = off_device(device.placed_ops, placement.devices)
        placed = f"{len(elsewhere)} ops of the step ran off their device"
    peak = placement.peak(precision)
    tokens = device_cfg.train_batch_size * device_cfg.n_ctx
    mfu = (training_flops_per_token(device_cfg) * tokens / device.step_s / (peak.flops * n_devices)
           if peak.flops and device.step_s > 0 else None)
    where = placement.describe()
    timing = (f"start-up {device.startup_s:.1f} s, first step {device.first_step_s:.2f} s, then "
              f"{device.step_s * 1000:.0f} ms/step" + (f", MFU {mfu:.1%}" if mfu is not None else ""))
    if verdict.passed:
        line = (f"selfcheck passed on {where} ({n_devices} device{'s' if n_devices > 1 else ''}, {precision}, "
                f"kernels {placement.kernels}): losses within {verdict.loss_rdiff:.1g} of the CPU's, weights within "
                f"{verdict.weight_share:.1g} of training's movement, {placed}; {timing}")
    else:
        line = f"selfcheck FAILED on {where} ({precision}): {'; '.join(verdict.problems)}"
    report = {
        "verdict": "passed" if verdict.passed else "failed",
        "problems": verdict.problems,
        "stack": stack_versions(),
        "device": placement.device_facts(),
        "model": {"n_layer": device_cfg.n_layer, "n_embd": device_cfg.n_embd, "n_ctx": device_cfg.n_ctx,
                  "batch": device_cfg.train_batch_size, "mesh_shape": device_cfg.mesh_shape,
                  "layout": device_cfg.layout, "precision": precision, "steps": len(reference.losses)},
        "losses": {"devices": device.losses, "cpu": reference.losses},
        "loss_relative_difference": verdict.loss_rdiff,
        "weight_difference_share": verdict.weight_share, "worst_weight": verdict.worst_weight,
        "tolerance": dataclasses.asdict(TOLERANCES[precision]),
        "off_device_ops": None if elsewhere is None else [list(op) for op in elsewhere[:50]],
        "peak": {"flops": peak.flops, "source": peak.source},
        "mfu": mfu,
        "seconds": {"start_up": device.startup_s, "first_step": device.first_step_s, "step": device.step_s,
                    "cpu_start_up": reference.startup_s, "cpu_step": reference.step_s},
    }
    print(json.dumps(report, indent=2, default=str), file=out)
    print(line, file=out, flush=True)
    return 0 if verdict.passed else 1


def model_settings(n_devices: int, precision: str, root: str) -> tuple:
    """The raw configs (devices, CPU reference) of the tiny model: a mesh over all `n_devices` with the batch split
    across it, and the same model on one device; checkpoints after every step under `root`."""
    # Adam's epsilon 1e-4 (not 1e-8): a gradient element that is rounding noise (16 bits, another summation order)
    # would otherwise take a full-size step of a random sign; both runs use the same settings.
    base = dict(n_layer=2, n_embd=32, n_head=4, n_vocab=64, n_ctx=16, attention_types=[[["global", "local"], 1]],
                local_attention_radius=4, train_batch_size=2 * max(n_devices, 2), train_steps=STEPS, lr=3e-2,
                warmup_steps=0, steps_per_checkpoint=1, keep_checkpoint_max=STEPS + 1, iterations=1,
                precision=precision, z_loss=0.0, epsilon=1e-4)
    device = dict(base, model_path=f"{root}/devices", mesh_shape=f"all:{n_devices}",
                  layout="batch:all" if n_devices > 1 else "")
    return device, dict(base, model_path=f"{root}/cpu", mesh_shape="all:1", layout="")
