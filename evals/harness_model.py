"""An lm-evaluation-harness model (`lm_eval.api.model.TemplateLM`, registered as "gpt-neo-mtf") backed by one
of our checkpoints: a thin client of infer/run.py's PREDICT graph, as the eval tasks and --predict are.

* `loglikelihood`: the harness's TemplateLM encodes each (context, continuation) as its HF backend does (the
  whole text encoded, the context's tokens split off; an empty context becomes the eos token, and so does a
  context of only whitespace, which the harness moves into the continuation); each request is one row of
  (context + continuation)[-(n_ctx + 1):] scored in one forward pass (infer/outputs.py's token_loss and
  token_correct): the continuation's summed log-probability, and whether every one of its tokens is the argmax.
  A model trained on `entmax_loss` has no such log-likelihoods: its log-likelihood requests are refused.
* `loglikelihood_rolling`: the harness's own rolling windows of n_ctx tokens (lm_eval.utils), each scored as
  a loglikelihood request, summed per text.
* `generate_until`: models/sampling.py's sampler (kv cache where the model has it), greedy unless the request
  asks for a temperature, stopping at the eos token, at a token whose text holds a stop sequence, or after
  max_gen_toks; the text is cut at the first stop sequence. Prompts are cut from the left to n_ctx - max_gen_toks
  tokens, as the HF backend cuts them. Of the request's generation settings, until, max_gen_toks, do_sample,
  temperature, top_k and top_p are followed; any other is named in one warning and ignored. A sampled request's
  seed is a hash of its prompt, its settings, the config's sampling_seed (else seed) and how many identical
  requests came before it, and it runs in a row of its own (the sampler's noise also depends on the row): its
  sample does not depend on which other requests run (`--limit`) or in which order.

Requests are sorted by length, longest first (as the HF backend sorts them), and scored in rows of a few
lengths (powers of two up to n_ctx; a length with less than a batch of rows joins the next): one PREDICT graph
per length, so short requests are not padded to n_ctx. Every batch is batch_size rows (a short one padded), so
the programs of one length serve every task of a run: a program costs more to build and start (~0.3-0.5 s at
4 x 256) than scoring a batch's padding rows.
Models whose outputs might depend on the row length (a layout splitting 'sequence', a layer or option without
an incremental path) are scored at n_ctx. A progress bar counts the requests.

From Python, the harness's own way to name a model works once this module is imported (it registers the name):
`lm_eval.simple_evaluate(model="gpt-neo-mtf", model_args="model=NAME,step=1000,batch_size=8", tasks=[...])`, with
NAME a config as main.py's --model takes it (see `create_from_arg_string`).

The model runs in the precision of the evaluations (devices/precision.py's `for_inference`: training's on this
device, or float32 with `eval_precision`), resolved where the model is made, whichever way it is made.
"""
from __future__ import annotations

import hashlib
import sys
from typing import Optional

import numpy as np
from lm_eval import utils as harness_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from tqdm import tqdm

from data.errors import DataError
from infer import run
from models.attention import incremental_unsupported
from models.sampling import SamplingOptions
from devices import precision

MODEL_NAME = "gpt-neo-mtf"
SHORTEST_ROW = 16  # the shortest row length scored: below it a graph costs more to build than it saves
# The generation settings the sampler follows (normalize_gen_kwargs gives every request do_sample and temperature).
GENERATION_SETTINGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p")


def row_length(tokens: int, n_ctx: int, by_length: bool) -> int:
    """The row length that scores `tokens` positions: the next power of two (at least SHORTEST_ROW), at most
    n_ctx; n_ctx when rows are not cut by length."""
    if not by_length:
        return n_ctx
    length = SHORTEST_ROW
    while length < tokens:
        length *= 2
    return min(length, n_ctx)


def length_groups(lengths: list[int], members: list[int], n_ctx: int, by_length: bool, batch_size: int) -> dict:
    """{row length: members} for members (longest first) of these token lengths. A group of fewer rows than
    a batch joins the next longer one: a graph of its own would cost more to build than the padding."""
    groups: dict[int, list[int]] = {}
    for length, member in zip(lengths, members):
        groups.setdefault(row_length(length, n_ctx, by_length), []).append(member)
    merged: dict[int, list[int]] = {}
    carried: list[int] = []
    for length in sorted(groups):
        carried = groups[length] + carried  # longest first within the group
        if len(carried) >= batch_size or length == max(groups):
            merged[length], carried = carried, []
    return dict(sorted(merged.items(), reverse=True))


def request_seed(base: int, context: str, settings: dict, occurrence: int) -> int:
    """A sampled request's seed in [0, 2**31): a hash of the run's seed, its prompt, its generation settings and
    how many identical requests came before it (a task's `repeats` ask for several samples of one request)."""
    text = repr((int(base), context, sorted((str(k), repr(v)) for k, v in settings.items()), int(occurrence)))
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:4], "little") % (2 ** 31)


def rows_by_length_safe(cfg) -> bool:
    """Whether scoring rows shorter than n_ctx gives the same outputs: every layer and option has an
    incremental path (so a position's outputs depend on no later position) and no layout splits 'sequence'
    (whose split must divide the row)."""
    return incremental_unsupported(cfg) is None and "sequence" not in dict(cfg.layout_rules)


@register_model(MODEL_NAME)
class CheckpointLM(TemplateLM):
    """The harness's view of a checkpoint of `cfg`'s model on `placement`, tokenized by `tokenizer`
    (data/tokenizer.py's LoadedTokenizer); `batch_size` rows per forward pass (default eval_batch_size)."""

    def __init__(self, cfg, placement, checkpoint: str, tokenizer, batch_size: Optional[int] = None,
                 predictor: Optional[run.Predictor] = None):
        """`predictor`: the programs to score with, at `checkpoint` (kept by the caller across checkpoints); by
        default each batch of requests builds its own (infer/run.py's predict)."""
        super().__init__()
        if cfg.mlm_training:
            raise DataError("a masked language model (mlm_training) does not score text left to right: evaluate a "
                            "causal model with the harness")
        cfg = precision.for_inference(cfg, placement)  # a config already resolved (evals/harness.py's) stays
        self.cfg, self.placement, self.checkpoint, self.tokenizer_ = cfg, placement, checkpoint, tokenizer
        self.predictor = predictor
        self.batch_size = batch_size or cfg.eval_batch_size
        self.by_length = rows_by_length_safe(cfg)
        eos = cfg.eos_id if cfg.eos_id is not None else tokenizer.eos_id
        if eos is None:
            raise DataError("the harness needs an end-of-text token (empty contexts, rolling windows, generation's "
                            "stop): set eos_id in the dataset config")
        self._eot = int(eos)
        self.padding = cfg.padding_id if cfg.padding_id is not None else 0
        self._ignored_settings: set = set()  # generation settings already named in a warning

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: Optional[dict] = None) -> "CheckpointLM":
        """The model `simple_evaluate(model="gpt-neo-mtf", model_args=...)` names: `model=NAME` (a config name in
        configs/ or a path to one, as main.py's --model), optionally `step=N` (a checkpoint of model_path; default
        the newest), `batch_size=B` (default: simple_evaluate's batch_size if a number, else eval_batch_size) and
        `eval_precision=float32` (the config key: float32 scoring instead of training's precision).
        The config is read and checked as main.py reads it; the mesh runs on this host's CPU devices or GPUs as
        main.py places it without device flags."""
        from data.tokenizer import load_for_config
        from config import load_config
        from modelpath import checkpoints
        from devices import kinds
        from devices.placement import DeviceRequest

        args = harness_utils.simple_parse_args_string(arg_string or "")
        unknown = sorted(set(args) - {"model", "step", "batch_size", "eval_precision"})
        if unknown or "model" not in args:
            raise DataError(f"model_args {arg_string!r}: give model=NAME (a config), optionally step=N, batch_size=B "
                            f"and eval_precision=float32" + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
        for key in ("step", "batch_size"):
            if key in args and (type(args[key]) is not int or args[key] < (0 if key == "step" else 1)):
                raise DataError(f"model_args {key}={args[key]!r}: give a whole number"
                                + (" (a checkpoint's step)" if key == "step" else " of rows, at least 1"))
        overrides = {"eval_precision": str(args["eval_precision"])} if "eval_precision" in args else None
        cfg = load_config(str(args["model"]), overrides)
        if "step" in args:
            step = args["step"]
            if step not in checkpoints.steps(cfg.model_path):
                raise DataError(f"no checkpoint of step {step} in {cfg.model_path}: its steps are "
                                f"{checkpoints.steps(cfg.model_path) or 'none'}")
            checkpoint = checkpoints.prefix_of(cfg.model_path, step)
        else:
            checkpoint = checkpoints.restorable(cfg.model_path)
            if checkpoint is None:
                raise DataError(f"no checkpoint in {cfg.model_path}: train the model first, or name a config "
                                f"whose model_path holds one")
        given = (additional_config or {}).get("batch_size")
        batch_size = args.get("batch_size", given if isinstance(given, int) else None)
        return cls(cfg, kinds.place(DeviceRequest(), cfg), checkpoint, load_for_config(cfg), batch_size)

    # ---- what TemplateLM asks of a model -------------------------------------------------------------

    @property
    def eot_token_id(self) -> int:
        return self._eot

    @property
    def max_length(self) -> int:
        return self.cfg.n_ctx

    @property
    def max_gen_toks(self) -> int:
        return 256  # the HF backend's default

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
        return self.tokenizer_.encode(string)

    def tok_decode(self, tokens) -> str:
        return self.tokenizer_.backend.decode([int(t) for t in tokens], skip_special_tokens=True)

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer_.path

    # ---- scoring -------------------------------------------------------------------------------------

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """(log P(continuation | context), whether greedy decoding gives the continuation) per request of
        (strings, context ids, continuation ids)."""
        if self.cfg.entmax_loss:  # before anything is scored: no request of such a task gets a number
            raise DataError("a model trained with entmax_loss has no softmax log-likelihoods to score "
                            "loglikelihood requests with (multiple choice, perplexity): run generation tasks only "
                            "with this model, or evaluate one trained on cross-entropy")
        n_ctx = self.cfg.n_ctx
        rows = []
        for _, context, continuation in requests:
            if not context:  # a context of only whitespace, which lm-eval moved into the continuation: as an
                # empty one, it becomes the eos token (lm-eval's TemplateLM.loglikelihood's rule for "")
                context, continuation = (([self.prefix_token_id], continuation)
                                         if continuation[:1] != [self.prefix_token_id] else
                                         (continuation[:1], continuation[1:]))
            if not continuation:
                raise DataError("a loglikelihood request has an empty continuation: its task gives an empty target")
            if len(continuation) > n_ctx:
                raise DataError(f"a continuation of {len(continuation)} tokens does not fit n_ctx {n_ctx}: score "
                                f"shorter targets, or use a model with a longer context")
            whole = (list(context) + list(continuation))[-(n_ctx + 1):]  # cut from the left, as the HF backend does
            rows.append((whole, len(continuation)))
        results: list = [None] * len(rows)
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))  # longest first
        groups = length_groups([len(rows[i][0]) - 1 for i in order], order, n_ctx, self.by_length, self.batch_size)
        with tqdm(total=len(rows), desc="loglikelihood requests", unit="request", dynamic_ncols=True,
                  disable=disable_tqdm) as bar:
            for length, members in groups.items():
                tokens = np.full([len(members), length], self.padding, np.int32)
                targets = np.full([len(members), length], self.padding, np.int32)
                for row, i in enumerate(members):
                    whole = rows[i][0]
                    tokens[row, :len(whole) - 1], targets[row, :len(whole) - 1] = whole[:-1], whole[1:]
                out = self._predict({"tokens": tokens, "targets": targets}, self.batch_size, on_batch=bar.update)
                for row, i in enumerate(members):
                    end = len(rows[i][0]) - 1
                    span = slice(end - rows[i][1], end)
                    results[i] = (-float(out["token_loss"][row, span].astype(np.float64).sum()),
                                  bool(out["token_correct"][row, span].all()))
        for (strings, _, _), answer in zip(requests, results):
            if strings is not None:
                self.cache_hook.add_partial("loglikelihood", strings, answer)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each text's log-likelihood over the harness's disjoint rolling windows of n_ctx tokens (the first
        predicted from the eos token)."""
        windows, owner = [], []
        for index, (text,) in enumerate(request.args for request in requests):
            for context, continuation in map(harness_utils.make_disjoint_window, harness_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id, max_seq_len=self.max_length,
                    context_len=1)):
                windows.append((None, context, continuation))
                owner.append(index)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for index, (logprob, _) in zip(owner, scores):
            totals[index] += logprob
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    # ---- generation ----------------------------------------------------------------------------------

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Each context's continuation until a stop sequence (the eos token's text among them) or max_gen_toks
        tokens; requests with the same generation settings are batched, longest prompts first."""
        eos_text = self.tokenizer_.backend.decode([self.eot_token_id], skip_special_tokens=False)
        groups: dict[str, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(repr(sorted(request.args[1].items())), []).append(i)
        seeds, seen = [], {}  # each request's seed, from the request itself (`request_seed`)
        base = self.cfg.sampling_seed if self.cfg.sampling_seed is not None else self.cfg.seed
        for request in requests:
            key = (request.args[0], repr(sorted(request.args[1].items())))
            seen[key] = seen.get(key, -1) + 1
            seeds.append(request_seed(base, request.args[0], request.args[1], seen[key]))
        results: list = [None] * len(requests)
        with tqdm(total=len(requests), desc="generate_until requests", unit="request", dynamic_ncols=True,
                  disable=disable_tqdm) as bar:
            for members in groups.values():
                settings = normalize_gen_kwargs(dict(requests[members[0]].args[1]), self.max_gen_toks)
                self._warn_ignored(settings)
                until = handle_stop_sequences(settings.pop("until", None), eos=eos_text)
                options = self._sampling_options(settings, self._stop_ids(until))
                keep = self.cfg.n_ctx - options.max_new_tokens
                if keep < 1:
                    raise DataError(f"max_gen_toks {options.max_new_tokens} leaves no room for a prompt in n_ctx "
                                    f"{self.cfg.n_ctx}: lower the task's max_gen_toks")
                prompts = {i: (self.tok_encode(requests[i].args[0])[-keep:] or [self.prefix_token_id]) for i in members}
                # the kv cache's prefill over the longest prompt's bucket, not all n_ctx positions: one program per
                # bucket, kept by the Predictor
                options = options.with_prefill_bucket([len(p) for p in prompts.values()], self.cfg.n_ctx)
                members = sorted(members, key=lambda i: -len(prompts[i]))
                tokens = np.full([len(members), self.cfg.n_ctx], self.padding, np.int32)
                for row, i in enumerate(members):
                    tokens[row, :len(prompts[i])] = prompts[i]
                # Each row's draw from its request's seed alone (draw_row 0, not its place in the batch), so sampled
                # requests share batches and draw what they would alone
                features = {"tokens": tokens, "prompt_length": np.array([len(prompts[i]) for i in members], np.int32),
                            "seed": np.array([seeds[i] for i in members], np.int32),
                            "draw_row": np.zeros(len(members), np.int32)}
                out = self._predict(features, self.batch_size, options, on_batch=bar.update)
                for row, i in enumerate(members):
                    new = out["tokens"][row, len(prompts[i]):out["lengths"][row]]
                    text = postprocess_generated_text(self.tok_decode(new), until, None)
                    results[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return results

    def _warn_ignored(self, settings: dict) -> None:
        """One warning line naming the request's generation settings the sampler does not follow (num_beams,
        repetition_penalty, ...), each named once: its generations are greedy or sampled as if they were absent."""
        ignored = sorted(set(settings) - set(GENERATION_SETTINGS) - self._ignored_settings)
        if ignored:
            self._ignored_settings.update(ignored)
            tqdm.write(f"warning: {MODEL_NAME} ignores the generation settings {', '.join(ignored)} that a task asks "
                       f"for (it follows {', '.join(GENERATION_SETTINGS)}): its generations may differ from the hf "
                       f"backend's", file=sys.stderr)  # above the requests' progress bar, not inside it

    def _predict(self, rows: dict, batch_size: int, options=None, on_batch=None) -> dict:
        if self.predictor is not None:
            return self.predictor.predict(rows, batch_size, options, on_batch=on_batch)
        return run.predict(self.cfg, self.placement, rows, batch_size, self.checkpoint, options, on_batch=on_batch)

    def _sampling_options(self, settings: dict, stop_ids: tuple) -> SamplingOptions:
        """The sampler's settings for one group of requests: greedy unless the request asks for a temperature
        (normalize_gen_kwargs sets it to 0 unless do_sample)."""
        return SamplingOptions.from_config(
            self.cfg, max_new_tokens=int(settings["max_gen_toks"]), temperature=float(settings.get("temperature", 0.0)),
            top_k=int(settings.get("top_k") or 0), top_p=float(settings.get("top_p") or 1.0),
            stop_id=self.eot_token_id, stop_ids=stop_ids, remove_partial_sequences=False, entmax_alpha=None)

    def _stop_ids(self, until: list[str]) -> tuple:
        """The tokens whose own text holds a stop sequence: a row may stop at one, since its text is cut at or
        before that token anyway (stop sequences spread over several tokens are cut from the full text)."""
        if not hasattr(self, "_token_texts"):
            decode = self.tokenizer_.backend.decode
            count = min(self.cfg.n_vocab, self.tokenizer_.vocab_size)  # n_vocab may be padded past the tokenizer's
            self._token_texts = [decode([i], skip_special_tokens=True) for i in range(count)]
        stops = [s for s in until if s]
        return tuple(i for i, text in enumerate(self._token_texts) if any(s in text for s in stops))
