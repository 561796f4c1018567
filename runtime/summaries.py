"""TensorBoard event files written without TensorBoard's summary ops: training's scalars in model_path and
the evaluations' in model_path/eval."""
from __future__ import annotations

import tensorflow.compat.v1 as tf


def summary_writer(folder: str) -> tf.summary.FileWriter:
    """An event-file writer for `folder` (TF's v1 writer must be made inside a graph)."""
    with tf.Graph().as_default():
        return tf.summary.FileWriter(folder)


def write_scalars(writer: tf.summary.FileWriter, step: int, values: dict) -> None:
    writer.add_summary(tf.Summary(value=[tf.Summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()]),
                       step)
