"""The config schema: model and dataset configs as typed, frozen objects, the checks between their fields,
and the quantities derived from them that several parts of the code need (mesh and layout parsing, micro-batch
counts).

It also says where configs are: `configs/NAME.json` for a name (`resolve_config_path`), read as JSON objects
(`read_json`), with dataset configs in `configs/dataset_configs/`; so a command line can find and read a config
without TensorFlow (run_experiment.py, the ladder's fit).

This module is the bottom of the project: it imports nothing of it, and knows no model internals. Resolving
dataset ids and the one check of a config are config.py's, above the models and data:
it runs `validate` here, then the checks against the registries of attention types, activations, MoE
hyperparameters, optimizers, sampling modes and input functions, and eval tasks, and the checks of a layout
against the model's tensor dimensions (models/layout.py); a changed copy of a config is its `replace`, which
runs them all again. Every problem is a `ConfigError` with a one-line message that says what to change.
"""
from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

REPO_ROOT = os.path.dirname(os.path.abspath(__file__))
CONFIG_DIR = os.path.join(REPO_ROOT, "configs")
DATASET_CONFIG_DIR = os.path.join(CONFIG_DIR, "dataset_configs")


class ConfigError(ValueError):
    """A config the user must fix. Its message is one line and names the fix."""


def resolve_config_path(name_or_path: str) -> str:
    """The file a config name (`configs/NAME.json`) or path means; a ConfigError naming the configs there are when
    it is not a file."""
    if name_or_path.endswith(".json") or os.sep in name_or_path:
        path = name_or_path
    else:
        path = os.path.join(CONFIG_DIR, name_or_path + ".json")
    if not os.path.isfile(path):
        available = sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".json"))
        raise ConfigError(f"model config {name_or_path!r} not found at {path}: pass a path to a .json or "
                          f"one of {', '.join(available)}")
    return path


def read_json(path: str, what: str) -> dict:
    """The JSON object in `path` (a `what`: "model config", "dataset config", ...); a ConfigError when it is not
    text, not JSON or not an object."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())  # bytes: json's own detection of UTF-8, -16 and -32
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} is not text (no JSON in UTF-8 or UTF-16/32): pass the .json file of the "
                          f"config, not a binary file") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{what} {path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}")
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} must hold a JSON object")
    return data


@dataclass(frozen=True)
class TokenizerId:
    """Which tokenizer a dataset was encoded with, or a model was trained with: a SHA-256 of its vocabulary and
    merges (data/tokenizer.py's LoadedTokenizer.tokenizer_id), its size and its end-of-text id. The `tokenizer_id`
    key of dataset and model configs (and of a model_path's tokenizer_id.json, modelpath/tokenizer_record.py),
    {"sha256": HEX, "size": N, "eos_id": ID, "from": PATH}; "from" only says where it was read, for messages.
    Records written before eos_id was recorded lack it: `matches` compares what both records have."""
    sha256: str
    size: int
    source: Optional[str] = field(default=None, compare=False)
    eos_id: Optional[int] = field(default=None, compare=False)  # None: not recorded (or the vocabulary has none)

    def matches(self, other: "TokenizerId") -> bool:
        """The same tokenizer: vocabulary, merges and size, and the end-of-text id where both record one."""
        return self == other and (self.eos_id is None or other.eos_id is None or self.eos_id == other.eos_id)

    def __str__(self) -> str:
        eos = f", end-of-text {self.eos_id}" if self.eos_id is not None else ""
        where = f", {self.source}" if self.source else ""
        return f"{self.sha256[:12]} ({self.size} tokens{eos}{where})"

    def encode_hint(self) -> str:
        """How to encode text with this tokenizer, for messages (" (python ...)"), or "" when it is not known where
        it was read: a tokenizer json is create_tfrecords' --encoder_path, a model folder its --tokenizer_from."""
        if not self.source or self.source.endswith(".manifest.json"):  # a manifest says which, not where it is
            return ""
        flag = "--encoder_path" if self.source.endswith(".json") else "--tokenizer_from"
        return f" (python data/create_tfrecords.py {flag} {self.source} ...)"

    def to_json(self) -> dict:
        record = {"sha256": self.sha256, "size": self.size}
        if self.eos_id is not None:
            record["eos_id"] = self.eos_id
        if self.source:
            record["from"] = self.source
        return record


def parse_tokenizer_id(value: Any, where: str) -> Optional[TokenizerId]:
    """A config's tokenizer_id record (None when absent); a ConfigError naming `where` when malformed."""
    if value is None:
        return None
    if isinstance(value, TokenizerId):
        return value

    def count(key, low):
        number = value.get(key)
        return not isinstance(number, bool) and isinstance(number, int) and number >= low

    if (not isinstance(value, dict) or not set(value) <= {"sha256", "size", "eos_id", "from"}
            or not isinstance(value.get("sha256"), str) or len(value["sha256"]) != 64 or not count("size", 1)
            or value.get("eos_id") is not None and not (count("eos_id", 0) and value["eos_id"] < value["size"])):
        raise ConfigError(f'tokenizer_id in {where} must be {{"sha256": "<64 hex digits>", "size": N, "eos_id": '
                          f"ID}} as data/create_tfrecords.py or tools/hf.py writes it, got {value!r}: delete it, or "
                          f"encode again to write it")
    return TokenizerId(value["sha256"].lower(), value["size"], value.get("from"), value.get("eos_id"))


@dataclass(frozen=True)
class TokenizerRecord:
    """One place that says which tokenizer encoded a dataset: its config's `tokenizer_id` key ("key"), a
    create_tfrecords manifest beside its files ("manifest"), or the tokenizer its `tokenizer_path` holds, read
    ("tokenizer_path"); `where` is the manifest's or tokenizer's path (the key's: the dataset config's)."""
    kind: str
    where: str
    tokenizer: TokenizerId


@dataclass(frozen=True)
class DatasetConfig:
    """One registered dataset: `configs/dataset_configs/<id>.json`."""
    id: str
    n_vocab: int
    path: str
    eval_path: Optional[str] = None
    tokenizer_path: Optional[str] = None
    tokenizer_is_pretrained: bool = False
    eos_id: Optional[int] = None
    padding_id: Optional[int] = None
    # What encoded it, as its records agree (the key's, else its tokenizer_path's, else its manifests'); None when
    # nothing records it. config.py reads the records; check_tokenizer_ids refuses records that disagree.
    tokenizer_id: Optional[TokenizerId] = None
    tokenizer_records: tuple = ()  # TokenizerRecord, in that order


@dataclass(frozen=True)
class DatasetUse:
    """One entry of a model config's `datasets`: [id, stitch, sampling_mode, weight], or a bare id (GPT-Neo's
    form, read sequentially: [id, 1, "sequential", 1.0])."""
    dataset: DatasetConfig
    stitch: int = 1
    sampling_mode: str = "documents_random"
    weight: float = 1.0


def option(default: Any = ()) -> Any:
    """A field that is a model option: it changes the model (its weights or what it computes) away from GPT-Neo's
    plain GPT. GPTConfig.model_options() lists those set, which is how the HF converter (tools/hf.py) and the
    kv-cache check (models/sampling.py) tell a model they can handle from one they cannot. A training setting
    (precision, recompute_grad, tokens_per_mb_per_replica, the optimizer's) is a plain field: it changes how a
    model is trained, not the model, so both ignore it."""
    return field(default=default, metadata={"model_option": True})


@dataclass(frozen=True)
class GPTConfig:
    # Architecture.
    n_layer: int
    n_embd: int
    n_head: int
    n_vocab: int
    n_ctx: int = 2048
    attention_types: tuple = ()          # one entry per layer, expanded from the compact form
    local_attention_radius: int = 256    # local attention sees the previous `radius` tokens, itself included
    activation_function: str = "gelu"
    scale_by_depth: bool = False
    scale_by_in: bool = False
    embed_dropout: float = 0.0
    attn_dropout: float = 0.0
    res_dropout: float = 0.0
    precision: str = "auto"              # devices/precision.py: bfloat16 on CPUs with bf16 matrix units, else float32
    allow_tf32: bool = False             # GPUs: float32 matmuls as TF32 (Ampere and newer); off: float32 is float32
    recompute_grad: bool = False
    z_loss: float = 1e-4                 # GPT-Neo's default auxiliary loss on log(Z) of the output softmax
    model: str = "GPT"
    tokenizer_id: Optional[TokenizerId] = None  # the model's tokenizer (tools/hf.py records it); its data must match

    # Model options (docs/models.md, "Model options"). Their defaults are the plain GPT above; a new one is declared
    # with option(), which is how incremental decoding and the HF converter know it changes the model.
    mlp_glu: bool = option(False)                # gated feed-forward: act(gate) * up
    scalenorm: bool = option(False)              # pre-norms with one scalar gain instead of LayerNorm's gain and bias
    rezero: bool = option(False)                 # no pre-norms; each residual branch times a learned scalar (init 0)
    macaron: bool = option(False)                # a half-weighted feed-forward before attention, and the other halved
    num_mem_kv: int = option(0)                  # learned memory key/values every query of a global layer sees
    moe_layers: tuple = option()                 # layers (from 0) whose feed-forward is a mixture of experts
    moe_params: tuple = option()                 # (key, value) pairs overriding models/moe.py's defaults
    moe_activation: Optional[str] = option(None)  # the experts' activation; None: activation_function
    axial_pos_emb: Optional[tuple] = option(None)   # (a, b), a*b >= n_ctx: axial instead of learned positions
    rotary_emb: bool = option(False)             # rotary positions in every attention layer instead of learned ones
    share_parameters: bool = option(False)       # every layer uses the same block weights
    no_weight_tie: bool = option(False)          # a separate output projection instead of the transposed wte
    mlm_training: bool = option(False)           # masked language modelling: bidirectional, loss on masked tokens
    mlm_mask_id: Optional[int] = option(None)
    mlm_cls_token_id: Optional[int] = option(None)
    mlm_mask_prob: float = option(0.15)
    mlm_same_token_prob: float = option(0.10)
    mlm_random_token_prob: float = option(0.10)
    mlm_mask_ignore_ids: tuple = option()

    # Optimisation.
    opt_name: str = "adam"
    lr: float = 1e-4
    warmup_steps: int = 0
    lr_decay: str = "cosine"
    lr_decay_end: Optional[int] = None   # step at which decay reaches 10% of lr; default train_steps
    lr_decay_share: float = 0.2          # lr_decay "wsd": the last share of lr_decay_end over which lr decays
    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-8
    ada_epsilon1: float = 1e-30
    ada_epsilon2: float = 1e-3
    weight_decay: float = 0.01
    gradient_clipping: Optional[float] = 1.0
    initial_loss_scale: float = 2.0 ** 15  # float16 precision: the dynamic loss scale's start (train/loss_scale.py)
    loss_scale_window: int = 2000        # float16: the loss scale doubles after this many steps without overflow
    entmax_loss: bool = False            # train on the entmax loss of the logits instead of cross-entropy
    entmax_alpha: float = 1.3            # alpha of entmax (loss and sampling): GPT-Neo's 1.3; 1.5 is entmax15
    log_grads: bool = False              # also log every variable's gradient norm (grad_norm/<variable>)
    wandb_project: Optional[str] = None  # also track the run in Weights & Biases, in this project (train/trackers.py)
    wandb_mode: str = "offline"          # "offline": written to model_path/wandb only (wandb sync uploads); "online"
    tokens_per_mb_per_replica: Optional[int] = None  # micro-batches of this many tokens per replica

    # Run.
    train_batch_size: int = 8
    train_steps: int = 1000
    eval_batch_size: int = 8
    eval_steps: int = 0
    predict_batch_size: int = 1
    predict_steps: int = 0
    iterations: int = 500
    steps_per_checkpoint: int = 1000
    keep_checkpoint_max: int = 5         # newest checkpoints kept in model_path
    keep_checkpoint_every_n_hours: float = 2.0  # and, of older ones, one per this many hours of training
    keep_checkpoint_steps: tuple = ()    # steps also saved, and never rotated away (e.g. to branch runs from)
    model_path: str = ""
    datasets: tuple = ()
    input_fn: Optional[str] = None       # GPT-Neo's input function: "sequential_input" or "generic_text" (data/inputs.py)
    shuffle_input_filenames: bool = True  # "sequential" datasets: the files in a seeded order each epoch
    mesh_shape: str = "all:1"
    layout: str = ""
    seed: int = 1234

    # Sampling (--predict).
    temperature: float = 1.0
    top_k: int = 0
    max_new_tokens: Optional[int] = None  # default: fill the context
    eos_id: Optional[int] = None
    padding_id: Optional[int] = None
    top_p: float = 1.0                   # nucleus sampling: keep the fewest tokens holding this much probability
    sampling_seed: Optional[int] = None  # same seed + same prompts -> same samples; None: a new seed each run
    stop_token: Optional[int] = None     # a sample ends at this id; None: eos_id; -1: only at max_new_tokens
    remove_partial_sequences: bool = False  # output only the new tokens, without the prompt
    kv_cache: bool = True                # incremental decoding with a key/value cache where the model allows it
    compiled_decoding: bool = True       # the kv-cache generation as one XLA program where supported
    sampling_use_entmax: bool = False    # sample from entmax(logits / temperature) instead of the softmax

    # Evaluation tasks (--eval, and after each checkpoint when eval_steps > 0).
    eval_tasks: tuple = ()               # e.g. ["lambada"]
    lambada_path: Optional[str] = None   # local LAMBADA jsonl, one {"text": ...} per line
    eval_results_path: Optional[str] = None  # jsonl that results are appended to; default model_path/eval_results.jsonl
    # The precision evaluation, the harness, --predict and --export run the model in: "auto" is training's (the
    # `precision` resolved on this device), "float32" scores in float32 whatever trained (devices/precision.py).
    eval_precision: str = "auto"
    # lm-evaluation-harness tasks (evals/harness.py; --harness_tasks and its flags override these for a run).
    harness_tasks: tuple = ()            # e.g. ["lambada_openai", "tiny_choice"]; task names of lm-eval
    harness_include_path: Optional[str] = None  # folder of the tasks' own YAML files (local data)
    harness_num_fewshot: Optional[int] = None   # default: each task's own
    harness_limit: Optional[float] = None       # examples per task (a fraction when below 1); default: all

    # ---- derived values ----
    @property
    def n_ctx_plus_one(self) -> int:
        return self.n_ctx + 1

    @property
    def head_size(self) -> int:
        return self.n_embd // self.n_head

    @property
    def causal(self) -> bool:
        """Whether position t sees only positions <= t (language modelling) or the whole sequence (MLM)."""
        return not self.mlm_training

    @property
    def mesh_dims(self) -> list[tuple[str, int]]:
        return parse_mesh_shape(self.mesh_shape)

    @property
    def layout_rules(self) -> list[tuple[str, str]]:
        return parse_layout(self.layout)

    @property
    def lr_decay_end_step(self) -> int:
        """The step at which the learning rate has decayed to 10% of lr: lr_decay_end, by default train_steps."""
        return self.lr_decay_end or self.train_steps

    @property
    def n_devices(self) -> int:
        n = 1
        for _, size in self.mesh_dims:
            n *= size
        return n

    def model_options(self) -> list[str]:
        """'name=value' for every model option not at its default (empty for GPT-Neo's plain GPT)."""
        return [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                if f.metadata.get("model_option") and getattr(self, f.name) != f.default]

    @property
    def tokenizer_dataset(self) -> Optional[DatasetConfig]:
        """The dataset whose tokenizer encodes prompts and decodes samples (the last, as GPT-Neo did)."""
        return self.datasets[-1].dataset if self.datasets else None


# ----------------------------------------------------------------------------------------------------
# Parsing helpers


def parse_mesh_shape(text: str) -> list[tuple[str, int]]:
    """'x:2,y:4' -> [('x', 2), ('y', 4)]."""
    dims = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        name, sep, size = part.partition(":")
        if not sep or not name.strip() or not size.strip().isdigit() or int(size) < 1:
            raise ConfigError(f"mesh_shape {text!r} is malformed at {part!r}: write it as 'x:2,y:4' "
                              f"(names and positive sizes)")
        dims.append((name.strip(), int(size)))
    if not dims:
        raise ConfigError("mesh_shape is empty: use e.g. 'all:1' for one device or 'x:2' for two")
    names = [n for n, _ in dims]
    if len(set(names)) != len(names):
        raise ConfigError(f"mesh_shape {text!r} names a mesh dimension twice")
    return dims


def parse_layout(text: str) -> list[tuple[str, str]]:
    """'batch:x,heads:y' -> [('batch', 'x'), ('heads', 'y')]."""
    rules = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        tensor_dim, sep, mesh_dim = part.partition(":")
        if not sep or not tensor_dim.strip() or not mesh_dim.strip():
            raise ConfigError(f"layout {text!r} is malformed at {part!r}: write it as 'batch:x,heads:y'")
        rules.append((tensor_dim.strip(), mesh_dim.strip()))
    return rules


def expand_attention_types(compact: Any, n_layer: int) -> tuple:
    """[[["global", "local"], 6]] -> ("global", "local") * 6, checked against n_layer. (Whether each name is
    a registered attention type is config.py's check.)"""
    if not isinstance(compact, list):
        raise ConfigError('attention_types must be a list like [[["global", "local"], 6]]')
    expanded = []
    for item in compact:
        if isinstance(item, str):  # already one type per layer
            expanded.append(item)
            continue
        if (not isinstance(item, list) or len(item) != 2 or not isinstance(item[0], list)
                or not isinstance(item[1], int) or item[1] < 1):
            raise ConfigError(f"attention_types entry {item!r} must look like [[\"global\", \"local\"], 6]")
        expanded.extend(list(item[0]) * item[1])
    if any(not isinstance(kind, str) for kind in expanded):
        raise ConfigError(f"attention_types names must be strings, got {compact!r}")
    if len(expanded) != n_layer:
        raise ConfigError(f"attention_types expand to {len(expanded)} layers but n_layer is {n_layer}: "
                          f"make the repeat counts sum to n_layer")
    return tuple(expanded)


def closest(key: str, known) -> str:
    """' (did you mean ...?)' for the nearest of `known`, or ''."""
    match = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


ALIASES = {"n_heads": "n_head", "window_size": "local_attention_radius",
            "axial_pos_emb_": "axial_pos_emb"}  # the reference's parameter list spells it with the underscore


def check_type(name: str, value: Any, expected: type) -> Any:
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is bool and not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{name} must be a whole number, got {value!r}")
    if expected is float and not isinstance(value, float):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    if expected is str and not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {value!r}")
    return value


FIELD_TYPES = {"int": int, "float": float, "bool": bool, "str": str,
                "Optional[int]": int, "Optional[float]": float, "Optional[str]": str}


def _int_list(name: str, value: Any) -> tuple:
    if not isinstance(value, (list, tuple)) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise ConfigError(f"{name} must be a list of whole numbers, got {value!r}")
    return tuple(value)


def parse_model_options(values: dict) -> dict:
    """The model options whose JSON values are lists or objects, as the tuples GPTConfig holds."""
    parsed = {}
    if values.get("moe_layers") is not None:
        parsed["moe_layers"] = _int_list("moe_layers", values["moe_layers"])
    if values.get("moe_params") is not None:
        params = values["moe_params"]
        if isinstance(params, (list, tuple)):  # already (key, value) pairs, e.g. from config.replace
            params = dict(params)
        if not isinstance(params, dict):
            raise ConfigError(f'moe_params must be an object like {{"moe_num_experts": 8}}, got {params!r}')
        parsed["moe_params"] = tuple(sorted(params.items()))
    if values.get("axial_pos_emb") is not None:
        axial = _int_list("axial_pos_emb", values["axial_pos_emb"])
        if len(axial) != 2 or min(axial) < 1:
            raise ConfigError(f"axial_pos_emb must be two positive sizes [a, b] with a*b >= n_ctx, got "
                              f"{values['axial_pos_emb']!r}")
        parsed["axial_pos_emb"] = axial
    if values.get("mlm_mask_ignore_ids") is not None:
        parsed["mlm_mask_ignore_ids"] = _int_list("mlm_mask_ignore_ids", values["mlm_mask_ignore_ids"])
    return parsed


def _validate_model_options(cfg: GPTConfig) -> None:
    if cfg.scalenorm and cfg.rezero:
        raise ConfigError("rezero removes the pre-norms that scalenorm would replace: set only one of them")
    if cfg.num_mem_kv < 0:
        raise ConfigError(f"num_mem_kv must be >= 0, got {cfg.num_mem_kv}")
    for layer in cfg.moe_layers:
        if not 0 <= layer < cfg.n_layer:
            raise ConfigError(f"moe_layers names layer {layer}, but layers count from 0 to n_layer - 1 = "
                              f"{cfg.n_layer - 1}: fix moe_layers")
    if len(set(cfg.moe_layers)) != len(cfg.moe_layers):
        raise ConfigError(f"moe_layers names a layer twice: {list(cfg.moe_layers)}")
    for key in ("moe_params", "moe_activation"):
        if getattr(cfg, key) and not cfg.moe_layers:
            raise ConfigError(f"{key} is set but moe_layers is empty: list the mixture-of-experts layers in "
                              f"moe_layers (e.g. [1, 3])")
    if cfg.rotary_emb and cfg.axial_pos_emb:
        raise ConfigError("rotary_emb and axial_pos_emb are two ways to give positions: set only one of them")
    if cfg.rotary_emb and cfg.head_size % 2:
        raise ConfigError(f"rotary_emb rotates pairs of features, so n_embd / n_head must be even, got "
                          f"{cfg.head_size}")
    if cfg.axial_pos_emb and cfg.axial_pos_emb[0] * cfg.axial_pos_emb[1] < cfg.n_ctx:
        raise ConfigError(f"axial_pos_emb {list(cfg.axial_pos_emb)} covers {cfg.axial_pos_emb[0] * cfg.axial_pos_emb[1]}"
                          f" positions, fewer than n_ctx {cfg.n_ctx}: make the product at least n_ctx")
    if cfg.tokens_per_mb_per_replica is not None and cfg.tokens_per_mb_per_replica < 1:
        raise ConfigError(f"tokens_per_mb_per_replica must be a positive number of tokens (or null for no "
                          f"micro-batching), got {cfg.tokens_per_mb_per_replica}")
    _validate_mlm(cfg)


def _validate_mlm(cfg: GPTConfig) -> None:
    mlm_keys = ("mlm_mask_id", "mlm_cls_token_id")
    if not cfg.mlm_training:
        for key in mlm_keys:
            if getattr(cfg, key) is not None:
                raise ConfigError(f"{key} is set but mlm_training is false: set mlm_training to true or remove {key}")
        return
    if cfg.mlm_mask_id is None:
        raise ConfigError("mlm_training needs mlm_mask_id, the token id reserved for [mask]: set mlm_mask_id")
    if cfg.padding_id is None:
        raise ConfigError("mlm_training labels unmasked positions with padding_id, which is not set: set padding_id "
                          "(or use a dataset whose config has one)")
    for key in mlm_keys + ("padding_id",):
        value = getattr(cfg, key)
        if value is not None and not 0 <= value < cfg.n_vocab:
            raise ConfigError(f"{key} {value} is not a token id below n_vocab {cfg.n_vocab}")
    if cfg.mlm_mask_id == cfg.padding_id:
        raise ConfigError(f"mlm_mask_id and padding_id are both {cfg.padding_id}: masked positions would look like "
                          f"padding; reserve another id for [mask]")
    for key in ("mlm_mask_prob", "mlm_same_token_prob", "mlm_random_token_prob"):
        if not 0.0 <= getattr(cfg, key) <= 1.0:
            raise ConfigError(f"{key} must be a probability in [0, 1], got {getattr(cfg, key)}")
    if cfg.mlm_mask_prob == 0:
        raise ConfigError("mlm_mask_prob is 0, so no token is ever masked and there is nothing to learn: set it > 0")
    if cfg.mlm_same_token_prob + cfg.mlm_random_token_prob > 1.0:
        raise ConfigError(f"mlm_same_token_prob + mlm_random_token_prob = "
                          f"{cfg.mlm_same_token_prob + cfg.mlm_random_token_prob} exceeds 1: lower one of them")


# Whole numbers and the least value each may take (an Optional one may also be null). steps_per_checkpoint 0
# would save a checkpoint every step; train_steps -5 would build everything and then find nothing to train.
LEAST_VALUES = {"n_layer": 1, "n_embd": 1, "n_head": 1, "n_vocab": 1, "n_ctx": 1, "train_batch_size": 1,
                "eval_batch_size": 1, "predict_batch_size": 1, "iterations": 1, "local_attention_radius": 1,
                "keep_checkpoint_max": 1, "steps_per_checkpoint": 1, "train_steps": 1, "lr_decay_end": 1,
                "warmup_steps": 0, "eval_steps": 0, "predict_steps": 0, "seed": 0}

# Numbers and the range each must lie in: (low, high, whether low itself is allowed), high excluded; None is
# no bound. The optimizer's: beta 1 would never forget a gradient; epsilon 0 divides by zero for a weight
# whose gradients were all 0 so far (Adam's v, Adafactor's squared gradient); a negative gradient_clipping
# would turn every gradient around (0 or null: no clipping).
RANGES = {"beta1": (0.0, 1.0, True), "beta2": (0.0, 1.0, True), "epsilon": (0.0, None, False),
          "ada_epsilon1": (0.0, None, False), "ada_epsilon2": (0.0, None, True), "weight_decay": (0.0, None, True),
          "gradient_clipping": (0.0, None, True), "z_loss": (0.0, None, True),
          "keep_checkpoint_every_n_hours": (0.0, None, True)}


def check_counts(values: dict) -> None:
    """The LEAST_VALUES fields among `values` (field name -> value) are at least their least value. Runs on the
    raw values before attention_types are expanded against n_layer, so that n_layer -1 is reported as itself."""
    for name, least in LEAST_VALUES.items():
        if values.get(name) is not None and values[name] < least:
            raise ConfigError(f"{name} must be at least {least}, got {values[name]}")


def _is_pair(item: Any) -> bool:
    return isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)


def _non_finite(name: str, value: Any) -> Optional[tuple]:
    """(where, value) of the first NaN or infinity in a field's value (a number, or the tuples and dataclasses a
    field holds: moe_params' (key, value) pairs, the datasets' weights), or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (name, value)
    if dataclasses.is_dataclass(value):
        found = (_non_finite(f"{name}.{f.name}", getattr(value, f.name)) for f in dataclasses.fields(value))
    elif isinstance(value, tuple):
        found = (_non_finite(f"{name}.{item[0]}", item[1]) if _is_pair(item) else _non_finite(f"{name}[{i}]", item)
                 for i, item in enumerate(value))
    else:
        return None
    return next((where for where in found if where is not None), None)


def check_finite(cfg: GPTConfig) -> None:
    """Every number in the config is finite. JSON readers accept NaN and Infinity, and no check of a range
    catches NaN (every comparison with it is false): "lr": NaN would train to the end with loss nan."""
    for f in dataclasses.fields(cfg):
        found = _non_finite(f.name, getattr(cfg, f.name))
        if found:
            where, value = found
            raise ConfigError(f"{where} is {value}, not a finite number: set it to a number (NaN and Infinity are "
                              f"not values a config can use)")


def _check_ranges(cfg: GPTConfig) -> None:
    for name, (low, high, low_allowed) in RANGES.items():
        value = getattr(cfg, name)
        if value is None:
            continue
        if value < low or (value == low and not low_allowed) or (high is not None and value >= high):
            span = f"{'[' if low_allowed else '('}{low:g}, {high:g})" if high is not None else None
            bound = f"in {span}" if span else f"{'at least' if low_allowed else 'more than'} {low:g}"
            raise ConfigError(f"{name} must be {bound}, got {value}")


def wsd_last_peak_step(decay_end: int, decay_share: float) -> int:
    """The last step whose update lr_decay "wsd" (models/optimizers.py) makes at the peak lr: the peak holds while
    step / decay_end <= 1 - decay_share, and the decay starts at the step after."""
    return max(0, math.floor((1.0 - decay_share) * decay_end))


def check_decay_after_warmup(warmup_steps: int, decay_end: int, decay_share: float) -> None:
    """A "wsd" run's warmup ends by its last step at the peak: the schedule takes the warmup's ramp while step <
    warmup_steps (models/optimizers.learning_rate, as GPT-Neo's), so a longer warmup never reaches the peak, cuts
    into the decay, and one reaching the run's end skips it (the run is never annealed). ConfigError naming the
    keys; the ladder (ladder/rules.py) catches it to name its own run and fix."""
    last_peak = wsd_last_peak_step(decay_end, decay_share)
    if warmup_steps > last_peak:
        raise ConfigError(f"warmup_steps ({warmup_steps}) runs past step {last_peak}, where lr_decay \"wsd\" starts "
                          f"its decay (the last lr_decay_share {decay_share:g} of {decay_end} steps), so the run "
                          f"would never hold its peak lr and its decay would be cut short: set warmup_steps to at "
                          f"most {last_peak}, or raise lr_decay_end (default train_steps) or lower lr_decay_share")


def validate(cfg: GPTConfig) -> GPTConfig:
    """Checks that hold between fields: the first part of config.py's `check`, which goes on with those
    against the registries and the model's tensor dimensions. Raises ConfigError naming the fix."""
    check_finite(cfg)  # first: NaN passes every comparison below
    check_counts({name: getattr(cfg, name) for name in LEAST_VALUES})
    if cfg.n_embd % cfg.n_head:
        raise ConfigError(f"n_embd ({cfg.n_embd}) must be divisible by n_head ({cfg.n_head})")
    if len(cfg.attention_types) != cfg.n_layer:
        raise ConfigError(f"attention_types has {len(cfg.attention_types)} layers but n_layer is {cfg.n_layer}")
    if cfg.model not in ("GPT", "GPT2"):
        raise ConfigError(f"model {cfg.model!r} is not known: only 'GPT' is built")
    if cfg.precision not in ("auto", "float32", "bfloat16", "float16"):
        raise ConfigError(f"precision must be 'auto', 'float32', 'bfloat16' or 'float16', got {cfg.precision!r}")
    if cfg.wandb_mode not in ("offline", "online"):
        raise ConfigError(f"wandb_mode must be 'offline' (nothing leaves the machine) or 'online', got {cfg.wandb_mode!r}")
    if cfg.eval_precision not in ("auto", "float32"):
        raise ConfigError(f"eval_precision must be 'auto' (training's precision on this device) or 'float32', got "
                          f"{cfg.eval_precision!r}")
    if cfg.harness_num_fewshot is not None and cfg.harness_num_fewshot < 0:
        raise ConfigError(f"harness_num_fewshot must be 0 or more, got {cfg.harness_num_fewshot}")
    if cfg.harness_limit is not None and cfg.harness_limit <= 0:
        raise ConfigError(f"harness_limit must be above 0 (a count, or a fraction below 1), got {cfg.harness_limit}")
    if cfg.initial_loss_scale < 1 or cfg.loss_scale_window < 1:
        raise ConfigError(f"initial_loss_scale and loss_scale_window must be at least 1, got "
                          f"{cfg.initial_loss_scale} and {cfg.loss_scale_window}")
    for name in ("embed_dropout", "attn_dropout", "res_dropout"):
        if not 0.0 <= getattr(cfg, name) < 1.0:
            raise ConfigError(f"{name} must be in [0, 1), got {getattr(cfg, name)}")
    if cfg.lr <= 0:
        raise ConfigError(f"lr must be positive, got {cfg.lr}")
    if not 0 < cfg.lr_decay_share <= 1:
        raise ConfigError(f"lr_decay_share must be in (0, 1], the share of the run over which \"wsd\" decays (0.2: "
                          f"the last 20%), got {cfg.lr_decay_share}")
    if cfg.lr_decay == "wsd":
        check_decay_after_warmup(cfg.warmup_steps, cfg.lr_decay_end_step, cfg.lr_decay_share)
    if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in cfg.keep_checkpoint_steps):
        raise ConfigError(f"keep_checkpoint_steps must be a list of steps >= 1, got {list(cfg.keep_checkpoint_steps)}")
    _check_ranges(cfg)
    _validate_model_options(cfg)
    _validate_sampling(cfg)
    if not 1.0 < cfg.entmax_alpha < 2.0:
        raise ConfigError(f"entmax_alpha must be in (1, 2) (1 would be softmax, 2 sparsemax), got {cfg.entmax_alpha}")
    for use in cfg.datasets:
        ds = use.dataset
        if ds.n_vocab > cfg.n_vocab:
            raise ConfigError(f"dataset {ds.id!r} was encoded with {ds.n_vocab} tokens but the model has "
                              f"n_vocab {cfg.n_vocab}: set n_vocab >= {ds.n_vocab}")
    _validate_mesh(cfg)
    return cfg


def reference_tokenizer(cfg: GPTConfig, source: str = "the config") -> tuple:
    """(the tokenizer the config's data must have been encoded with, a phrase naming it), or (None, None): the
    config's own tokenizer_id (its model's, recorded by tools/hf.py), else that of its first dataset that records
    one."""
    if cfg.tokenizer_id is not None:
        return cfg.tokenizer_id, f"{source}'s model uses tokenizer {cfg.tokenizer_id}"
    for use in cfg.datasets:
        if use.dataset.tokenizer_id is not None:
            return (use.dataset.tokenizer_id,
                    f"dataset {use.dataset.id!r} of the same model was encoded with {use.dataset.tokenizer_id}")
    return None, None


def check_tokenizer_ids(cfg: GPTConfig, source: str = "the config") -> GPTConfig:
    """Every dataset that records the tokenizer that encoded it (tokenizer_id) was encoded with the model's
    (reference_tokenizer): a model reads one tokenizer's ids, and another's would train it on garbage without a
    sign. And the end-of-text ids agree: a dataset's eos_id with its tokenizer's, the config's with the model's
    tokenizer's (samples stop at it, and the data's documents end with it). And first, each dataset's records of
    its tokenizer (check_tokenizer_records) agree. A ConfigError naming both."""
    for use in cfg.datasets:
        check_tokenizer_records(use.dataset)
    for use in cfg.datasets:
        dataset, recorded = use.dataset, use.dataset.tokenizer_id
        if recorded is not None and None not in (recorded.eos_id, dataset.eos_id) and recorded.eos_id != dataset.eos_id:
            raise ConfigError(f"dataset {dataset.id!r} sets eos_id {dataset.eos_id}, but the tokenizer that encoded it "
                              f"({recorded}) ends a document with {recorded.eos_id}: set eos_id {recorded.eos_id} in "
                              f"its dataset config")
    reference, named = reference_tokenizer(cfg, source)
    for use in cfg.datasets:
        dataset = use.dataset
        if dataset.tokenizer_id is None or dataset.tokenizer_id.matches(reference):
            continue
        raise ConfigError(f"dataset {dataset.id!r} was encoded with tokenizer {dataset.tokenizer_id}, but {named}: "
                          f"encode the text with the model's tokenizer{reference.encode_hint()}, or train on data "
                          f"encoded with it")
    if reference is not None and None not in (reference.eos_id, cfg.eos_id) and reference.eos_id != cfg.eos_id:
        raise ConfigError(f"{source} has eos_id {cfg.eos_id}, but {named}: set eos_id to {reference.eos_id} in "
                          f"{source}")
    return cfg


def check_tokenizer_records(dataset: DatasetConfig) -> None:
    """A ConfigError naming both when two of a dataset's records of the tokenizer that encoded it disagree: its
    config's tokenizer_id key, the manifests create_tfrecords wrote beside its files, the tokenizer its
    tokenizer_path holds (DatasetConfig.tokenizer_records). Whichever is wrong, its tokens are not the ones the
    others describe, so nothing can be checked until they agree."""
    records = dataset.tokenizer_records
    for index, first in enumerate(records):
        for second in records[index + 1:]:
            if not first.tokenizer.matches(second.tokenizer):
                raise ConfigError(_disagreement(dataset, first, second))


def _disagreement(dataset: DatasetConfig, first: TokenizerRecord, second: TokenizerRecord) -> str:
    """The line for two records that disagree, `first` the earlier of key, manifest, tokenizer_path."""
    if second.kind == "tokenizer_path":
        said = ("its config records" if first.kind == "key" else
                f"the create_tfrecords manifest beside its files records")
        return (f"{dataset.id}'s tokenizer_path {second.where} is tokenizer {second.tokenizer}, but {said} that "
                f"{first.tokenizer} encoded it: point tokenizer_path at the tokenizer that encoded it, or encode the "
                f"text again")
    if first.kind == "key":
        return (f"dataset {dataset.id!r}'s config records that tokenizer {first.tokenizer} encoded it, but the "
                f"create_tfrecords manifest beside its files records {second.tokenizer}: correct or delete its "
                f"tokenizer_id key in {first.where}, or encode the text again with the key's tokenizer")
    return (f"dataset {dataset.id!r} holds files of two tokenizers: {first.tokenizer} and {second.tokenizer}, as "
            f"their create_tfrecords manifests record: encode all of its text with one tokenizer, or point path and "
            f"eval_path at the files of one")


_WARNED_UNRECORDED: set = set()


def warn_unrecorded_tokenizers(cfg: GPTConfig, against: Optional[str] = None) -> None:
    """A `warning:` line, once per dataset per process, for each dataset that records no tokenizer at all (no
    tokenizer_id key, no create_tfrecords manifest beside its files, no tokenizer_path that could be read): its
    tokens are checked against nothing, neither the model's tokenizer nor a model_path's record. `against` names
    what it would be checked against when the config does not (modelpath/tokenizer_record.py: model_path's). A
    tokenizer_path that names a tokenizer not read here (a hub name such as GPT-Neo's configs' "gpt2") is warned
    about only when there is something to check it against."""
    reference, named = reference_tokenizer(cfg)
    against = named or against
    for use in cfg.datasets:
        dataset = use.dataset
        if dataset.tokenizer_id is not None or (dataset.id, dataset.path) in _WARNED_UNRECORDED:
            continue
        if dataset.tokenizer_path and not against:
            continue
        _WARNED_UNRECORDED.add((dataset.id, dataset.path))
        unread = (f"and its tokenizer_path {dataset.tokenizer_path} is no tokenizer file or folder here to read"
                  if dataset.tokenizer_path else "no tokenizer_path")
        checked = f"the model's ({against})" if against else "the model's tokenizer"
        print(f"warning: dataset {dataset.id!r} records no tokenizer (no tokenizer_id key, no create_tfrecords "
              f"manifest beside its files, {unread}), so its tokens are not checked against {checked}: encode the "
              f"text with data/create_tfrecords.py, whose manifest records the tokenizer, or set tokenizer_path in "
              f"its dataset config to the tokenizer that encoded it", file=sys.stderr, flush=True)


def _validate_sampling(cfg: GPTConfig) -> None:
    if cfg.temperature < 0:
        raise ConfigError(f"temperature must be >= 0 (0 is greedy decoding), got {cfg.temperature}")
    if cfg.top_k < 0:
        raise ConfigError(f"top_k must be >= 0 (0 keeps every token), got {cfg.top_k}")
    if not 0.0 < cfg.top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1] (1 keeps every token), got {cfg.top_p}")
    if cfg.sampling_seed is not None and not 0 <= cfg.sampling_seed < 2 ** 31:
        raise ConfigError(f"sampling_seed must be in [0, 2**31) or null, got {cfg.sampling_seed}")
    if cfg.max_new_tokens is not None and cfg.max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be at least 1 (or null to fill the context), got {cfg.max_new_tokens}")
    if cfg.stop_token is not None and not -1 <= cfg.stop_token < cfg.n_vocab:
        raise ConfigError(f"stop_token must be a token id below n_vocab {cfg.n_vocab}, -1 for none, or null for "
                          f"eos_id; got {cfg.stop_token}")


def _validate_mesh(cfg: GPTConfig) -> None:
    """The layout's rules name mesh dimensions of mesh_shape, each tensor dimension once. (Whether the tensor
    dimensions exist, divide evenly and may share a mesh dimension is models/layout.py's check.)"""
    mesh = dict(cfg.mesh_dims)
    seen = set()
    for tensor_dim, mesh_dim in cfg.layout_rules:
        if mesh_dim not in mesh:
            raise ConfigError(f"layout splits {tensor_dim!r} over mesh dimension {mesh_dim!r}, which mesh_shape "
                              f"{cfg.mesh_shape!r} does not have")
        if tensor_dim in seen:
            raise ConfigError(f"layout splits {tensor_dim!r} twice: a tensor dimension maps to one mesh dimension")
        seen.add(tensor_dim)


def dimension_is_split(cfg: GPTConfig, name: str) -> bool:
    """True if cfg.layout splits the tensor dimension `name` over a mesh dimension of size > 1 (then the kernels
    that need it whole on each device, models/kernels/, keep mesh-tensorflow's formulation)."""
    mesh = dict(cfg.mesh_dims)
    return any(tensor_dim == name and mesh.get(mesh_dim, 1) > 1 for tensor_dim, mesh_dim in cfg.layout_rules)


def batch_split(cfg: GPTConfig) -> int:
    """How many ways the batch is split (the size of the mesh dimension `batch` maps to; 1 if none)."""
    mesh = dict(cfg.mesh_dims)
    return math.prod(mesh[m] for t, m in cfg.layout_rules if t == "batch")


def num_microbatches(cfg: GPTConfig, batch_size: int) -> int:
    """Micro-batches per step: as many as it takes for each to hold at most tokens_per_mb_per_replica tokens
    per replica, in whole sequences, a divisor of the per-replica batch (mesh-tensorflow's
    serialize_num_microbatches, which tests/test_schema.py compares this with); 1 without micro-batching."""
    if not cfg.tokens_per_mb_per_replica:
        return 1
    per_replica = batch_size // batch_split(cfg)
    size = max(1, cfg.tokens_per_mb_per_replica // cfg.n_ctx)
    while per_replica % size:
        size -= 1
    return per_replica // size


