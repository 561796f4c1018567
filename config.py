"""Reading model and dataset configs: JSON in GPT-Neo's format, read once into schema.py's objects, and
the one check of a config, which reading it and every change to it (`replace`) run.

`load_config("name")` finds `configs/name.json` (or takes a path), checks every key, fills the reference
defaults, resolves the dataset ids in `datasets` to `configs/dataset_configs/ID.json` (each with the records of
the tokenizer that encoded it: its tokenizer_id key, the create_tfrecords manifests beside its files, the
tokenizer its tokenizer_path holds, read) and returns a frozen `GPTConfig` that passed `check`:
schema.py's checks between fields (its datasets' tokenizer records against each other and the model's
among them), then the names the config uses against the registries that define them (attention
types, activations, mesh-tensorflow's MoE hyperparameters, optimizers and learning-rate decays, input
functions, eval tasks), each used entry's own checks, and the layout against the model's tensor dimensions
(models/layout.py). `replace(cfg, ...)` is a changed copy that passed the same check. Every problem is a
`ConfigError` with a one-line message that says what to change.

The checks live with their registries (an attention type's entry carries its own; MoE's beside its
defaults; input functions' beside INPUT_FNS; an eval task's in its entry), and this module runs them all.
It sits just above models/ and data/, where every registry is, and below the jobs, which can therefore all
re-check a config they change (training's precision, export's one device, the planner's layouts).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Optional

from schema import (ALIASES, CONFIG_DIR, DATASET_CONFIG_DIR, read_json, resolve_config_path, FIELD_TYPES,
                    ConfigError, DatasetConfig, DatasetUse, GPTConfig, TokenizerId, TokenizerRecord, check_counts,
                    check_type, closest, check_tokenizer_ids, expand_attention_types, parse_model_options,
                    parse_tokenizer_id, validate)
from data.create_tfrecords import manifest_tokenizers
from data.errors import DataError
from data.eval_tasks import TASKS
from data.inputs import INPUT_FNS, SAMPLING_MODES, check_input_fn
from data.tokenizer import tokenizer_id_at
from models.activations import ACTIVATIONS
from models.attention import check_attention_types
from models.layout import check_layout
from models.moe import check_moe_params
from models.optimizers import LR_DECAYS, OPTIMIZERS


def load_dataset_config(dataset_id: str, config_dir: str = DATASET_CONFIG_DIR) -> DatasetConfig:
    path = os.path.join(config_dir, dataset_id + ".json")
    if not os.path.isfile(path):
        known = sorted(f[:-5] for f in os.listdir(config_dir) if f.endswith(".json")) \
            if os.path.isdir(config_dir) else []
        raise ConfigError(f"dataset {dataset_id!r} has no config at {path}: register it there "
                          f"(see docs/data.md, 'Registering a dataset'){closest(dataset_id, known)}")
    raw = read_json(path, "dataset config")
    known_keys = {f.name for f in dataclasses.fields(DatasetConfig)} - {"id"}
    for key in raw:
        if key not in known_keys:
            raise ConfigError(f"unknown key {key!r} in dataset config {path}{closest(key, known_keys)}")
    for key in ("n_vocab", "path"):
        if key not in raw:
            raise ConfigError(f"dataset config {path} lacks {key!r}")
    # Relative paths are relative to the folder holding configs/ (the repository root for shipped configs).
    base = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(path))))

    def local(p):
        return p if p is None or os.path.isabs(p) or "://" in p else os.path.join(base, p)

    tokenizer_is_pretrained = bool(raw.get("tokenizer_is_pretrained", False))
    tokenizer_path = raw.get("tokenizer_path")
    # A pretrained tokenizer is a folder (relative like the other paths when it is one) or a hub name ("gpt2").
    if tokenizer_path and (not tokenizer_is_pretrained or os.path.isdir(local(tokenizer_path))):
        tokenizer_path = local(tokenizer_path)
    data_paths = (local(raw["path"]), local(raw.get("eval_path") or None))
    records = tokenizer_records(path, parse_tokenizer_id(raw.get("tokenizer_id"), path), data_paths, tokenizer_path,
                                tokenizer_is_pretrained)
    return DatasetConfig(
        id=dataset_id, n_vocab=check_type("n_vocab", raw["n_vocab"], int), path=data_paths[0],
        eval_path=data_paths[1], tokenizer_path=tokenizer_path, tokenizer_is_pretrained=tokenizer_is_pretrained,
        eos_id=raw.get("eos_id"), padding_id=raw.get("padding_id"), tokenizer_id=agreed_tokenizer(records),
        tokenizer_records=records)


def tokenizer_records(config_path: str, key: Optional[TokenizerId], data_paths: tuple, tokenizer_path: Optional[str],
                      pretrained: bool) -> tuple:
    """Every record of the tokenizer that encoded a dataset (schema.py's TokenizerRecord), in the order
    key, manifests, tokenizer_path: its config's tokenizer_id key; the manifests create_tfrecords wrote beside the
    files its path and eval_path globs match, which say what encoded them whoever wrote the dataset config; the
    tokenizer its tokenizer_path holds, read. `check` refuses records that disagree."""
    records = [TokenizerRecord("key", config_path, key)] if key is not None else []
    for glob in data_paths:
        records += [TokenizerRecord("manifest", manifest, recorded) for manifest, recorded in manifest_tokenizers(glob)
                    if manifest not in [record.where for record in records]]
    try:
        read = tokenizer_id_at(tokenizer_path, pretrained)
    except DataError as e:
        raise ConfigError(f"dataset config {config_path}: {e}: point tokenizer_path at the tokenizer that encoded "
                          f"the data, or delete the key") from None
    if read is not None:
        records.append(TokenizerRecord("tokenizer_path", tokenizer_path, read))
    return tuple(records)


def agreed_tokenizer(records: tuple) -> Optional[TokenizerId]:
    """The tokenizer a dataset's records name (the key's, else its tokenizer_path's, else a manifest's, which
    records no end-of-text id: another record's, when one has it); None when nothing records it."""
    if not records:
        return None
    ranked = sorted(records, key=lambda record: ("key", "tokenizer_path", "manifest").index(record.kind))
    agreed = ranked[0].tokenizer
    eos_ids = [record.tokenizer.eos_id for record in ranked if record.tokenizer.eos_id is not None]
    return agreed if agreed.eos_id is not None or not eos_ids else dataclasses.replace(agreed, eos_id=eos_ids[0])


def _parse_datasets(value: Any, config_dir: str, input_fn: Optional[str] = None) -> tuple:
    """The `datasets` entries: [id, stitch, sampling_mode, weight] lists (shorter lists take the defaults) and
    GPT-Neo's bare ids. An entry that names no sampling mode gets input_fn's (data/inputs.py, INPUT_FNS);
    without input_fn a bare id is read sequentially, as GPT-Neo's default input function did, and a list
    samples documents at random, as here before."""
    if not isinstance(value, list):
        raise ConfigError('datasets must be a list like [["my_dataset", 10, "documents_random", 1.0]] or '
                          '["my_dataset"]')
    uses = []
    for entry in value:
        bare = isinstance(entry, str)
        if bare:
            entry = [entry]
        if not isinstance(entry, list) or len(entry) not in (1, 2, 3, 4) or not isinstance(entry[0], str):
            if isinstance(entry, list) and len(entry) == 5:
                raise ConfigError(f"datasets entry {entry!r} uses the old [train_glob, eval_glob, stitch, mode, "
                                  f"weight] form: register the globs in configs/dataset_configs/ID.json and "
                                  f"write [ID, stitch, mode, weight]")
            raise ConfigError(f"datasets entry {entry!r} must be [dataset_id, stitch, sampling_mode, weight] or a "
                              f"dataset id \"ID\" (read sequentially)")
        dataset_id, stitch, mode, weight = (list(entry) + [None] * 3)[:4]
        stitch = 1 if stitch is None else check_type("stitch", stitch, int)
        if mode is None:
            mode = INPUT_FNS[input_fn][0] if input_fn in INPUT_FNS else "sequential" if bare else "documents_random"
        weight = 1.0 if weight is None else check_type("weight", weight, float)
        if mode not in SAMPLING_MODES:
            raise ConfigError(f"sampling mode {mode!r} of dataset {dataset_id!r} is not known: choose from "
                              f"{', '.join(SAMPLING_MODES)}{closest(mode, SAMPLING_MODES)}")
        if stitch < 1 or weight <= 0:
            raise ConfigError(f"dataset {dataset_id!r} needs stitch >= 1 and weight > 0")
        uses.append(DatasetUse(load_dataset_config(dataset_id, config_dir), stitch, mode, weight))
    return tuple(uses)


def _predict_max_steps(value: Any) -> Optional[int]:
    if value is None:
        return None
    if check_type("predict_max_steps", value, int) < 0:
        raise ConfigError(f"predict_max_steps must be >= 0 (0 or null: no cap), got {value}")
    return value or None


# Keys that name a setting of GPTConfig another way: key -> (field, the field's value for the key's value). The
# reference's aliases, and GPT-Neo's slow_sampling (its sampler without the key/value cache) and
# predict_max_steps (its cap on new tokens, 0 or null for none). docs/configs.md, "Parameter reference".
SYNONYMS = {**{key: (name, lambda value: value) for key, name in ALIASES.items()},
            "slow_sampling": ("kv_cache", lambda value: not check_type("slow_sampling", value, bool)),
            "predict_max_steps": ("max_new_tokens", _predict_max_steps)}


def config_from_dict(raw: dict, source: str = "config", dataset_config_dir: str = DATASET_CONFIG_DIR) -> GPTConfig:
    fields = {f.name: f for f in dataclasses.fields(GPTConfig)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in fields:
            values[key] = value
        elif key not in SYNONYMS:
            raise ConfigError(f"unknown key {key!r} in {source}{closest(key, fields)}")
    for key, (name, translate) in SYNONYMS.items():
        if key in raw:
            value = translate(raw[key])
            if name in raw and raw[name] != value:
                raise ConfigError(f"{source} sets {key} {json.dumps(raw[key])} and {name} {json.dumps(raw[name])}, "
                                  f"which disagree ({key} {json.dumps(raw[key])} means {name} {json.dumps(value)}): "
                                  f"keep one of them")
            values[name] = value
    for required in ("n_layer", "n_embd", "n_head", "n_vocab"):
        if required not in values:
            raise ConfigError(f"{source} lacks {required!r}, which has no default")
    for name, value in list(values.items()):
        if name in ("attention_types", "datasets", "tokenizer_id"):
            continue
        expected = FIELD_TYPES.get(str(fields[name].type))
        if value is None and str(fields[name].type).startswith("Optional"):
            continue
        if expected is not None:
            values[name] = check_type(name, value, expected)
    check_counts(values)  # n_layer -1 is its own error, not an attention_types mismatch
    values["attention_types"] = expand_attention_types(
        values.get("attention_types", [[["global"], values["n_layer"]]]), values["n_layer"])
    values["datasets"] = _parse_datasets(values.get("datasets", []), dataset_config_dir, values.get("input_fn"))
    values["tokenizer_id"] = parse_tokenizer_id(values.get("tokenizer_id"), source)
    values.update(parse_model_options(values))
    values["eval_tasks"] = _parse_eval_tasks(values.get("eval_tasks") or [])
    values["harness_tasks"] = parse_harness_tasks(values.get("harness_tasks") or [])
    values["keep_checkpoint_steps"] = _parse_steps(values.get("keep_checkpoint_steps") or [])
    if values["datasets"]:  # special ids come from the (last) dataset's tokenizer, as in GPT-Neo
        last = values["datasets"][-1].dataset
        values.setdefault("eos_id", last.eos_id)
        values.setdefault("padding_id", last.padding_id)
    return check(GPTConfig(**values), source)


def _parse_eval_tasks(value: Any) -> tuple:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f'eval_tasks must be a list of task names like ["lambada"], got {value!r}')
    return tuple(value)


def _parse_steps(value: Any) -> tuple:
    if not isinstance(value, (list, tuple)) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise ConfigError(f"keep_checkpoint_steps must be a list of steps like [400, 800], got {value!r}")
    return tuple(sorted(set(value)))


def parse_harness_tasks(value: Any) -> tuple:
    """harness_tasks: a list of lm-eval task names, or one comma-separated string (as --harness_tasks gives)."""
    if isinstance(value, str):
        value = [name.strip() for name in value.split(",") if name.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(f'harness_tasks must be a list of lm-eval task names like ["lambada_openai"], got {value!r}')
    return tuple(value)


def check(cfg: GPTConfig, source: str = "the config") -> GPTConfig:
    """Every check of a config, in one order: its datasets' tokenizers against the model's, the checks between
    fields (schema.py's validate), the names it uses against the registries that define them with each
    used entry's own checks (an attention type's, an eval task's), and the layout against the model's tensor
    dimensions. `source` names the config in messages. Raises ConfigError naming the fix; returns cfg."""
    # The tokenizers first: data of another tokenizer is the problem to name, whatever else differs (its n_vocab).
    check_tokenizer_ids(cfg, source)
    validate(cfg)
    check_attention_types(cfg)
    for key in ("activation_function", "moe_activation"):
        name = getattr(cfg, key)
        if name is not None and name not in ACTIVATIONS:
            raise ConfigError(f"{key} {name!r} is not known: choose from {', '.join(ACTIVATIONS)}"
                              f"{closest(name, ACTIVATIONS)}")
    check_moe_params(cfg)
    check_layout(cfg)
    for key, registry in (("opt_name", OPTIMIZERS), ("lr_decay", LR_DECAYS)):
        name = getattr(cfg, key)
        if name not in registry:
            raise ConfigError(f"{key} {name!r} is not known: choose from {', '.join(registry)}{closest(name, registry)}")
    check_input_fn(cfg)
    for task in cfg.eval_tasks:
        if task not in TASKS:
            raise ConfigError(f"eval task {task!r} is not known: choose from {', '.join(TASKS)}{closest(task, TASKS)}")
        TASKS[task].check(cfg)
    return cfg


def replace(cfg: GPTConfig, **changes) -> GPTConfig:
    """A copy of cfg with some fields changed, checked again as a config read from disk is (`check`). List and
    object options may be given as in JSON; a move to another mesh is replace(cfg, mesh_shape=..., layout=...)."""
    changes.update(parse_model_options(changes))
    return check(dataclasses.replace(cfg, **changes))


def load_config(name_or_path: str, overrides: Optional[dict] = None,
                dataset_config_dir: str = DATASET_CONFIG_DIR) -> GPTConfig:
    """Reads a model config by name or path; `overrides` replace keys before validation."""
    path = resolve_config_path(name_or_path)
    raw = read_json(path, "model config")
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    for key, (name, _) in SYNONYMS.items():  # a flag overrides the config's key under either of its names
        if name in given:
            raw.pop(key, None)
    raw.update(given)
    return config_from_dict(raw, source=os.path.basename(path),
                            dataset_config_dir=dataset_registry_for(path, dataset_config_dir))


def dataset_registry_for(config_path: str, default: str = DATASET_CONFIG_DIR) -> str:
    """The dataset registry of a model config at config_path: a config folder kept outside the repo brings its
    own (a dataset_configs folder beside the config), else `default`."""
    beside = os.path.join(os.path.dirname(os.path.abspath(config_path)), "dataset_configs")
    return beside if os.path.isdir(beside) else default
