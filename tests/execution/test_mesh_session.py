"""execution/mesh_session.py: the session every job's program runs in. Its initialisation leaves nothing
weight-sized behind (issue 34), a save refuses weights that hold inf or NaN, writing nothing, and a session that
never saves builds no check for it. (Its restore of
a checkpoint a trainer rotated away is tested with the trainer's lock: tests/modelpath/test_lock.py.)"""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf

from execution import meshes
from execution.mesh_session import MeshSession, checkpoint_saver, finiteness, save_finite
from modelpath import checkpoints
from tiny import placement_for, random_tokens, tiny_config
from train.step import training_step


def allocator_bytes_in_use(session, probe) -> int:
    """The bytes TF's CPU allocator holds now, beside `probe`'s own output: what the session keeps between runs
    (RunMetadata's allocator_bytes_in_use, recorded when `probe` allocates)."""
    metadata = tf.RunMetadata()
    session.run(probe, options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE), run_metadata=metadata)
    used = [m.allocator_bytes_in_use for device in metadata.step_stats.dev_stats for node in device.node_stats
            for m in node.memory if m.allocator_bytes_in_use]
    assert used, "the allocator reports no statistics"
    return min(used)


def training_graph(cfg, placement, probe: bool = False):
    """(graph, the tiny model's lowered training step on a batch of random tokens, a 1 MiB probe op if asked for)."""
    graph = tf.Graph()
    with graph.as_default(), tf.device(placement.device_function()):
        tokens = tf.constant(random_tokens([cfg.train_batch_size, cfg.n_ctx], cfg.n_vocab))
        mesh, impl = meshes.placement_mesh(cfg, placement)
        lowered = training_step(cfg, mesh, impl, tokens, tokens)
        # 1 MiB: taken from the allocator whose use it reports
        return graph, lowered, (tf.random.uniform([1 << 18]) * 2.0 if probe else None)


@pytest.mark.slow
def test_no_copy_of_the_optimizer_state_outlives_initialisation(tmp_path):
    """TF folds a zeros initializer into a constant (compact in the graph, whole in memory) and a session keeps
    the executors it ran, kernels and tensors included: Adam's zero slots stayed held by the initialiser's
    executor once the first update gave each slot a buffer of its own, two weight-sized copies for the whole run
    (0.93 GiB at GPT-Neo 125M). MeshSession initialises through a callable it releases (run_once). Bug: run the
    initialiser with session.run, and the allocator holds the slots' size twice more after a step."""
    cfg = tiny_config(n_vocab=16384, n_embd=128, n_head=4, train_batch_size=2, model_path=str(tmp_path / "run"))
    placement = placement_for(cfg)
    graph, lowered, probe = training_graph(cfg, placement, probe=True)
    slots = sum(v.shape.num_elements() * 4 for v in graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES)
                if "adam_" in v.op.name)
    with MeshSession(graph, lowered.lowering, "", placement.session_config(), checkpoint=None) as session:
        before = allocator_bytes_in_use(session.session, probe)
        for _ in range(2):
            session.run(lowered.train_op)
        after = allocator_bytes_in_use(session.session, probe)
    assert slots > 16 * 2 ** 20  # the embedding's two slots, 8 MiB each
    assert after - before < slots / 4, (before, after, slots)


def test_a_save_of_weights_holding_inf_or_nan_names_them_and_writes_nothing(tmp_path):
    """Each floating-point variable's flag is computed where it lives, and the save is refused before the writer
    runs: NonFiniteWeights names the variables that are not finite (the integer step is not checked), and
    model_path holds no file of that step; with finite values the same save writes model.ckpt-STEP. Bug caught:
    the check asking whether any variable is finite (`flags.any()`: a checkpoint of NaN written beside finite
    ones)."""
    model_path = str(tmp_path / "run")
    graph = tf.Graph()
    with graph.as_default():
        weights = tf.Variable(np.ones([3, 2], np.float32), name="w")
        bias = tf.Variable(np.zeros([2], np.float32), name="b")
        step = tf.Variable(np.int64(7), name="global_step")
        break_weight = weights[1, 0].assign(np.nan)
        checked, finite = finiteness([weights, bias, step])
        saver = checkpoint_saver([weights, bias, step])
    assert [v.op.name for v in checked] == ["w", "b"]
    with tf.Session(graph=graph) as session:
        session.run(tf.variables_initializer([weights, bias, step]))
        writer = checkpoints.CheckpointWriter(model_path, saver)
        prefix = save_finite(session, writer, 7, checked, finite)
        assert prefix == checkpoints.prefix_of(model_path, 7) and checkpoints.steps(model_path) == [7]
        session.run(break_weight)
        with pytest.raises(checkpoints.NonFiniteWeights) as info:
            save_finite(session, writer, 8, checked, finite)
    assert info.value.names == ["w"] and info.value.step == 8
    assert checkpoints.steps(model_path) == [7]
    assert not [name for name in tf.io.gfile.listdir(model_path) if "-8" in name]


def test_a_session_that_never_saves_builds_no_finiteness_check_and_refuses_to_save(tmp_path):
    """saves=False (prediction, evaluation, export) adds no IsFinite op to the graph and its save is an error, not
    a checkpoint written unchecked; the default session of the same graph checks every floating-point variable.
    Bug caught: MeshSession ignoring `saves` (the check built for every reading session: a third of a tiny model's
    session set-up)."""
    cfg = tiny_config(model_path=str(tmp_path / "run"))
    placement = placement_for(cfg)
    graph, lowered, _ = training_graph(cfg, placement)
    floating = [v for v in graph.get_collection(tf.GraphKeys.GLOBAL_VARIABLES) if v.dtype.base_dtype.is_floating]

    def checks() -> int:
        return sum(op.type == "IsFinite" for op in graph.get_operations())

    with MeshSession(graph, lowered.lowering, "", placement.session_config(), None, finalize=False,
                     saves=False) as reading:
        assert checks() == 0
        saver = checkpoint_saver(floating)
        with pytest.raises(RuntimeError, match="saves=False"):
            reading.save(checkpoints.CheckpointWriter(cfg.model_path, saver), 1)
    assert checkpoints.steps(cfg.model_path) == []
    with MeshSession(graph, lowered.lowering, "", placement.session_config(), None):
        assert checks() == len(floating) > 0
