"""`python -m ladder run SPEC`: every run trained in turn, smallest size first, each in its own model_path, by the
same command a user would type for it (`main.py --model OUT/configs/NAME.json`), evaluating after each of its
`eval_points` checkpoints (evenly spaced; the last at the end of the run). The runs of one `ladder run` are run by
one worker process (ladder/worker.py), which imports main.py once and calls its `main` with each run's arguments:
TensorFlow's import and the peak measurement are paid once per ladder, not once per run, and the ladder's own
process keeps no state of any run.

Under the WSD schedule a size's trunk trains first, saving (and keeping) a checkpoint at each branch's start; then
each branch gets a copy of that checkpoint in its own model_path (modelpath/checkpoints.copy) and trains from it to
its own end, where it is evaluated: main.py resumes it as it resumes any run.

Resumable: a run whose last checkpoint is at its train_steps and whose final evaluation is recorded is skipped; one
trained to the end but not evaluated is evaluated (`main.py --eval`); one cut off resumes from its last checkpoint
(main.py's own resume: the same batches, no step trained twice), a branch too. Ctrl-C (or SIGTERM) is passed once
to the worker while a run is under way: the run saves after its current step, and the ladder stops with a line
saying how to go on (between runs, nothing more is started).
Finished runs are never touched again.

Progress: each size's own progress lines (with its ETA), each followed by the ladder's share of FLOPs done and its
ETA (`Progress`: the FLOPs left at the last measured FLOP rate, plus start-ups and evaluations as they took).

With a "launcher" in the spec, `run` trains nothing: it writes one script per size (SLURM sbatch, or a Kubernetes
Indexed Job) into OUT/launch/ and prints how to submit them.
"""
from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Optional

from schema import REPO_ROOT
from modelpath import checkpoints
from modelpath.tokenizer_record import RECORD as TOKENIZER_RECORD

from ladder import plan as ladder_plan
from ladder.plan import Ladder, SizePlan, duration
from ladder.spec import LadderError
from ladder.status import results_file, validation_losses
from execution.preemption import exit_code, install

_STEP_LINE = re.compile(r"^step\s+(\d+)/(\d+)")


# ----------------------------------------------------------------------------------------------------
# What a size's model_path holds


def checkpoint_steps(model_path: str) -> list[int]:
    """The steps of the complete checkpoints in model_path, ascending."""
    return checkpoints.steps(model_path)


def eval_results(size: SizePlan) -> dict:
    """step -> validation loss of the size (its eval_results.jsonl)."""
    return validation_losses(results_file(size.record()))


@dataclass
class SizeState:
    step: int                     # the last checkpoint's step (a branch not started: the step it starts from)
    steps: int                    # the run's train_steps
    evaluated: bool               # the final evaluation is recorded
    branch_from: Optional[str] = None  # a branch not started yet: its trunk

    @property
    def done(self) -> bool:
        return self.step >= self.steps and self.evaluated

    def describe(self) -> str:
        if self.done:
            return "done"
        if self.step >= self.steps:
            return "trained, final evaluation missing"
        if self.branch_from:
            return f"new, branches from {self.branch_from} at step {self.step}"
        return f"resumes at step {self.step}" if self.step else "new"


def size_state(size: SizePlan) -> SizeState:
    steps = checkpoint_steps(size.run.model_path)
    if not steps and size.run.kind == "branch" and size.run.start:
        return SizeState(size.run.start, size.run.steps, False, size.run.trunk)
    step = steps[-1] if steps else 0
    return SizeState(step, size.run.steps, size.run.steps in eval_results(size))


def start_branch(records: list, name: str) -> Optional[str]:
    """Run `name`'s model_path made from its trunk's checkpoint at the branch's start, with the trunk's tokenizer
    record (`records`: the plan's, SizePlan.record()): the branch then trains, resumes and is locked to its config
    as any run. Nothing when it has a checkpoint already (returns None); a LadderError when the trunk has no
    checkpoint there."""
    found = {r["name"]: r for r in records}
    run = found[name]
    if checkpoint_steps(run["model_path"]):
        return None
    trunk = found[run["trunk"]]
    start = run["start_step"]
    if start not in checkpoint_steps(trunk["model_path"]):
        raise LadderError(f"branch {name} starts from {trunk['name']}'s checkpoint at step {start}, which "
                          f"{trunk['model_path']} does not hold (keep_checkpoint_steps keeps it once saved): train "
                          f"{trunk['name']} first, or delete {trunk['model_path']} to train it again")
    prefix = checkpoints.copy(checkpoints.prefix_of(trunk["model_path"], start), run["model_path"])
    record, mine = (os.path.join(path, TOKENIZER_RECORD) for path in (trunk["model_path"], run["model_path"]))
    if os.path.isfile(record) and not os.path.exists(mine):
        shutil.copyfile(record, mine + ".tmp")
        os.replace(mine + ".tmp", mine)
    return prefix


# ----------------------------------------------------------------------------------------------------
# Training here


class Progress:
    """The ladder's share of FLOPs done, and its ETA: the rest of the size under way at its measured rate, the sizes
    still to start at the FLOP rate of the last size measured (bigger sizes run at more FLOP/s, so this errs long
    and shortens as they run), plus for each of them the start-up and evaluation time this session's sizes took."""

    def __init__(self, ladder: Ladder, states: dict):
        self.total = ladder.flops
        self.done = {s.name: self._done(s, states[s.name].step) for s in ladder.sizes}
        self.waiting = {s.name: s.flops for s in ladder.sizes if not states[s.name].done}
        self.rate = None                # FLOP/s of the size under way (or the last one), between its progress lines
        self.overheads: list = []       # per size trained here: its wall time not spent between progress lines
        self._size_start = self._last = None
        self._size_training = self._size_flops = self._size_from = 0.0

    def start(self, size: SizePlan) -> None:
        self.waiting.pop(size.name, None)
        self._size_start, self._last = time.monotonic(), None
        self._size_training = self._size_flops = 0.0
        self._size_from = self.done[size.name]

    def gap(self) -> None:
        """A line that is not progress (an evaluation, a restart between checkpoints): the time to the next progress
        line is not training."""
        self._last = None

    @staticmethod
    def _done(size: SizePlan, step: int) -> float:
        """The FLOPs a run has done at `step` (a branch counts from its start)."""
        trained = min(max(step - size.run.start, 0), size.run.trained_steps)
        return size.flops * trained / max(size.run.trained_steps, 1)

    def update(self, size: SizePlan, step: int) -> None:
        now = time.monotonic()
        flops = self._done(size, step)
        if self._last is not None and now > self._last:
            self._size_training += now - self._last
            self._size_flops += flops - self.done[size.name]
            self.rate = self._size_flops / self._size_training
        self.done[size.name], self._last = flops, now

    def finish(self, size: SizePlan) -> None:
        self.done[size.name] = size.flops
        elapsed = time.monotonic() - self._size_start
        if self.rate is None and size.flops > self._size_from and elapsed > 0:
            # no two progress lines in a row yet (a short run, evaluations between them): the size's FLOPs over its
            # whole time, start-up and evaluations included (so its overhead is in the rate, not added again)
            self.rate = (size.flops - self._size_from) / elapsed
            self.overheads.append(0.0)
            return
        self.overheads.append(elapsed - self._size_training)

    def line(self, size: SizePlan) -> str:
        done = sum(self.done.values())
        shown = f"ladder {100 * done / self.total:.0f}% of FLOPs"
        if not self.rate:
            return f"{shown}, eta ?"
        overhead = (sum(self.overheads) / len(self.overheads) if self.overheads else
                    time.monotonic() - self._size_start - self._size_training)
        left = ((size.flops - self.done[size.name]) + sum(self.waiting.values())) / self.rate
        return f"{shown}, eta {duration(left + overhead * len(self.waiting))}"


class Worker:
    """The process that runs the ladder's runs (ladder/worker.py), started at the first run that trains: `run(argv)`
    runs main.py's `main(argv)` there and yields the run's output lines; its exit code is `code` after them. In
    its own session: a terminal's Ctrl-C reaches the ladder only, which passes it on once (twice would stop the run
    at once, without its checkpoint)."""

    def __init__(self, cpu_devices: int = 1):
        self.cpu_devices = cpu_devices
        self.process: Optional[subprocess.Popen] = None
        self.busy = False                # a run is under way: signals are passed on
        self.code: Optional[int] = None  # the last run's exit code
        self._token = secrets.token_hex(8)  # the line after a run's output: no run prints it

    def _start(self) -> subprocess.Popen:
        command = [sys.executable, "-m", "ladder.worker", self._token, str(self.cpu_devices)]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd=REPO_ROOT, env=env, start_new_session=True)

    def run(self, argv: list):
        if self.process is None:
            self.process = self._start()
        self.code, self.busy = None, True
        try:
            self.process.stdin.write(json.dumps(argv) + "\n")
            self.process.stdin.flush()
        except OSError:  # the worker is gone (a broken pipe): its code below
            pass
        end = f"{self._token} "
        for line in self.process.stdout:
            line = line.rstrip("\n")
            if end in line:  # after the run's last line, or after a last line without its end
                before, _, code = line.rpartition(end)
                if before:
                    yield before
                self.code, self.busy = int(code), False
                return
            yield line
        code = self.process.wait()  # the worker ended during the run (killed, or a crash below Python)
        self.code, self.busy, self.process = 128 - code if code < 0 else code or 1, False, None

    def send_signal(self, signum: int) -> None:
        if self.busy and self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)

    def close(self) -> None:
        """The worker ends at the end of its input; a run still under way (the ladder stopped by an error of its
        own) is stopped as by SIGTERM: it saves after its step."""
        if self.process is None:
            return
        if self.busy and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.stdin.close()
        except OSError:  # gone already
            pass
        for _ in self.process.stdout:  # what it still says (a run's last lines): the ladder has stopped listening
            pass
        self.process.wait()
        self.process = None

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Forward:
    """While the ladder trains: SIGINT and SIGTERM to the ladder are passed to the worker's run under way (once
    each), and noted."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.signum: Optional[int] = None
        self._previous = {}

    def __enter__(self):
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = install(signum, self._handle)  # not in a fork of the ladder
        return self

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum, frame):
        self.signum = signum
        self.worker.send_signal(signum)


def _train_size(size: SizePlan, evaluate_only: bool, progress: Progress, worker: Worker, say) -> int:
    """main.py's run of `size` (training, or with `evaluate_only` its final evaluation) in the worker, its lines
    shown with the size's name and the ladder's progress; returns main.py's exit code."""
    for line in worker.run(["--model", size.run.config_path] + (["--eval"] if evaluate_only else [])):
        match = _STEP_LINE.match(line)
        if match:
            progress.update(size, int(match.group(1)))
            line = f"{line} | {progress.line(size)}"
        else:
            progress.gap()
        say(f"[{size.name}] {line}")
    return worker.code


def _stopped_before(size: SizePlan, signum: int, say) -> int:
    """The ladder's end on a signal that came before `size` trained: its line, and the shell's code for the signal
    (130 for SIGINT, 143 for SIGTERM), as a run cut off by it would return."""
    say(f"ladder stopped before {size.name} trained (run the same command to resume)")
    return exit_code(signum)


def run_here(ladder: Ladder, say=print) -> int:
    """Trains the sizes not done, smallest first; returns 0, or the exit code of the size that stopped."""
    states = {s.name: size_state(s) for s in ladder.sizes}
    progress = Progress(ladder, states)
    total = len(ladder.sizes)
    # The worker's CPU is split once, before TensorFlow starts there: into the most devices a run's mesh uses
    cpu_devices = max([s.cfg.n_devices for s in ladder.sizes if not states[s.name].done], default=1)
    with Worker(cpu_devices) as worker, _Forward(worker) as forward:
        for i, size in enumerate(ladder.sizes, 1):
            state = states[size.name]
            r = size.run
            head = (f"ladder {ladder.spec.name}: run {i}/{total} {size.name}: N {size.params['non_embedding']:,}, "
                    f"{r.shape.n_layer} x {r.shape.n_embd}, {r.steps} steps of {r.batch_tokens:,} tokens in "
                    f"{r.model_path}")
            if state.done:
                say(f"{head}: done, skipped (final eval loss {eval_results(size)[r.steps]:.4f})")
                continue
            say(f"{head}: {state.describe()}")
            if forward.signum is not None:  # a Ctrl-C between runs: stop before starting another
                return _stopped_before(size, forward.signum, say)
            started = time.monotonic()
            progress.start(size)
            if state.branch_from:
                say(f"[{size.name}] starts from {start_branch([s.record() for s in ladder.sizes], size.name)}")
                if forward.signum is not None:  # a Ctrl-C during the copy: stop before training anything
                    return _stopped_before(size, forward.signum, say)
            code = _train_size(size, state.step >= r.steps, progress, worker, say)
            if forward.signum is not None or code in (130, 143):
                say(f"ladder stopped during {size.name} (its last checkpoint is kept; finished runs are untouched): "
                    f"run the same command to resume")
                return code or 130
            if code != 0:
                print(f"error: run {size.name} stopped with exit code {code} (its error is above); the runs before "
                      f"it are kept: fix it and run the same command to go on", file=sys.stderr, flush=True)
                return code
            progress.finish(size)
            final = eval_results(size).get(r.steps)
            shown = f"final eval loss {final:.4f}" if final is not None else "no final evaluation recorded"
            say(f"ladder: {size.name} done in {duration(time.monotonic() - started)} ({shown}); {i}/{total} runs, "
                f"{progress.line(size)}")
    say(f"ladder {ladder.spec.name}: all {total} runs trained; next: python -m ladder fit {ladder.spec.path}")
    return 0


# ----------------------------------------------------------------------------------------------------
# Scripts for a cluster


def _gpu_ids(count: int) -> str:
    return " ".join(f"device:GPU:{i}" for i in range(count))


def launcher_scripts(ladder: Ladder) -> list[str]:
    """One script per lineage in OUT/launch/ (a trunk and its branches in turn, or a run of the base schedule):
    SLURM sbatch files or Kubernetes Indexed Jobs (docs/multihost.md). A branch's step first copies its trunk's
    checkpoint into its model_path (`python -m ladder branch`, which does nothing once it has one)."""
    launcher = ladder.spec.launcher
    folder = os.path.join(ladder.spec.out, "launch")
    os.makedirs(folder, exist_ok=True)
    workdir = launcher.workdir or REPO_ROOT
    lineages = {}
    for size in ladder.sizes:
        lineages.setdefault(size.run.lineage, []).append(size)
    written = []
    for name, runs in lineages.items():
        devices = runs[0].cfg.n_devices
        nodes = math.ceil(devices / launcher.gpus_per_node)
        per_node = min(devices, launcher.gpus_per_node)
        if devices % per_node:
            raise LadderError(f"size {name} uses {devices} GPUs, which do not split evenly over nodes of "
                              f"{launcher.gpus_per_node}: set \"launcher\".gpus_per_node to a divisor or multiple")
        steps = []  # (a branch's copy command or None, main.py's command, a comment)
        for size in runs:
            copy = (f"{launcher.python} -m ladder branch {ladder.spec.path} {size.name}"
                    if size.run.kind == "branch" and size.run.start else None)
            main = f"{launcher.python} main.py --model {size.run.config_path} --gpu_ids {_gpu_ids(per_node)}"
            comment = (f"# {size.name}: N {size.params['non_embedding']:,}, steps {size.run.start} -> {size.run.steps}, "
                       f"mesh {size.cfg.mesh_shape}; the ladder's evaluations run after each checkpoint")
            steps.append((copy, main, comment))
        job = f"{ladder.spec.name}-{name}".lower().replace(".", "-").replace("_", "-")
        if launcher.kind == "slurm":
            path = os.path.join(folder, f"{name}.sbatch")
            lines = ["#!/bin/bash", f"#SBATCH --job-name={job}", f"#SBATCH --nodes={nodes}",
                     "#SBATCH --ntasks-per-node=1", f"#SBATCH --gpus-per-node={per_node}",
                     f"#SBATCH --time={launcher.time}",
                     "#SBATCH --signal=TERM@300            # SIGTERM before the time limit: save and stop",
                     "#SBATCH --requeue                    # a preempted job comes back and resumes"]
            if launcher.partition:
                lines.append(f"#SBATCH --partition={launcher.partition}")
            lines += ["set -e", f"cd {workdir}"]
            for copy, main, comment in steps:
                lines += [comment] + ([copy] if copy else []) + [f"srun {main}"]
            text = "\n".join(lines + [""])
        else:
            path = os.path.join(folder, f"{name}.yaml")
            workers = ", ".join(f'\\"{job}-{i}.{job}:2222\\"' for i in range(nodes))
            commands = []
            for copy, main, _ in steps:
                if copy:  # once, by the chief; the workers wait for it in the cluster's start-up
                    commands.append(f'          if [ "${{JOB_COMPLETION_INDEX:-0}}" = 0 ]; then {copy}; fi')
                commands.append(f"          {main}")
            text = "\n".join([
                "apiVersion: batch/v1", "kind: Job", f"metadata: {{name: {job}}}", "spec:",
                f"  completions: {nodes}", f"  parallelism: {nodes}", "  completionMode: Indexed",
                "  backoffLimit: 20", "  template:", "    spec:", f"      subdomain: {job}",
                "      restartPolicy: OnFailure", "      terminationGracePeriodSeconds: 300", "      containers:",
                "      - name: train", f"        image: {launcher.image}", f"        workingDir: {workdir}",
                '        command: ["bash", "-c"]', "        args:", "        - |", "          set -e",
                *([f'          export TF_CONFIG="{{\\"cluster\\": {{\\"worker\\": [{workers}]}}, '
                   f'\\"task\\": {{\\"type\\": \\"worker\\", \\"index\\": $JOB_COMPLETION_INDEX}}}}"']
                  if nodes > 1 else []),
                *commands, "        ports: [{containerPort: 2222}]",
                f"        resources: {{limits: {{nvidia.com/gpu: {per_node}}}}}", ""])
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        written.append(path)
    return written


def run(ladder: Ladder, say=print) -> int:
    if ladder.spec.launcher is None:
        ladder_plan.check_data(ladder)  # before anything is written: the data is on this machine
    written = ladder_plan.write_configs(ladder)
    if ladder.spec.launcher is None:
        return run_here(ladder, say)
    scripts = launcher_scripts(ladder)
    say(f"ladder {ladder.spec.name}: wrote {len(written)} run configs and {len(scripts)} "
        f"{ladder.spec.launcher.kind} scripts (nothing trains here):")
    for path in scripts:
        say(f"  {path}")
    submit = "sbatch" if ladder.spec.launcher.kind == "slurm" else "kubectl apply -f"
    say(f"submit them with: for f in {os.path.join(ladder.spec.out, 'launch')}/*; do {submit} $f; done   "
        f"(model_paths and data on shared storage; `python -m ladder status` reads them)")
    return 0
