"""evals/harness_model.py: the harness's model (`gpt-neo-mtf`, `CheckpointLM`) on our checkpoints, offline,
against the harness's own `hf` backend on the to_hf folder of the same checkpoint (weights of order one, where a
wrong position, span or truncation moves a log-likelihood by far more than float32 rounding does); requests
grouped by row length, the model named by its config, whitespace contexts, generation settings, sampled
requests' seeds and the precision it runs in. (evals/harness.py's tasks checked and run at checkpoints:
tests/evals/test_harness.py.)

The shipped tiny tasks (tests/fixtures/harness_tasks/) run through the harness's own evaluator with each backend; every
request's answer and every metric must agree."""
import contextlib
import os

import pytest

lm_eval = pytest.importorskip("lm_eval")

from config import load_config, replace  # noqa: E402
from evals import harness  # noqa: E402
from tiny import checkpoint_of_order_one_weights, placement_for  # noqa: E402
from workspace import REPO, make_workspace  # noqa: E402

TASKS = os.path.join(REPO, "tests", "fixtures", "harness_tasks")
TINY_TASKS = ("tiny_choice", "tiny_lambada", "tiny_rolling", "tiny_generate")


def checkpoint_at_order_one_weights(root):
    """A workspace model under root (n_ctx 32, the committed tokenizer) at a checkpoint of weights of order one
    (model_path/model.ckpt-1); its config."""
    cfg = load_config(make_workspace(root))
    os.makedirs(cfg.model_path)
    checkpoint_of_order_one_weights(cfg, os.path.join(cfg.model_path, "model.ckpt-1"))
    return cfg


@pytest.fixture(scope="module")
def checkpoint_run(tmp_path_factory):
    """A workspace model (n_ctx 32, the committed tokenizer) at a checkpoint of weights of order one, and its
    HF folder."""
    root = tmp_path_factory.mktemp("harness")
    cfg = checkpoint_at_order_one_weights(root)
    from tools import hf
    hf.to_hf(cfg, cfg.model_path, str(root / "hf"))
    return root, cfg


def evaluate(model, manager, tasks, **options):
    from lm_eval import evaluator
    return evaluator.simple_evaluate(model=model, tasks=tasks, task_manager=manager, log_samples=True,
                                     bootstrap_iters=0, **options)


def answers(results, task):
    """Per document (by doc_id), the backend's raw answers: [(log-likelihood, greedy)], [log-likelihood] or
    [text]."""
    return {s["doc_id"]: [tuple(r) if isinstance(r, (list, tuple)) else r for r in (x[0] for x in s["resps"])]
            for s in results["samples"][task]}


@pytest.mark.slow
def test_tiny_tasks_agree_with_the_harness_hf_backend(checkpoint_run, monkeypatch):
    """Every request type through the harness's evaluator, offline, ours against lm-eval's `hf` backend (PyTorch)
    on the same weights: per-request log-likelihoods within 1e-4 relative, the same greedy flags and so the same
    accuracies, the same rolling perplexities and the same greedy generations cut at the same stop sequences.
    The requests include contexts longer than n_ctx (cut from the left), an empty context, continuations of
    several tokens and rows of different lengths in one batch.
    Bugs caught: the continuation's span off by one position, contexts cut from the right (or not at all), an
    empty context not given the eos token, rolling windows summed wrongly, a generation that keeps the stop
    sequence or the prompt, results returned in sorted instead of request order, rows that stop at a token
    holding no stop sequence."""
    torch = pytest.importorskip("torch")
    from lm_eval.models.huggingface import HFLM
    root, cfg = checkpoint_run
    prepared = harness.prepare(harness.HarnessOptions(tasks=TINY_TASKS, include_path=TASKS))
    from evals.harness_model import CheckpointLM
    from data.tokenizer import load_for_config
    # float32 as HF's side, on every CPU (precision auto would score in bf16 on one with bf16 units): the
    # precision the harness's model runs in is the test below's
    cfg = replace(cfg, precision="float32")
    ours_lm = CheckpointLM(cfg, placement_for(cfg), os.path.join(cfg.model_path, "model.ckpt-1"), load_for_config(cfg),
                           batch_size=4)
    from infer import run
    row_lengths, predict = [], run.predict

    def recording(cfg, placement, rows, *args, **kwargs):
        row_lengths.append(rows["tokens"].shape[1])
        return predict(cfg, placement, rows, *args, **kwargs)

    monkeypatch.setattr(run, "predict", recording)
    ours = evaluate(ours_lm, prepared.manager, prepared.tasks)
    assert min(row_lengths) < cfg.n_ctx == max(row_lengths)  # rows cut to the requests' length, and whole ones
    torch.manual_seed(0)
    hf_lm = HFLM(pretrained=str(root / "hf"), device="cpu", batch_size=4, dtype="float32")
    theirs = evaluate(hf_lm, prepared.manager, prepared.tasks)

    # The cases the request set must hold, from the harness's own requests.
    requests = [args for task in ("tiny_choice", "tiny_lambada") for s in ours["samples"][task] for args in s["arguments"]]
    contexts = [ours_lm.tok_encode(context) for context, _ in requests]
    continuations = [ours_lm.tok_encode(continuation) for _, continuation in requests]
    assert any(len(c) == 0 for c in contexts)                     # an empty context
    assert any(len(c) > cfg.n_ctx for c in contexts)              # cut from the left
    assert any(len(c) > 1 for c in continuations)                 # several tokens
    assert len({len(a) + len(b) for a, b in zip(contexts, continuations)}) > 4  # mixed lengths

    for task in ("tiny_choice", "tiny_lambada"):
        ours_answers, their_answers = answers(ours, task), answers(theirs, task)
        assert ours_answers.keys() == their_answers.keys()
        for doc, responses in ours_answers.items():
            for (ll, greedy), (their_ll, their_greedy) in zip(responses, their_answers[doc], strict=True):
                assert abs(their_ll) > 1  # weights of order one: log-likelihoods far from 0
                assert ll == pytest.approx(their_ll, rel=1e-4), (task, doc)
                assert greedy == their_greedy, (task, doc)
    for doc, responses in answers(ours, "tiny_rolling").items():
        assert responses == pytest.approx(answers(theirs, "tiny_rolling")[doc], rel=1e-4)
    generated = answers(ours, "tiny_generate")
    assert generated == answers(theirs, "tiny_generate")
    assert any(text for texts in generated.values() for text in texts)  # not all cut to nothing at once

    # A stop sequence the generation does reach: a piece from the middle of the hf backend's free generation.
    from lm_eval.api.instance import Instance

    def generate(lm, prompts, until):
        return lm.generate_until([Instance("generate_until", {}, (p, {"until": until, "max_gen_toks": 8,
                                                                      "do_sample": False}), i)
                                  for i, p in enumerate(prompts)])

    prompts = ["import os\nimport sys\n", "def read_header(self, name):"]
    free = generate(hf_lm, prompts[:1], [])[0]
    stop = free[len(free) // 2:len(free) // 2 + 2]
    assert stop.strip() and free.index(stop) > 0, free
    ours_cut = generate(ours_lm, prompts, [stop])
    assert ours_cut == generate(hf_lm, prompts, [stop])
    assert ours_cut[0] == free[:free.index(stop)]  # cut before the stop sequence, which is not kept

    ours_metrics, their_metrics = harness.task_metrics(ours), harness.task_metrics(theirs)
    for task in TINY_TASKS:
        assert ours_metrics[task].keys() == their_metrics[task].keys()
        for name, value in ours_metrics[task].items():
            assert value == pytest.approx(their_metrics[task][name], rel=1e-4), (task, name)
    assert ours_metrics["tiny_rolling"]["bits_per_byte"] > 0


def test_requests_are_grouped_by_row_length():
    """Longest first, in power-of-two row lengths up to n_ctx; a length with less than a batch of rows joins the
    next longer one; n_ctx only where rows may not be cut."""
    from evals.harness_model import length_groups, row_length
    assert [row_length(n, 64, True) for n in (1, 16, 17, 33, 64)] == [16, 16, 32, 64, 64]
    assert row_length(3, 64, False) == 64
    assert length_groups([60, 30, 20, 15, 10, 3], list("abcdef"), 64, True, 2) == \
        {64: ["a"], 32: ["b", "c"], 16: ["d", "e", "f"]}
    assert length_groups([60, 30, 20, 15, 10, 3], list("abcdef"), 64, True, 4) == {64: ["a"], 32: list("bcdef")}
    assert list(length_groups([60, 30, 20, 15, 10, 3], list("abcdef"), 64, True, 4)) == [64, 32]


def test_the_harness_names_our_model_by_its_config(checkpoint_run):
    """`simple_evaluate(model="gpt-neo-mtf", model_args="model=CONFIG,step=N,batch_size=B")`, the harness's own
    way to name a model, reads the config as main.py does and scores what the model built by hand scores, at
    the checkpoint of that step; a step without a checkpoint, a bad value or a missing model= is a DataError
    naming the fix.
    Bugs caught: the step ignored (the newest checkpoint scored), simple_evaluate's batch size "auto" passed on
    as a number of rows, model_args' unknown keys dropped silently."""
    from evals.harness_model import CheckpointLM, MODEL_NAME
    from data.errors import DataError
    from data.tokenizer import load_for_config
    root, cfg = checkpoint_run
    config = str(root / "configs" / "tiny.json")
    first = os.path.join(cfg.model_path, "model.ckpt-1")
    for suffix in (".index", ".data-00000-of-00001"):  # a newer checkpoint of other weights: step=1 must skip it
        assert os.path.exists(first + suffix)
    state = os.path.join(cfg.model_path, "checkpoint")
    kept_state = open(state).read()
    checkpoint_of_order_one_weights(cfg, os.path.join(cfg.model_path, "model.ckpt-2"), seed=5)
    try:
        named = CheckpointLM.create_from_arg_string(f"model={config},step=1,batch_size=3", {"batch_size": "auto"})
        assert named.checkpoint == first and named.batch_size == 3
        assert CheckpointLM.create_from_arg_string(f"model={config}", {"batch_size": "auto"}).batch_size == \
            cfg.eval_batch_size
        prepared = harness.prepare(harness.HarnessOptions(tasks=("tiny_lambada",), include_path=TASKS))
        by_name = evaluate(MODEL_NAME, prepared.manager, prepared.tasks, model_args=f"model={config},step=1", limit=6)
        by_hand = evaluate(CheckpointLM(cfg, placement_for(cfg), first, load_for_config(cfg)), prepared.manager,
                           prepared.tasks, limit=6)
        assert answers(by_name, "tiny_lambada") == pytest.approx(answers(by_hand, "tiny_lambada"))
        for args, message in [(f"model={config},step=7", "no checkpoint of step 7"),
                              (f"model={config},step=one", "step='one': give a whole number"),
                              (f"model={config},batch_size=0", "batch_size=0: give a whole number"),
                              (f"model={config},steps=1", "unknown: steps"),
                              ("step=1", "give model=NAME")]:
            with pytest.raises(DataError, match=message):
                CheckpointLM.create_from_arg_string(args)
    finally:
        for name in os.listdir(cfg.model_path):  # the module's other tests read the step-1 checkpoint as newest
            if name.startswith("model.ckpt-2"):
                os.remove(os.path.join(cfg.model_path, name))
        with open(state, "w") as f:
            f.write(kept_state)


@contextlib.contextmanager
def checkpoint_lm(cfg, **changes):
    """Our harness model of the module's checkpoint (weights of order one), its config changed by `changes`, its
    programs kept from call to call (as evals/harness.py keeps them)."""
    from data.tokenizer import load_for_config
    from evals.harness_model import CheckpointLM
    from infer import run
    from config import replace
    from devices import precision
    cfg = replace(cfg, **changes) if changes else cfg
    placement, checkpoint = placement_for(cfg), os.path.join(cfg.model_path, "model.ckpt-1")
    with run.Predictor(precision.for_inference(cfg, placement), placement, checkpoint) as predictor:
        yield CheckpointLM(cfg, placement, checkpoint, load_for_config(cfg), batch_size=4, predictor=predictor)


def instances(kind, arguments):
    from lm_eval.api.instance import Instance
    return [Instance(kind, {}, args, i) for i, args in enumerate(arguments)]


def test_a_context_of_only_whitespace_is_scored_as_an_empty_one(checkpoint_run):
    """lm-eval moves a context's trailing whitespace into the continuation, so a context of only whitespace
    encodes to no tokens: it is scored after the end-of-text token, as the harness scores an empty context with
    the whitespace in the continuation (and as the `hf` backend scores an empty context), never as a free answer.
    Bug caught: the context's tokens taken as they come (`if not context:` branch gone), which scores such a
    request (0.0, greedy): certain, and the winner of any multiple-choice question."""
    _, cfg = checkpoint_run
    with checkpoint_lm(cfg) as lm:
        blank, empty, worded = lm.loglikelihood(instances("loglikelihood", [
            ("  ", " import os"), ("", "   import os"), ("Question: which module?", " import os")]))
    assert blank == pytest.approx(empty, rel=1e-6)
    assert blank[0] < -1 and worded[0] < -1  # weights of order one: far from a certain 0.0


def test_every_batch_is_batch_size_rows_so_one_program_serves_each_length(checkpoint_run, monkeypatch):
    """Scoring and greedy generation ask for batches of batch_size rows however few requests a group holds (a
    short batch is padded), so the program of a length built for one task serves the next. Bug caught: a group's
    program built at its own count of rows (`min(batch_size, rows)`), so a task's last few requests and the next
    task's full batches of the same length built two programs (a second or so each at 4 x 256)."""
    import numpy as np
    _, cfg = checkpoint_run
    asked = []

    def fake_predict(rows, batch_size, options=None, on_batch=None):
        asked.append(batch_size)
        on_batch(len(rows["tokens"]))
        if options is None:
            return {"token_loss": np.zeros(rows["tokens"].shape, np.float32),
                    "token_correct": np.ones(rows["tokens"].shape, bool)}
        return {"tokens": rows["tokens"], "lengths": rows["prompt_length"]}

    with checkpoint_lm(cfg) as lm:
        monkeypatch.setattr(lm, "_predict", fake_predict)
        lm.loglikelihood(instances("loglikelihood", [("import os", " x")]))
        lm.generate_until(instances("generate_until", [("def f(", {"until": ["\n"], "max_gen_toks": 2})]))
    assert asked == [4, 4] and lm.batch_size == 4


@pytest.mark.slow
def test_generation_settings_the_sampler_does_not_follow_are_named_once(checkpoint_run, capsys, monkeypatch):
    """A task's generation_kwargs beyond until, max_gen_toks, do_sample, temperature, top_k and top_p (HF's
    num_beams, repetition_penalty, ...) are named in one `warning:` line, once per model, not dropped silently;
    the ones it follows say nothing. The sampler itself is not run (each group's prompt, nothing generated): the
    warning comes before it, and its programs are tested above.
    Bug caught: `_warn_ignored` not called (the settings dropped without a word)."""
    _, cfg = checkpoint_run
    asking = {"until": ["\n"], "max_gen_toks": 2, "num_beams": 4, "repetition_penalty": 1.2}

    def prompts_only(rows, batch_size, options=None, on_batch=None):
        on_batch(len(rows["tokens"]))
        return {"tokens": rows["tokens"], "lengths": rows["prompt_length"]}

    with checkpoint_lm(cfg) as lm:
        monkeypatch.setattr(lm, "_predict", prompts_only)
        lm.generate_until(instances("generate_until", [("def f(", dict(asking)), ("class A", dict(asking))]))
        lm.generate_until(instances("generate_until", [("def g(", dict(asking))]))
        warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
        assert len(warnings) == 1 and "num_beams, repetition_penalty" in warnings[0], warnings
        lm.generate_until(instances("generate_until", [("def h(", {"until": ["\n"], "max_gen_toks": 2,
                                                                  "do_sample": False, "temperature": 0.0})]))
        assert "warning:" not in capsys.readouterr().err


@pytest.mark.slow
def test_each_group_of_generations_prefills_over_its_longest_prompts_bucket(checkpoint_run, monkeypatch):
    """generate_until asks the sampler for a prefill over the smallest power of two that holds the group's longest
    prompt (capped at n_ctx), per group of generation settings, not over all n_ctx positions.
    Bugs caught: the bucket of the shortest prompt (`min` for `max`), one bucket for every group."""
    from models.sampling import prefill_bucket
    _, cfg = checkpoint_run
    seen = []

    def fake_predict(rows, batch_size, options=None, on_batch=None):
        seen.append((int(rows["prompt_length"].max()), options.prefill_length))
        on_batch(len(rows["tokens"]))
        return {"tokens": rows["tokens"], "lengths": rows["prompt_length"]}

    with checkpoint_lm(cfg) as lm:
        monkeypatch.setattr(lm, "_predict", fake_predict)
        greedy, longer = {"until": ["\n"], "max_gen_toks": 2}, {"until": ["\n"], "max_gen_toks": 4}
        lm.generate_until(instances("generate_until", [("x", dict(greedy)), ("def read_header(self, name):",
                                                                              dict(greedy)), ("import os", dict(longer))]))
    assert [length for length, _ in seen] == [len(lm.tok_encode("def read_header(self, name):")),
                                              len(lm.tok_encode("import os"))]
    assert seen[0][0] > 4 and seen[1][0] > 1  # buckets other than one another's or the shortest's
    assert [bucket for _, bucket in seen] == [prefill_bucket(length, cfg.n_ctx) for length, _ in seen]
    assert seen[0][1] != seen[1][1]


@pytest.mark.slow
def test_a_sampled_request_draws_the_same_sample_whichever_requests_run_beside_it(checkpoint_run):
    """A sampled generation (do_sample, temperature 1) is a function of the request and the config's seed alone:
    the same whether its neighbours run too (as --limit changes them) or in another order, though they share its
    batch; identical requests (a task's `repeats`) draw different samples; another sampling_seed draws others.
    Bugs caught: the seed taken from the request's place in its sorted group (np.arange, as before), the row's
    place in its batch hashed into its draw (no "draw_row" fed), every repeat of a request given one seed."""
    from evals.harness_model import CheckpointLM
    from config import replace
    _, cfg = checkpoint_run
    settings = {"until": ["\n\n"], "max_gen_toks": 8, "do_sample": True, "temperature": 1.0}
    prompts = ["import os\nimport sys\n", "def read_header(self, name):", "class Parser(object):", "x = ["]
    with checkpoint_lm(cfg, sampling_seed=11) as lm:
        calls, predict = [], lm._predict
        lm._predict = lambda rows, batch_size, *args, **kwargs: calls.append(
            (len(rows["tokens"]), batch_size)) or predict(rows, batch_size, *args, **kwargs)
        all_four = lm.generate_until(instances("generate_until", [(p, dict(settings)) for p in prompts]))
        assert len(set(all_four)) == 4 and all(all_four) and calls == [(4, 4)]  # the four in one batch
        some = lm.generate_until(instances("generate_until", [(p, dict(settings)) for p in prompts[:0:-1]]))
        assert some == all_four[:0:-1]
        repeated = lm.generate_until(instances("generate_until", [(prompts[1], dict(settings))] * 3))
        assert repeated[0] == all_four[1] and len(set(repeated)) == 3
        reseeded = CheckpointLM(replace(cfg, sampling_seed=12), lm.placement, lm.checkpoint, lm.tokenizer_,
                                batch_size=4, predictor=lm.predictor)  # the seeds are the programs' inputs
        other_seed = reseeded.generate_until(instances("generate_until", [(prompts[1], dict(settings))]))
    assert other_seed != [all_four[1]]


def test_the_harness_model_runs_in_trainings_precision_or_float32_from_its_model_args(checkpoint_run, monkeypatch):
    """`model_args="model=CONFIG"` runs the model as --eval does: in training's precision for the device (here a
    CPU with bf16 units, faked), resolved where the model is made; `eval_precision=float32` asks for float32.
    Bugs caught: CheckpointLM keeping the config's "auto" (models/gpt.py builds it in float32), model_args'
    eval_precision not reaching the config."""
    from evals.harness_model import CheckpointLM
    from devices import precision
    root, _ = checkpoint_run
    monkeypatch.setattr(precision, "cpu_info", lambda path="/proc/cpuinfo": ("test CPU", frozenset({"avx512_bf16"})))
    config = str(root / "configs" / "tiny.json")
    assert precision.running(CheckpointLM.create_from_arg_string(f"model={config}").cfg) == "bfloat16"
    assert precision.running(CheckpointLM.create_from_arg_string(f"model={config},eval_precision=float32").cfg) \
        == "float32"
