"""ladder/spec.py: a ladder spec read into a checked LadderSpec; every bad spec is one error line. write_spec and
SMALL_RULES, the spec every ladder test starts from, are here (the other ladder tests import them)."""
from __future__ import annotations

import json
import os
import re

import pytest

from workspace import make_workspace

from ladder import cli as ladder_cli

# Narrow heads and a low aspect ratio reach tiny targets (the first CPU ladder's rules, before
# configs/ladders/cpu.json kept every size at depth 2).
SMALL_RULES = {"aspect_ratio": 8, "head_width": 8, "lr_at_108M": 0.0006}


def write_spec(folder, base: str, **changes) -> str:
    spec = {"base": base, "sizes": ["6.6K", "22K", "51K"], "chinchilla_multiples": [1], "rules": SMALL_RULES,
            "eval_points": 2, "eval_steps": 4, "repeats": [], "out": os.path.join(str(folder), "out")}
    spec.update(changes)
    path = os.path.join(str(folder), "ladder.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    return path


@pytest.mark.parametrize("change, message", [
    ({"size": ["6.6K"]}, r"unknown key 'size' .*did you mean 'sizes'"),
    ({"sizes": ["500"]}, r"size 500 cannot be shaped within 5%.*head_width"),
    ({"sizes": ["51K"], "devices": {"count": 2, "memory": "1MB"}}, r"size n51K does not fit 2 device\(s\)"),
    ({"overrides": {"n_layer": 3}}, r"sets n_layer, which the ladder's rules decide"),
    ({"rules": {"aspect": 8}}, r"unknown key 'aspect' in \"rules\".*did you mean 'aspect_ratio'"),
    ({"schedule": "cosine"}, r"\"schedule\" in .* is 'cosine': use \"wsd\" .* or \"base\""),
    ({"overrides": {"lr_decay": "cosine"}}, r"sets lr_decay, which the ladder's rules decide .*\"schedule\": \"base\""),
    ({"repeats": ["7K"]}, r"\"repeats\" in .* names 7K, which is not among \"sizes\""),
    ({"rules": {"branch_fractions": [0.5, 2]}}, r"\"rules\".branch_fractions .* must be a list of fractions"),
    ({"chinchilla_multiples": [0.1], "rules": dict(SMALL_RULES, branch_fractions=[0.5])},
     r"run n6.6K-x0.05 would start its decay at step 10, inside its 13-step warmup, and never anneal: raise "
     r"\"chinchilla_multiples\" or lower \"rules\".warmup_tokens_per_param \(now 1\)"),
])
def test_bad_specs_are_one_error_line(tmp_path, capsys, change, message):
    """Each bad spec: exit 1 and one `error:` line naming the fix, nothing written. (Bugs: place() refusing a size
    that fits no mesh only when one device is given; a WSD run whose decay starts inside its warmup planned, so it
    is never annealed.)"""
    spec = write_spec(tmp_path, make_workspace(tmp_path), **change)
    assert ladder_cli.main(["plan", spec]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and re.search(message, err), err
    assert not os.path.exists(os.path.join(str(tmp_path), "out"))
