"""What a training run leaves in its model_path for the tools that read it afterwards.

* `run_info.json`, written when training starts: the model's shape, tokens per step and model FLOPs per token
  (models/flops.py), the training length and learning rate it ran with (--train_steps, --lr, --warmup_steps), so that `tools/plot_runs.py` can put a run's loss against training tokens and compute
  from the model_path alone, and the Sacred run ids (`--sacred_id`, set by run_experiment.py) that trained it.
* `read_scalars`: the TensorBoard scalars (loss, learning_rate, tokens_per_sec, mfu, ...) of a model_path
  (or of its `eval/` folder), step by step, from the event files, without TensorBoard running.
"""
from __future__ import annotations

import glob
import json
import os
import struct
import sys
import time
from typing import Optional

RUN_INFO = "run_info.json"


def run_info(cfg) -> dict:
    from models import flops
    return {
        "n_layer": cfg.n_layer, "n_embd": cfg.n_embd, "n_head": cfg.n_head, "n_ctx": cfg.n_ctx,
        "n_vocab": cfg.n_vocab, "attention_types": list(cfg.attention_types),
        "train_batch_size": cfg.train_batch_size, "tokens_per_step": cfg.train_batch_size * cfg.n_ctx,
        "flops_per_token": flops.training_flops_per_token(cfg), "parameters": flops.parameter_count(cfg)["total"],
        "precision": cfg.precision, "train_steps": cfg.train_steps, "lr": cfg.lr, "warmup_steps": cfg.warmup_steps,
    }


def write_run_info(cfg, start_step: int, sacred_id: Optional[str] = None) -> str:
    """Writes model_path/run_info.json (keeping the history of earlier starts); returns its path. A damaged one
    (cut short, not JSON, not an object) never blocks training: it is kept as run_info.json.damaged, with a
    warning, and a new one is written."""
    path = os.path.join(cfg.model_path, RUN_INFO)
    previous = read_run_info(cfg.model_path)
    if previous is None and os.path.isfile(path):
        os.replace(path, path + ".damaged")
        _warn(f"kept it as {path}.damaged; writing a new {RUN_INFO} (the starts it listed are not carried over)")
    previous = previous or {}
    info = run_info(cfg)
    starts = previous.get("starts") if isinstance(previous.get("starts"), list) else []
    info["starts"] = starts + [  # each start with what it trained to and at (a fine-tune's --train_steps, --lr)
        {"step": start_step, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "sacred_id": sacred_id,
         "train_steps": cfg.train_steps, "lr": cfg.lr, "warmup_steps": cfg.warmup_steps}]
    os.makedirs(cfg.model_path, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(info, f, indent=1)
    os.replace(path + ".tmp", path)
    return path


def read_run_info(model_path: str) -> Optional[dict]:
    """model_path/run_info.json; None when there is none, or (with a warning) when it is damaged."""
    path = os.path.join(model_path, RUN_INFO)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:  # empty, cut short, garbage
        _warn(f"{path} is damaged ({type(e).__name__}: {str(e).splitlines()[0][:80]}): ignoring it")
        return None
    if not isinstance(info, dict):
        _warn(f"{path} is damaged (it holds a JSON {type(info).__name__}, not an object): ignoring it")
        return None
    return info


def _warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)


def read_scalars(folder: str) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...] sorted by step} from the TensorBoard event files directly in `folder`.
    A step written twice (a run restarted from an earlier checkpoint) keeps the value written last. Reads the
    files itself (TFRecord framing, tensorboard's Event protos), so neither TensorFlow nor TensorBoard runs."""
    found: dict[str, dict[int, float]] = {}
    for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*")), key=_event_file_order):
        for event in _events(path):
            if not event.HasField("summary"):
                continue
            for value in event.summary.value:
                number = _scalar(value)
                if number is not None:
                    found.setdefault(value.tag, {})[int(event.step)] = number
    return {tag: sorted(values.items()) for tag, values in found.items()}


def _events(path: str):
    """The Event records of one event file; stops quietly at a record still being written."""
    from tensorboard.compat.proto.event_pb2 import Event
    with open(path, "rb") as f:
        while True:
            header = f.read(12)  # uint64 length, uint32 masked CRC of the length
            if len(header) < 12:
                return
            (length,) = struct.unpack("<Q", header[:8])
            data = f.read(length)
            footer = f.read(4)  # uint32 masked CRC of the data
            if len(data) < length or len(footer) < 4:
                return
            event = Event()
            try:
                event.ParseFromString(data)
            except Exception:  # noqa: BLE001 - a torn record at the end of a file being written
                return
            yield event


def _scalar(value) -> Optional[float]:
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if value.HasField("tensor") and value.metadata.plugin_data.plugin_name == "scalars":
        tensor = value.tensor
        if tensor.float_val:
            return float(tensor.float_val[0])
        if tensor.double_val:
            return float(tensor.double_val[0])
        if tensor.tensor_content and tensor.dtype in (1, 2):  # DT_FLOAT, DT_DOUBLE
            return float(struct.unpack("<f" if tensor.dtype == 1 else "<d", tensor.tensor_content[:4 if tensor.dtype == 1 else 8])[0])
    return None


def _event_file_order(path: str):
    """Event files sort by the creation time in their names (events.out.tfevents.<time>.<host>...)."""
    parts = os.path.basename(path).split(".")
    try:
        return (float(parts[3]), path)
    except (IndexError, ValueError):
        return (0.0, path)
