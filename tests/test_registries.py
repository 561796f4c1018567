"""The names a config may use come from the registries that define them (config.py checks them):
an optimizer, a learning-rate decay or a sampling mode added to its registry is accepted by the config with no
other change, and an unknown name is one error naming the registered ones."""
import pytest
import tensorflow.compat.v1 as tf

from config import config_from_dict, replace
from schema import ConfigError
from data import inputs
from models import gpt
from modelpath import checkpoints
from modelpath.checkpoints import CheckpointError
from tiny import random_tokens, tiny_config, train
from models import optimizers


def test_an_unknown_optimizer_decay_or_sampling_mode_lists_the_registered_ones():
    with pytest.raises(ConfigError, match="opt_name 'adamw' is not known: choose from adam, adafactor"):
        tiny_config(opt_name="adamw")
    with pytest.raises(ConfigError, match="lr_decay 'exponential' is not known: choose from cosine, linear"):
        tiny_config(lr_decay="exponential")
    with pytest.raises(ConfigError, match="choose from documents_random, documents_fixed, chunks, sequential"):
        config_from_dict(dict(n_layer=1, n_embd=8, n_head=1, n_vocab=64, datasets=[["stdlib", 1, "documents_every", 1]]))


def test_a_registered_optimizer_decay_and_sampling_mode_are_accepted_and_used(monkeypatch):
    monkeypatch.setitem(optimizers.OPTIMIZERS, "sgd", optimizers.Optimizer(lambda cfg, lr, fused: ("sgd", cfg.lr)))
    monkeypatch.setitem(optimizers.LR_DECAYS, "constant", lambda progress, cfg: 1.0 + 0.0 * progress)
    cfg = tiny_config(opt_name="sgd", lr_decay="constant", lr=0.5, warmup_steps=0)
    assert optimizers.make_optimizer(cfg, None) == ("sgd", 0.5)
    with tf.Graph().as_default(), tf.Session() as session:
        assert session.run(optimizers.learning_rate(cfg, tf.constant(3))) == 0.5

    monkeypatch.setitem(inputs.SAMPLING_MODES, "documents_every", inputs.SamplingMode(prechunked=False))
    cfg = config_from_dict(dict(n_layer=1, n_embd=8, n_head=1, n_vocab=50257,
                                datasets=[["stdlib", 2, "documents_every", 1.0]]))
    assert cfg.datasets[0].sampling_mode == "documents_every"


@pytest.mark.slow
def test_a_checkpoint_of_one_optimizer_opened_for_another_is_one_line_from_the_slot_patterns(tmp_path):
    adam = tiny_config(model_path=str(tmp_path), train_steps=1, steps_per_checkpoint=1)
    train(adam, random_tokens([adam.train_batch_size, adam.n_ctx + 1]))
    checkpoint = checkpoints.latest(str(tmp_path))
    # Sampling and evaluation graphs hold no slots: Adam's in the checkpoint are known by its entry's pattern.
    checkpoints.check_fits(checkpoint, gpt.variable_shapes(adam), slot_patterns=optimizers.slot_patterns())
    with pytest.raises(CheckpointError, match=r"gpt2/\S+/adam_[mv] \[.*\] is in the checkpoint but not in this"):
        checkpoints.check_fits(checkpoint, gpt.variable_shapes(adam))  # without the patterns: unknown variables
    adafactor = replace(adam, opt_name="adafactor", beta1=0.0, train_steps=2)
    with pytest.raises(CheckpointError) as info:
        train(adafactor, random_tokens([adam.train_batch_size, adam.n_ctx + 1]))
    message = str(info.value)
    assert "holds the optimizer state of adam" in message and "trains with opt_name adafactor" in message
    assert "set opt_name to adam" in message and "\n" not in message
    assert checkpoints.latest(str(tmp_path)) == checkpoint  # nothing was written
