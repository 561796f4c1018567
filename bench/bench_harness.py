"""lm-evaluation-harness speed: our harness model (evals/harness_model.py, the PREDICT graph) against the
harness's own `hf` backend (PyTorch) on the to_hf folder of the same checkpoint, on the CPU, in examples/s.

    .venv/bin/python bench/bench_harness.py                  # ~5 minutes on 2 cores
    .venv/bin/python bench/bench_harness.py --examples 40     # a quick check

The model (default: 4 layers, 256 wide, 8 heads, context 256, global/local with a 64-token window, the committed
4096-token tokenizer) gets a checkpoint of random weights. The tasks are the tests' tiny tasks
(tests/fixtures/harness_tasks/) with more examples, generated here from the same word lists and integer stream
(data/synthetic_text.py's, whose text the tests read too: the same bytes on every machine): multiple choice
(3 choices), LAMBADA-style last word, rolling perplexity over texts of ~1-3 contexts, and generation of up to
16 tokens. Each side runs each task through the harness's evaluator (simple_evaluate) in its own process, both
with batch size 16 and in float32 (ours with `eval_precision: float32`: until 2026-12-06 ours ran in "auto",
bf16 on CPUs with bf16 units; the table's first line names each side's); two times are printed: the evaluator's whole call (requests built, run and scored, and
lm-eval's record of the environment, which runs torch's collect_env where torch is installed: ~0.8 s a call, the
same for both sides; our graph builds and session starts are in it, HF's model load is not), and the model's
request methods alone (loglikelihood, loglikelihood_rolling, generate_until: what each side's own code spends). Ours scores through one infer/run.py Predictor kept across the tasks,
as the harness's runs do (evals/harness.py). Results are printed as a table with the ratio ours / hf, then each
side's memory: the process's peak RSS against the model's float32 weights, and for ours the bytes of the
variables its Predictor's sessions hold (one copy of the weights for all its programs).

    .venv/bin/python bench/bench_harness.py --only ours --n_layer 8 --n_embd 512   # memory, larger weights
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
if __name__ == "__main__":
    from console.stderr_filter import quiet_tensorflow
    quiet_tensorflow()

MARK = "BENCH_RESULT "
TASKS = ("tiny_choice", "tiny_lambada", "tiny_rolling", "tiny_generate")
TOKENIZER = os.path.join(ROOT, "data", "tokenizers", "stdlib-bpe-4096.json")

# The examples are the tests' tiny tasks' kind of text: data/synthetic_text.py's words (Python-like, which the
# committed tokenizer encodes as real source), drawn by its integer stream.
from data.synthetic_text import NOUNS, VERBS, Stream, words  # noqa: E402


# The tasks' YAML, as tests/fixtures/harness_tasks/ has it (one kind of request each), with longer generations
# than the tests' 6 tokens: the sampler's per-token speed shows.
TASK_YAML = {
    "tiny_choice": """output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: label
metric_list:
  - {metric: acc, aggregation: mean, higher_is_better: true}
  - {metric: acc_norm, aggregation: mean, higher_is_better: true}
""",
    "tiny_lambada": """output_type: loglikelihood
doc_to_text: "{{text.split(' ')[:-1]|join(' ')}}"
doc_to_target: "{{' '+text.split(' ')[-1]}}"
metric_list:
  - {metric: perplexity, aggregation: perplexity, higher_is_better: false}
  - {metric: acc, aggregation: mean, higher_is_better: true}
""",
    "tiny_rolling": """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - {metric: word_perplexity, aggregation: weighted_perplexity, higher_is_better: false}
  - {metric: byte_perplexity, aggregation: weighted_perplexity, higher_is_better: false}
  - {metric: bits_per_byte, aggregation: bits_per_byte, higher_is_better: false}
""",
    "tiny_generate": """output_type: generate_until
doc_to_text: "{{prompt}}"
doc_to_target: "{{answer}}"
generation_kwargs:
  until: [")", "\\n"]
  max_gen_toks: 16
  do_sample: false
metric_list:
  - {metric: exact_match, aggregation: mean, higher_is_better: true}
""",
}


def write_tasks(folder: str, examples: int) -> None:
    """The tiny tasks' YAML files with `examples` generated examples each (a quarter for rolling and generation,
    whose examples are longer or slower)."""
    s = Stream(11)
    data = {
        "tiny_choice": [{"question": f"To {s.pick(VERBS)} the {s.pick(NOUNS)} {words(s, 4)}, call",
                         "choices": [f"{s.pick(VERBS)}_{s.pick(NOUNS)}()" for _ in range(3)], "label": s.below(3)}
                        for _ in range(examples)],
        "tiny_lambada": [{"text": words(s, 10 + s.below(60)) + " " + s.pick(NOUNS)} for _ in range(examples)],
        "tiny_rolling": [{"text": "\n".join(words(s, 12) for _ in range(10 + s.below(40)))}
                         for _ in range(max(1, examples // 4))],
        "tiny_generate": [{"prompt": f"{words(s, 8)}\ndef {s.pick(VERBS)}_{s.pick(NOUNS)}(", "answer": s.pick(NOUNS)}
                          for _ in range(max(1, examples // 4))],
    }
    for task, records in data.items():
        with open(os.path.join(folder, task + ".yaml"), "w") as f:
            f.write(f"task: {task}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {task}.jsonl\n"
                    f"test_split: test\n{TASK_YAML[task]}metadata:\n  version: 1.0\n")
        with open(os.path.join(folder, task + ".jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)


def prepare(args, folder: str) -> None:
    """The model config, a checkpoint of random weights, its HF folder, and the tasks, under `folder`."""
    import numpy as np
    import models  # noqa: F401
    from config import load_config
    from models import gpt
    from tools import hf

    os.makedirs(os.path.join(folder, "configs", "dataset_configs"))
    with open(os.path.join(folder, "configs", "dataset_configs", "tok.json"), "w") as f:
        json.dump({"n_vocab": 4096, "path": "unused_*.tfrecords", "tokenizer_path": TOKENIZER, "eos_id": 0,
                   "padding_id": 1}, f)
    config = os.path.join(folder, "configs", "bench.json")
    with open(config, "w") as f:
        json.dump(dict(n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head, n_vocab=4096, n_ctx=args.n_ctx,
                       attention_types=[[["global", "local"], args.n_layer // 2]], local_attention_radius=args.window,
                       datasets=[["tok"]], model_path=os.path.join(folder, "run"), mesh_shape="all:1", layout="",
                       eval_batch_size=args.batch_size, predict_batch_size=args.batch_size,
                       # float32 as the hf side: "auto" would score in bf16 on CPUs with bf16 units
                       eval_precision="float32"), f)
    cfg = load_config(config)
    rng = np.random.RandomState(0)
    state = {name: (0.02 * rng.randn(*shape)).astype(np.float32) for name, shape in gpt.variable_shapes(cfg).items()}
    for name in state:
        if name.endswith("/g"):
            state[name] = np.ones_like(state[name])  # LayerNorm gains
    hf.write_checkpoint(cfg, state)
    hf.to_hf(cfg, cfg.model_path, os.path.join(folder, "hf"))
    os.makedirs(os.path.join(folder, "tasks"))
    write_tasks(os.path.join(folder, "tasks"), args.examples)


def worker(side: str, folder: str, batch_size: int) -> dict:
    """Each task through simple_evaluate with one side's model: seconds and examples; then the memory: the
    process's peak RSS, the weights' bytes and (ours) the bytes of the variables the Predictor holds."""
    from evals import harness
    prepared = harness.prepare(harness.HarnessOptions(tasks=TASKS, include_path=os.path.join(folder, "tasks")))
    if side == "ours":
        from config import load_config
        from data.tokenizer import load_for_config
        from evals.harness_model import CheckpointLM
        from devices.placement import cpu_devices, local_placement
        from infer.run import Predictor
        from models import gpt
        cfg = load_config(os.path.join(folder, "configs", "bench.json"))
        placement = local_placement(cpu_devices(1), None)
        checkpoint = os.path.join(cfg.model_path, "model.ckpt-0")
        predictor = Predictor(cfg, placement, checkpoint)
        lm = CheckpointLM(cfg, placement, checkpoint, load_for_config(cfg), batch_size, predictor=predictor)
        weight_bytes = 4 * sum(math.prod(shape) for shape in gpt.variable_shapes(cfg).values())
        from devices import precision
        running = precision.running(lm.cfg)
    else:
        import torch
        from lm_eval.models.huggingface import HFLM
        torch.set_num_threads(len(os.sched_getaffinity(0)))
        lm = HFLM(pretrained=os.path.join(folder, "hf"), device="cpu", batch_size=batch_size, dtype="float32")
        weight_bytes = sum(p.numel() * p.element_size() for p in lm.model.parameters())
        running = str(lm.model.dtype).replace("torch.", "")
    from lm_eval import evaluator
    # The model's own share: its request methods, timed as the harness calls them. The rest of simple_evaluate
    # (building the requests, scoring, and lm-eval's environment record, which runs torch's collect_env: ~0.8 s a
    # call where torch is installed, and its import on ours' first call) is the harness's, the same code for both.
    model_seconds = [0.0]
    for method in ("loglikelihood", "loglikelihood_rolling", "generate_until"):
        def timed(*a, _inner=getattr(lm, method), **k):
            start = time.perf_counter()
            try:
                return _inner(*a, **k)
            finally:
                model_seconds[0] += time.perf_counter() - start
        setattr(lm, method, timed)
    results = {}
    for name, task in zip(TASKS, prepared.tasks):
        start, model_seconds[0] = time.perf_counter(), 0.0
        out = evaluator.simple_evaluate(model=lm, tasks=[task], task_manager=prepared.manager, bootstrap_iters=0,
                                        log_samples=False)
        seconds = time.perf_counter() - start
        results[name] = {"seconds": seconds, "model_seconds": model_seconds[0],
                         "examples": out["n-samples"][name]["effective"]}
    memory = {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "weights": weight_bytes}
    if side == "ours":
        memory.update(held=predictor.variable_bytes(), programs=len(predictor._programs))
        predictor.close()
    return {"tasks": results, "memory": memory, "precision": running}


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=200, help="examples of the choice and LAMBADA tasks (a quarter "
                   "of that for rolling and generation)")
    p.add_argument("--n_layer", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=256)
    p.add_argument("--n_head", type=int, default=8)
    p.add_argument("--n_ctx", type=int, default=256)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--only", choices=["ours", "hf"], help="run one side only (its speed and memory lines)")
    p.add_argument("--worker", choices=["ours", "hf"], help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def measure(args) -> dict:
    """Each side in its own process on the same checkpoint and tasks: {side: {"tasks": ..., "memory": ...}}, with
    each task's examples/s and, where both sides ran, ours / hf."""
    with tempfile.TemporaryDirectory() as folder:
        prepare(args, folder)
        measured = {}
        for side in (args.only,) if args.only else ("ours", "hf"):
            print(f"  harness: {side} ...", flush=True)
            run = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", side, "--folder", folder,
                                  "--batch_size", str(args.batch_size)], capture_output=True, text=True)
            lines = [line for line in run.stdout.splitlines() if line.startswith(MARK)]
            if run.returncode or not lines:
                raise RuntimeError(f"the {side} side failed:\n{run.stderr[-3000:]}")
            measured[side] = json.loads(lines[-1][len(MARK):])
    def rates(seconds: str) -> dict:  # {task: {side: examples per `seconds`}}
        return {task: {side: m["tasks"][task]["examples"] / m["tasks"][task][seconds] for side, m in measured.items()}
                for task in TASKS}

    def ours_over_hf(by_task: dict) -> dict:
        return {task: r["ours"] / r["hf"] for task, r in by_task.items() if len(r) == 2}

    whole, model = rates("seconds"), rates("model_seconds")
    return {"model": {k: getattr(args, k) for k in ("n_layer", "n_embd", "n_head", "n_ctx", "batch_size")},
            "sides": measured, "rates": whole, "ratios": ours_over_hf(whole), "model_rates": model,
            "model_ratios": ours_over_hf(model)}


def print_table(s: dict) -> None:
    m = s["model"]
    sides = list(s["sides"])
    print(f"model: {m['n_layer']} layers x {m['n_embd']}, {m['n_head']} heads, n_ctx {m['n_ctx']}, vocab 4096; "
          f"batch {m['batch_size']}; {os.cpu_count()} CPUs; "
          + ", ".join(f"{side} in {s['sides'][side].get('precision', '?')}" for side in sides))
    print("examples/s through simple_evaluate (whole), and through the model's request methods alone (model)")
    print(f"{'task':<16}{'examples':>9}" + "".join(f"{side + ' whole':>12}{side + ' model':>12}" for side in sides)
          + (f"{'ours/hf whole':>15}{'ours/hf model':>15}" if s["ratios"] else ""))
    for task in TASKS:
        examples = s["sides"][sides[0]]["tasks"][task]["examples"]
        print(f"{task:<16}{examples:>9}" + "".join(f"{s['rates'][task][side]:>12.1f}{s['model_rates'][task][side]:>12.1f}"
                                                    for side in sides)
              + (f"{s['ratios'][task]:>15.2f}{s['model_ratios'][task]:>15.2f}" if task in s["ratios"] else ""))
    mb = 2 ** 20
    for side in sides:
        memory = s["sides"][side]["memory"]
        held = (f", variables held {memory['held'] / mb:.0f} MiB ({memory['held'] / memory['weights']:.2f} x the "
                f"weights) by {memory['programs']} programs" if "held" in memory else "")
        print(f"memory {side}: peak RSS {memory['peak_rss'] / mb:.0f} MiB, weights {memory['weights'] / mb:.0f} MiB "
              f"float32{held}")


def main(argv=None) -> int:
    args = parse(argv)
    if args.worker:
        print(MARK + json.dumps(worker(args.worker, args.folder, args.batch_size)), flush=True)
        return 0
    try:
        s = measure(args)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print_table(s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
