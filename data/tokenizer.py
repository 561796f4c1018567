"""Load a tokenizer behind one small interface, whatever its origin.

Two kinds are supported, matching the ``tokenizer_path`` / ``tokenizer_is_pretrained`` keys of a
dataset config: a ``tokenizers`` JSON file (what ``data/train_tokenizer.py`` writes), or a
pretrained GPT-2 tokenizer loaded through ``transformers``. Both end up as a
``tokenizers.Tokenizer`` so encoding is fast, batched and identical in behaviour.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Optional

from tokenizers import Tokenizer

from schema import TokenizerId
from data.errors import DataError

EOS_TOKEN = "<|endoftext|>"
PADDING_TOKEN = "<|padding|>"


@dataclass(frozen=True)
class LoadedTokenizer:
    """A ``tokenizers.Tokenizer`` plus the ids the rest of the code needs to know about."""

    backend: Tokenizer
    path: str
    pretrained: bool

    @cached_property
    def vocab_size(self) -> int:
        """Number of ids the model's embedding must cover (added special tokens included).

        Cached: the tokenizers library rebuilds its vocabulary on every call.
        """
        return self.backend.get_vocab_size(with_added_tokens=True)

    @cached_property
    def eos_id(self) -> Optional[int]:
        """Id of ``<|endoftext|>``, the default document separator; None if the vocabulary lacks it."""
        return self.backend.token_to_id(EOS_TOKEN)

    @cached_property
    def padding_id(self) -> Optional[int]:
        """Id of ``<|padding|>`` if the vocabulary has one, else the eos id (GPT-2 has no pad token)."""
        padding = self.backend.token_to_id(PADDING_TOKEN)
        return self.eos_id if padding is None else padding

    @cached_property
    def tokenizer_id(self) -> TokenizerId:
        """What the configs record of this tokenizer: a SHA-256 of its vocabulary (added tokens included) and its
        merges, its size and its end-of-text id. The same tokenizer hashes the same whichever files it was read
        from (an HF folder's vocab.json and merges.txt, or its tokenizer.json, or ours); another vocabulary or
        merge order does not. The end-of-text id is recorded apart, not hashed, so records written before it
        keep their hash."""
        return TokenizerId(vocabulary_sha256(self.backend), self.vocab_size, self.path or None, self.eos_id)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; no special tokens are added, so decode(encode(x)) == x."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        """Token ids of many texts at once (the Rust side parallelises this across cores).

        Uses ``encode_batch_fast`` where the tokenizers library has it (0.20+): the same ids,
        without computing character offsets, which we never use (about 1.3x faster).
        """
        encode = getattr(self.backend, "encode_batch_fast", None) or self.backend.encode_batch
        return [encoding.ids for encoding in encode(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``, keeping special tokens so that nothing is silently lost."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=False)


def vocabulary_sha256(backend: Tokenizer) -> str:
    """SHA-256 of the model type, the vocabulary (token -> id, added tokens included) and the merges, in a form
    that does not depend on how the tokenizers library wrote them ("a b" strings or [a, b] pairs)."""
    model = json.loads(backend.to_str()).get("model", {})
    merges = [merge.split(" ", 1) if isinstance(merge, str) else list(merge) for merge in model.get("merges") or []]
    record = {"type": model.get("type"), "vocab": sorted(backend.get_vocab(with_added_tokens=True).items()),
              "merges": merges}
    return hashlib.sha256(json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8")).hexdigest()


def load_tokenizer(path: str, pretrained: bool = False) -> LoadedTokenizer:
    """Load a tokenizer JSON file, or (``pretrained``) a GPT-2 tokenizer folder or hub name.

    Raises DataError with a one-line message if the file is missing or unreadable, or if a
    pretrained tokenizer is neither available locally nor downloadable.
    """
    if pretrained:
        return LoadedTokenizer(_load_pretrained_backend(path), path, True)
    if not path:
        raise DataError("no tokenizer given: pass the path of a tokenizer json (e.g. data/tokenizers/stdlib-bpe-4096.json)")
    if not os.path.isfile(path):
        raise DataError(f"tokenizer file not found: {path}")
    try:
        backend = Tokenizer.from_file(path)
    except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
        raise DataError(f"cannot read tokenizer json {path}: {_first_line(exc)}") from exc
    return LoadedTokenizer(backend, path, False)


def load_tokenizer_folder(folder: str) -> Tokenizer:
    """The tokenizer of an HF model or tokenizer folder (a released GPT-Neo's, or to_hf's): its tokenizer.json
    read directly, else its vocab.json and merges.txt as GPT2TokenizerFast reads them. Without transformers'
    class check, so a folder saved by another tokenizer class loads without its three warning lines."""
    whole = os.path.join(folder, "tokenizer.json")
    if os.path.isfile(whole):
        try:
            return Tokenizer.from_file(whole)
        except Exception as exc:  # tokenizers raises a bare Exception on malformed JSON
            raise DataError(f"cannot read {whole}: {_first_line(exc)}: copy the folder again") from None
    missing = [name for name in ("vocab.json", "merges.txt") if not os.path.isfile(os.path.join(folder, name))]
    if missing:
        raise DataError(f"{folder} holds no tokenizer: it needs tokenizer.json, or vocab.json and merges.txt "
                        f"(missing {', '.join(missing)}); pass the folder of a released model or of to_hf's export")
    from transformers import GPT2TokenizerFast  # heavy import, only needed on this path
    from transformers.utils import logging as hf_logging
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # GPT2TokenizerFast is what vocab.json + merges.txt are: no class warning
    try:
        return GPT2TokenizerFast.from_pretrained(folder, local_files_only=True).backend_tokenizer
    except Exception as exc:  # OSError / ValueError for damaged files
        raise DataError(f"cannot read the tokenizer files in {folder} ({_first_line(exc)}): copy the folder "
                        f"again") from None
    finally:
        hf_logging.set_verbosity(verbosity)


def _load_pretrained_backend(name_or_folder: str) -> Tokenizer:
    """A local folder's tokenizer (load_tokenizer_folder), or GPT2TokenizerFast by hub name from the local
    cache; go to the hub only when it is reachable."""
    name_or_folder = name_or_folder or "gpt2"
    if os.path.isdir(name_or_folder):
        return load_tokenizer_folder(name_or_folder)
    from transformers import GPT2TokenizerFast  # heavy import, only needed on this path

    attempts = [True] if not _hub_reachable() else [True, False]
    last_error: Exception | None = None
    for local_files_only in attempts:
        try:
            tokenizer = GPT2TokenizerFast.from_pretrained(name_or_folder, local_files_only=local_files_only)
            return tokenizer.backend_tokenizer
        except Exception as exc:  # OSError / ValueError depending on what is missing
            last_error = exc
    raise DataError(
        f"cannot load the pretrained GPT-2 tokenizer {name_or_folder!r} offline "
        f"({_first_line(last_error)}); pass a local folder holding the GPT-2 tokenizer files "
        "(vocab.json and merges.txt, or tokenizer.json)"
    )


def _hub_reachable(timeout_s: float = 2.0) -> bool:
    """True if downloads are allowed and huggingface.co answers; offline machines never try."""
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0") or os.environ.get("TRANSFORMERS_OFFLINE", "") not in ("", "0"):
        return False
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def _first_line(exc: BaseException | None) -> str:
    text = str(exc).strip() if exc is not None else ""
    return text.splitlines()[0] if text else type(exc).__name__


# A folder's tokenizer is read from these (load_tokenizer_folder, GPT2TokenizerFast).
_FOLDER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "added_tokens.json", "special_tokens_map.json",
                 "tokenizer_config.json")
_IDS_READ: dict = {}


def tokenizer_id_at(path: Optional[str], pretrained: bool = False) -> Optional[TokenizerId]:
    """The TokenizerId of the tokenizer at a dataset config's tokenizer_path (a tokenizer json, or with
    `pretrained` a model folder), or None when there is none here to read (nothing at the path, a hub name such as
    "gpt2", a bucket): what config.py compares with the data's other records of its tokenizer. Each
    version of a file (its path, size and modification time) is read once a process: loading and hashing GPT-2's
    takes a tenth of a second, and every config read asks. A DataError when it is there but cannot be read."""
    if not path:
        return None
    if pretrained and os.path.isdir(path):
        files = [os.path.join(path, name) for name in _FOLDER_FILES if os.path.isfile(os.path.join(path, name))]
    elif not pretrained and os.path.isfile(path):
        files = [path]
    else:
        return None
    if not files:  # a folder without a tokenizer's files
        return None
    version = (os.path.abspath(path), pretrained,
               tuple((name, os.stat(name).st_size, os.stat(name).st_mtime_ns) for name in files))
    if version not in _IDS_READ:
        _IDS_READ[version] = load_tokenizer(path, pretrained).tokenizer_id
    return _IDS_READ[version]


def load_for_dataset(dataset) -> LoadedTokenizer:
    """The tokenizer a registered dataset (schema.py's DatasetConfig) was encoded with."""
    return load_tokenizer(dataset.tokenizer_path, pretrained=dataset.tokenizer_is_pretrained)


def load_for_config(cfg) -> LoadedTokenizer:
    """The tokenizer of the config's last dataset (it encodes prompts and decodes samples, as in GPT-Neo)."""
    dataset = cfg.tokenizer_dataset
    if dataset is None or not dataset.tokenizer_path:
        raise DataError("no tokenizer: the config's last dataset must name tokenizer_path in its dataset config")
    tokenizer = load_for_dataset(dataset)
    problem = not_the_encoder(dataset, tokenizer)  # prompts encoded, samples decoded with another tokenizer
    if problem:
        raise DataError(problem)
    return tokenizer


def not_the_encoder(dataset, tokenizer: LoadedTokenizer) -> Optional[str]:
    """What is wrong when a dataset's tokenizer_path holds another tokenizer than the one its config records as
    having encoded it (the path pointed elsewhere, or the file retrained in place); None when it is the one, or
    when nothing is recorded."""
    if dataset.tokenizer_id is None or tokenizer.tokenizer_id.matches(dataset.tokenizer_id):
        return None
    return (f"{dataset.id}'s tokenizer_path {dataset.tokenizer_path} is tokenizer {tokenizer.tokenizer_id}, but its "
            f"config records that {dataset.tokenizer_id} encoded it: point tokenizer_path at the tokenizer that "
            f"encoded it, or encode the text again")
