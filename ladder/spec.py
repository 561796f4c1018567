"""A ladder spec: `configs/ladders/NAME.json`, read once into a typed, checked `LadderSpec`.

    {
      "base": "default",                        # the model config every size starts from (name or path)
      "sizes": ["12.5K", "25K", "50K"],          # target non-embedding parameter counts
      "chinchilla_multiples": [1],               # each size trains 20 * N * multiple tokens (one run per multiple)
      "devices": {"count": 1, "kind": "cpu"},    # per size: at most this many devices of this kind and memory
      "rules": {"head_width": 16},               # overrides of the per-size rules (Rules below)
      "overrides": {"precision": "float32"},     # config keys set in every size's config
      "eval_points": 4,                          # evaluations per run, evenly spaced, the last at its end
      "schedule": "wsd",                         # per size a WSD trunk with decay branches; "base": one run per
                                                 # multiple on the base config's own schedule
      "repeats": ["12.5K"],                      # sizes trained again on another data order (default: the smallest)
      "out": "runs/ladders/NAME"                 # where the sizes' configs and model_paths go
    }

Every problem is a `LadderError` (a ConfigError): one line naming the key and the fix.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from typing import Optional

from schema import REPO_ROOT, ConfigError, closest


class LadderError(ConfigError):
    """A ladder spec or a ladder's folder that cannot be used; one line naming the fix."""


@dataclass(frozen=True)
class Rules:
    """The per-size rules and their constants; each can be overridden in the spec's "rules". Sources:
    docs/ladder.md, "The rules"."""
    aspect_ratio: float = 64.0            # n_embd / n_layer: GPT-3 Small (768 / 12) and Large (1536 / 24)
    head_width: int = 64                  # n_embd / n_head: GPT-3 Small and Medium
    size_tolerance: float = 0.05          # the shape's N within this fraction of the target
    tokens_per_param: float = 20.0        # Chinchilla (Hoffmann et al. 2022): D = 20 N at multiple 1
    batch_tokens_at_108M: float = 327680.0  # Porian et al. 2024 (as OLMo-core's ladder): 160 x 2048 at N = 108M
    batch_exponent: float = 2.0 / 3.0       # ... and batch ~ N^(2/3)
    lr_at_108M: float = 0.0047              # Porian et al. 2024: peak lr 0.0047 at N = 108M
    lr_exponent: float = -1.0 / 3.0         # ... and lr ~ N^(-1/3)
    warmup_tokens_per_param: float = 1.0    # Porian et al. 2024: warm up over N tokens
    decay_share: float = 0.2                # WSD: each run decays over its last 20% (Hägele et al. 2024)
    branch_fractions: tuple = (0.25, 0.5)   # WSD: branches end at these fractions of the longest run (this project's)
    small_batch_beta2: float = 0.99         # Porian et al. 2024 (table 4): beta2 0.99 for batches below ...
    small_batch_tokens: float = 524288.0    # ... this many tokens; the base config's beta2 above it


@dataclass(frozen=True)
class Devices:
    count: int = 1                        # the most devices one size may use
    kind: str = "cpu"                     # "cpu" (logical devices splitting this CPU) or "gpu"
    memory: Optional[str] = None          # one device's memory, e.g. "80GB"; cpu: this host's available RAM / count
    model_tflops: Optional[float] = None  # achieved model TFLOP/s per device, for the time estimate


@dataclass(frozen=True)
class Launcher:
    """`run` on a cluster: one script per size instead of training here."""
    kind: str                             # "slurm" (sbatch scripts) or "kubernetes" (Indexed Job manifests)
    gpus_per_node: int = 8
    time: str = "24:00:00"                # slurm: --time
    partition: Optional[str] = None       # slurm: --partition
    image: str = "your-registry/gpt-zoo:latest"  # kubernetes: the container image
    python: str = "python"                # the interpreter on the nodes
    workdir: Optional[str] = None         # the repository on the nodes (default: this one's path)


@dataclass(frozen=True)
class LadderSpec:
    name: str
    path: str
    base: str
    sizes: tuple                          # target non-embedding parameter counts (floats), as given, ascending
    multiples: tuple = (1.0,)
    devices: Devices = Devices()
    rules: Rules = Rules()
    overrides: dict = field(default_factory=dict)
    eval_points: int = 4
    eval_steps: Optional[int] = None      # batches per evaluation (default: the base config's, else 10)
    out: str = ""
    launcher: Optional[Launcher] = None
    schedule: str = "wsd"                 # "wsd": a trunk per size with decay branches; "base": separate runs
    repeats: tuple = ()                   # targets trained again on another data order (seed + 1)


_KEYS = {"base", "sizes", "chinchilla_multiples", "devices", "rules", "overrides", "eval_points", "eval_steps",
         "out", "launcher", "schedule", "repeats", "comment"}
SCHEDULES = ("wsd", "base")
_TYPES = {"int": int, "float": float, "str": str, "Optional[str]": str, "Optional[float]": float, "tuple": tuple}
_TYPE_NAMES = {int: "a whole number", float: "a number", str: "a string"}
_SUFFIX = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12}


def parse_count(value, what: str) -> float:
    """12500, 1.25e4, "12.5K", "1.3B" -> a positive number."""
    if isinstance(value, bool):
        raise LadderError(f"{what} must be a number like 25000 or \"25K\", got {value!r}")
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([KMBT]?)\s*", str(value), re.IGNORECASE)
        if not match:
            raise LadderError(f"{what} {value!r} is not a count: write it like 25000, 2.5e4 or \"25K\"")
        number = float(match.group(1)) * _SUFFIX[match.group(2).upper()]
    if not number > 0:
        raise LadderError(f"{what} must be positive, got {value!r}")
    return number


def short_count(n: float) -> str:
    """25000 -> '25K', 12500 -> '12.5K', 1.3e9 -> '1.3B'."""
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:.3g}"


def _section(raw: dict, key: str, cls, path: str):
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise LadderError(f"\"{key}\" in {path} must be an object, got {value!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {}
    for name, item in value.items():
        if name not in fields:
            raise LadderError(f"unknown key {name!r} in \"{key}\" of {path}{closest(name, fields)}: the keys are "
                              f"{', '.join(fields)}")
        expected = _TYPES.get(str(fields[name].type))
        if expected is tuple:  # a list of fractions in (0, 1)
            if not isinstance(item, list) or any(isinstance(x, bool) or not isinstance(x, (int, float))
                                                 or not 0 < x < 1 for x in item):
                raise LadderError(f"\"{key}\".{name} in {path} must be a list of fractions in (0, 1) like "
                                  f"[0.25, 0.5], got {item!r}")
            values[name] = tuple(sorted({float(x) for x in item}))
            continue
        if expected is float and isinstance(item, int) and not isinstance(item, bool):
            item = float(item)
        if expected is not None and (isinstance(item, bool) or not isinstance(item, expected)):
            raise LadderError(f"\"{key}\".{name} in {path} must be {_TYPE_NAMES[expected]}, got {item!r}")
        if expected in (int, float) and item <= 0 and name not in ("batch_exponent", "lr_exponent"):
            raise LadderError(f"\"{key}\".{name} in {path} must be positive, got {item!r}")
        values[name] = item
    return values


def load_spec(path: str) -> LadderSpec:
    """Reads and checks a ladder spec (a path, or a name in configs/ladders/)."""
    if not path.endswith(".json") and os.sep not in path:
        path = os.path.join(REPO_ROOT, "configs", "ladders", path + ".json")
    if not os.path.isfile(path):
        raise LadderError(f"ladder spec {path} not found: pass a path to a .json or a name in configs/ladders/")
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise LadderError(f"ladder spec {path} is not valid JSON ({str(e).splitlines()[0]}): fix it") from None
    if not isinstance(raw, dict):
        raise LadderError(f"ladder spec {path} must hold a JSON object")
    for key in raw:
        if key not in _KEYS:
            raise LadderError(f"unknown key {key!r} in ladder spec {path}{closest(key, _KEYS)}: the keys are "
                              f"{', '.join(sorted(_KEYS - {'comment'}))}")
    if not isinstance(raw.get("base"), str) or not raw["base"]:
        raise LadderError(f"ladder spec {path} needs \"base\": the model config every size starts from (a name in "
                          f"configs/ or a path)")
    sizes = raw.get("sizes")
    if not isinstance(sizes, list) or not sizes:
        raise LadderError(f"ladder spec {path} needs \"sizes\": a list of target non-embedding parameter counts like "
                          f"[\"25K\", \"50K\"]")
    targets = sorted(parse_count(s, "a size") for s in sizes)
    if len(set(targets)) != len(targets):
        raise LadderError(f"ladder spec {path} lists a size twice: give each target once")
    multiples = raw.get("chinchilla_multiples", [1])
    if not isinstance(multiples, list) or not multiples:
        raise LadderError(f"\"chinchilla_multiples\" in {path} must be a list of positive numbers like [1] or [0.5, 1, 2]")
    multiples = tuple(sorted({parse_count(m, "a Chinchilla multiple") for m in multiples}))
    devices = Devices(**_section(raw, "devices", Devices, path))
    if devices.kind not in ("cpu", "gpu"):
        raise LadderError(f"\"devices\".kind in {path} is {devices.kind!r}: use \"cpu\" or \"gpu\" (a TPU trains each "
                          f"size's config written by `plan` with main.py --tpu)")
    if devices.kind == "gpu" and not devices.memory:
        raise LadderError(f"\"devices\" in {path} are GPUs without \"memory\": give one GPU's memory, e.g. \"80GB\"")
    rules = Rules(**_section(raw, "rules", Rules, path))
    for key in ("size_tolerance", "decay_share"):
        if not 0 < getattr(rules, key) < 1:
            raise LadderError(f"\"rules\".{key} in {path} must be a fraction in (0, 1), got {getattr(rules, key)}")
    schedule = raw.get("schedule", "wsd")
    if schedule not in SCHEDULES:
        raise LadderError(f"\"schedule\" in {path} is {schedule!r}: use \"wsd\" (a trunk per size with decay branches) "
                          f"or \"base\" (one run per Chinchilla multiple on the base config's schedule)")
    repeats = raw.get("repeats")
    if repeats is not None and not isinstance(repeats, list):
        raise LadderError(f"\"repeats\" in {path} must be a list of sizes like [\"6.6K\"] (or [] for none)")
    repeats = (targets[0],) if repeats is None else tuple(sorted({parse_count(r, "a repeated size") for r in repeats}))
    unknown = [short_count(r) for r in repeats if r not in targets]
    if unknown:
        raise LadderError(f"\"repeats\" in {path} names {', '.join(unknown)}, which is not among \"sizes\": repeat "
                          f"one of {', '.join(short_count(t) for t in targets)}")
    overrides = raw.get("overrides", {})
    if not isinstance(overrides, dict):
        raise LadderError(f"\"overrides\" in {path} must be an object of config keys, got {overrides!r}")
    ruled = {"n_layer", "n_embd", "n_head", "attention_types", "lr", "warmup_steps", "train_batch_size", "train_steps",
             "steps_per_checkpoint", "model_path", "mesh_shape", "layout", "tokens_per_mb_per_replica",
             "keep_checkpoint_steps"}
    if schedule == "wsd":
        ruled |= {"lr_decay", "lr_decay_share", "lr_decay_end"}
    taken = sorted(ruled & set(overrides))
    if taken:
        how = ("set \"schedule\": \"base\" to train on the base config's schedule, or change \"rules\".decay_share"
               if set(taken) <= {"lr_decay", "lr_decay_share", "lr_decay_end"} else
               "change the rule in \"rules\" instead")
        raise LadderError(f"\"overrides\" in {path} sets {', '.join(taken)}, which the ladder's rules decide per size: "
                          f"{how} (docs/ladder.md)")
    for key in ("eval_points", "eval_steps"):
        value = raw.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise LadderError(f"\"{key}\" in {path} must be a whole number >= 1, got {value!r}")
    launcher = raw.get("launcher")
    if launcher is not None:
        if not isinstance(launcher, dict) or launcher.get("kind") not in ("slurm", "kubernetes"):
            raise LadderError(f"\"launcher\" in {path} must be an object with \"kind\": \"slurm\" or \"kubernetes\"")
        launcher = Launcher(kind=launcher["kind"], **_section({"launcher": {k: v for k, v in launcher.items()
                                                                         if k != "kind"}}, "launcher", Launcher, path))
        if devices.kind != "gpu":
            raise LadderError(f"\"launcher\" in {path} writes scripts for GPU nodes: set \"devices\" to "
                              f"{{\"kind\": \"gpu\", \"count\": N, \"memory\": \"80GB\"}}")
    name = os.path.splitext(os.path.basename(path))[0]
    out = raw.get("out") or os.path.join("runs", "ladders", name)
    if not isinstance(out, str):
        raise LadderError(f"\"out\" in {path} must be a folder path, got {out!r}")
    if not os.path.isabs(out):
        out = os.path.join(REPO_ROOT, out)
    return LadderSpec(name=name, path=os.path.abspath(path), base=raw["base"], sizes=tuple(targets),
                      multiples=multiples, devices=devices, rules=rules, overrides=dict(overrides),
                      eval_points=raw.get("eval_points", 4), eval_steps=raw.get("eval_steps"), out=out,
                      launcher=launcher, schedule=schedule, repeats=repeats)
