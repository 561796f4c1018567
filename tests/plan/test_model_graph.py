"""plan/model_graph.py: the training step's graph built for planning, without devices: op for op the graph
train/step.py builds (float16's loss scaling and gated updates included; a micro-batched step planned as its one
pass with the variables training makes), and its parameter counts, exactly a trained checkpoint's variables."""
import math

import pytest
import tensorflow.compat.v1 as tf

from conftest import CPU_DEVICES
from config import replace
from devices.placement import Placement
from execution import meshes
from models import flops
from models.optimizers import AdamUpdate
from plan import model_graph
from schema import num_microbatches
from tiny import random_tokens, tiny_config, train
from train import step as train_step
from train.optimizer import AssignIf


def checkpoint_parameters(model_path):
    checkpoint = tf.train.latest_checkpoint(model_path)
    return {name: math.prod(shape) for name, shape in tf.train.list_variables(checkpoint)
            if name.startswith("gpt2/") and "adam" not in name}


@pytest.mark.slow
def test_parameter_count_is_exactly_the_trained_checkpoints_variables(tmp_path):
    cfg = tiny_config(n_layer=3, attention_types=[[["local", "global", "local"], 1]], activation_function="relu",
                      model_path=str(tmp_path / "run"), train_steps=1)
    train(cfg, random_tokens([8, cfg.n_ctx + 1]))
    trained = checkpoint_parameters(cfg.model_path)
    counted = model_graph.build(cfg).parameter_count()
    assert counted["total"] == sum(trained.values())
    assert counted["embedding"] == trained["gpt2/wte"] + trained["gpt2/wpe"]
    assert counted["non_embedding"] == counted["total"] - counted["embedding"]
    # The closed form (models/flops.py) agrees for the default architecture, and so FLOPs/token is 6N + attention.
    assert flops.parameter_count(cfg) == counted
    assert flops.training_flops_per_token(cfg, counted) == flops.training_flops_per_token(cfg)


def operations(graph) -> list:
    """An mtf graph op for op: kind, name and output shapes."""
    return [(type(op).__name__, op.name, [t.shape for t in op.outputs]) for op in graph.operations]


def test_the_planned_graph_is_the_one_the_training_step_builds():
    """Planning reads the training step's own graph (train/step.py's build, before lowering), op for op: float16's
    loss scaling and gated updates, the per-variable gradient norms, the learning rate. Bug caught: a planning graph
    rebuilt by hand beside the step (plan/model_graph.py's was, without loss scaling)."""
    cfg = tiny_config(precision="float16", log_grads=True, mesh_shape="x:2", layout="heads:x")
    with tf.Graph().as_default():
        tokens = tf.zeros([cfg.train_batch_size, cfg.n_ctx], tf.int32)
        mesh, impl = meshes.placement_mesh(cfg, Placement(devices=tuple(CPU_DEVICES[:2])))
        train_step.build(cfg, mesh, impl, tokens, tokens)
    planned = model_graph.build(cfg)

    assert operations(planned.graph) == operations(mesh.graph)
    # float16's gated updates: AssignIf, or the gate handed to the fused Adam's one update (its last input)
    assert any(isinstance(op, AssignIf) or isinstance(op, AdamUpdate) and op.inputs[-1].dtype == tf.bool
               for op in planned.graph.operations)
    assert planned.forward_operations[-1] is planned.objective.operation


def test_a_micro_batched_step_is_planned_as_one_pass_with_the_variables_training_makes():
    """With tokens_per_mb_per_replica, training runs the step's pass on each micro-batch inside one loop operation;
    the planner reads that pass (the whole batch's step, op for op) with exactly the variables the micro-batched
    step creates (the weights and the optimizer's slots). Bug caught: the planner building the micro-batched step
    itself, whose forward pass (everything up to the summed objective) would be the whole loop."""
    cfg = tiny_config(tokens_per_mb_per_replica=2 * 16)  # 4 sequences of 16 -> 2 micro-batches
    assert num_microbatches(cfg, cfg.train_batch_size) == 2
    with tf.Graph().as_default():
        tokens = tf.zeros([cfg.train_batch_size, cfg.n_ctx], tf.int32)
        mesh, impl = meshes.placement_mesh(cfg, Placement(devices=tuple(CPU_DEVICES[:1])))
        train_step.build(cfg, mesh, impl, tokens, tokens)
    planned = model_graph.build(cfg)
    whole_batch = model_graph.build(replace(cfg, tokens_per_mb_per_replica=None))

    def variables(graph):
        return [(v.name, v.shape, v.master_dtype, v.trainable) for v in graph.all_variables]

    assert operations(planned.graph) == operations(whole_batch.graph)
    assert planned.n_forward_ops == whole_batch.n_forward_ops
    assert variables(planned.graph) == variables(mesh.graph)
    assert any(type(op).__name__ == "WhileLoopOperation" for op in mesh.graph.operations)  # training loops


@pytest.mark.parametrize("axial_pos_emb", [None, (4, 4)], ids=["learned", "axial"])
def test_the_position_tables_learned_or_axial_are_embedding_parameters(axial_pos_emb):
    """Token and position tables are the embedding parameters (the scaling-law fits count N without them): the
    learned table's n_ctx rows, or the axial tables' a + b rows; every layer's weight is non-embedding, as the
    closed form (models/flops.py) counts the layers.
    Bug caught: `_EMBEDDING_NAME` without `axial` (the axial tables counted among the layers' parameters)."""
    cfg = tiny_config(axial_pos_emb=axial_pos_emb)
    counted = model_graph.build(cfg).parameter_count()
    positions = sum(axial_pos_emb) if axial_pos_emb else cfg.n_ctx
    assert counted["embedding"] == (cfg.n_vocab + positions) * cfg.n_embd
    assert counted["non_embedding"] == flops.parameter_count(cfg)["non_embedding"]
    assert counted["total"] == counted["embedding"] + counted["non_embedding"]
