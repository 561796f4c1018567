"""lm-evaluation-harness tasks on model_path's checkpoints: `main.py --eval --harness_tasks lambada_openai,...`,
and the config's harness_tasks after each checkpoint during training (docs/evaluation.md).

The model is evals/harness_model.py's CheckpointLM; the harness (lm-eval, requirements-eval.txt) builds the
requests, runs its own evaluator and computes its own metrics. Nothing is downloaded: the harness and `datasets`
run offline (HF_DATASETS_OFFLINE, HF_HUB_OFFLINE), so a task reads local files, as a custom task YAML with
`dataset_path: json` and `dataset_kwargs: {data_files: ...}` in a folder named by harness_include_path; a
relative data file is read from beside its YAML. tests/fixtures/harness_tasks/ holds tiny such tasks.

Each run writes the harness's results JSON (model_path/harness/results_STEP.json, or --harness_output; with
--log_samples each request's samples too), appends one line per task to the eval results file (the task as
"harness/NAME") and writes the metrics as TensorBoard scalars under model_path/eval. The model runs in the
precision of the evaluations (devices/precision.py's `for_inference`), which the lines, the rows and the
results JSON's "gpt_neo" entry name.
"""
from __future__ import annotations

import contextlib
import math
import os
import platform
import sys
from dataclasses import dataclass
from importlib import metadata
from typing import Optional

from schema import ConfigError, GPTConfig, closest
from data.errors import DataError
from console.environment import installed_tensorflow_version
from data.tokenizer import load_for_config
from evals import task_index
from evals.tasks import append_result
from infer import run
from modelpath import checkpoints
from modelpath.files import write_json_atomically
from devices import precision
from modelpath import events
from modelpath.events import summary_writer, write_scalars

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
LOCAL_BUILDERS = ("json", "csv", "text", "parquet", "arrow")  # datasets' builders that read data_files


@dataclass(frozen=True)
class HarnessOptions:
    """One harness run: the config's harness_* keys, with this run's flags over them (cli/eval_flags.py)."""
    tasks: tuple
    include_path: Optional[str] = None
    num_fewshot: Optional[int] = None
    limit: Optional[float] = None        # examples per task (a fraction when below 1)
    batch_size: Optional[int] = None     # rows per forward pass; default eval_batch_size
    output_path: Optional[str] = None    # the results JSON; default model_path/harness/results_STEP.json
    log_samples: bool = False            # also write each request's inputs and outputs beside the results

    @classmethod
    def from_config(cls, cfg: GPTConfig, **changes) -> "HarnessOptions":
        values = dict(tasks=cfg.harness_tasks, include_path=cfg.harness_include_path,
                      num_fewshot=cfg.harness_num_fewshot, limit=cfg.harness_limit)
        values.update({k: v for k, v in changes.items() if v is not None})
        return cls(**values)


def go_offline() -> None:
    """No downloads from here on: the variables for modules still to be imported, the flags of those already
    imported (they read the variables once)."""
    os.environ.update(OFFLINE)
    if "huggingface_hub" in sys.modules:
        import huggingface_hub.constants
        huggingface_hub.constants.HF_HUB_OFFLINE = True
    if "datasets" in sys.modules:
        import datasets.config
        datasets.config.HF_DATASETS_OFFLINE = True
        datasets.config.HF_HUB_OFFLINE = True


def import_harness():
    """evals/harness_model.py (which imports lm-eval), offline; one error line when lm-eval is not installed."""
    go_offline()
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise ConfigError("harness tasks need lm-evaluation-harness, which is not installed: pip install -r "
                          "requirements-eval.txt") from None
    from evals import harness_model
    return harness_model


def task_manager(include_path: Optional[str], names: tuple):
    """The harness's TaskManager: the include_path's tasks only when they hold every name asked for (fast),
    else the harness's own tasks too. Unknown names are one error naming the closest known ones."""
    from lm_eval.tasks import TaskManager
    if include_path and not os.path.isdir(include_path):
        raise ConfigError(f"harness_include_path {include_path} is not a folder: point it at a folder of task YAML "
                          f"files (tests/fixtures/harness_tasks/ holds examples)")
    if include_path:
        manager = TaskManager(include_path=include_path, include_defaults=False)
        if all(name in manager.all_tasks for name in names):
            return manager
    with task_index.lm_evals_own_tasks_cached(task_index.cache_folder()):  # 5.6 CPU s to index them afresh
        manager = TaskManager(include_path=include_path)
    for name in names:
        if name not in manager.all_tasks:
            where = f" or in {include_path}" if include_path else ""
            raise ConfigError(f"harness task {name!r} is not known (not among lm-eval's tasks{where}){closest(name, manager.all_tasks)}: "
                              f"name a task of lm-eval or a task YAML in the folder harness_include_path names")
    return manager


def local_task(manager, name: str):
    """The task to ask the harness for: its name, or for a task whose YAML reads local data files, its config
    with those files resolved beside the YAML (the harness would read them from the working directory).
    Files that are not there are one error naming the task and the file."""
    from lm_eval.tasks._yaml_loader import load_yaml
    entry = manager.task_index.get(name)
    if entry is None or entry.yaml_path is None:
        return name
    config = load_yaml(entry.yaml_path, resolve_func=True)
    if config.get("dataset_path") not in LOCAL_BUILDERS:
        return name
    kwargs = dict(config.get("dataset_kwargs") or {})
    files = kwargs.get("data_files")
    if files is None:
        raise DataError(f"harness task {name!r} ({entry.yaml_path}) reads dataset_path {config['dataset_path']} but "
                        f"names no data_files: add dataset_kwargs: {{data_files: {{test: FILE}}}}")
    folder = os.path.dirname(os.path.abspath(entry.yaml_path))

    def resolve(path: str) -> str:
        path = os.path.join(folder, os.path.expanduser(path))
        if not os.path.isfile(path):
            raise DataError(f"harness task {name!r} reads {path}, which is not there: put the task's data there, "
                            f"or fix data_files in {entry.yaml_path}")
        return path

    if isinstance(files, dict):
        files = {split: [resolve(p) for p in ([paths] if isinstance(paths, str) else paths)]
                 for split, paths in files.items()}
    else:
        files = [resolve(p) for p in ([files] if isinstance(files, str) else files)]
    return dict(config, dataset_kwargs=dict(kwargs, data_files=files))


def task_metrics(results: dict) -> dict:
    """{task: {metric: value}} from the harness's results: numbers only (a stderr it could not compute is
    'N/A'), named "acc" for the harness's "acc,none" and "exact_match/strict-match" for a filter's."""
    table = {}
    for task, values in results.get("results", {}).items():
        metrics = {}
        for key, value in values.items():
            if "," not in key or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            metric, kept = key.split(",", 1)
            if isinstance(value, float) and not math.isfinite(value):
                continue
            metrics[metric if kept == "none" else f"{metric}/{kept}"] = value
        table[task] = metrics
    return table


def write_json(path: str, value) -> None:
    """Written whole under a temporary name, then renamed: a failed write leaves no half file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_json_atomically(path, value, default=str, ensure_ascii=False)


@dataclass(frozen=True)
class Prepared:
    """The tasks of a run, checked: the TaskManager that knows them and what to ask it for."""
    manager: object
    tasks: list


# The requests a model trained on entmax_loss cannot answer: they need the softmax's log-likelihoods.
LOGLIKELIHOOD_TYPES = ("loglikelihood", "loglikelihood_rolling", "multiple_choice")


def output_type(manager, task) -> Optional[str]:
    """The kind of request a task makes (its YAML's output_type, includes followed; a config given as a dict
    says it itself); None where only building it would tell (a group, a task defined in Python)."""
    from lm_eval.tasks._yaml_loader import load_yaml
    if isinstance(task, dict):
        return task.get("output_type")
    entry = manager.task_index.get(task)
    if entry is None or entry.yaml_path is None or entry.kind.name != "TASK":
        return None
    try:
        return load_yaml(entry.yaml_path, resolve_func=False).get("output_type")
    except (OSError, ValueError):
        return None


def check_fits_model(cfg: GPTConfig, prepared: Prepared) -> None:
    """A model trained on entmax_loss has no softmax log-likelihoods: its tasks that ask for them are one error
    before anything runs (evals/harness_model.py refuses each such request too, for the tasks only their
    building tells)."""
    if not cfg.entmax_loss:
        return
    asking = [task if isinstance(task, str) else task.get("task", "?") for task in prepared.tasks
              if output_type(prepared.manager, task) in LOGLIKELIHOOD_TYPES]
    if asking:
        raise DataError(f"harness task {', '.join(asking)} scores log-likelihoods, which a model trained with "
                        f"entmax_loss does not have: run generation tasks only with this model, or evaluate one "
                        f"trained on cross-entropy")


def prepare(options: HarnessOptions, cfg: Optional[GPTConfig] = None) -> Prepared:
    """lm-eval imported offline, every task name known and its local data files there, and (given the model's
    config) every task one the model can answer: checked before a checkpoint is loaded or a step trained, so
    that a typo is one error line at once."""
    import_harness()
    manager = task_manager(options.include_path, options.tasks)
    prepared = Prepared(manager, [local_task(manager, name) for name in options.tasks])
    if cfg is not None:
        check_fits_model(cfg, prepared)
    return prepared


def package_version(name: str) -> str:
    """An installed distribution's version, read from its metadata without importing it; "N/A" if absent."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "N/A"


def add_environment(storage: dict) -> None:
    """The results JSON's environment entries (the keys lm-eval's own add_env_info writes), for this stack. lm-eval's
    imports PyTorch wherever it is installed and runs `pip list` and nvidia-smi for its "pretty_env_info": seconds
    of every evaluation (after each checkpoint, in training's process) and torch's memory, for a model run by
    TensorFlow."""
    storage.update(
        pretty_env_info=f"TensorFlow {installed_tensorflow_version()}, mesh-tensorflow "
                        f"{package_version('mesh-tensorflow')}, Python {platform.python_version()}, "
                        f"{platform.platform()}, {precision.cpu_kind(*precision.cpu_info())}",
        transformers_version=package_version("transformers"), lm_eval_version=package_version("lm_eval"),
        upper_git_hash=None)


@contextlib.contextmanager
def environment_of_this_stack(evaluator):
    """simple_evaluate with add_environment in place of lm-eval's add_env_info (its evaluator module's name)."""
    original = evaluator.add_env_info
    evaluator.add_env_info = add_environment
    try:
        yield
    finally:
        evaluator.add_env_info = original


class Harness:
    """The harness's tasks at checkpoints (see the module docstring for what a run writes). The scoring programs
    are built at the first checkpoint and kept, restored at each next one (a training run's evaluations)."""

    def __init__(self, cfg: GPTConfig, placement, options: HarnessOptions, prepared: Optional[Prepared] = None):
        self.prepared = prepared or prepare(options)
        check_fits_model(cfg, self.prepared)
        cfg = precision.for_inference(cfg, placement)  # resolved already when evals/at_checkpoints.py made this
        self.cfg, self.placement, self.options = cfg, placement, options
        self.tokenizer = load_for_config(cfg)
        self.predictor = run.Predictor(cfg, placement)

    def on_checkpoint(self, step: int, prefix: str) -> dict:
        """The tasks on the checkpoint `prefix` of `step`; prints one line per task and writes the results.
        Returns {task: {metric: value}}."""
        from lm_eval import evaluator
        from evals import harness_model
        cfg, options = self.cfg, self.options
        manager, tasks = self.prepared.manager, self.prepared.tasks
        output = options.output_path or os.path.join(cfg.model_path, "harness", f"results_{step}.json")
        checkpoints.check_writable(os.path.dirname(os.path.abspath(output)),
                                   "make it writable, or pass --harness_output to write the results elsewhere")
        self.predictor.restore(prefix)
        lm = harness_model.CheckpointLM(cfg, self.placement, prefix, self.tokenizer, options.batch_size,
                                        predictor=self.predictor)
        try:
            with environment_of_this_stack(evaluator):
                results = evaluator.simple_evaluate(model=lm, tasks=tasks, num_fewshot=options.num_fewshot,
                                                    limit=options.limit, task_manager=manager,
                                                    log_samples=options.log_samples,
                                                    bootstrap_iters=0 if options.limit else 100000)
        except (FileNotFoundError, ConnectionError) as e:  # a task's data neither local nor in the datasets cache
            raise DataError(f"a harness task's data could not be read offline ({str(e).splitlines()[0]}): give the "
                            f"task local data files (docs/evaluation.md)") from None
        samples = results.pop("samples", None)
        results["gpt_neo"] = {"step": step, "checkpoint": lm.checkpoint, "config": cfg.model_path,
                              "precision": precision.running(lm.cfg)}
        write_json(output, results)
        if samples is not None:
            write_json(output[:-len(".json")] + "_samples.json" if output.endswith(".json") else output + ".samples",
                       samples)
        table = task_metrics(results)
        writer = summary_writer(events.folder(cfg.model_path, evaluation=True))
        for task, metrics in table.items():
            append_result(lm.cfg, {"step": step, "task": f"harness/{task}", **metrics})
            write_scalars(writer, step, {f"harness/{task}/{name}": value for name, value in metrics.items()})
            shown = " | ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
            print(f"harness {task} at step {step}: {shown} ({precision.running(lm.cfg)})", flush=True)
        writer.close()
        print(f"harness results in {output}", flush=True)
        return table

    def close(self) -> None:
        self.predictor.close()

    def __enter__(self) -> "Harness":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_harness(cfg: GPTConfig, placement, step: int, options: HarnessOptions,
                prepared: Optional[Prepared] = None) -> dict:
    """The harness's tasks on model_path's checkpoint at `step` (Harness)."""
    with Harness(cfg, placement, options, prepared) as harness:
        return harness.on_checkpoint(step, checkpoints.prefix_of(cfg.model_path, step))
