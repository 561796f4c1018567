"""A model_path's TensorBoard event files: training's scalars in model_path, the evaluations' in model_path/eval
(`folder`). Written without TensorBoard's summary ops (TensorFlow's v1 FileWriter, imported when a writer is made),
and read back (`read_scalars`) by the tools that plot or copy them, without TensorFlow or TensorBoard running.
"""
from __future__ import annotations

import glob
import os
import struct
from typing import Optional

EVAL = "eval"  # model_path/eval: the evaluations' scalars (evals/)


def folder(model_path: str, evaluation: bool = False) -> str:
    """Where a run's scalars go: model_path for training's, model_path/eval for the evaluations'."""
    return os.path.join(model_path, EVAL) if evaluation else model_path


def summary_writer(where: str):
    """An event-file writer (tf.summary.FileWriter) for the folder `where`; TF's v1 writer must be made inside a
    graph."""
    import tensorflow.compat.v1 as tf
    with tf.Graph().as_default():
        return tf.summary.FileWriter(where)


def write_scalars(writer, step: int, values: dict) -> None:
    import tensorflow.compat.v1 as tf
    writer.add_summary(tf.Summary(value=[tf.Summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()]),
                       step)


def read_scalars(where: str) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...] sorted by step} from the TensorBoard event files directly in the folder `where`.
    A step written twice (a run restarted from an earlier checkpoint) keeps the value written last. Reads the
    files itself (TFRecord framing, tensorboard's Event protos), so neither TensorFlow nor TensorBoard runs."""
    found: dict[str, dict[int, float]] = {}
    for path in sorted(glob.glob(os.path.join(where, "events.out.tfevents.*")), key=_event_file_order):
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
