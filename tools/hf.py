"""Convert between this project's checkpoints and HF transformers' GPTNeoForCausalLM folders.

    # ours -> HF: a folder GPTNeoForCausalLM.from_pretrained and AutoTokenizer.from_pretrained read
    python -m tools.hf to_hf --model CONFIG [--checkpoint PREFIX_OR_DIR] --out DIR

    # HF -> ours: a model config and a step-0 checkpoint that main.py trains (fine-tunes) and predicts from
    python -m tools.hf from_hf HF_DIR --config OUT.json --model_path DIR [--base_config default]
                               [--dataset ID ...] [--tokenizer_dataset ID --data_path GLOB [--eval_path GLOB]]

Both directions map GPT-Neo's variable names (the ones HF's own `load_tf_weights_in_gpt_neo` reads):

    gpt2/wte, gpt2/wpe                                  transformer.wte / wpe .weight (lm_head is tied to wte)
    gpt2/h{i}/norm_1|norm_2/g|b                          transformer.h.{i}.ln_1|ln_2 .weight|bias
    gpt2/h{i}/attn/q|k|v|o                               transformer.h.{i}.attn.attention.q_proj|k_proj|v_proj|out_proj.weight (transposed)
    gpt2/h{i}/attn/compute_output_bias/o_b               transformer.h.{i}.attn.attention.out_proj.bias
    gpt2/h{i}/mlp/conv1d_main/c_fc|c_proj/kernel|bias    transformer.h.{i}.mlp.c_fc|c_proj .weight (transposed)|bias
    gpt2/ln_f/g|b                                        transformer.ln_f.weight|bias

Only models GPTNeo can express convert: global/local attention, learned positions, LayerNorm, a plain MLP with
an activation HF knows. Any other model option (MoE, rotary, GLU, ...; schema.py's option() fields) is
refused with the option's name; training settings (precision, recompute_grad, tokens_per_mb_per_replica, the
optimizer's) do not change the model and are no obstacle.

Neither direction needs PyTorch: the weights are read and written with safetensors' NumPy API, the config with
transformers' GPTNeoConfig.

to_hf leaves --out holding exactly one export: it writes the files into a new folder beside --out (a failed
write leaves --out as it was), then replaces the HF files in --out with them, removing those the new export does
not have (an earlier export's index and shards, a pytorch_model.bin). config.json goes first and comes back
last, so a run cut short in between leaves a folder no reader takes for a model. An --out holding other files
(not an HF export's) is refused unless the user confirms (--yes, or the question at a terminal); those files
stay. from_hf refuses a folder whose weights files do not agree with each other or with their index.

from_hf writes the model config from `--base_config` (training settings, datasets, mesh) with the architecture
taken from the HF config, then a step-0 checkpoint of it (`write_checkpoint`, from_neo's too): the variables are
those the training step's mesh-tensorflow graph creates (train/step.build, before lowering), so the checkpoint
holds exactly what a training checkpoint of the config holds, by name, shape and dtype: the HF weights, the
optimizer's slots at zero, global_step 0, float16's loss-scale state at its start. The graph is neither lowered
nor run: only the variables' values are set and saved.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if __name__ == "__main__":  # TF's C++ start-up chatter off the console
    from console.stderr_filter import quiet_tensorflow
    quiet_tensorflow()

import numpy as np  # noqa: E402

from models import gpt  # noqa: E402  (first: the models package makes mesh-tensorflow importable)
from console.arguments import ArgumentParser  # noqa: E402
from modelpath import checkpoints, tokenizer_record  # noqa: E402
from config import config_from_dict, dataset_registry_for, load_config, replace  # noqa: E402
from schema import read_json  # noqa: E402
from schema import ConfigError, GPTConfig  # noqa: E402

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"  # a sharded weights file's map of keys to shards
SHARD = re.compile(r"model-\d+-of-\d+\.safetensors")  # the shards an index maps keys to
# The files of an HF model folder (save_pretrained's, for the model and its tokenizer): an --out holding only these
# is an earlier export, and to_hf replaces them all. Anything else in --out is the user's.
HF_FILES = re.compile(r"(config|generation_config)\.json|model\.safetensors(\.index\.json)?|model-\d+-of-\d+\.safetensors"
                      r"|pytorch_model\.bin(\.index\.json)?|pytorch_model-\d+-of-\d+\.bin|tf_model\.h5"
                      r"|flax_model\.msgpack|tokenizer(_config)?\.json|special_tokens_map\.json|vocab\.json|merges\.txt"
                      r"|added_tokens\.json")

# Our activation_function -> HF's ACT2FN name (same function), and back.
TO_HF_ACTIVATION = {"gelu": "gelu_new", "relu": "relu", "silu": "silu", "swish": "silu", "sigmoid": "sigmoid",
                    "tanh": "tanh", "mish": "mish", "id": "linear", "lrelu001": "leaky_relu"}
FROM_HF_ACTIVATION = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu_fast": "gelu", "relu": "relu",
                      "silu": "silu", "swish": "swish", "sigmoid": "sigmoid", "tanh": "tanh", "mish": "mish",
                      "linear": "id", "leaky_relu": "lrelu001"}

_LAYER = re.compile(r"^gpt2/h(\d+)/(.+)$")
_IN_LAYER = {
    "norm_1/g": ("ln_1.weight", False), "norm_1/b": ("ln_1.bias", False),
    "norm_2/g": ("ln_2.weight", False), "norm_2/b": ("ln_2.bias", False),
    "attn/q": ("attn.attention.q_proj.weight", True), "attn/k": ("attn.attention.k_proj.weight", True),
    "attn/v": ("attn.attention.v_proj.weight", True), "attn/o": ("attn.attention.out_proj.weight", True),
    "attn/compute_output_bias/o_b": ("attn.attention.out_proj.bias", False),
    "mlp/conv1d_main/c_fc/kernel": ("mlp.c_fc.weight", True), "mlp/conv1d_main/c_fc/bias": ("mlp.c_fc.bias", False),
    "mlp/conv1d_main/c_proj/kernel": ("mlp.c_proj.weight", True),
    "mlp/conv1d_main/c_proj/bias": ("mlp.c_proj.bias", False),
}
_TOP = {"gpt2/wte": ("transformer.wte.weight", False), "gpt2/wpe": ("transformer.wpe.weight", False),
        "gpt2/ln_f/g": ("transformer.ln_f.weight", False), "gpt2/ln_f/b": ("transformer.ln_f.bias", False)}


class ConversionError(ConfigError):
    """A model or folder that cannot be converted. One line, names the reason."""


def hf_name(name: str) -> Optional[tuple[str, bool]]:
    """Our variable name -> (HF state-dict key, transpose?), or None if GPTNeo has no such weight."""
    if name in _TOP:
        return _TOP[name]
    match = _LAYER.match(name)
    if match and match.group(2) in _IN_LAYER:
        key, transpose = _IN_LAYER[match.group(2)]
        return f"transformer.h.{match.group(1)}.{key}", transpose
    return None


def compact_attention_types(types) -> list:
    """("global", "local", "global", "local") -> [[["global", "local"], 2]] (HF's and GPT-Neo's format)."""
    types = list(types)
    for period in range(1, len(types) + 1):
        if len(types) % period == 0 and types == types[:period] * (len(types) // period):
            return [[types[:period], len(types) // period]]
    return [[types, 1]]


def check_convertible(cfg: GPTConfig) -> None:
    unknown = sorted(set(cfg.attention_types) - {"global", "local"})
    if unknown:
        raise ConversionError(f"attention types {unknown} have no GPTNeo equivalent (only global and local)")
    if cfg.activation_function not in TO_HF_ACTIVATION:
        raise ConversionError(f"activation_function {cfg.activation_function!r} has no HF equivalent: GPTNeo "
                              f"folders can use {', '.join(sorted(TO_HF_ACTIVATION))}")
    extra = cfg.model_options()
    if extra:
        raise ConversionError(f"GPTNeo cannot express option {extra[0]}: convert only plain GPT-Neo models")


def hf_config_for(cfg: GPTConfig):
    from transformers import GPTNeoConfig
    check_convertible(cfg)
    eos = cfg.eos_id if cfg.eos_id is not None else 0
    return GPTNeoConfig(
        vocab_size=cfg.n_vocab, max_position_embeddings=cfg.n_ctx, hidden_size=cfg.n_embd, num_layers=cfg.n_layer,
        attention_types=compact_attention_types(cfg.attention_types), num_heads=cfg.n_head,
        intermediate_size=4 * cfg.n_embd, window_size=cfg.local_attention_radius,
        activation_function=TO_HF_ACTIVATION[cfg.activation_function], resid_dropout=cfg.res_dropout,
        embed_dropout=cfg.embed_dropout, attention_dropout=cfg.attn_dropout, layer_norm_epsilon=1e-5,
        bos_token_id=eos, eos_token_id=eos, pad_token_id=cfg.padding_id, tie_word_embeddings=True,
        architectures=["GPTNeoForCausalLM"])


# ----------------------------------------------------------------------------------------------------
# ours -> HF


def hf_state_dict(cfg: GPTConfig, checkpoint: str) -> dict:
    """numpy arrays under HF keys, read from our checkpoint (a prefix)."""
    import tensorflow.compat.v1 as tf
    check_convertible(cfg)
    reader = tf.train.load_checkpoint(checkpoint)
    stored = reader.get_variable_to_shape_map()
    state = {}
    for name, shape in sorted(gpt.variable_shapes(cfg).items()):
        mapped = hf_name(name)
        if mapped is None:
            raise ConversionError(f"variable {name} has no GPTNeo equivalent")
        if name not in stored:
            raise ConversionError(f"{checkpoint} lacks {name}: is it a checkpoint of this config?")
        if list(stored[name]) != list(shape):
            raise ConversionError(f"{name} is {stored[name]} in {checkpoint} but {shape} in the config")
        value = reader.get_tensor(name).astype(np.float32)
        key, transpose = mapped
        state[key] = np.ascontiguousarray(value.T if transpose else value)
    expected = hf_keys(cfg.n_layer)
    if set(state) != expected:
        raise ConversionError(f"HF GPTNeo expects other weights: missing {sorted(expected - set(state))[:3]}, "
                              f"unexpected {sorted(set(state) - expected)[:3]}")
    return state


def hf_keys(n_layer: int) -> set:
    """The keys of GPTNeoForCausalLM's weights file (lm_head is tied to wte and not stored)."""
    return {key for key, _ in _TOP.values()} | {f"transformer.h.{i}.{key}" for i in range(n_layer)
                                                  for key, _ in _IN_LAYER.values()}


def hf_tokenizer(cfg: GPTConfig):
    """The config's tokenizer as an HF fast tokenizer (None if it has none), loaded before anything is
    written."""
    dataset = cfg.tokenizer_dataset
    if dataset is None or not dataset.tokenizer_path:
        return None
    from data.errors import DataError
    from data.tokenizer import EOS_TOKEN, PADDING_TOKEN, load_for_dataset
    from transformers import PreTrainedTokenizerFast
    try:  # a folder's tokenizer is read as it is (data/tokenizer.py): no "tokenizer class" warning lines
        backend = load_for_dataset(dataset).backend
    except DataError as e:
        raise ConversionError(f"the tokenizer of dataset {dataset.id!r} cannot be read: {e}") from None
    special = {}
    if backend.token_to_id(EOS_TOKEN) is not None:
        special.update(eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, unk_token=EOS_TOKEN)
    if backend.token_to_id(PADDING_TOKEN) is not None:
        special["pad_token"] = PADDING_TOKEN
    return PreTrainedTokenizerFast(tokenizer_object=backend, **special)


def resolve_checkpoint(path: str) -> str:
    """A checkpoint prefix, or a folder's newest readable checkpoint; a ConversionError when there is none."""
    if os.path.isdir(path):
        found = checkpoints.restorable(path)
        if not found:
            raise ConversionError(f"no checkpoint in {path}: train the model first (python main.py --model ...), or "
                                  f"pass --checkpoint PREFIX_OR_DIR")
        return found
    if os.path.isfile(path + ".index"):
        why = checkpoints.problem(path)
        if why:
            raise ConversionError(f"checkpoint {path} cannot be read: {why}")
        return path
    raise ConversionError(f"no checkpoint at {path} (neither a folder of checkpoints nor a prefix with a .index "
                          f"file): train the model first (python main.py --model ...), or pass --checkpoint")


def check_out_dir(out_dir: str) -> None:
    """--out is a folder to write, or one to make: not a file (or a file in place of a parent)."""
    blocker = os.path.abspath(out_dir)
    while not os.path.exists(blocker):
        blocker = os.path.dirname(blocker)
    if not os.path.isdir(blocker):
        where = "is a file" if blocker == os.path.abspath(out_dir) else f"cannot be made: {blocker} is a file"
        raise ConversionError(f"--out {out_dir} {where}, not a folder: choose another --out (or move the file away)")
    if not os.access(blocker, os.W_OK):
        raise ConversionError(f"--out {out_dir} cannot be written ({blocker} is not writable): choose another --out")


def other_files(out_dir: str) -> list[str]:
    """What in out_dir is not an HF export's file (HF_FILES): the user's, sorted; [] for a new or empty folder or
    an earlier export."""
    if not os.path.isdir(out_dir):
        return []
    return sorted(name for name in os.listdir(out_dir)
                  if not (HF_FILES.fullmatch(name) and os.path.isfile(os.path.join(out_dir, name))))


def to_hf(cfg: GPTConfig, checkpoint: str, out_dir: str, among_other_files: bool = False) -> str:
    """Writes config.json, model.safetensors and the tokenizer files of our checkpoint (a prefix, or a folder:
    its newest) to out_dir, which then holds exactly this export (an earlier one's files are replaced or
    removed). An out_dir holding other files is refused unless `among_other_files` (the user confirmed); they
    stay. Needs no PyTorch: the weights go through safetensors' NumPy API, the config through transformers'
    GPTNeoConfig."""
    from safetensors.numpy import save_file

    check_out_dir(out_dir)
    others = other_files(out_dir)
    if others and not among_other_files:
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        raise ConversionError(f"--out {out_dir} holds files that are not an HF export ({', '.join(others[:3])}{more}): "
                              f"choose a new or empty folder, or pass --yes to write the export among them (the HF "
                              f"config, weights and tokenizer files there are replaced)")
    checkpoint = resolve_checkpoint(checkpoint)
    hf_config = hf_config_for(cfg)
    state = hf_state_dict(cfg, checkpoint)
    tokenizer = hf_tokenizer(cfg)
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(os.path.abspath(out_dir))}.", dir=parent)
    try:
        try:
            hf_config.save_pretrained(staging)
            save_file(state, os.path.join(staging, SAFETENSORS), metadata={"format": "pt"})  # "pt": HF's loaders ask
            if tokenizer is not None:
                tokenizer.save_pretrained(staging)
        except OSError as e:
            raise ConversionError(f"could not write the export beside {out_dir} ({checkpoints.reason(e)}): free space "
                                  f"or fix the folder, then run again ({out_dir} was not touched)") from None
        install(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def install(staging: str, out_dir: str) -> None:
    """Moves the export written in `staging` into out_dir (renames: one file system) so that out_dir's HF files are
    exactly the new ones. config.json is removed first and moved in last: until then the folder is no model to
    from_hf or from_pretrained, which both need it, so a run cut short never pairs the new config with old
    weights. Of the old files, indexes go before the shards they list."""
    os.makedirs(out_dir, exist_ok=True)
    new = sorted(os.listdir(staging))
    old = [name for name in os.listdir(out_dir)
           if HF_FILES.fullmatch(name) and os.path.isfile(os.path.join(out_dir, name))]
    stale = sorted((name for name in old if name not in new or name == "config.json"),
                   key=lambda name: (name != "config.json", not name.endswith(".index.json"), name))
    for name in stale:
        os.remove(os.path.join(out_dir, name))
    for name in sorted(new, key=lambda name: name == "config.json"):
        os.replace(os.path.join(staging, name), os.path.join(out_dir, name))


# ----------------------------------------------------------------------------------------------------
# HF -> ours


def dataset_entries(base: dict, dataset_ids: list) -> list:
    """The `datasets` entries for dataset_ids, each read as the base config's entry in its place (or its first)
    is: the same stitch, sampling mode and weight (and a bare id stays bare), only the id replaced."""
    entries = base.get("datasets") or []
    made = []
    for i, dataset_id in enumerate(dataset_ids):
        entry = entries[min(i, len(entries) - 1)] if entries else [dataset_id]
        made.append(dataset_id if isinstance(entry, str) else [dataset_id] + list(entry[1:]))
    return made


def config_from_hf(hf_config, base: dict, model_path: str, datasets: Optional[list] = None) -> dict:
    """Our model config (JSON dict): the base config's settings with the HF model's architecture. `datasets`
    (entries) replace the base's."""
    activation = hf_config.activation_function
    if activation not in FROM_HF_ACTIVATION:
        raise ConversionError(f"HF activation {activation!r} has no equivalent here (HF 'gelu' is the exact erf "
                              f"GELU; this model's 'gelu' is the tanh approximation, HF's 'gelu_new')")
    if hf_config.intermediate_size not in (None, 4 * hf_config.hidden_size):
        raise ConversionError(f"intermediate_size {hf_config.intermediate_size} is not 4 * hidden_size; this "
                              f"model's MLP is 4x wide")
    if abs(hf_config.layer_norm_epsilon - 1e-5) > 1e-12:
        raise ConversionError(f"layer_norm_epsilon {hf_config.layer_norm_epsilon} is not 1e-5, this model's")
    unknown = sorted(set(hf_config.attention_layers) - {"global", "local"})
    if unknown:
        raise ConversionError(f"attention types {unknown} are not GPTNeo's global/local")
    raw = dict(base)
    for key in ("attention_types", "local_attention_radius", "window_size", "n_heads"):
        raw.pop(key, None)
    raw.update(
        n_layer=hf_config.num_layers, n_embd=hf_config.hidden_size, n_head=hf_config.num_heads,
        n_vocab=hf_config.vocab_size, n_ctx=hf_config.max_position_embeddings,
        attention_types=compact_attention_types(hf_config.attention_layers),
        local_attention_radius=hf_config.window_size, activation_function=FROM_HF_ACTIVATION[activation],
        embed_dropout=hf_config.embed_dropout, attn_dropout=hf_config.attention_dropout,
        res_dropout=hf_config.resid_dropout, model_path=model_path)
    if datasets is not None:
        raw["datasets"] = datasets
    if hf_config.eos_token_id is not None:
        raw["eos_id"] = hf_config.eos_token_id
    return raw


def folder_tokenizer(folder: str, what: str = "the HF folder"):
    """data/tokenizer.py's LoadedTokenizer of a model folder's tokenizer files (tokenizer.json, or vocab.json and
    merges.txt); None when the folder has none."""
    from data.errors import DataError
    from data.tokenizer import load_tokenizer
    if not any(os.path.isfile(os.path.join(folder, name)) for name in ("tokenizer.json", "vocab.json")):
        return None
    try:
        return load_tokenizer(folder, pretrained=True)
    except DataError as e:
        raise ConversionError(f"the tokenizer of {what} cannot be read: {e}") from None


def check_encoded_with(tokenizer, data_glob: str, what: str) -> None:
    """The tfrecords of data_glob were encoded with `tokenizer`, as the create_tfrecords manifests beside them
    record; a ConversionError naming both when they were not. Files without a manifest (written by another
    tool) cannot be checked: a warning says so."""
    import glob as globlib
    from data.create_tfrecords import read_manifest_tokenizer
    files = sorted(globlib.glob(data_glob))
    if not files:
        raise ConversionError(f"{what} {data_glob} matches no files: encode your text first (python "
                              f"data/create_tfrecords.py --tokenizer_from MODEL_DIR ...), or fix the glob")
    folders = sorted({os.path.dirname(path) for path in files})
    for folder in folders:
        found = read_manifest_tokenizer(folder, tokenizer)
        if found is None:
            print(f"warning: {folder} has no create_tfrecords manifest, so what encoded {what} {data_glob} cannot be "
                  f"checked against the model's tokenizer {tokenizer.tokenizer_id}", file=sys.stderr)
        elif found is not True:
            raise ConversionError(f"{what} {data_glob} was encoded with tokenizer {found}, but the model's is "
                                  f"{tokenizer.tokenizer_id}: encode the text with the model's tokenizer (python "
                                  f"data/create_tfrecords.py --tokenizer_from {tokenizer.path} ...)")


def register_tokenizer_dataset(tokenizer, dataset_id: str, data_path: str, eval_path: Optional[str],
                               registry: str) -> str:
    """Writes registry/<id>.json for tfrecords already encoded with `tokenizer` (a model folder's, checked against
    the files' manifests): paths relative to the folder holding configs/ where they are inside it, and the
    tokenizer's record."""
    from data.create_tfrecords import dataset_config_path, write_json_atomically
    check_encoded_with(tokenizer, data_path, "--data_path")
    if eval_path:
        check_encoded_with(tokenizer, eval_path, "--eval_path")
    tokenizer_path = dataset_config_path(tokenizer.path, registry)
    entry = {"n_vocab": tokenizer.vocab_size, "path": dataset_config_path(data_path, registry),
             "eval_path": dataset_config_path(eval_path, registry) if eval_path else None,
             "tokenizer_is_pretrained": True, "tokenizer_path": tokenizer_path, "eos_id": tokenizer.eos_id,
             "padding_id": tokenizer.padding_id,
             "tokenizer_id": {**tokenizer.tokenizer_id.to_json(), "from": tokenizer_path}}
    os.makedirs(registry, exist_ok=True)
    path = os.path.join(registry, dataset_id + ".json")
    write_json_atomically(path, entry)
    return path


def write_checkpoint(cfg: GPTConfig, state: dict, shapes: Optional[dict] = None) -> str:
    """Saves model.ckpt-0 in cfg.model_path with every variable training restores: the model weights from
    `state` (our names -> arrays), everything else at its initial value (optimizer slots at zero, global_step 0,
    float16's loss scale at initial_loss_scale). The variables are those the training step's mesh-tensorflow
    graph creates (train/step.build, the step before lowering: its master variables, named, shaped and typed as
    a training checkpoint stores them, with the optimizer's slots and the step's own state); nothing is lowered
    and no mesh session opened, and the initializers of the weights state replaces are never run. `shapes`:
    gpt.variable_shapes(cfg) when the caller has it (a graph build fewer: ~4 CPU s at GPT-Neo 125M)."""
    import tensorflow.compat.v1 as tf
    from execution import meshes
    from devices.placement import Placement
    from execution.mesh_session import checkpoint_saver, finiteness, save_finite
    from train.step import build

    shapes = gpt.variable_shapes(cfg) if shapes is None else shapes
    missing = sorted(set(shapes) - set(state))
    if missing:
        raise ConversionError(f"no weights for {missing[:3]}{' ...' if len(missing) > 3 else ''}")
    one_device = replace(cfg, mesh_shape="all:1", layout="", train_batch_size=1)
    graph = tf.Graph()
    with graph.as_default():
        zeros = tf.zeros([1, cfg.n_ctx], tf.int32)
        mesh, impl = meshes.placement_mesh(one_device, Placement(devices=("",)))
        build(one_device, mesh, impl, zeros, zeros)  # creates the master variables; slices come at lowering
        variables = {v.op.name: v for v in tf.global_variables()}
        for name, value in state.items():
            if name not in variables:
                raise ConversionError(f"the training graph has no variable {name}")
            if list(value.shape) != variables[name].shape.as_list():
                raise ConversionError(f"{name} is {list(value.shape)} in the HF model but "
                                      f"{variables[name].shape.as_list()} here")
        values = {name: tf.placeholder(variables[name].dtype.base_dtype, value.shape) for name, value in state.items()}
        assign = tf.group([variables[name].assign(values[name]) for name in state])
        initialize = tf.variables_initializer([v for name, v in variables.items() if name not in state])
        saver = checkpoint_saver(list(variables.values()))
        checked, finite = finiteness(list(variables.values()))
    config = tf.ConfigProto()  # at L1, TF's graph optimiser first folds the slots' zeros into constants (5 s at 125M)
    config.graph_options.optimizer_options.opt_level = tf.OptimizerOptions.L0
    with tf.Session(graph=graph, config=config) as session:
        session.run(assign, {values[name]: value for name, value in state.items()})
        session.run(initialize)
        writer = checkpoints.CheckpointWriter(cfg.model_path, saver, cfg.keep_checkpoint_max,
                                              cfg.keep_checkpoint_every_n_hours)
        saved = save_finite(session, writer, 0, checked, finite)
    tokenizer_record.record(cfg)  # the imported model's tokenizer, which its model_path's later jobs must match
    return saved


def read_json_file(path: str, what: str) -> dict:
    """A JSON object from an HF folder's file; one line when it is not one (cut short, damaged)."""
    try:
        return read_json(path, what)
    except ConfigError as e:
        raise ConversionError(f"{e}: copy the folder again, or export it again") from None


def weight_files(hf_dir: str) -> dict:
    """The HF folder's weights files -> the keys each must hold (None: whatever it holds), after checking that
    they are one export: model.safetensors alone, or an index with exactly the shards it lists."""
    index = os.path.join(hf_dir, SAFETENSORS_INDEX)
    shards = sorted(name for name in os.listdir(hf_dir) if SHARD.fullmatch(name))
    fix = "delete the stale files (or export again into an empty folder)"
    if os.path.isfile(index):
        if os.path.isfile(os.path.join(hf_dir, SAFETENSORS)):
            newer = max((SAFETENSORS, SAFETENSORS_INDEX), key=lambda name: os.path.getmtime(os.path.join(hf_dir, name)))
            raise ConversionError(f"{hf_dir} holds both {SAFETENSORS} and {SAFETENSORS_INDEX}: two exports, one of them "
                                  f"stale ({newer} is the newer): {fix}")
        weight_map = read_json_file(index, "the weights index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map or not all(
                isinstance(key, str) and isinstance(file, str) for key, file in weight_map.items()):
            raise ConversionError(f"{index} has no weight_map of tensor names to files: copy the folder again, or "
                                  f"export it again")
        files = {}
        for key, file in weight_map.items():
            files.setdefault(file, set()).add(key)
        for file in sorted(files):
            if not os.path.isfile(os.path.join(hf_dir, file)):
                raise ConversionError(f"{SAFETENSORS_INDEX} in {hf_dir} lists {file}, which is missing: copy the "
                                      f"folder again, or export it again")
        unlisted = [name for name in shards if name not in files]
        if unlisted:
            raise ConversionError(f"{hf_dir} holds {unlisted[0]}, which its {SAFETENSORS_INDEX} does not list (a shard "
                                  f"of another export): {fix}")
        return files
    if os.path.isfile(os.path.join(hf_dir, SAFETENSORS)):
        if shards:
            raise ConversionError(f"{hf_dir} holds {SAFETENSORS} and shards without an index ({shards[0]}): {fix}")
        return {SAFETENSORS: None}
    if shards:
        raise ConversionError(f"{hf_dir} holds shards ({shards[0]}) but no {SAFETENSORS_INDEX} listing them: copy the "
                              f"folder again, or export it again")
    raise ConversionError(f"{hf_dir} has no {SAFETENSORS}: the converter reads safetensors weights (an older "
                          f"folder with only pytorch_model.bin: load it with transformers and save_pretrained it "
                          f"again, which writes {SAFETENSORS})")


def read_hf_weights(hf_dir: str) -> dict:
    """The HF folder's weights as float32 NumPy arrays by HF key, read with safetensors' NumPy API (no PyTorch):
    model.safetensors, or the shards a model.safetensors.index.json lists, each holding exactly the tensors the
    index maps to it. A file cut short or damaged, or one that disagrees with the index, is one line."""
    from safetensors import SafetensorError, safe_open

    state = {}
    for name, expected in sorted(weight_files(hf_dir).items()):
        path = os.path.join(hf_dir, name)
        try:
            with safe_open(path, "np") as f:
                keys = set(f.keys())
                if expected is not None and keys != expected:
                    missing, extra = sorted(expected - keys), sorted(keys - expected)
                    what = (f"lacks {missing[0]}, which {SAFETENSORS_INDEX} maps to it" if missing else
                            f"holds {extra[0]}, which {SAFETENSORS_INDEX} does not map to it")
                    raise ConversionError(f"{name} in {hf_dir} {what}: the index and the weights are of different "
                                          f"exports; copy the folder again, or export it again")
                for key in sorted(keys):
                    state[key] = f.get_tensor(key).astype(np.float32)
        except SafetensorError as e:
            raise ConversionError(f"{path} cannot be read ({e}): cut short or damaged; copy it again, or export the "
                                  f"folder again") from None
    return state


@dataclass(frozen=True)
class OwnText:
    """--text_dir: the user's text to encode with the imported model's tokenizer and train on, as dataset
    `dataset_id` (data/own_text.py)."""
    text_dir: str
    dataset_id: str = "mine"
    eval_text_dir: Optional[str] = None
    data_dir: Optional[str] = None  # default: data/<dataset_id> beside the configs/ folder of the config written


def check_import_target(config_out: str, model_path: str) -> None:
    if checkpoints.latest(model_path):
        raise ConversionError(f"{model_path} already holds a checkpoint: choose an empty --model_path")
    if os.path.isdir(config_out):
        raise ConversionError(f"--config {config_out} is a folder: pass the path of the .json to write")


def imported_config(raw: dict, config_out: str, tokenizer, datasets: Optional[list], own_text: Optional[OwnText],
                    show_progress: bool = True) -> GPTConfig:
    """Finishes an imported model's config (JSON dict `raw`: the base's settings, the model's architecture):
    records the model's tokenizer, sets its datasets (`datasets` ids, or --text_dir's text encoded now with the
    tokenizer), checks it whole and writes it to config_out. Nothing is written before the checks that need no
    data have passed; the text's encoding comes before the config."""
    registry = dataset_registry_for(config_out)
    if tokenizer is not None:
        from data.create_tfrecords import dataset_config_path
        if None not in (tokenizer.eos_id, raw.get("eos_id")) and tokenizer.eos_id != raw["eos_id"]:
            raise ConversionError(f"the model's end-of-text id is {raw['eos_id']}, but its tokenizer's ({tokenizer.path}) "
                                  f"is {tokenizer.eos_id}: that is not the tokenizer the model was trained with; "
                                  f"give it the tokenizer files of its release")
        raw["tokenizer_id"] = {**tokenizer.tokenizer_id.to_json(), "from": dataset_config_path(tokenizer.path, registry)}
    if own_text is not None:
        if tokenizer is None:
            raise ConversionError("--text_dir needs the model's tokenizer to encode the text, and the model folder "
                                  "has no tokenizer files: pass --tokenizer_from a folder holding them")
        datasets = [own_text.dataset_id]
    if datasets is not None:
        raw["datasets"] = dataset_entries(raw, datasets)
    source = os.path.basename(config_out)
    model = config_from_dict({**raw, "datasets": []}, source=source, dataset_config_dir=registry)  # but the data
    if own_text is not None:
        from data.errors import DataError
        from data.own_text import encode_own_text
        entry = raw["datasets"][0]  # a bare id is read sequentially, a list's mode defaults to documents_random
        mode = "sequential" if isinstance(entry, str) else (entry[2] if len(entry) > 2 and entry[2] else
                                                            "documents_random")
        stitch = 1 if isinstance(entry, str) or len(entry) < 2 or entry[1] is None else entry[1]
        data_dir = own_text.data_dir or os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(registry))),
                                                     "data", own_text.dataset_id)
        try:
            encoded = encode_own_text(own_text.text_dir, own_text.eval_text_dir, own_text.dataset_id, tokenizer,
                                      model.n_ctx, stitch, mode, data_dir, registry, show_progress)
        except DataError as e:
            raise ConversionError(f"--text_dir: {e}") from None
        print(f"encoded {own_text.text_dir} with the model's tokenizer: training {encoded.train.line()}; held out "
              f"({encoded.held_out_files} files) {encoded.held_out.line()}; registered {encoded.config_path}")
    cfg = config_from_dict(raw, source=source, dataset_config_dir=registry)  # the data too, and its tokenizer
    os.makedirs(os.path.dirname(os.path.abspath(config_out)), exist_ok=True)
    with open(config_out, "w") as f:
        json.dump(raw, f, indent=2)
    return cfg


def from_hf(hf_dir: str, config_out: str, model_path: str, base_config: str = "default",
            datasets: Optional[list] = None, own_text: Optional[OwnText] = None,
            show_progress: bool = True) -> tuple[GPTConfig, str]:
    """HF folder -> our config JSON at config_out (recording the folder's tokenizer, when it has one) and a step-0
    checkpoint in model_path. `datasets` (ids) replace the base config's, each read as the base's entry is;
    `own_text` encodes a folder of text with the model's tokenizer into a new dataset to train on. Needs no
    PyTorch."""
    from transformers import GPTNeoConfig
    from schema import resolve_config_path

    config_path = os.path.join(hf_dir, "config.json")
    if not os.path.isfile(config_path):
        raise ConversionError(f"{hf_dir} has no config.json: pass a GPTNeoForCausalLM folder (save_pretrained's output)")
    check_import_target(config_out, model_path)
    model_type = read_json_file(config_path, "HF config").get("model_type")
    if model_type not in (None, "gpt_neo"):
        raise ConversionError(f"{config_path} is a {model_type} model, not GPTNeo: the converter reads GPTNeoForCausalLM "
                              f"folders")
    try:
        hf_config = GPTNeoConfig.from_pretrained(hf_dir, local_files_only=True)
    except (OSError, ValueError) as e:  # values GPTNeoConfig refuses (attention_types against num_layers, ...)
        raise ConversionError(f"{config_path} is not a GPTNeo config transformers reads ({str(e).splitlines()[0]})") \
            from None
    if not hf_config.tie_word_embeddings:
        raise ConversionError("the HF model's lm_head is not tied to wte; this model always ties them")
    hf_state = read_hf_weights(hf_dir)
    if "lm_head.weight" in hf_state and not np.array_equal(hf_state["lm_head.weight"],
                                                            hf_state.get("transformer.wte.weight")):
        raise ConversionError("the HF model's lm_head is not tied to wte; this model always ties them")
    tokenizer = folder_tokenizer(hf_dir)
    base = read_json(resolve_config_path(base_config), "base config")
    raw = config_from_hf(hf_config, base, model_path)
    architecture = config_from_dict({**raw, "datasets": []}, source=os.path.basename(config_out),
                                    dataset_config_dir=dataset_registry_for(config_out))
    state, shapes = {}, gpt.variable_shapes(architecture)  # the same model as cfg's below: read once
    for name in shapes:
        mapped = hf_name(name)
        if mapped is None or mapped[0] not in hf_state:
            raise ConversionError(f"variable {name} has no weight in the HF model")
        key, transpose = mapped
        state[name] = np.ascontiguousarray(hf_state[key].T if transpose else hf_state[key])
    imported_config(raw, config_out, tokenizer, datasets, own_text, show_progress)
    cfg = load_config(config_out)
    return cfg, write_checkpoint(cfg, state, shapes)


# GPT-Neo's config keys that describe the model (its architecture, options and special ids), taken from a
# mesh-tf release's config.json; every other key (training, data, mesh) comes from the base config.
NEO_MODEL_KEYS = ("n_layer", "n_embd", "n_head", "n_heads", "n_vocab", "n_ctx", "attention_types",
                  "local_attention_radius", "window_size", "activation_function", "scale_by_depth", "scale_by_in",
                  "embed_dropout", "attn_dropout", "res_dropout", "eos_id", "padding_id", "axial_pos_emb_")


def neo_model_keys() -> tuple:
    """NEO_MODEL_KEYS and every model option (schema.py's option() fields)."""
    import dataclasses
    return NEO_MODEL_KEYS + tuple(f.name for f in dataclasses.fields(GPTConfig) if f.metadata.get("model_option"))


def from_neo(neo_dir: str, config_out: str, model_path: str, tokenizer_dir: str, base_config: str = "default",
             datasets: Optional[list] = None, own_text: Optional[OwnText] = None,
             show_progress: bool = True) -> tuple[GPTConfig, str]:
    """GPT-Neo's own (mesh-tensorflow) release -> our config JSON and a step-0 checkpoint: the model keys of its
    config.json with the base config's training settings, and the weights of its newest checkpoint (stored in
    bfloat16 or float32; optimizer slots and global_step are left behind: a fine-tune starts its own). The
    release ships no tokenizer: tokenizer_dir is a folder with GPT-2's files (a released HF GPT-Neo folder has
    them), recorded as the model's."""
    import tensorflow.compat.v1 as tf
    from schema import resolve_config_path

    config_path = os.path.join(neo_dir, "config.json")
    if not os.path.isfile(config_path):
        raise ConversionError(f"{neo_dir} has no config.json: pass the folder of a GPT-Neo release (its config.json "
                              f"beside the model.ckpt-STEP files)")
    check_import_target(config_out, model_path)
    release = read_json_file(config_path, "GPT-Neo config")
    if "model_type" in release:
        raise ConversionError(f"{config_path} is an HF config (model_type {release['model_type']!r}): import an HF "
                              f"folder with from_hf")
    checkpoint = resolve_checkpoint(neo_dir)
    tokenizer = folder_tokenizer(tokenizer_dir, "--tokenizer_from")
    if tokenizer is None:
        raise ConversionError(f"--tokenizer_from {tokenizer_dir} holds no tokenizer files (tokenizer.json, or "
                              f"vocab.json and merges.txt): pass a folder with GPT-2's, such as a released HF "
                              f"GPT-Neo folder")
    raw = {key: value for key, value in read_json(resolve_config_path(base_config), "base config").items()
           if key not in neo_model_keys()}
    raw.update({key: release[key] for key in neo_model_keys() if key in release})
    raw["model_path"] = model_path
    architecture = config_from_dict({**raw, "datasets": []}, source=os.path.basename(config_out),
                                    dataset_config_dir=dataset_registry_for(config_out))
    if tokenizer.vocab_size > architecture.n_vocab:
        raise ConversionError(f"--tokenizer_from's tokenizer has {tokenizer.vocab_size} tokens, more than the "
                              f"model's n_vocab {architecture.n_vocab}: pass the tokenizer the model was trained with")
    reader = tf.train.load_checkpoint(checkpoint)
    stored = reader.get_variable_to_shape_map()
    state, shapes = {}, gpt.variable_shapes(architecture)  # the same model as cfg's below: read once
    for name, shape in sorted(shapes.items()):
        if name not in stored:
            raise ConversionError(f"{checkpoint} lacks {name}: is it a checkpoint of {config_path}'s model?")
        value = np.asarray(reader.get_tensor(name)).astype(np.float32)
        if np.squeeze(value).shape != np.squeeze(np.zeros(shape, np.int8)).shape:
            raise ConversionError(f"{name} is {list(value.shape)} in {checkpoint} but {list(shape)} in "
                                  f"{config_path}'s model")
        state[name] = value.reshape(shape)
    imported_config(raw, config_out, tokenizer, datasets, own_text, show_progress)
    cfg = load_config(config_out)
    return cfg, write_checkpoint(cfg, state, shapes)


# ----------------------------------------------------------------------------------------------------
# CLI


def add_import_arguments(p) -> None:
    """The arguments from_hf and from_neo share: where to write, the base config, and the data to train on."""
    p.add_argument("--config", required=True, help="path of the model config JSON to write")
    p.add_argument("--model_path", required=True, help="empty folder for the checkpoint (the config's model_path)")
    p.add_argument("--base_config", default="default",
                   help="config whose training settings, datasets and mesh to keep (default: default; configs/"
                        "finetune.json holds a fine-tune's)")
    p.add_argument("--dataset", action="append", metavar="ID",
                   help="train on this registered dataset id instead of the base config's (repeatable), read as "
                        "the base's entry is (stitch, sampling mode, weight)")
    p.add_argument("--text_dir", help="a folder of your text (.txt files, one document each, or lm_dataformat "
                   "archives): encoded with the model's tokenizer into dataset --dataset_id, with every tenth file "
                   "held out for --eval")
    p.add_argument("--eval_text_dir", help="with --text_dir: held-out text of its own (then all of --text_dir trains)")
    p.add_argument("--dataset_id", default="mine", help="with --text_dir: the dataset id to register (default: mine)")
    p.add_argument("--data_dir", help="with --text_dir: where the tfrecords go (default: data/<dataset_id> beside "
                   "the configs/ folder of --config)")


def main(argv=None) -> int:
    p = ArgumentParser(prog="python -m tools.hf", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    out = sub.add_parser("to_hf", help="our checkpoint -> a GPTNeoForCausalLM folder")
    out.add_argument("--model", required=True, help="config name in configs/ or a path to a .json")
    out.add_argument("--checkpoint", help="checkpoint prefix or folder (default: the config's model_path)")
    out.add_argument("--out", required=True, help="folder to write (config.json, model.safetensors, tokenizer); "
                     "an earlier export there is replaced")
    out.add_argument("--yes", action="store_true", help="write into an --out that holds other files too, without "
                     "asking (they stay; its HF files are replaced)")
    into = sub.add_parser("from_hf", help="a GPTNeoForCausalLM folder -> our config and checkpoint")
    into.add_argument("hf_dir", help="folder with config.json and the weights (e.g. a downloaded EleutherAI model); "
                      "its tokenizer files, when it has them, are the model's tokenizer")
    add_import_arguments(into)
    into.add_argument("--tokenizer_dataset", metavar="ID",
                      help="register dataset ID for tfrecords already encoded with the HF folder's tokenizer (needs "
                           "--data_path; their manifest is checked); it becomes the config's last dataset")
    into.add_argument("--data_path", help="tfrecords glob of --tokenizer_dataset")
    into.add_argument("--eval_path", help="eval tfrecords glob of --tokenizer_dataset")
    neo = sub.add_parser("from_neo", help="GPT-Neo's own release (config.json and a mesh-tf checkpoint) -> our "
                         "config and checkpoint")
    neo.add_argument("neo_dir", help="folder with the release's config.json and model.ckpt-STEP files")
    neo.add_argument("--tokenizer_from", metavar="DIR", required=True,
                     help="folder with the model's tokenizer files (GPT-2's: vocab.json and merges.txt, or "
                          "tokenizer.json; a released HF GPT-Neo folder has them)")
    add_import_arguments(neo)
    args = p.parse_args(argv)

    import tensorflow.compat.v1 as tf
    tf.get_logger().setLevel("ERROR")
    try:
        if args.command == "to_hf":
            cfg = load_config(args.model)
            among = args.yes
            others = [] if among else other_files(args.out)
            if others and sys.stdin.isatty():  # as main.py --new asks; without a terminal, to_hf's error says --yes
                answer = input(f"--out {args.out} holds other files ({', '.join(others[:3])}"
                               f"{' ...' if len(others) > 3 else ''}). Write the export among them (its HF files "
                               f"there are replaced)? [y/N] ")
                if answer.strip().lower() not in ("y", "yes"):
                    print("nothing was written")
                    return 1
                among = True
            path = to_hf(cfg, args.checkpoint or cfg.model_path, args.out, among_other_files=among)
            print(f"wrote GPTNeoForCausalLM folder {path}")
            return 0
        own_text = OwnText(args.text_dir, args.dataset_id, args.eval_text_dir, args.data_dir) if args.text_dir else None
        if own_text and (args.dataset or getattr(args, "tokenizer_dataset", None)):
            raise ConversionError("--text_dir makes the dataset to train on: drop --dataset / --tokenizer_dataset")
        if args.command == "from_neo":
            cfg, checkpoint = from_neo(args.neo_dir, args.config, args.model_path, args.tokenizer_from,
                                       args.base_config, args.dataset, own_text)
        else:
            datasets = list(args.dataset or [])
            if args.tokenizer_dataset:
                if not args.data_path:
                    raise ConversionError("--tokenizer_dataset needs --data_path (the tfrecords it registers)")
                tokenizer = folder_tokenizer(args.hf_dir)
                if tokenizer is None:
                    raise ConversionError(f"{args.hf_dir} has no tokenizer files (tokenizer.json, or vocab.json and "
                                          f"merges.txt) for --tokenizer_dataset: copy them into it")
                check_import_target(args.config, args.model_path)
                written = register_tokenizer_dataset(tokenizer, args.tokenizer_dataset, args.data_path,
                                                     args.eval_path, dataset_registry_for(args.config))
                print(f"registered dataset {args.tokenizer_dataset} at {written}")
                datasets.append(args.tokenizer_dataset)
            cfg, checkpoint = from_hf(args.hf_dir, args.config, args.model_path, args.base_config,
                                      datasets or None, own_text)
        print(f"wrote config {args.config} and checkpoint {checkpoint}: train with python main.py --model "
              f"{args.config}")
        return 0
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
