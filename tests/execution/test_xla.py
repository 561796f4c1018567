"""execution/xla.py: --xla turns TensorFlow's auto-clustering of element-wise ops on through TF_XLA_FLAGS."""
import os

from execution import xla


def test_xla_fusion_adds_its_flags_once_and_keeps_the_users_own(monkeypatch):
    """The flags are added to what TF_XLA_FLAGS holds (a user's own flags stay), once however often it is asked
    for, and a user's own --tf_xla_auto_jit setting is left as it is. Bug caught: the variable overwritten with
    the fusion flags (the user's --tf_xla_min_cluster_size dropped)."""
    monkeypatch.delenv("TF_XLA_FLAGS", raising=False)
    xla.enable_xla_fusion()
    assert os.environ["TF_XLA_FLAGS"] == xla.XLA_FUSION_FLAGS
    xla.enable_xla_fusion()
    assert os.environ["TF_XLA_FLAGS"] == xla.XLA_FUSION_FLAGS
    monkeypatch.setenv("TF_XLA_FLAGS", "--tf_xla_min_cluster_size=4")
    xla.enable_xla_fusion()
    assert os.environ["TF_XLA_FLAGS"].split() == ["--tf_xla_min_cluster_size=4"] + xla.XLA_FUSION_FLAGS.split()
    monkeypatch.setenv("TF_XLA_FLAGS", "--tf_xla_auto_jit=1")
    xla.enable_xla_fusion()
    assert os.environ["TF_XLA_FLAGS"] == "--tf_xla_auto_jit=1"
