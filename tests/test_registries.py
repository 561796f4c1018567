"""The names a config may use come from the registries that define them (cli/config_loading.py checks them):
an optimizer, a learning-rate decay or a sampling mode added to its registry is accepted by the config with no
other change, and an unknown name is one error naming the registered ones."""
import pytest
import tensorflow.compat.v1 as tf

from cli.config_loading import config_from_dict
from config.schema import ConfigError
from data import inputs
from tiny import tiny_config
from train import optimizer


def test_an_unknown_optimizer_decay_or_sampling_mode_lists_the_registered_ones():
    with pytest.raises(ConfigError, match="opt_name 'adamw' is not known: choose from adam, adafactor"):
        tiny_config(opt_name="adamw")
    with pytest.raises(ConfigError, match="lr_decay 'exponential' is not known: choose from cosine, linear"):
        tiny_config(lr_decay="exponential")
    with pytest.raises(ConfigError, match="choose from documents_random, documents_fixed, chunks, sequential"):
        config_from_dict(dict(n_layer=1, n_embd=8, n_head=1, n_vocab=64, datasets=[["stdlib", 1, "documents_every", 1]]))


def test_a_registered_optimizer_decay_and_sampling_mode_are_accepted_and_used(monkeypatch):
    monkeypatch.setitem(optimizer.OPTIMIZERS, "sgd", lambda cfg, lr: ("sgd", cfg.lr))
    monkeypatch.setitem(optimizer.LR_DECAYS, "constant", lambda progress: 1.0 + 0.0 * progress)
    cfg = tiny_config(opt_name="sgd", lr_decay="constant", lr=0.5, warmup_steps=0)
    assert optimizer.make_optimizer(cfg, None) == ("sgd", 0.5)
    with tf.Graph().as_default(), tf.Session() as session:
        assert session.run(optimizer.learning_rate(cfg, tf.constant(3))) == 0.5

    monkeypatch.setitem(inputs.SAMPLING_MODES, "documents_every", inputs.SamplingMode(prechunked=False))
    cfg = config_from_dict(dict(n_layer=1, n_embd=8, n_head=1, n_vocab=50257,
                                datasets=[["stdlib", 2, "documents_every", 1.0]]))
    assert cfg.datasets[0].sampling_mode == "documents_every"
