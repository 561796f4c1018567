"""execution/op_listing.py: the ops requested on a GPU that ran on the CPU, found in a session's partition graphs
and told in one line."""
import numpy as np
import tensorflow.compat.v1 as tf

from conftest import CPU_DEVICES
from execution import op_listing


def test_cpu_fallbacks_are_the_ops_requested_on_a_gpu_that_ran_on_a_cpu():
    local = "/job:localhost/replica:0/task:0/device:"
    ops = [("a", "MatMul", "/device:GPU:0", local + "GPU:0"),
           ("b", "StringJoin", "/device:GPU:0", local + "CPU:0"),
           ("c", "Unique", "/device:GPU:1", local + "CPU:0"),
           ("d", "IteratorGetNext", "", local + "CPU:0"),          # requested nowhere: the placer's choice
           ("e", "AssignVariableOp", "/device:CPU:0", local + "CPU:0"),  # master copies live on the host
           ("f", "Mul", "/job:worker/task:1/device:GPU:0", "/job:worker/replica:0/task:1/device:CPU:0")]
    fallbacks = op_listing.cpu_fallbacks(ops)
    assert [f.name for f in fallbacks] == ["b", "c", "f"]
    line = op_listing.describe_placement(op_listing.PlacementReport(ops, fallbacks))
    assert line.startswith("placement: 3 of 4 ops of the training step placed on a GPU ran on the CPU")
    assert "StringJoin x1 (b); Unique x1 (c); Mul x1 (f)" in line and "\n" not in line
    clean = [op for op in ops if op[0] not in ("b", "c", "f")]
    assert op_listing.describe_placement(op_listing.PlacementReport(clean, [])) == \
        "placement: all 1 ops of the training step placed on GPUs ran there"


def test_placement_listing_reads_where_a_session_ran_each_op(capsys):
    """A real session with soft placement: a string op (no GPU kernel anywhere) requested on a GPU runs on the
    CPU and is listed; ops requested on the CPU are not."""
    graph = tf.Graph()
    with graph.as_default():
        text = tf.placeholder(tf.string, [2])
        number = tf.placeholder(tf.float32, [2])
        with tf.device("/device:GPU:0"):
            joined = tf.strings.join([text, text], name="joined")
        with tf.device(CPU_DEVICES[0]):
            doubled = tf.multiply(number, 2.0, name="doubled")
    with tf.Session(graph=graph, config=tf.ConfigProto(allow_soft_placement=True,
                                                       device_count={"CPU": 4})) as session:
        values, report = op_listing.run_listing_placement(session, [joined, doubled],
                                                    {text: ["a", "b"], number: [1.0, 2.0]})
    assert list(values[0]) == [b"aa", b"bb"] and np.allclose(values[1], [2.0, 4.0])
    names = {f.name: f for f in report.fallbacks}
    assert "joined" in names and names["joined"].op_type == "StringJoin"
    assert "doubled" not in names and ("doubled", "Mul", CPU_DEVICES[0]) in [op[:3] for op in report.ops]
    assert "placement: " in capsys.readouterr().out and "StringJoin x1 (joined" in \
        op_listing.describe_placement(report)
