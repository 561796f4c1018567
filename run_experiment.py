"""Track a run of main.py with Sacred: its config, its metrics and its console output, as GPT-Neo's
run_experiment.py did, without Docker or a database by default.

    python run_experiment.py --model default                              # file observer in runs/sacred/
    python run_experiment.py --model gpt3_small --gpu_ids device:GPU:0 device:GPU:1 --mesh_shape x:2 --layout batch:x
    python run_experiment.py --model default --mongo_url mongodb://user:pw@host:27017 --experiment_name neo-small

Every flag that is not one of the few below is main.py's and goes to main.py unchanged (--gpu_ids, --tpu,
--steps_per_checkpoint, --new --yes, --eval, ...). run_experiment.py starts a Sacred run, then runs main.py in a
child process with `--sacred_id <run id>` (main.py records it in model_path/run_info.json), echoes main.py's
output (Sacred captures it: cout.txt), and copies the run's TensorBoard scalars (loss, learning_rate,
grad_norm, tokens_per_sec, model_flops_per_sec, mfu, eval_loss, ...) into Sacred's metrics every
--poll_seconds and once more at the end, only the steps this run trained (a resumed run does not re-log the
steps of earlier runs). A main.py that fails marks the Sacred run FAILED, and run_experiment.py exits with its
code.

Observers: a FileStorageObserver in --sacred_dir (default runs/sacred; each run is a numbered folder holding
config.json, run.json, metrics.json and cout.txt), and with --mongo_url also a MongoObserver (pymongo), e.g.
for Omniboard as in GPT-Neo's docker-compose set-up. --sacred_dir none keeps only the MongoDB observer.
--tensorboard starts TensorBoard on the run's model_path (a free port from 6006 on) for as long as it runs;
--heartbeat_timeout restarts main.py (resuming from its last checkpoint) when no new scalar arrives for that
many seconds, as the reference did for preempted TPUs.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings

REPO = os.path.dirname(os.path.abspath(__file__))
MAIN = os.path.join(REPO, "main.py")
sys.path.insert(0, REPO)

from console.arguments import ArgumentParser, number_above, whole_number  # noqa: E402
from modelpath import checkpoints  # noqa: E402  (no TensorFlow in this process)
from modelpath.events import read_scalars  # noqa: E402
from schema import ConfigError, read_json, resolve_config_path  # noqa: E402


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="All other flags are main.py's (python main.py --help).")
    p.add_argument("--experiment_name", help="Sacred experiment name (default: the model config's name)")
    p.add_argument("--sacred_dir", default=os.path.join("runs", "sacred"),
                   help="FileStorageObserver folder (default: runs/sacred); 'none' for no file observer")
    p.add_argument("--mongo_url", help="also record to MongoDB at this URL (mongodb://[user:pw@]host:port)")
    p.add_argument("--mongo_db", default="sacred", help="MongoDB database name (default: sacred)")
    p.add_argument("--poll_seconds", type=number_above(0), default=30.0, help="copy new TensorBoard scalars every N seconds")
    p.add_argument("--tensorboard", action="store_true", help="serve TensorBoard on the model_path while running")
    p.add_argument("--heartbeat_timeout", type=number_above(0, inclusive=True), default=0.0,
                   help="restart main.py if no new scalar arrives for N seconds (0: never)")
    p.add_argument("--max_restarts", type=whole_number(0), default=3, help="restarts allowed by --heartbeat_timeout")
    own, rest = p.parse_known_args(argv)
    if any(a == "--sacred_id" or a.startswith("--sacred_id=") for a in rest):
        p.error("--sacred_id is set by run_experiment.py to the Sacred run's id; do not pass it")
    # The few main.py flags this wrapper reads; main.py itself checks all of them (and fails the run if wrong).
    peek = ArgumentParser(add_help=False)
    peek.add_argument("--model", default="default")
    peek.add_argument("--new", action="store_true")
    peek.add_argument("--eval", action="store_true")
    for flag in ("--mesh_shape", "--layout"):
        peek.add_argument(flag)
    peek.add_argument("--steps_per_checkpoint", type=int)
    main_args, _ = peek.parse_known_args(rest)
    return own, rest, main_args


# ---------------------------------------------------------------------------------------------------------
# The model config, read without importing TensorFlow (models/ does).


def read_config(main_args) -> tuple[str, dict]:
    try:
        path = resolve_config_path(main_args.model)
        return path, read_json(path, "model config")
    except (ConfigError, OSError):
        return main_args.model, {}  # main.py reports a missing or broken config itself, as one error line


# ---------------------------------------------------------------------------------------------------------
# Metrics: TensorBoard scalars -> Sacred


class MetricCopier:
    """Logs each scalar of model_path (and model_path/eval, as eval_<tag>) to the Sacred run once, for steps
    after `start_step`."""

    def __init__(self, run, model_path: str, start_step: int, eval_only: bool = False):
        self.run, self.model_path = run, model_path
        self.last = {}  # metric name -> last step logged
        self.start_step = start_step
        self.eval_from = start_step - 1 if eval_only else start_step  # --eval evaluates the checkpoint it finds
        self.last_new = time.time()

    def poll(self) -> int:
        if not self.model_path or not os.path.isdir(self.model_path):
            return 0
        logged = 0
        for folder, prefix in ((self.model_path, ""), (os.path.join(self.model_path, "eval"), "eval_")):
            if not os.path.isdir(folder):
                continue
            try:
                scalars = read_scalars(folder)
            except OSError:
                continue
            for tag, points in scalars.items():
                name = prefix + tag.replace("/", "_").replace(".", "_")
                for step, value in points:
                    if step <= self.last.get(name, self.eval_from if prefix else self.start_step):
                        continue
                    self.run.log_scalar(name, value, step)
                    self.last[name] = step
                    logged += 1
        if logged:
            self.last_new = time.time()
        return logged


# ---------------------------------------------------------------------------------------------------------
# TensorBoard


def free_port(low: int = 6006, high: int = 6106) -> int:
    for port in range(low, high):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            if s.connect_ex(("localhost", port)) != 0:
                return port
    raise RuntimeError(f"no free port in {low}..{high} for TensorBoard")


def start_tensorboard(model_path: str):
    port = free_port()
    binary = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    command = [binary] if os.path.exists(binary) else [sys.executable, "-m", "tensorboard.main"]
    proc = subprocess.Popen(command + ["--logdir", model_path, "--port", str(port), "--bind_all"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"TensorBoard for {model_path} at http://{socket.gethostname()}:{port}/", flush=True)
    return proc, port


# ---------------------------------------------------------------------------------------------------------
# The run


def run_main_once(command: list[str], copier: MetricCopier, own) -> tuple[int, bool]:
    """Runs main.py, echoing its output and copying metrics. Returns (exit code, stalled)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env=env, cwd=os.getcwd())

    def echo():
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()

    reader = threading.Thread(target=echo, daemon=True)
    reader.start()
    copier.last_new = time.time()
    stalled = False
    try:
        while proc.poll() is None:
            reader.join(timeout=min(own.poll_seconds, 5.0))
            if time.time() - getattr(copier, "_polled", 0) >= own.poll_seconds:
                copier.poll()
                copier._polled = time.time()
            if own.heartbeat_timeout and time.time() - copier.last_new > own.heartbeat_timeout:
                print(f"run_experiment: no new metrics for {own.heartbeat_timeout:.0f}s; stopping main.py to "
                      f"restart it from its last checkpoint", flush=True)
                stalled = True
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                break
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        proc.wait()
        raise
    proc.wait()
    reader.join(timeout=10)
    copier.poll()
    return proc.returncode, stalled


def sacred_logger() -> logging.Logger:
    """Sacred's logger, showing its warnings and errors only: its INFO lines ("Running command ...",
    "Started run with ID ...", "Completed after ...") would sit between main.py's lines, and this run prints
    its id itself."""
    logger = logging.getLogger("run_experiment")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s - %(name)s - %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.WARNING)
    return logger


def folder_problem(folder: str) -> str | None:
    """Why Sacred's file observer could not make its run folders in `folder` (a file, or a folder or parent this
    process cannot write), or None; found before the run starts, without creating anything."""
    path = os.path.abspath(folder)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    where = folder if path == os.path.abspath(folder) else f"{folder} cannot be made: {path}"
    if not os.path.isdir(path):
        return f"{where} is a file, not a folder"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{where} is not writable"
    return None


def main(argv=None) -> int:
    own, rest, main_args = parse_args(argv)
    path, raw = read_config(main_args)
    model_path = raw.get("model_path") if isinstance(raw.get("model_path"), str) else None
    name = own.experiment_name or os.path.splitext(os.path.basename(path))[0]

    with warnings.catch_warnings():  # sacred imports pkg_resources, deprecated in setuptools 80: nothing to act on
        warnings.filterwarnings("ignore", message="pkg_resources is deprecated", category=UserWarning)
        from sacred import SETTINGS, Experiment
        from sacred.observers import FileStorageObserver
    SETTINGS.CAPTURE_MODE = "sys"  # main.py's output is echoed by this process, so sys-level capture sees it
    ex = Experiment(name, base_dir=REPO)
    ex.logger = sacred_logger()
    import glob
    from importlib import metadata
    for source in [MAIN] + sorted(glob.glob(os.path.join(REPO, "*", "*.py"))):
        if not os.path.relpath(source, REPO).startswith(("tests", "bench", ".")):
            ex.add_source_file(source)  # the code that trained, as the reference recorded every .py file
    for package in ("tensorflow", "mesh-tensorflow", "numpy"):
        try:
            ex.add_package_dependency(package, metadata.version(package))
        except metadata.PackageNotFoundError:
            pass
    if own.sacred_dir and own.sacred_dir.lower() != "none":
        problem = folder_problem(own.sacred_dir)
        if problem:
            print(f"error: --sacred_dir {problem}: pass a folder (it is made if missing), or 'none' with --mongo_url",
                  file=sys.stderr)
            return 1
        ex.observers.append(FileStorageObserver(own.sacred_dir))
    if own.mongo_url:
        from sacred.observers import MongoObserver
        ex.observers.append(MongoObserver(url=own.mongo_url, db_name=own.mongo_db))
    if not ex.observers:
        print("error: no observer: keep --sacred_dir or give --mongo_url", file=sys.stderr)
        return 1
    overrides = {k: getattr(main_args, k) for k in ("mesh_shape", "layout", "steps_per_checkpoint")
                 if getattr(main_args, k, None) is not None}
    ex.add_config({"model": main_args.model, "config_file": os.path.abspath(path), "main_args": rest,
                   "overrides": overrides, "params": raw})
    outcome = {"code": None}

    @ex.main
    def run_experiment(_run):
        start = 0 if main_args.new else checkpoints.latest_step(model_path or "")
        _run.info.update({"model_path": model_path, "start_step": start, "command": [MAIN] + rest})
        print(f"Sacred run {_run._id} of experiment {name!r}; model_path {model_path}, from step {start}", flush=True)
        tensorboard = None
        if own.tensorboard and model_path:
            os.makedirs(model_path, exist_ok=True)
            tensorboard, port = start_tensorboard(model_path)
            _run.info["tensorboard_port"] = port
        copier = MetricCopier(_run, model_path, start, eval_only=main_args.eval)
        args = list(rest)
        try:
            for attempt in range(own.max_restarts + 1):
                code, stalled = run_main_once([sys.executable, MAIN] + args + ["--sacred_id", str(_run._id)],
                                              copier, own)
                if not stalled:
                    break
                args = [a for a in args if a not in ("--new", "--yes")]  # a restart resumes; never deletes
                _run.info["restarts"] = attempt + 1
        finally:
            if tensorboard is not None:
                tensorboard.terminate()
        outcome["code"] = code
        if code != 0:
            sys.stdout.flush()
            getattr(_run, "_get_captured_output", lambda: None)()  # Sacred keeps output only up to its last
            raise RuntimeError(f"main.py exited with code {code}")  # heartbeat on failure; take the rest now
        last = {k: v for k, v in copier.last.items()}
        return {"last_step": max(last.values()) if last else start, "metrics_logged": sorted(last)}

    try:
        ex.run()
    except RuntimeError as e:
        if outcome["code"] is None:
            raise
        print(f"run_experiment: {e}; the Sacred run is marked FAILED", file=sys.stderr)
        return outcome["code"] or 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
