"""The training precision for the device at hand: bfloat16 on a CPU only where it has bf16 matrix units.

On a CPU without them (AVX2, or AVX-512 without AVX512_BF16) TensorFlow converts bf16 to fp32 around every
matmul and bf16 training runs at about 0.55-0.6x fp32's speed (docs/measured.md, "bf16 against fp32 on CPUs"); with them (AVX512_BF16,
AMX-BF16, Arm's BF16 extension) oneDNN's bf16 matmuls reach about twice the fp32 peak and bf16 trains ~1.6x
faster. So:

* `precision: "auto"` (the default): bfloat16 on a CPU with bf16 matrix units, float32 on any other CPU, and
  float32 on GPUs and TPUs (set bfloat16 there yourself: TPUs, A100/H100 and later).
* An explicit `precision` is what trains; where it is slower than float32 on this CPU (bfloat16 or float16
  without the matching matrix units) one line says so and how to train faster. A config written for TPUs
  (GPT-3's ask for bfloat16) thus runs as asked, with a warning, rather than silently changing its numerics.

`choose` is a pure function of the asked precision, the device kind and the CPU's flags (tests feed it flag
sets); `for_placement` reads the flags of this host's CPU (/proc/cpuinfo; none elsewhere, e.g. macOS).

Every job that runs a model takes its precision from here, once, where its placement is known: training
(`for_training`), and the jobs that run the trained model without training it (`for_inference`: `--eval` and
the evaluations after each checkpoint, the harness from either, `--predict`, `--export`). Those run in training's
precision on the same device (`eval_precision: "auto"`, the default), so `--eval` gives the numbers the
evaluation during training gave for the same checkpoint, or in float32 (`eval_precision: "float32"`). Each
result records the precision it ran in (`running`).
"""
from __future__ import annotations

import sys
from typing import Iterable, NamedTuple

from schema import GPTConfig

# /proc/cpuinfo flags of bf16 matrix units: x86's AVX512-BF16 dot products and AMX-BF16 tiles, and the BF16
# extension of Armv8.6 (BFMMLA; "bf16" in an aarch64 kernel's Features line: Graviton3, Neoverse V1/V2).
BF16_UNITS = ("avx512_bf16", "amx_bf16", "bf16")
FP16_UNITS = ("avx512_fp16", "amx_fp16")   # the same for float16 matmuls (Sapphire and Granite Rapids)
AUTO = "auto"


class Choice(NamedTuple):
    precision: str   # what trains: float32, bfloat16 or float16
    note: str        # one line for the start-up output ("" where there is nothing to say)


def cpu_info(path: str = "/proc/cpuinfo") -> tuple[str, frozenset]:
    """(model name, flags) of this host's CPU from `path` (Linux x86 "flags", aarch64 "Features"); ("", {})
    where it cannot be read."""
    name, flags = "", set()
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "cpu model") and not name:
                    name = value.strip()
                elif key in ("flags", "features"):
                    flags.update(value.split())
    except OSError:
        pass
    return name, frozenset(flags)


def units(flags: Iterable[str], kinds: tuple = BF16_UNITS) -> list[str]:
    """Which of `kinds` (matrix-unit flags) `flags` has, in `kinds`' order."""
    flags = set(flags)
    return [k for k in kinds if k in flags]


def cpu_kind(name: str, flags: Iterable[str]) -> str:
    """One line naming the CPU and the vector/matrix units that decide its matmul speed, for benchmarks."""
    flags = set(flags)
    vector = ("AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else
              "NEON" if "asimd" in flags else "no AVX2")
    bf16 = units(flags)
    return (f"{name or 'unknown CPU'}: {vector}, bf16 matrix units "
            f"{'yes (' + ', '.join(bf16) + ')' if bf16 else 'none'}")


def choose(asked: str, device_kind: str, flags: Iterable[str]) -> Choice:
    """The precision to train in when the config asks for `asked` ("auto", "float32", "bfloat16", "float16")
    on devices of `device_kind` ("CPU", "GPU", "TPU") and the host CPU has `flags`."""
    flags = set(flags)
    bf16 = units(flags)
    if device_kind != "CPU":
        if asked == AUTO:
            return Choice("float32", f"precision auto: float32 on {device_kind}s (set \"precision\": \"bfloat16\" "
                                     f"for bf16 activations)")
        return Choice(asked, "")
    if asked == AUTO:
        if bf16:
            return Choice("bfloat16", f"precision auto: bfloat16, this CPU has bf16 matrix units ({', '.join(bf16)}); "
                                      f"set \"precision\": \"float32\" for fp32 activations")
        return Choice("float32", "precision auto: float32, this CPU has no bf16 matrix units (avx512_bf16, amx_bf16), "
                                 "where bf16 trains slower than fp32")
    if asked == "bfloat16" and not bf16:
        return Choice("bfloat16", "warning: precision bfloat16 on a CPU without bf16 matrix units (avx512_bf16, "
                                  "amx_bf16): it trains slower than float32 here; set \"precision\" to \"auto\" or "
                                  "\"float32\" to train faster")
    if asked == "float16" and not units(flags, FP16_UNITS):
        return Choice("float16", "warning: precision float16 on a CPU without fp16 matrix units (avx512_fp16, "
                                 "amx_fp16): it trains slower than float32 here; set \"precision\" to \"auto\" or "
                                 "\"float32\" to train faster")
    return Choice(asked, "")


def for_placement(asked: str, placement, cpuinfo: str = "/proc/cpuinfo") -> Choice:
    """`choose` for this host's CPU flags and the placement's device kind (a multi-host cluster: the chief's CPU
    stands for all hosts, which run one machine kind)."""
    return choose(asked, placement.device_kind, cpu_info(cpuinfo)[1])


class Resolved(NamedTuple):
    cfg: GPTConfig   # the job's config, `precision` the one it runs in (never "auto")
    note: str        # one line on why ("" where there is nothing to say)


def for_training(cfg: GPTConfig, placement, cpuinfo: str = "/proc/cpuinfo") -> Resolved:
    """The config training runs: `precision` as `choose` resolves it for the placement."""
    from config import replace  # here: the benches' drivers read the CPU's flags without TensorFlow
    chosen = for_placement(cfg.precision, placement, cpuinfo)
    return Resolved(replace(cfg, precision=chosen.precision), chosen.note)


def resolve_for_inference(cfg: GPTConfig, placement, cpuinfo: str = "/proc/cpuinfo") -> Resolved:
    """The config a job that runs the trained model (evaluation, the harness, sampling, export) runs: training's
    precision on this placement (`for_training`'s), or float32 where `eval_precision` asks for it. A config already
    resolved (the one training hands its evaluations) keeps its precision: resolving twice changes nothing."""
    from config import replace
    trained = for_placement(cfg.precision, placement, cpuinfo).precision
    runs_in = "float32" if cfg.eval_precision == "float32" else trained
    note = ""  # said where a precision other than float32 was resolved, or float32 asked over it
    if runs_in != cfg.precision and trained != "float32":
        note = (f"eval_precision float32: the model runs in float32 (training's precision here: {trained})"
                if runs_in == "float32" else
                f"precision auto: the model runs in {runs_in}, as training does on this {placement.device_kind}; "
                f"\"eval_precision\": \"float32\" (or --eval_precision float32) runs it in float32")
    return Resolved(replace(cfg, precision=runs_in), note)


def for_inference(cfg: GPTConfig, placement, out=None) -> GPTConfig:
    """`resolve_for_inference`'s config, its note printed: what every job running the trained model calls at its
    entry (evals/at_checkpoints.py, evals/harness.py, evals/harness_model.py, infer/job.py)."""
    resolved = resolve_for_inference(cfg, placement)
    if resolved.note:
        print(resolved.note, file=out or sys.stdout, flush=True)
    return resolved.cfg


def running(cfg: GPTConfig) -> str:
    """The precision a model of `cfg` is built in (models/gpt.py's activation dtype; an unresolved "auto" builds
    in float32): what every result records beside its numbers."""
    from models.gpt import variable_dtype
    return variable_dtype(cfg).activation_dtype.name
