"""--dry_run (plan/dry_run.py): per-device memory against what the placement mesh allocates, the smallest mesh
search, and every shipped config's layout on its real graph. (The planned graph itself and its parameter counts:
tests/plan/test_model_graph.py.)"""
import dataclasses
import glob
import math
import os
import re

import mesh_tensorflow as mtf
import pytest
import tensorflow.compat.v1 as tf

import main
from models import flops
from models.kernels import attention
from plan import model_graph
from plan import dry_run as plan
from config import load_config, replace
from schema import CONFIG_DIR, ConfigError, num_microbatches
from execution import meshes
from devices.placement import Placement
from tiny import cpu_mesh_impl, tiny_config
from train.optimizer import autostack_allowed
from train.step import training_step


def allocated_slices(cfg):
    """Bytes of the slice variables the placement mesh creates on each device, for weights and optimizer state."""
    built = model_graph.build(cfg, declare_only=False)
    with built.tf_graph.as_default():
        impl = cpu_mesh_impl(cfg.mesh_shape, cfg.layout)
        mtf.Lowering(built.graph, {built.mesh: impl}, autostack=autostack_allowed(built.updates))  # as training does
        per_device = {}
        for op in built.tf_graph.get_operations():
            if op.type in ("VarHandleOp", "VariableV2") and "_slice_" in op.name:
                kind = "optimizer" if ("adam_" in op.name or "_slot_" in op.name) else "weights"
                size = math.prod(op.get_attr("shape").dim[i].size for i in range(len(op.get_attr("shape").dim)))
                key = (op.device, kind)
                per_device[key] = per_device.get(key, 0) + size * tf.as_dtype(op.get_attr("dtype")).size
    return per_device


@pytest.mark.slow
@pytest.mark.parametrize("mesh_shape,layout,opt_name", [
    ("x:2,y:2", "batch:x,embd:y,memory_length:y", "adam"),
    ("x:4", "heads:x,intermediate_expanded:x,vocab:x", "adafactor"),
])
def test_weight_and_optimizer_bytes_match_what_the_placement_mesh_allocates(mesh_shape, layout, opt_name):
    cfg = tiny_config(n_embd=64, n_vocab=128, mesh_shape=mesh_shape, layout=layout, opt_name=opt_name,
                      train_batch_size=8)
    estimate = plan.memory(plan.collect(cfg), cfg, recompute=False)
    allocated = allocated_slices(cfg)
    devices = {device for device, _ in allocated}
    assert len(devices) == cfg.n_devices
    for device in devices:
        for kind, estimated in (("weights", estimate.weights), ("optimizer", estimate.optimizer)):
            real = allocated[(device, kind)]
            assert abs(estimated - real) <= 0.05 * real, (device, kind, estimated, real)
    # The layout really splits weights (so matching is not a replicated full copy matching itself).
    whole = plan.memory(plan.collect(cfg), replace(cfg, mesh_shape="all:1", layout=""), recompute=False)
    assert estimate.weights < whole.weights and estimate.optimizer < whole.optimizer


def test_on_gpus_master_copies_are_in_host_ram_and_each_gpu_holds_its_slices():
    """The runner's own training graph on a GPU placement mesh (built, not run: no GPU needed): every master
    variable, optimizer slots included, is on the host's CPU, as many bytes as the dry run's host RAM line;
    the slices on each GPU are the dry run's per-device weights and optimizer state."""
    cfg = tiny_config(n_embd=64, n_vocab=128, mesh_shape="x:2", layout="heads:x,intermediate_expanded:x,vocab:x")
    gpus = ("/device:GPU:0", "/device:GPU:1")
    with tf.Graph().as_default() as graph:
        tokens = tf.zeros([cfg.train_batch_size, cfg.n_ctx], tf.int32)
        mesh, impl = meshes.placement_mesh(cfg, Placement(devices=gpus))
        training_step(cfg, mesh, impl, tokens, tokens)
    variables = [op for op in graph.get_operations() if op.type in ("VarHandleOp", "VariableV2")]
    masters = [op for op in variables if "_slice_" not in op.name and op.name.startswith("gpt2/")]
    slices = [op for op in variables if "_slice_" in op.name]

    def size(op):
        return math.prod(d.size for d in op.get_attr("shape").dim) * tf.as_dtype(op.get_attr("dtype")).size

    assert masters and {op.device for op in masters} == {"/device:CPU:0"}
    assert {op.device for op in slices} == set(gpus)
    made = plan.make_plan(cfg)
    assert sum(size(op) for op in masters) == made.facts.master_bytes == plan.host_memory(made, cpu_devices=False)
    per_device = made.memory[False].weights + made.memory[False].optimizer
    for gpu in gpus:
        assert sum(size(op) for op in slices if op.device == gpu) == pytest.approx(per_device, rel=0.05)
    # On CPU devices the slices are host RAM too.
    assert plan.host_memory(made, cpu_devices=True) == made.facts.master_bytes + 2 * made.memory[False].total


def test_activation_estimates_follow_recompute_batch_and_layout():
    cfg = tiny_config(n_layer=4, attention_types=[[["global", "local"], 2]], train_batch_size=8, n_ctx=32)
    facts = plan.collect(cfg)
    off, on = plan.memory(facts, cfg, False), plan.memory(facts, cfg, True)
    assert on.activations_saved < 0.5 * off.activations_saved  # only block inputs are kept
    assert on.activations_working > off.activations_working     # one block is rebuilt in the backward pass
    assert on.weights == off.weights and on.optimizer == off.optimizer == 2 * off.weights  # Adam: m and v
    split = replace(cfg, mesh_shape="x:2", layout="batch:x")
    halved = plan.memory(facts, split, False)
    assert halved.activations_saved == pytest.approx(off.activations_saved / 2, rel=0.02)
    assert halved.weights == off.weights  # data parallel keeps a full copy of the weights everywhere
    micro = replace(cfg, tokens_per_mb_per_replica=2 * cfg.n_ctx)  # 8 sequences -> 4 micro-batches of 2
    assert num_microbatches(micro, micro.train_batch_size) == 4
    per_micro = plan.memory(facts, micro, False)
    assert per_micro.activations_saved == pytest.approx(off.activations_saved / 4, rel=0.02)
    assert per_micro.accumulators == off.gradients and off.accumulators == 0


@pytest.mark.parametrize("precision,itemsize", [("float32", 4), ("bfloat16", 2)])
def test_the_plan_counts_the_softmax_weights_the_blocked_attention_keeps(precision, itemsize, monkeypatch):
    """models/kernels/attention.causal_attention keeps every block's softmax weights for its backward pass inside
    one op, where the mtf graph does not show them: the plan counts them from the op's kept_for_backward, in the
    activations' dtype (under bf16 only the bf16 weights are kept). Above KEEPS_WEIGHTS_UP_TO it recomputes them
    and keeps nothing: the plan's activations grow linearly with the context."""
    def saved(n_ctx):
        cfg = tiny_config(n_layer=2, attention_types=[[["global", "local"], 1]], n_ctx=n_ctx, train_batch_size=2,
                          precision=precision)
        return cfg, plan.collect(cfg, recompute_flags=(False,))

    cfg, facts = saved(256)
    # global: 4 blocks of 64 queries over 64, 128, 192 and 256 keys; local (radius 4): 4 blocks of 64 queries,
    # the first over its own 64 keys, the others over 3 more before them
    expected = {"global": 64 * (64 + 128 + 192 + 256), "local": 64 * 64 + 3 * 64 * (64 + 3)}
    kept = [(dict(key), itemsize, count) for (key, itemsize), count in facts.saved[False].groups.items()
            if "causal_attention_weights" in dict(key)]
    assert sorted(k["causal_attention_weights"] for k, _, _ in kept) == sorted(expected.values())
    assert all(k["batch"] == 2 and k["heads"] == cfg.n_head and size == itemsize and count == 1
               for k, size, count in kept)
    per_layer = [sum(dict(key).get("causal_attention_weights", 0) for (key, _), _ in layer.groups.items())
                 for layer in facts.layer_saved]
    assert per_layer == [expected["global"], expected["local"]]

    monkeypatch.setattr(attention, "KEEPS_WEIGHTS_UP_TO", 128)
    sizer = plan.Sizer("all:1", "")
    recomputed = {n_ctx: saved(n_ctx)[1].saved[False] for n_ctx in (256, 512)}
    assert not any("causal_attention_weights" in dict(key) for key, _ in recomputed[256].groups)
    assert facts.saved[False].bytes(sizer) - recomputed[256].bytes(sizer) == pytest.approx(
        itemsize * 2 * cfg.n_head * sum(expected.values()))
    assert recomputed[512].bytes(sizer) == pytest.approx(2 * recomputed[256].bytes(sizer), rel=0.01)  # linear


@pytest.mark.parametrize("changes", [
    dict(n_layer=7, attention_types=[[["global", "local"], 3], [["local"], 1]]),
    dict(n_layer=6, attention_types=[[["global"], 5], [["local"], 1]], moe_layers=[1, 5], precision="bfloat16"),
    dict(n_layer=5, attention_types=[[["global"], 5]], share_parameters=True, mlp_glu=True, num_mem_kv=2),
    dict(n_layer=4, attention_types=[[["global"], 4]], macaron=True, rezero=True, opt_name="adafactor", beta1=0.0,
         mesh_shape="x:2", layout="heads:x,vocab:x"),
], ids=["alternating", "moe_and_a_late_kind", "shared_glu_memory", "macaron_adafactor_split"])
def test_the_estimate_from_a_few_layers_is_the_whole_graphs(changes):
    """plan/memory_check.py answers from graphs of a few layers (by_layer_kind) so that 3000 layers take seconds:
    every count it extrapolates is the one the whole model's graph gives (layer kinds appearing late, shared
    weights, MoE layers, optimizer slots, a split layout)."""
    cfg = tiny_config(n_ctx=32, **changes)
    whole, estimate = plan.collect(cfg), plan.by_layer_kind(cfg)
    for name in ("weights", "optimizer", "gradients", "weight_casts"):
        assert getattr(estimate, name).groups == getattr(whole, name).groups, name
    assert {flag: s.groups for flag, s in estimate.saved.items()} == {flag: s.groups for flag, s in whole.saved.items()}
    assert (estimate.params, estimate.master_bytes, estimate.master_weight_bytes) == (
        whole.params, whole.master_bytes, whole.master_weight_bytes)
    assert set(estimate.all_tensors.groups) == set(whole.all_tensors.groups)
    for recompute in (False, True):  # the largest tensor and the largest layer, which the working set takes
        assert plan.memory(estimate, cfg, recompute) == plan.memory(whole, cfg, recompute)
    assert plan.inference_memory(estimate, cfg, "predict") == plan.inference_memory(whole, cfg, "predict")


def test_smallest_mesh_that_fits():
    cfg = tiny_config(train_batch_size=8)
    facts = plan.collect(cfg)
    one = plan.memory(facts, cfg, recompute=False).total
    fit = plan.smallest_fit(cfg, facts, one, recompute=False)
    assert fit.n_devices == 1 and fit.mesh_shape == "all:1"
    fit = plan.smallest_fit(cfg, facts, 0.6 * one, recompute=False)
    assert fit is not None and fit.n_devices > 1 and fit.memory.total <= 0.6 * one
    chosen = replace(cfg, mesh_shape=fit.mesh_shape, layout=fit.layout)
    assert chosen.n_devices == fit.n_devices
    assert plan.memory(facts, chosen, False).total == fit.memory.total
    # Nothing on half as many devices fits.
    for candidate, _ in plan.candidate_layouts(cfg, fit.n_devices // 2):
        assert plan.memory(facts, candidate, False).total > 0.6 * one
    assert plan.smallest_fit(cfg, facts, 1000, recompute=False) is None  # 1 kB: not on any mesh


def test_parse_bytes():
    assert plan.parse_bytes("80GB") == 80e9
    assert plan.parse_bytes("16GiB") == 16 * 2 ** 30
    assert plan.parse_bytes("512 MB") == 512e6
    assert plan.parse_bytes("1.5e9") == 1.5e9
    assert plan.parse_bytes("40g") == 40e9
    with pytest.raises(ConfigError, match="80GB"):
        plan.parse_bytes("lots")


def test_a_layout_a_layer_cannot_take_is_an_error():
    # Local attention reshapes `sequence` into blocks (here n_ctx / window = 1 block): splitting it fails.
    # The config check refuses it up front ...
    with pytest.raises(ConfigError, match="1 blocks"):
        tiny_config(n_ctx=16, local_attention_radius=16, mesh_shape="x:2", layout="sequence:x")
    # ... and the planner refuses it too for a config that skipped validation (by the same check, or by its own
    # reading of the built graph).
    cfg = dataclasses.replace(tiny_config(n_ctx=16, local_attention_radius=16), mesh_shape="x:2", layout="sequence:x")
    with pytest.raises(ConfigError, match="1 blocks|cannot split"):
        plan.memory(plan.collect(cfg), cfg, recompute=False)


def test_dry_run_cli(capsys):
    assert main.main(["--model", "colab_XL", "--dry_run", "--device_memory", "16GB"]) == 0
    out = capsys.readouterr().out
    cfg = load_config("colab_XL")
    total = flops.parameter_count(cfg)["total"]
    assert f"{total:,} " in out and "non-embedding" in out and "FLOPs/token" in out
    assert "tokens/step    8,192 (4 sequences x 2048)" in out and "micro-batches  1 per step" in out
    for row in ("weights (float32)", "optimizer state (adam)", "activations kept for backward", "total"):
        assert row in out
    assert "recompute_grad off" in out and "recompute_grad on" in out
    # Adam: weights and two slots, float32 master copies in host RAM on GPUs (about 15 GiB).
    assert f"host RAM       {plan.human_bytes(12 * total)} on GPUs and TPUs" in out and "14.70 GiB" in out
    assert "does NOT fit" in out  # a 1.3B model with Adam is more than one 16 GB device holds
    fit = re.search(r"smallest mesh that fits, recompute_grad on: (\d+) devices, --mesh_shape (\S+) --layout (\S+)", out)
    assert fit, out
    fitted = replace(cfg, mesh_shape=fit.group(2), layout=fit.group(3))
    assert fitted.n_devices == int(fit.group(1)) > 1
    assert plan.memory(plan.collect(cfg), fitted, recompute=True).total <= 16e9
    assert "| loss" not in out and not os.path.exists(os.path.join(cfg.model_path, "checkpoint"))  # nothing trained


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(CONFIG_DIR, "*.json"))),
                         ids=lambda p: os.path.basename(p)[:-5])
def test_every_config_splits_every_tensor_of_its_graph_evenly(path):
    cfg = load_config(path)  # loads and validates
    # The training graph (gradients and optimizer) of the first layers up to the last one of a kind not seen
    # before (attention type, MoE or not): every tensor shape of the whole graph is among its shapes, and the
    # check below reads each shape once. (A 40-layer graph took seconds to build for the same shapes.)
    kinds = [(kind, layer in (getattr(cfg, "moe_layers", None) or ())) for layer, kind in enumerate(cfg.attention_types)]
    built = model_graph.build(cfg, n_layer=max(kinds.index(kind) for kind in set(kinds)) + 1)
    impl = mtf.placement_mesh_impl.PlacementMeshImpl(mtf.convert_to_shape(cfg.mesh_shape),
                                                     mtf.convert_to_layout_rules(cfg.layout), [""] * cfg.n_devices)
    mesh = dict(cfg.mesh_dims)
    split_somewhere, seen = set(), set()
    for op in built.graph.operations:
        for t in op.outputs:
            key = tuple((d.name, d.size) for d in t.shape.dims)
            if key in seen:
                continue
            seen.add(key)
            layout = impl.tensor_layout(t.shape)  # raises if a split dimension does not divide evenly
            for dim, axis in zip(t.shape.dims, layout.tensor_axis_to_mesh_axis):
                if axis is not None:
                    mesh_dim = impl.shape.dims[axis]
                    assert dim.size % mesh_dim.size == 0
                    split_somewhere.add(dim.name)
    assert split_somewhere == {dim for dim, mesh_dim in cfg.layout_rules if mesh[mesh_dim] > 1}
