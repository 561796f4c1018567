"""ladder/rules.py: a WSD branch's config has its trunk's learning rate for every update before it starts, the peak
for its first and less for each later one."""
from __future__ import annotations

import pytest

from tests.ladder.test_spec import SMALL_RULES, write_spec
from workspace import make_workspace

from ladder import plan as ladder_plan
from ladder.spec import load_spec


def rates_at(cfg, steps) -> list:
    """The trainer's learning rate (models/optimizers.py) for the update from each global step of `steps`."""
    import tensorflow.compat.v1 as tf
    from models.optimizers import learning_rate
    with tf.Graph().as_default(), tf.Session() as session:
        return [float(v) for v in session.run(learning_rate(cfg, tf.constant(steps, tf.int64)))]


def test_a_branch_trains_its_trunks_schedule_until_its_own_decay(tmp_path):
    """Every branch's config has the trunk's learning rate for every update before the step it starts from (the
    trunk's checkpoint there, kept by the trunk's keep_checkpoint_steps), the peak for its first update, and less
    for every later one: a WSD run of its own length whose stable phase the trunk trained. (Bugs: branch_start
    rounding up, `math.ceil(...) + 1`, so the trunk's checkpoint holds an update the branch would have decayed; or
    taking the decay's share for the stable phase's, `math.floor(decay_share * steps)`, so a branch trains stable
    steps of its own.)"""
    spec = load_spec(write_spec(tmp_path, make_workspace(tmp_path), sizes=["6.6K", "51K"],
                                rules=dict(SMALL_RULES, branch_fractions=[0.3, 0.5, 0.7])))
    ladder = ladder_plan.make_ladder(spec)
    runs = {s.name: s for s in ladder.sizes}
    branches = [s for s in ladder.sizes if s.run.kind == "branch"]
    assert len(branches) == 6
    for branch in branches:
        trunk, start = runs[branch.run.trunk], branch.run.start
        assert trunk.cfg.lr_decay == branch.cfg.lr_decay == "wsd" and start in trunk.cfg.keep_checkpoint_steps
        before = list(range(start))
        assert rates_at(branch.cfg, before) == rates_at(trunk.cfg, before), branch.name
        first, later = rates_at(branch.cfg, [start])[0], rates_at(branch.cfg, list(range(start + 1, branch.run.steps)))
        assert first == pytest.approx(branch.cfg.lr, rel=1e-6) and max(later) < branch.cfg.lr, branch.name
