"""execution/runner.py: a job's step built on the placement's mesh with the placement's fused-kernels path, and the
in-memory batches every layout and a resumed run read alike."""
import dataclasses

import numpy as np
import tensorflow.compat.v1 as tf

import main
from conftest import CPU_DEVICES
from devices.placement import Placement
from execution import runner
from models.kernels import common
from tiny import tiny_config


def test_the_kernels_path_belongs_to_the_graph_and_comes_from_the_placement(monkeypatch):
    """The fused kernels' path is a value given where a job's graph is built (execution/runner.py), the placement's,
    which the device flags choose. Bug caught: the runner building every step on XLA kernels whatever the
    placement's path (`common.kernels("xla")`)."""
    from cli import device_flags
    from models.kernels.elementwise import _gelu_forward
    from execution import meshes
    from devices import kinds

    def gelu(*_):
        common.fused(_gelu_forward, tf.zeros([64, 1024]))
        return meshes.Lowered(None, {})

    def ops_built(placement=None):  # with a placement: built as a job's step is (execution/runner.py)
        if placement is not None:
            program = runner.Program(tiny_config(), placement, gelu, runner.Fed({}))
            return {op.type for op in program.graph.get_operations()}
        graph = tf.Graph()
        with graph.as_default():
            gelu()
        return {op.type for op in graph.get_operations()}

    compiled_call = {"PartitionedCall", "StatefulPartitionedCall"}
    assert ops_built() & compiled_call  # XLA by default
    with common.kernels("plain"):  # graphs without a placement: the block's path
        assert not common.xla_kernels() and "Tanh" in ops_built() and not ops_built() & compiled_call
    assert common.xla_kernels()  # back to the default
    cpu = Placement(devices=tuple(CPU_DEVICES[:1]))
    assert ops_built(cpu) & compiled_call
    plain = dataclasses.replace(cpu, kernels="plain")
    assert "Tanh" in ops_built(plain) and not ops_built(plain) & compiled_call
    assert common.xla_kernels()  # nothing leaked out of those graphs
    # --plain_kernels or the environment variable choose the placement's path (cli/device_flags.py)

    def placed(*flags):
        return kinds.place(device_flags.request(main.parse_args(["--gpu_ids", CPU_DEVICES[0], *flags])))
    assert placed().kernels == "xla"
    assert placed("--plain_kernels").kernels == "plain"
    monkeypatch.setenv(device_flags.PLAIN_KERNELS_ENV, "1")
    assert placed().kernels == "plain"


def test_fixed_batches_from_a_step_are_the_batches_an_uninterrupted_run_reads_there():
    """Rows cycled in order as (inputs, labels) batches: a run resumed at step 3 (the self-check's, the tests')
    reads the batches a run from step 0 reads at steps 3, 4, ..., across the end of the rows. Bug caught: the
    start step not skipped (`.skip(start_step)` dropped: a resumed run trains its first batches again)."""
    rows = np.arange(5 * 4).reshape(5, 4)  # 5 rows of n_ctx + 1 = 4 tokens; batches of 2 wrap around
    from_start = list(runner.fixed_batches(rows, 2)(0).take(6).as_numpy_iterator())
    resumed = list(runner.fixed_batches(rows, 2)(3).take(3).as_numpy_iterator())
    cycled = np.concatenate([rows] * 3)
    for step, (inputs, labels) in enumerate(from_start):
        np.testing.assert_array_equal(inputs, cycled[2 * step:2 * step + 2, :-1])
        np.testing.assert_array_equal(labels, cycled[2 * step:2 * step + 2, 1:])
    for (inputs, labels), (expected_inputs, expected_labels) in zip(resumed, from_start[3:]):
        np.testing.assert_array_equal(inputs, expected_inputs)
        np.testing.assert_array_equal(labels, expected_labels)
