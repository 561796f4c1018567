"""infer/export.py, `--export`'s refusals, each before a graph is built or anything written: a model_path without
a checkpoint, an export folder that exists, a parent folder it cannot write in. (The SavedModel, loaded in a
fresh process, samples what --predict sampled: tests/scenarios/test_predict_export.py.)"""
import os

import pytest

from infer.export import export_saved_model
from modelpath.checkpoints import CheckpointError
from permissions import read_only
from schema import ConfigError
from tiny import tiny_config


@pytest.fixture
def no_graph(monkeypatch):
    """export.py's program builder replaced by one that fails the test: a refusal comes before any graph."""
    from infer import export

    def built(*args, **kwargs):
        raise AssertionError("a graph was built before the refusal")
    monkeypatch.setattr(export.runner, "Program", built)


def test_refusals_come_before_the_graph_and_write_nothing(tmp_path, no_graph):
    """Bugs caught: a model_path without a checkpoint passed on as a prefix (`if not found` gone: a restore error
    after the graph's build), an export folder that exists written into (its check gone), a parent that cannot be
    written in found by the SavedModel builder (check_writable gone)."""
    cfg = tiny_config(model_path=str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    with pytest.raises(ConfigError, match=f"^no checkpoint in {tmp_path / 'run'} to export: train first$"):
        export_saved_model(cfg, cfg.model_path, str(tmp_path / "export"))
    assert not (tmp_path / "export").exists()

    prefix = str(tmp_path / "run" / "model.ckpt-2")  # a prefix is not looked into before the graph
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "kept.txt").write_text("an earlier export")
    with pytest.raises(ConfigError, match="export already exists: remove it or pass another --export_dir$"):
        export_saved_model(cfg, prefix, str(tmp_path / "export"))
    assert os.listdir(tmp_path / "export") == ["kept.txt"]

    (tmp_path / "locked").mkdir()
    with read_only(tmp_path / "locked"), pytest.raises(CheckpointError, match="--export_dir to write the SavedModel"):
        export_saved_model(cfg, prefix, str(tmp_path / "locked" / "export"))
    assert os.listdir(tmp_path / "locked") == []
