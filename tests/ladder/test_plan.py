"""ladder/plan.py: each run's row of the plan is what `main.py --dry_run` prints for the config plan wrote, and a
started run's config is never changed under it."""
from __future__ import annotations

import json
import os
import re

import pytest

from tests.ladder.test_spec import SMALL_RULES, write_spec
from workspace import make_workspace

from config import replace
from ladder import plan as ladder_plan
from ladder.spec import LadderError, load_spec


def _dry_run_numbers(text: str) -> dict:
    def find(pattern):
        return re.search(pattern, text, re.M).group(1).replace(",", "")
    return {"total": int(find(r"parameters\s+([\d,]+) \(")), "non_embedding": int(find(r"([\d,]+) non-embedding")),
            "flops_per_token": float(find(r"FLOPs/token\s+(\S+) for training")),
            "tokens_per_step": int(find(r"tokens/step\s+([\d,]+) ")),
            "micro_batches": int(find(r"micro-batches\s+(\d+) per step")),
            "micro_batch": int(find(r"per step, each (\d+) sequences per replica")),
            "steps": int(find(r"whole run\s+([\d,]+) steps")), "mesh": find(r"mesh / layout\s+(\S+) ")}


def test_plan_agrees_with_dry_run_on_each_sizes_config(tmp_path, capsys):
    """Each size's row (parameters, FLOPs/token, tokens/step, steps, mesh, micro-batches) is what
    `main.py --model SIZE_CONFIG --dry_run` prints for the config plan wrote. The device's memory is set between
    one sequence's and the whole batch's need, so the planner must pick a micro-batch and accumulate.
    (Bug: the config written without the chosen tokens_per_mb_per_replica.)"""
    import main
    base = make_workspace(tmp_path)
    probe = ladder_plan.make_ladder(load_spec(write_spec(tmp_path, base, sizes=["51K"])))
    size = probe.sizes[0]
    memory = (ladder_plan.dry_run.memory(ladder_plan.dry_run.collect(size.cfg), replace(
        size.cfg, tokens_per_mb_per_replica=size.cfg.n_ctx), False).total + size.memory_per_device) / 2
    spec = load_spec(write_spec(tmp_path, base, sizes=["6.6K", "51K"],
                                devices={"count": 2, "kind": "cpu", "memory": f"{memory:.0f}B"}))
    ladder = ladder_plan.make_ladder(spec)
    ladder_plan.write_configs(ladder)
    assert any(s.micro_batches > 1 for s in ladder.sizes)
    branch = next(s for s in ladder.sizes if s.run.kind == "branch")
    for s in [s for s in ladder.sizes if s.run.kind == "trunk"] + [branch]:  # a size's other runs differ in steps
        capsys.readouterr()
        assert main.main(["--model", s.run.config_path, "--dry_run"]) == 0
        printed = _dry_run_numbers(capsys.readouterr().out)
        assert printed == {"total": s.params["total"], "non_embedding": s.params["non_embedding"],
                           "flops_per_token": float(f"{s.flops_per_token:.3e}"), "tokens_per_step": s.run.batch_tokens,
                           "micro_batches": s.micro_batches, "micro_batch": s.micro_batch, "steps": s.run.steps,
                           "mesh": s.cfg.mesh_shape}, s.name
    table = ladder_plan.table(ladder)
    assert all(f"{s.params['non_embedding']:,}" in table for s in ladder.sizes)
    assert f"{branch.run.trunk} @ {branch.run.start}" in table


def test_started_trunks_and_branches_keep_their_configs(tmp_path):
    """Once its runs have checkpoints (a trunk's own, a branch's copied from its trunk), a spec changed after them
    (another decay share, which changes every run's schedule) is refused before anything is written, naming every
    run it would change, branches as trunks; runs not started take the change. (Bug: write_configs comparing the
    trunks only, `if size.run.kind == "branch": continue`.)"""
    path = write_spec(tmp_path, make_workspace(tmp_path), sizes=["6.6K", "22K"],
                      rules=dict(SMALL_RULES, branch_fractions=[0.5]))
    ladder = ladder_plan.make_ladder(load_spec(path))
    ladder_plan.write_configs(ladder)
    started = [s for s in ladder.sizes if s.run.size == "n6.6K"]  # n6.6K's trunk and branch; n22K's not yet
    for s in started:
        os.makedirs(s.run.model_path)
        open(os.path.join(s.run.model_path, f"model.ckpt-{s.run.start or 1}.index"), "w").close()
    with open(path) as f:
        raw = json.load(f)
    raw["rules"] = dict(raw["rules"], decay_share=0.3)
    changed = os.path.join(str(tmp_path), "changed.json")
    with open(changed, "w") as f:
        json.dump(raw, f)
    before = {s.name: open(s.run.config_path).read() for s in ladder.sizes}
    with pytest.raises(LadderError, match=r"runs n6\.6K, n6\.6K-x0\.5 have trained .*lr_decay_share.* changed"):
        ladder_plan.write_configs(ladder_plan.make_ladder(load_spec(changed)))
    assert {s.name: open(s.run.config_path).read() for s in ladder.sizes} == before
