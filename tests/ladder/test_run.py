"""ladder/run.py (`python -m ladder run`): a real ladder of trunks and branches, trained here on the test corpus,
keeps its branch points, resumes a cut-off branch without training anything again, and its annealed eval loss falls
with N; `status` reads its model_paths and `python -m ladder branch` starts a branch from its trunk's checkpoint (both
on that ladder or a copy of it); with a launcher, one script per trunk and nothing trained; a dataset without files
is one error line before anything is written."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal

import pytest

from tests.ladder.test_spec import SMALL_RULES, write_spec
from workspace import TOKENIZER, make_workspace

from ladder import cli as ladder_cli
from ladder import plan as ladder_plan
from ladder import run as ladder_run
from ladder import status
from ladder.records import PLAN_FILE
from ladder.spec import load_spec
from modelpath.tokenizer_record import RECORD as TOKENIZER_RECORD


def ladder_workspace(root) -> str:
    """The test workspace with the corpus's larger "ladder" split as its training set; returns the base config."""
    from data.create_tfrecords import create_tfrecords
    import corpus
    base = make_workspace(root)
    train = os.path.join(str(root), "train")
    for name in os.listdir(train):
        os.remove(os.path.join(train, name))
    corpus.write_documents(os.path.join(str(root), "ladder_text"), "ladder")
    create_tfrecords(input_dir=os.path.join(str(root), "ladder_text"), output_dir=train, name="train",
                     mode="documents", encoder_path=TOKENIZER, use_gpt2_tokenizer=False, gpt2_tokenizer_path=None,
                     separator=None, minimum_size=40, show_progress=False)
    return base


# The real ladder: two sizes at Chinchilla multiple 0.1 (trunks of 25 and 51 steps; at 0.2, twice as many steps, the
# bigger size's eval loss was the lower by less), each with a branch ending at half of it (13 and 25 steps, from the
# trunk's checkpoint at 10 and 20), keep_checkpoint_max 1 so that rotation would take the branch points first; warmup
# over a quarter of N tokens (3 and 6 steps), so that even the small branch's decay (from step 10) is past it.
SMALL, SMALL_BRANCH, BIG, BIG_BRANCH = "n6.6K-x0.1", "n6.6K-x0.05", "n51K-x0.1", "n51K-x0.05"


@pytest.fixture(scope="module")
def trained_ladder(tmp_path_factory):
    """Two tiny sizes (8x apart) on the test corpus, each a WSD trunk and a branch, run here: the ladder gets SIGINT
    at the bigger size's branch's first step, then runs again. Returns what each run said, what the finished runs
    held after the cut and the branch's checkpoints then."""
    root = tmp_path_factory.mktemp("ladder")
    spec = load_spec(write_spec(root, ladder_workspace(root), sizes=["6.6K", "51K"], chinchilla_multiples=[0.1],
                                rules=dict(SMALL_RULES, branch_fractions=[0.5], warmup_tokens_per_param=0.25), overrides={"keep_checkpoint_max": 1},
                                eval_steps=20))
    first = []

    def say(line):
        first.append(line)
        if re.match(rf"\[{re.escape(BIG_BRANCH)}\] step\s+\d+/", line):
            os.kill(os.getpid(), signal.SIGINT)  # as a terminal's Ctrl-C reaches the ladder

    first_code = ladder_run.run(ladder_plan.make_ladder(spec), say=say)
    kept, kept_results = {}, {}
    for name in (SMALL, SMALL_BRANCH, BIG):
        folder = os.path.join(spec.out, name)
        kept[name] = {n: os.stat(os.path.join(folder, n)).st_mtime_ns for n in os.listdir(folder)}
        with open(os.path.join(folder, "eval_results.jsonl")) as f:
            kept_results[name] = f.read()
    cut = ladder_run.checkpoint_steps(os.path.join(spec.out, BIG_BRANCH))
    second = []
    second_code = ladder_run.run(ladder_plan.make_ladder(spec), say=second.append)
    return {"spec": spec, "first": "\n".join(first), "first_code": first_code, "second": "\n".join(second),
            "second_code": second_code, "kept": kept, "kept_results": kept_results, "cut": cut}


@pytest.mark.slow
def test_cut_off_branch_resumes_without_training_again(trained_ladder):
    """The trunks keep their branch points although keep_checkpoint_max is 1; each branch starts from a copy of its
    trunk's checkpoint there. SIGINT during the bigger size's branch stops the ladder with the branch's checkpoint
    saved where it stopped; the next run skips the finished runs (their files untouched), resumes the cut branch from
    its own checkpoint and trains it to its end. (Bugs: CheckpointWriter._rotate deleting a keep_checkpoint_steps
    checkpoint, so the branch has nothing to start from; SizeState.done comparing step > steps, so a finished run is
    evaluated again; the ladder not passing SIGINT on, so the branch trains on to its end; a warmup past the small
    branch's decay start, so its learning rate rises and it is never annealed; checkpoints.copy writing no state
    file, so each branch's start says it repaired one.)"""
    t, out = trained_ladder, trained_ladder["second"]
    assert t["first_code"] == 130, t["first"][-3000:]
    assert f"ladder stopped during {BIG_BRANCH}" in t["first"]
    for trunk, branch, start, end in ((SMALL, SMALL_BRANCH, 10, 13), (BIG, BIG_BRANCH, 20, 25)):
        trunk_path, branch_path = (os.path.join(t["spec"].out, name) for name in (trunk, branch))
        assert start in ladder_run.checkpoint_steps(trunk_path)  # kept past the rotation's one
        assert re.search(rf"\[{re.escape(branch)}\] starts from {re.escape(branch_path)}/model.ckpt-{start}$",
                         t["first"], re.M)
        assert re.search(rf"\[{re.escape(branch)}\] training .* steps {start} -> {end},", t["first"])
    assert "repaired" not in t["first"]  # a branch's copy comes with its state file: nothing for training to fix
    # the small branch anneals: its learning rate falls over its steps (a decay inside the warmup would be skipped)
    lrs = [float(lr) for lr in re.findall(rf"\[{re.escape(SMALL_BRANCH)}\] step .*\| lr (\S+)", t["first"])]
    assert len(lrs) >= 2 and all(b < a for a, b in zip(lrs, lrs[1:])), lrs
    # the branch's own rotation (keep_checkpoint_max 1) leaves the checkpoint it was cut at
    assert len(t["cut"]) == 1 and 20 < t["cut"][0] < 25, t["cut"]
    assert t["second_code"] == 0, out[-3000:]
    for i, name in enumerate((SMALL, SMALL_BRANCH, BIG), 1):
        assert re.search(rf"run {i}/4 {re.escape(name)}: .*: done, skipped", out)
        assert f"[{name}]" not in out  # nothing of a finished run ran
        folder = os.path.join(t["spec"].out, name)
        assert {n: os.stat(os.path.join(folder, n)).st_mtime_ns for n in os.listdir(folder)} == t["kept"][name]
        with open(os.path.join(folder, "eval_results.jsonl")) as f:
            assert f.read() == t["kept_results"][name]
    assert re.search(rf"run 4/4 {re.escape(BIG_BRANCH)}: .*: resumes at step {t['cut'][0]}$", out, re.M)
    assert re.search(rf"\[{re.escape(BIG_BRANCH)}\] training .* steps {t['cut'][0]} -> 25", out)
    assert re.search(r"\| ladder \d+% of FLOPs, eta \S+", out)  # the ladder's progress on the runs' lines


@pytest.mark.slow
def test_tiny_ladders_annealed_eval_loss_falls_with_n(trained_ladder):
    """At each Chinchilla multiple (the branch's end, the trunk's end), the bigger size's annealed eval loss is the
    lower. (Bug: size_runs shaping every size by the first target.)"""
    losses = {r["name"]: status.validation_losses(status.results_file(r)).get(r["train_steps"])
              for r in status.size_records(trained_ladder["spec"])}
    assert None not in losses.values(), losses
    assert losses[BIG] < losses[SMALL] and losses[BIG_BRANCH] < losses[SMALL_BRANCH], losses


@pytest.mark.slow
def test_status_reads_the_model_paths(trained_ladder):
    """status: every run done at 100%, with its final eval loss as recorded. (Bug: the eval loss shown from the
    first evaluation instead of the latest.)"""
    text = status.table(trained_ladder["spec"])
    for r in status.size_records(trained_ladder["spec"]):
        row = next(line for line in text.splitlines() if line.startswith(r["name"] + " "))
        final = status.validation_losses(status.results_file(r))[r["train_steps"]]
        assert row.endswith("done") and " 100%" in row and f"{final:.3f}" in row, row


@pytest.mark.slow
def test_the_branch_and_status_commands_on_a_copy_of_the_ladder(trained_ladder, tmp_path, capsys):
    """`python -m ladder branch` (what the launcher scripts run before a branch's main.py) makes a branch's
    model_path from its trunk's checkpoint at the branch point, with the trunk's tokenizer record, then leaves it
    alone; a name that is no branch is one error line listing the branches; `status` prints every run's row. Run
    on a copy of the trained ladder without its plan file (so the records are planned afresh for the copy's
    folders) and without the small branch's model_path. (Bugs: the command copying the trunk's latest checkpoint
    instead of the branch point; copying again over a branch that has its own.)"""
    original = trained_ladder["spec"]
    out = str(tmp_path / "out")
    shutil.copytree(original.out, out)
    os.remove(os.path.join(out, PLAN_FILE.format(original.name)))
    shutil.rmtree(os.path.join(out, SMALL_BRANCH))
    with open(original.path) as f:
        raw = json.load(f)
    spec = str(tmp_path / f"{original.name}.json")
    with open(spec, "w") as f:
        json.dump(dict(raw, out=out), f)
    capsys.readouterr()

    branch_path = os.path.join(out, SMALL_BRANCH)
    assert ladder_cli.main(["branch", spec, SMALL_BRANCH]) == 0
    assert capsys.readouterr().out.strip() == f"{SMALL_BRANCH}: starts from {branch_path}/model.ckpt-10"
    assert ladder_run.checkpoint_steps(branch_path) == [10]  # the branch point, not the trunk's latest (25)
    with open(os.path.join(out, SMALL, TOKENIZER_RECORD)) as trunk, open(os.path.join(branch_path, TOKENIZER_RECORD)) as mine:
        assert mine.read() == trunk.read()
    kept = {n: os.stat(os.path.join(branch_path, n)).st_mtime_ns for n in os.listdir(branch_path)}
    assert ladder_cli.main(["branch", spec, SMALL_BRANCH]) == 0
    assert "has its own checkpoints" in capsys.readouterr().out
    assert {n: os.stat(os.path.join(branch_path, n)).st_mtime_ns for n in os.listdir(branch_path)} == kept

    assert ladder_cli.main(["branch", spec, SMALL]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"error: {SMALL} is not a branch of ladder {original.name}: its branches are "
                   f"{SMALL_BRANCH}, {BIG_BRANCH}"), err

    assert ladder_cli.main(["status", spec]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert rows[BIG].endswith("done") and rows[BIG_BRANCH].endswith("done"), rows
    assert not rows[SMALL_BRANCH].endswith("done"), rows  # at its branch point, not trained


def test_the_eta_after_a_size_without_a_measured_rate_comes_from_its_whole_time(monkeypatch):
    """A size whose progress lines never came two in a row (an evaluation between each: a short run) leaves no
    measured rate: its end gives the ETA from its FLOPs over its whole time, start-up and evaluations included, and
    a rate measured later replaces it. (Bug: Progress.finish keeping no rate, so the line says `eta ?` until the
    next size's second progress line.)"""
    from types import SimpleNamespace
    clock = [0.0]
    monkeypatch.setattr(ladder_run.time, "monotonic", lambda: clock[0])
    sizes = [SimpleNamespace(name=name, flops=flops, run=SimpleNamespace(start=0, trained_steps=10))
             for name, flops in (("small", 100.0), ("big", 300.0))]
    states = {s.name: SimpleNamespace(step=0, done=False) for s in sizes}
    progress = ladder_run.Progress(SimpleNamespace(flops=400.0, sizes=sizes), states)
    small, big = sizes
    progress.start(small)
    for step, at in ((5, 2.0), (10, 8.0)):
        clock[0] = at
        progress.update(small, step)
        assert progress.line(small).endswith("eta ?")
        progress.gap()  # an evaluation's line
    clock[0] = 10.0
    progress.finish(small)
    assert progress.line(small) == "ladder 25% of FLOPs, eta 0m30s"  # big's 300 FLOPs at small's 100 in 10 s
    progress.start(big)
    for step, at in ((1, 11.0), (2, 12.0)):  # two lines in a row: big's own rate, 30 FLOPs a second
        clock[0] = at
        progress.update(big, step)
    assert progress.line(big) == "ladder 40% of FLOPs, eta 0m08s"  # 240 FLOPs at 30/s, and no overhead to add


@pytest.mark.parametrize("kind, suffix", [("slurm", "sbatch"), ("kubernetes", "yaml")])
def test_run_on_a_cluster_writes_one_script_per_trunk(tmp_path, kind, suffix):
    """With a launcher, run trains nothing and writes a script per lineage (an sbatch file, an Indexed Job) running
    main.py on its trunk's config and then on each branch's, over the mesh's GPUs, each branch after `python -m
    ladder branch` has copied the trunk's checkpoint in. (Bugs: --gpu_ids listing the whole node's GPUs for a
    one-GPU size; a branch's main.py before its copy.)"""
    base = make_workspace(tmp_path)
    spec = load_spec(write_spec(tmp_path, base, sizes=["6.6K", "22K"], devices={"count": 8, "kind": "gpu",
                     "memory": "80GB"}, launcher={"kind": kind, "gpus_per_node": 8, "partition": "gpu"}))
    lines = []
    assert ladder_run.run(ladder_plan.make_ladder(spec), say=lines.append) == 0
    assert sorted(os.listdir(os.path.join(spec.out, "launch"))) == [f"n22K.{suffix}", f"n6.6K.{suffix}"]
    for name in ("n6.6K", "n22K"):
        with open(os.path.join(spec.out, "launch", f"{name}.{suffix}")) as f:
            script = f.read()
        trunk = script.index(f"main.py --model {os.path.join(spec.out, 'configs', name + '.json')} "
                             f"--gpu_ids device:GPU:0\n")
        for branch in (f"{name}-x0.25", f"{name}-x0.5"):
            copy = script.index(f" -m ladder branch {spec.path} {branch}")
            train = script.index(f"main.py --model {os.path.join(spec.out, 'configs', branch + '.json')} "
                                 f"--gpu_ids device:GPU:0\n")
            assert trunk < copy < train
        if kind == "slurm":
            assert "#SBATCH --nodes=1" in script and "#SBATCH --partition=gpu" in script
        else:
            assert "completions: 1" in script and "nvidia.com/gpu: 1" in script
        assert not os.path.exists(os.path.join(spec.out, name))  # nothing trained
    assert ("sbatch" if kind == "slurm" else "kubectl apply") in lines[-1]



def test_run_refuses_a_dataset_without_files(tmp_path, capsys):
    """A base config whose dataset has no files: `run` says so in one line before writing or training anything.
    (Bug: the data checked after the sizes' configs are written.)"""
    base = make_workspace(tmp_path)
    for name in os.listdir(os.path.join(str(tmp_path), "train")):
        os.remove(os.path.join(str(tmp_path), "train", name))
    spec = write_spec(tmp_path, base, sizes=["6.6K"])
    assert ladder_cli.main(["run", spec]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(r"dataset 'tiny' has no training files matching", err), err
    assert not os.path.exists(os.path.join(str(tmp_path), "out"))


def test_a_signal_during_a_branchs_copy_stops_the_ladder_with_its_code(tmp_path, monkeypatch):
    """SIGTERM while a branch's model_path is made from its trunk's checkpoint stops the ladder before the branch
    trains (no worker started), with 143 as the shell's code for SIGTERM, as SIGTERM at any other point of the
    ladder. (Bug: that stop returning a fixed 130, Ctrl-C's code, whatever the signal.)"""
    spec = load_spec(write_spec(tmp_path, make_workspace(tmp_path), sizes=["6.6K"], chinchilla_multiples=[0.1],
                                rules=dict(SMALL_RULES, branch_fractions=[0.5], warmup_tokens_per_param=0.25)))
    ladder = ladder_plan.make_ladder(spec)
    branch = [s for s in ladder.sizes if s.run.kind == "branch"]
    assert len(branch) == 1
    ladder.sizes[:] = branch  # the trunk as if done: the branch is the next run, not started

    def copy_then_terminated(records, name):
        os.kill(os.getpid(), signal.SIGTERM)  # as a cluster's preemption notice reaches the ladder
        return os.path.join(spec.out, name, "model.ckpt-10")

    monkeypatch.setattr(ladder_run, "start_branch", copy_then_terminated)
    said = []
    assert ladder_run.run_here(ladder, say=said.append) == 143, said
    assert said[-1] == f"ladder stopped before {branch[0].name} trained (run the same command to resume)"
