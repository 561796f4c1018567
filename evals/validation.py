"""The validation loss: the model's mean cross-entropy (the entmax loss with `entmax_loss`; over masked positions
for MLM) on batches of the eval dataset at a checkpoint, run by `main.py --eval` and after each checkpoint when
eval_steps > 0."""
from __future__ import annotations

import math
from typing import Callable, Optional

import mesh_tensorflow as mtf
import numpy as np
import tensorflow.compat.v1 as tf

from schema import ConfigError, GPTConfig
from data.inputs import eval_batches, eval_dataset
from data.mlm import mask_dataset
from data.tokenizer import load_for_config
from evals.tasks import append_result
from models import gpt
from modelpath import checkpoints
from execution import meshes, runner
from devices import precision
from devices.placement import Placement
from modelpath import events
from modelpath.events import summary_writer, write_scalars
from models.optimizers import slot_patterns


def evaluation_loss(cfg: GPTConfig, mesh: mtf.Mesh, mesh_impl, inputs: tf.Tensor,
                    labels: tf.Tensor) -> meshes.Lowered:
    """The batch's mean cross-entropy (over masked positions for MLM) as `loss`, the model as in inference."""
    dims = gpt.Dims.of(cfg, meshes.batch_size(inputs))
    x, y = meshes.import_tokens(mesh, dims, inputs, labels)
    cross_entropy, _ = gpt.loss(gpt.forward(x, cfg, dims, train=False).logits, y, cfg, dims, gpt.loss_weights(y, cfg))
    lowering = mtf.Lowering(mesh.graph, {mesh: mesh_impl})
    return meshes.Lowered(lowering, {"loss": tf.cast(lowering.export_to_tf_tensor(cross_entropy), tf.float32)})


def evaluation_program(cfg: GPTConfig, placement: Placement, batches: Callable[[], tf.data.Dataset],
                       steps: int) -> runner.Program:
    """The evaluation loss of `steps` batches of `batches()` on the placement (in one call of a TPU's loop)."""
    return runner.Program(cfg, placement, lambda mesh, impl, batch: evaluation_loss(cfg, mesh, impl, *batch),
                          runner.Batches(batches), steps_per_call=steps)


def mean_loss(program: runner.Program, session, steps: int) -> float:
    """The mean loss over `steps` batches of the evaluation program's input, read from its start."""
    program.start(session)
    return float(np.mean([values["loss"] for values in program.run(session, steps)]))


def evaluate(cfg: GPTConfig, placement: Placement, batches: Callable[[], tf.data.Dataset], steps: int,
             checkpoint: Optional[str] = None) -> tuple[float, int]:
    """The mean loss over `steps` batches of `batches()` ((inputs, labels), eval_batch_size rows each; made
    inside the graph) at `checkpoint` (default: model_path's latest); returns (loss, the checkpoint's step)."""
    checkpoint = checkpoint or checkpoints.require_checkpoint(cfg.model_path)
    program = evaluation_program(cfg, placement, batches, steps)
    with program.open(checkpoint, slot_patterns(), saves=False) as session:
        return mean_loss(program, session, steps), checkpoints.step_of(checkpoint)


def evaluated_bytes(batches: Callable[[], tf.data.Dataset], steps: int, decode: Callable[[list], str]) -> int:
    """The UTF-8 bytes of the text that the labels of the first `steps` batches spell (special tokens left
    out), each row decoded whole: what bits per byte divides by."""
    graph = tf.Graph()
    with graph.as_default():
        _, labels = tf.data.make_one_shot_iterator(batches().take(steps)).get_next()
        with tf.Session(graph=graph) as session:
            return sum(len(decode(row.tolist()).encode("utf-8")) for _ in range(steps) for row in session.run(labels))


def bits_per_byte(loss: float, tokens: int, n_bytes: int) -> float:
    """The mean cross-entropy (nats a token) over `tokens` tokens spelling `n_bytes` bytes, in bits a byte:
    tokenizer-independent, so models with different vocabularies compare."""
    return loss * tokens / (n_bytes * math.log(2))


class Validation:
    """The validation loss over eval_steps batches (at most the eval data's) at checkpoints: printed, written as
    TensorBoard scalars under model_path/eval and appended to the results file. Beside loss and perplexity, bits
    per byte (a causal model's cross-entropy over the bytes the tokens spell). The program is built at the first
    checkpoint and its session kept, restored at each next one (a training run's evaluations, train/job.py)."""

    def __init__(self, cfg: GPTConfig, placement: Placement):
        path = cfg.tokenizer_dataset.eval_path if cfg.tokenizer_dataset else None
        if not path:
            raise ConfigError("no eval_path: set it in the dataset config to evaluate")
        available = eval_batches(path, cfg.n_ctx, cfg.eval_batch_size)
        self.cfg, self.placement, self.path = cfg, placement, path
        self.steps = min(cfg.eval_steps or available, available)
        self.program, self.session = None, None
        self._bytes: Optional[int] = None  # the bytes the evaluated tokens spell: the same at every checkpoint

    def batches(self) -> tf.data.Dataset:
        return mask_dataset(eval_dataset(self.path, self.cfg.n_ctx, self.cfg.eval_batch_size, n_vocab=self.cfg.n_vocab),
                            self.cfg)

    def loss(self, checkpoint: str) -> float:
        if self.session is None:
            self.program = evaluation_program(self.cfg, self.placement, self.batches, self.steps)
            self.session = self.program.open(checkpoint, slot_patterns(), saves=False)
        else:
            self.session.restore(checkpoint)
        return mean_loss(self.program, self.session, self.steps)

    def on_checkpoint(self, step: int, prefix: str) -> dict:
        cfg, steps = self.cfg, self.steps
        loss = self.loss(prefix)
        # The entmax loss (entmax_loss) is no log-likelihood: it has no perplexity. A masked language model's loss
        # covers only its masked positions: no bits per byte of the whole text.
        scores = {"loss": loss} if cfg.entmax_loss else {"loss": loss, "perplexity": math.exp(min(loss, 50))}
        shown = " (entmax loss)" if cfg.entmax_loss else f" | perplexity {scores['perplexity']:.2f}"
        if not cfg.entmax_loss and cfg.causal:
            if self._bytes is None:
                decode = load_for_config(cfg).backend.decode
                self._bytes = evaluated_bytes(self.batches, steps, lambda ids: decode(ids, skip_special_tokens=True))
            if self._bytes:
                scores["bits_per_byte"] = bits_per_byte(loss, steps * cfg.eval_batch_size * cfg.n_ctx, self._bytes)
                shown += f" | bits per byte {scores['bits_per_byte']:.4f}"
        print(f"eval at step {step}: loss {loss:.4f}{shown} "
              f"over {steps} batches of {cfg.eval_batch_size} x {cfg.n_ctx} tokens in {precision.running(cfg)}",
              flush=True)
        writer = summary_writer(events.folder(cfg.model_path, evaluation=True))
        write_scalars(writer, step, scores)
        writer.close()
        record = {"step": step, "task": "validation", **scores, "batches": steps}
        append_result(cfg, record)
        return record

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None

    def __enter__(self) -> "Validation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def report(cfg: GPTConfig, placement: Placement) -> dict:
    """The validation loss at model_path's latest checkpoint (Validation's line, scalars and results record)."""
    checkpoint = checkpoints.require_checkpoint(cfg.model_path)
    with Validation(cfg, placement) as validation:
        return validation.on_checkpoint(checkpoints.step_of(checkpoint), checkpoint)
