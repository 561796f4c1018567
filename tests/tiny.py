"""Tiny models and data for tests: a config builder, random token batches, one-call runs through the
project's runner (train/loop.py): training, logits, and the losses and gradients of one batch; and `run_mtf`,
a mesh-tensorflow function of NumPy inputs run on one device."""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field

import mesh_tensorflow as mtf
import numpy as np
import tensorflow.compat.v1 as tf

from config import config_from_dict, replace
from schema import GPTConfig
from infer.run import predict
from models import gpt
from modelpath import checkpoints
from execution import meshes, runner
from devices.placement import Placement
from execution.runner import fixed_batches  # noqa: F401  (the tests' batches: tiny.fixed_batches)
from execution.mesh_session import MeshSession
from execution.callbacks import EachStep
from train import loop, objective
from models.optimizers import slot_patterns

from conftest import CPU_DEVICES


def tiny_config(**overrides) -> GPTConfig:
    """2 layers (global then local), 32 wide, 4 heads, vocab 64, context 16, local window 4."""
    values = dict(n_layer=2, n_embd=32, n_head=4, n_vocab=64, n_ctx=16, attention_types=[[["global", "local"], 1]],
                  local_attention_radius=4, train_batch_size=4, eval_batch_size=4, train_steps=4, lr=3e-3,
                  warmup_steps=0, steps_per_checkpoint=4, mesh_shape="all:1", layout="", z_loss=0.0)
    values.update(overrides)
    return config_from_dict(values, "test config")


def random_tokens(shape, vocab=64, seed=0) -> np.ndarray:
    return np.random.RandomState(seed).randint(0, vocab, size=shape).astype(np.int32)


def devices_for(cfg: GPTConfig) -> list[str]:
    return CPU_DEVICES[:cfg.n_devices]


def placement_for(cfg: GPTConfig) -> Placement:
    return Placement(devices=tuple(devices_for(cfg)))


def cpu_mesh_impl(mesh_shape: str, layout: str) -> mtf.placement_mesh_impl.PlacementMeshImpl:
    """A placement mesh of `mesh_shape` and `layout` over the first of conftest's CPU devices, for tests that
    lower a mesh-tensorflow graph of their own."""
    shape = mtf.convert_to_shape(mesh_shape)
    return mtf.placement_mesh_impl.PlacementMeshImpl(shape, mtf.convert_to_layout_rules(layout),
                                                     CPU_DEVICES[:shape.size])


def train(cfg: GPTConfig, data: np.ndarray, steps: int | None = None) -> list[float]:
    """Trains cfg.model_path (resuming from its checkpoint) to step `steps` (default train_steps) on the rows
    of `data`; returns the losses of the steps it ran."""
    losses = []
    loop.train(cfg, placement_for(cfg), fixed_batches(data, cfg.train_batch_size), until=steps,
               callbacks=[EachStep(lambda step, values: losses.append(float(values["loss"])))])
    return losses


def model_weights(model_path) -> dict:
    """The model's weights (no optimizer slots) in model_path's latest checkpoint."""
    checkpoint = checkpoints.latest(str(model_path))
    return {name: tf.train.load_variable(checkpoint, name)
            for name, _ in tf.train.list_variables(checkpoint) if name.startswith("gpt2/") and "adam" not in name}


@dataclass
class TrainingRun:
    """What `run_training` saw: per step (before that step's update) and after the last step."""
    losses: list = field(default_factory=list)        # cross-entropy, as training logs it
    objectives: list = field(default_factory=list)    # what was minimised (with z-loss and MoE loss)
    moe_losses: list = field(default_factory=list)    # the MoE load-balancing loss (empty without MoE)
    # name -> the norm of the last step's unclipped gradient, as training logs it with log_grads (else empty)
    gradient_norms: dict = field(default_factory=dict)
    weights: dict = field(default_factory=dict)       # model variable's name -> value after the last step


def run_training(cfg: GPTConfig, batches: list, devices: list[str], steps: int) -> TrainingRun:
    """`steps` training steps from the seeded initial weights on the batches [(inputs, labels), ...] (cycled),
    through the runner, in a throwaway model_path."""
    inputs = np.stack([b[0] for b in batches]).reshape(-1, cfg.n_ctx)
    labels = np.stack([b[1] for b in batches]).reshape(-1, cfg.n_ctx)
    batch_size = len(batches[0][0])
    run = TrainingRun()

    def dataset(start_step):
        ds = runner.in_memory(tf.data.Dataset.from_tensor_slices((inputs, labels)))
        return ds.repeat().batch(batch_size, drop_remainder=True).skip(start_step)

    def record(step, values):
        run.losses.append(float(values["loss"]))
        run.objectives.append(float(values["objective"]))
        if "moe_loss" in values:
            run.moe_losses.append(float(values["moe_loss"]))
        run.gradient_norms = {name[len("grad_norm/"):]: float(norm) for name, norm in values.items()
                              if name.startswith("grad_norm/")}

    with tempfile.TemporaryDirectory() as folder:
        cfg = replace(cfg, model_path=folder, train_steps=steps, steps_per_checkpoint=steps)
        loop.train(cfg, Placement(devices=tuple(devices)), dataset, callbacks=[EachStep(record)])
        checkpoint = checkpoints.latest(folder)
        names = [name for name, _ in tf.train.list_variables(checkpoint)]
        run.weights = {name: tf.train.load_variable(checkpoint, name) for name in names
                       if name.startswith("gpt2/") and checkpoints.slot_of(name, names, slot_patterns()) is None}
    return run


def compute_logits(cfg: GPTConfig, tokens: np.ndarray, devices: list[str], checkpoint: str | None = None) -> np.ndarray:
    """tokens [batch, n_ctx] -> float32 logits [batch, n_ctx, n_vocab], from a checkpoint (a prefix or a
    model_path) or from the seeded initial weights, identical on every layout."""
    tokens = np.asarray(tokens, np.int32)
    return predict(cfg, Placement(devices=tuple(devices)), {"tokens": tokens}, len(tokens),
                          checkpoint)["logits"]


def _at_initial_weights(cfg: GPTConfig, inputs: np.ndarray, labels: np.ndarray, devices: list[str], build) -> dict:
    """The values of `build(x, y, dims)`'s mtf tensors (a dict) on one batch, at the seeded initial weights."""
    inputs, labels = np.asarray(inputs, np.int32), np.asarray(labels, np.int32)
    placement = Placement(devices=tuple(devices))
    graph = tf.Graph()
    with graph.as_default():
        tf.set_random_seed(cfg.seed)  # the graph seed training's program sets: its initial weights
        mesh, impl = meshes.placement_mesh(cfg, placement)
        dims = gpt.Dims.of(cfg, inputs.shape[0])
        x, y = (mtf.import_fully_replicated(mesh, tf.constant(t), mtf.Shape([dims.batch, dims.sequence]))
                for t in (inputs, labels))
        named = build(x, y, dims)
        lowering = mtf.Lowering(mesh.graph, {mesh: impl})
        fetches = {name: lowering.export_to_tf_tensor(t) for name, t in named.items()}
    with MeshSession(graph, lowering, "", placement.session_config(), checkpoint=None) as session:
        return session.run(fetches)


def initial_weights(cfg: GPTConfig) -> dict:
    """Variable name -> the model's initial value (float32, from its initializers under cfg.seed), on one device:
    a start to write as a step-0 checkpoint (tools/hf.write_checkpoint) that other runs and other frameworks
    read. Not necessarily the values training draws without a checkpoint (its graph holds other ops first)."""
    cfg = replace(cfg, precision="float32", mesh_shape="all:1", layout="")  # the variables' values, not bf16 copies

    def build(x, y, dims):
        gpt.forward(x, cfg, dims, train=False)
        return {v.name: v.outputs[0] for v in x.graph.trainable_variables}
    zeros = np.zeros([1, cfg.n_ctx], np.int32)
    return _at_initial_weights(cfg, zeros, zeros, devices_for(cfg), build)


def compute_losses(cfg: GPTConfig, inputs: np.ndarray, labels: np.ndarray, devices: list[str],
                   train: bool = True) -> dict[str, float]:
    """The losses of one batch at the seeded initial weights, without a backward pass: "loss" (cross-entropy),
    "objective" and, with MoE layers, "moe_loss". train=True builds the model as a training step does (MoE
    capacity and dropout of training)."""
    def build(x, y, dims):
        losses = objective.losses(x, y, cfg, dims, train=train, weights=gpt.loss_weights(y, cfg))
        named = {"loss": losses.cross_entropy, "objective": losses.objective}
        if losses.moe_loss is not None:
            named["moe_loss"] = losses.moe_loss
        return named
    return {name: float(value) for name, value in _at_initial_weights(cfg, inputs, labels, devices, build).items()}


def compute_gradients(cfg: GPTConfig, inputs: np.ndarray, labels: np.ndarray, devices: list[str]) -> dict:
    """Variable name -> the unclipped gradient of the objective on one batch at the seeded initial weights, as the
    training step computes it (train/objective.py's losses_and_gradients: micro-batched with
    tokens_per_mb_per_replica, recomputed with recompute_grad); variables without a gradient are left out."""
    def build(x, y, dims):
        _, grads, variables = objective.losses_and_gradients(x, y, cfg, dims)
        return {v.name: g for v, g in zip(variables, grads) if g is not None}
    return _at_initial_weights(cfg, inputs, labels, devices, build)


def run_predict(cfg: GPTConfig, features: dict, devices: list[str], checkpoint: str | None = None,
                options=None) -> dict:
    """infer/outputs.py's outputs for numpy features (one batch of all their rows), through infer/run.py's predict."""
    rows = len(next(iter(features.values())))
    return predict(cfg, Placement(devices=tuple(devices)), features, rows, checkpoint, options)


def choose_tokens(logits, seeds, rows, position: int, options) -> tf.Tensor:
    """models/token_choice.choose_tokens_tf with every row drawn by `options`' (a SamplingOptions) temperature,
    top-k and top-p, as TF tensors."""
    from models.token_choice import choose_tokens_tf
    drawn = options.draw_rows(int(logits.shape[0]))
    return choose_tokens_tf(logits, seeds, rows, tf.constant(position), options,
                            *(tf.constant(drawn[name]) for name in ("temperature", "top_k", "top_p")))


def checkpoint_of_order_one_weights(cfg, prefix, seed=0) -> str:
    """A checkpoint of cfg's model (GPT-Neo's variable names) whose activations are of order 1 everywhere: at
    the initial weights (std 0.02) GELU's inputs are ~0.1, where its cubic term is ~1e-4 of the output and an
    activation constant off by a third changes the logits less than float32 rounding does."""
    rng = np.random.RandomState(seed)
    d, vocab = cfg.n_embd, cfg.n_vocab
    shapes = {"gpt2/wte": ([vocab, d], 1.0), "gpt2/wpe": ([cfg.n_ctx, d], 1.0), "gpt2/ln_f/g": ([d], None),
              "gpt2/ln_f/b": ([d], 0.3)}
    for i in range(cfg.n_layer):
        layer = f"gpt2/h{i}/"
        shapes.update({layer + "norm_1/g": ([d], None), layer + "norm_1/b": ([d], 0.3),
                       layer + "norm_2/g": ([d], None), layer + "norm_2/b": ([d], 0.3),
                       layer + "attn/compute_output_bias/o_b": ([d], 0.3),
                       layer + "mlp/conv1d_main/c_fc/kernel": ([d, 4 * d], 1.5 / np.sqrt(d)),  # GELU inputs ~1.5
                       layer + "mlp/conv1d_main/c_fc/bias": ([4 * d], 0.3),
                       layer + "mlp/conv1d_main/c_proj/kernel": ([4 * d, d], 1.0 / np.sqrt(4 * d)),
                       layer + "mlp/conv1d_main/c_proj/bias": ([d], 0.3)})
        shapes.update({layer + f"attn/{w}": ([d, d], 0.7 / np.sqrt(d)) for w in "qkvo"})
    graph = tf.Graph()
    with graph.as_default():
        for name, (shape, std) in shapes.items():
            value = 1.0 + 0.3 * rng.randn(*shape) if std is None else std * rng.randn(*shape)  # gains around 1
            tf.Variable(value.astype(np.float32), name=name)
        tf.Variable(np.int64(1), name="global_step")
        with tf.Session(graph=graph) as session:
            session.run(tf.global_variables_initializer())
            return tf.train.Saver().save(session, prefix)


def run_mtf(build, arrays: dict, dims: dict):
    """Builds `build(mesh, **mtf_inputs) -> {name: mtf.Tensor}` on one device and returns NumPy results.
    dims maps each input's name to its list of mtf.Dimensions."""
    graph = tf.Graph()
    with graph.as_default():
        mtf_graph = mtf.Graph()
        mesh = mtf.Mesh(mtf_graph, "test_mesh")
        inputs = {name: mtf.import_tf_tensor(mesh, tf.constant(value), mtf.Shape(dims[name]))
                  for name, value in arrays.items()}
        outputs = build(mesh, **inputs)
        impl = mtf.placement_mesh_impl.PlacementMeshImpl(mtf.convert_to_shape("all:1"), [], ["/cpu:0"])
        lowering = mtf.Lowering(mtf_graph, {mesh: impl})
        fetches = {name: lowering.export_to_tf_tensor(t) for name, t in outputs.items()}
        with tf.Session() as session:
            session.run(tf.global_variables_initializer())
            session.run(lowering.copy_masters_to_slices())
            return session.run(fetches), mtf_graph
