"""What a training step holds in memory (issue 34): nothing weight-sized outlives the variables' initialisation,
and blocked attention keeps per-row statistics for its backward pass, not its softmax weights."""
import numpy as np
import tensorflow.compat.v1 as tf

from runtime import meshes
from runtime.mesh_session import MeshSession
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


def test_no_copy_of_the_optimizer_state_outlives_initialisation(tmp_path):
    """TF folds a zeros initializer into a constant (compact in the graph, whole in memory) and a session keeps
    the executors it ran, kernels and tensors included: Adam's zero slots stayed held by the initialiser's
    executor once the first update gave each slot a buffer of its own, two weight-sized copies for the whole run
    (0.93 GiB at GPT-Neo 125M). MeshSession initialises through a callable it releases (run_once). Bug: run the
    initialiser with session.run, and the allocator holds the slots' size twice more after a step."""
    cfg = tiny_config(n_vocab=16384, n_embd=128, n_head=4, train_batch_size=2, model_path=str(tmp_path / "run"))
    placement = placement_for(cfg)
    graph = tf.Graph()
    with graph.as_default(), tf.device(placement.device_function()):
        tokens = tf.constant(random_tokens([cfg.train_batch_size, cfg.n_ctx], cfg.n_vocab))
        mesh, impl = meshes.placement_mesh(cfg, placement)
        lowered = training_step(cfg, mesh, impl, tokens, tokens)
        probe = tf.random.uniform([1 << 18]) * 2.0  # 1 MiB: taken from the allocator whose use it reports
        slots = sum(v.shape.num_elements() * 4 for v in tf.global_variables() if "adam_" in v.op.name)
    with MeshSession(graph, lowered.lowering, "", placement.session_config(), checkpoint=None) as session:
        before = allocator_bytes_in_use(session.session, probe)
        for _ in range(2):
            session.run(lowered.train_op)
        after = allocator_bytes_in_use(session.session, probe)
    assert slots > 16 * 2 ** 20  # the embedding's two slots, 8 MiB each
    assert after - before < slots / 4, (before, after, slots)
