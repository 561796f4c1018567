"""bench/profile_train.py's breakdown of a training step: every op of a real traced step, ours and HF's, sorted into
its part of the model."""
import os
import re
import sys
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "bench"))
import bench_train  # noqa: E402
from tests.bench.test_bench_train import TINY  # noqa: E402

PROJECTIONS, LOGITS, ATTENTION_MATMULS = "matmul: projections", "matmul: output logits (tied embedding)", "matmul: attention"
OPTIMIZER, BIAS_GRADIENTS = "optimizer (Adam, clipping)", "bias gradients (sums)"


@pytest.fixture(scope="module")
def traced_step(tmp_path_factory):
    """What bench/profile_train.py reads of one training step of a tiny model, traced as it traces (its
    timeline_ops: op type, node name, ms), with the config and the model's variable names."""
    import numpy as np
    import tensorflow.compat.v1 as tf

    import profile_train
    from conftest import CPU_DEVICES
    from execution import meshes
    from devices.placement import Placement
    from execution.mesh_session import MeshSession
    from train.step import training_step

    cfg = bench_train.bench_config(TINY, model_path=str(tmp_path_factory.mktemp("profile") / "run"))
    placement = Placement(devices=tuple(CPU_DEVICES[:1]))
    data = np.random.RandomState(0).randint(0, cfg.n_vocab, size=[cfg.train_batch_size, cfg.n_ctx + 1]).astype(np.int32)
    graph = tf.Graph()
    with graph.as_default(), tf.device(placement.device_function()):
        mesh, impl = meshes.placement_mesh(cfg, placement)
        lowered = training_step(cfg, mesh, impl, tf.constant(data[:, :-1]), tf.constant(data[:, 1:]))
    variables = [v.name for v in mesh.graph.trainable_variables]
    with MeshSession(graph, lowered.lowering, "", placement.session_config(), None) as session:
        session.run(lowered.train_op)
        metadata = tf.RunMetadata()
        session.session.run(lowered.train_op, options=tf.RunOptions(trace_level=tf.RunOptions.FULL_TRACE),
                            run_metadata=metadata)
    return profile_train.timeline_ops(metadata), cfg, variables


@pytest.mark.slow
def test_the_profile_sorts_each_op_of_a_real_training_step_into_its_part_of_the_model(traced_step):
    """The categories are read off the lowered graph's scopes, which move when the model's kernels do. On a real
    step's timeline (not names written for the test): bugs caught, each seen in the script, are the clipping's
    sums of squares (an L2Loss per gradient: train/optimizer.SumOfSquares) not counted as the optimizer's,
    the bias and LayerNorm gradients' products with ones counted as projections, oneDNN's _MklTranspose
    counted as other instead of copies, and grappler's .../ArithmeticOptimizer/... rewrites inside the layers
    counted as the optimizer."""
    import profile_train as p
    ops, cfg, variables = traced_step
    sorted_ops = {}
    for op_type, name, _ in ops:
        sorted_ops.setdefault(p.tf_category(op_type, name), []).append((op_type, name))
    assert set(sorted_ops) <= set(p.CATEGORIES)
    assert set(p.CATEGORIES) - {"other"} <= set(sorted_ops), set(p.CATEGORIES) - set(sorted_ops)

    def matmuls(category):
        return [name for op_type, name in sorted_ops.get(category, []) if op_type in p.MATMULS]

    # the optimizer's ops are outside the model: grappler's rewrites inside it (LayerNorm's squares, the residual
    # adds, named .../ArithmeticOptimizer/...) are not the optimizer's
    assert sorted_ops[OPTIMIZER] and not [name for _, name in sorted_ops[OPTIMIZER] if name.startswith("gpt2/")]
    assert len(matmuls(LOGITS)) == 3  # the tied embedding's product and its two gradients
    assert len(matmuls(ATTENTION_MATMULS)) == 2 * 3 * cfg.n_layer  # q.k and weights.v of each layer, each with two gradients
    assert all(re.match(r"gpt2/h\d+/attn/attention/", name) for name in matmuls(ATTENTION_MATMULS)), matmuls(ATTENTION_MATMULS)
    # The projections are the layers' weight products, of attention and MLP in every layer, and nothing else.
    parts = set()
    for name in matmuls(PROJECTIONS):
        scope = re.match(r"gpt2/h(\d+)/(attn|mlp)/", name)
        assert scope and "/attention/" not in name and "bias_add" not in name and "norm" not in name, name
        parts.add(scope.groups())
    assert parts == {(str(layer), part) for layer in range(cfg.n_layer) for part in ("attn", "mlp")}
    # The clipping's global norm: one sum of squares (an L2Loss) per gradient, each counted as the optimizer's.
    assert len([name for op_type, name in sorted_ops[OPTIMIZER] if op_type == "L2Loss"]) == len(variables)
    # Each bias's gradient: one product with a row of ones.
    assert len(matmuls(BIAS_GRADIENTS)) == len([v for v in variables if re.search(r"(bias|/o_b)$", v)])
    assert not matmuls("other") and not matmuls("copies (transpose, reshape, cast, concat)")
    # A layer's computing ops are all in a category of their own; only variable bookkeeping and the residual
    # stream's gradient sums (gpt2/hN/add_N: the skip's gradient plus the branch's) are "other".
    bookkeeping = {"VarHandleOp", "ReadVariableOp", "Const", "NoOp"}
    unsorted = [(op_type, name) for op_type, name in sorted_ops.get("other", [])
                if re.match(r"gpt2/h\d+/", name) and op_type not in bookkeeping
                and not re.match(r"gpt2/h\d+/add(_\d+)*/", name)]
    assert not unsorted, unsorted


def test_the_profile_sorts_each_op_of_a_real_hf_step(monkeypatch):
    """HF's side on a real profiled step of a tiny GPTNeo (profile_train.worker_hf): every op lands in a category
    of the breakdown, each part of the model gets its ops, and no matrix product is counted as other or copies."""
    import profile_train as p
    import torch
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # this process's torch keeps its threads
    args = SimpleNamespace(**TINY, warmup=0, steps=1, top=10 ** 6, precision="float32")
    events = p.worker_hf(args)["top"]  # [category, phase, op name, ms] of every (category, phase, name)
    categories = {category for category, _, _, _ in events}
    assert categories <= set(p.CATEGORIES)
    expected = {PROJECTIONS, LOGITS, ATTENTION_MATMULS, "attention: softmax, mask", "LayerNorm", "GELU", "loss", OPTIMIZER,
                "embedding gradient"}
    assert expected <= categories, expected - categories
    products = [(category, phase) for category, phase, name, _ in events
                if re.search(r"aten::(mm|addmm|bmm|baddbmm|matmul|linear)$", name)]
    assert products and all(category in (PROJECTIONS, LOGITS, ATTENTION_MATMULS) or phase in ("hf_optimizer", "hf_clip")
                            for category, phase in products), products
    # The output layer's product runs forward and backward.
    assert {phase for category, phase, _, _ in events if category == LOGITS} == {"hf_forward", "hf_backward"}
