"""infer/run.py's Predictor: what it says before a wait (the outputs themselves: tests/scenarios/test_predict_export.py)."""
import numpy as np
import pytest

from infer import run


class Built(Exception):
    """Raised in place of building the program: the test stops there."""


def test_the_label_line_comes_before_the_graph_is_built(monkeypatch, capsys):
    """The bug this catches: the "building the graph" line printed after `_program` (or not at all), so the console
    stays silent through the graph's build, the restore and the first call's optimisation."""
    printed_before_build = []

    def program(self, rows, batch_size, options):
        printed_before_build.append(capsys.readouterr().out)
        raise Built

    monkeypatch.setattr(run.Predictor, "_program", program)
    predictor = run.Predictor(cfg=None, placement=None, checkpoint="/runs/m/model.ckpt-20")
    with pytest.raises(Built):
        predictor.predict({"tokens": np.zeros([1, 8], np.int32)}, 1, label="sampling 1 x 96 new tokens")
    assert printed_before_build == ["sampling 1 x 96 new tokens: building the graph, restoring model.ckpt-20 ...\n"]


def test_without_a_label_nothing_is_printed(monkeypatch, capsys):
    monkeypatch.setattr(run.Predictor, "_program", lambda *a: (_ for _ in ()).throw(Built()))
    with pytest.raises(Built):
        run.Predictor(cfg=None, placement=None).predict({"tokens": np.zeros([1, 8], np.int32)}, 1)
    assert capsys.readouterr().out == ""
