"""A synthetic language of facts whose entropy per token is known exactly, for the scaling ladder.

The stream is a sequence of facts of three tokens: a key of two tokens (`aI bJ`), drawn from a Zipf distribution
over `keys` pairs (rank r has probability r^-zipf / Z, the pairs given ranks in a seeded random order), then the
key's value (`vK`), fixed per key by the seed and replaced by a uniformly drawn value with probability `noise`.
Facts are independent, so the entropy per token is exactly

    (H(key) + H(value | key)) / 3,

H(key) the Zipf distribution's entropy and H(value | key) the noise's, the same for every key. A model learns the
frequent keys' values first; the rare keys' values take parameters to hold and tokens to see, so the loss falls
as a power of both toward that floor (the quanta account of scaling: Hutter 2021, "Learning curve theory";
Michaud et al. 2023, "The quantization model of neural scaling"), and a fitted E can be checked against it.

The three kinds of token have disjoint ids (word-level tokenizer, `tokenizer()`), and a document is a whole
number of facts with no separator between documents, so any stretch of the stream, a window of documents
stitched at a random offset included, is the same language: the next key never depends on what came before it.
An evaluation window (the eval set is cut into n_ctx + 1 = 129 = 3 x 43 tokens from its start) begins at a key,
so the best possible eval loss of a model that sees the window is the entropy per token above. (A training
window at a random offset may begin between a key's two tokens: its first value is then predicted without the
key's first token, at most 1/128 of its tokens.)

Deterministic from the seed on every machine: numpy's PCG64 raw 64-bit output (its stream is fixed across
numpy versions), mapped to uniforms and inverted through the cumulative distribution here.

    python data/facts.py     # data/facts/ and data/facts_eval/, which configs/dataset_configs/facts.json names
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

if __package__ in (None, ""):  # allow `python data/facts.py` as well as `-m`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np

from data.errors import DataError

FIRST, SECOND, VALUE = "a", "b", "v"  # the three kinds of token
RANGE = 128  # ids of each kind: keys are pairs of 128 x 128, values one of at most 128
SPECIAL = ("<|endoftext|>", "<|padding|>", "<|unk|>")
TOKENIZER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tokenizers", "facts-word-387.json")
FACT_TOKENS = 3


@dataclass(frozen=True)
class Language:
    """The generator's parameters: what decides the stream (with the seed) and its entropy."""

    keys: int = 16384
    zipf: float = 1.6
    values: int = 128
    noise: float = 0.0

    def check(self) -> None:
        if not 2 <= self.keys <= RANGE * RANGE:
            raise DataError(f"--keys must be 2 to {RANGE * RANGE} (pairs of {RANGE} x {RANGE} tokens), got {self.keys}")
        if not 0 <= self.zipf <= 10:
            raise DataError(f"--zipf must be 0 to 10, got {self.zipf}")
        if not 2 <= self.values <= RANGE:
            raise DataError(f"--values must be 2 to {RANGE}, got {self.values}")
        if not 0 <= self.noise <= 1:
            raise DataError(f"--noise must be a probability, 0 to 1, got {self.noise}")

    def key_probabilities(self) -> np.ndarray:
        weights = np.arange(1, self.keys + 1, dtype=np.float64) ** -self.zipf
        return weights / weights.sum()

    def key_entropy(self) -> float:
        p = self.key_probabilities()
        return float(-(p * np.log(p)).sum())

    def value_entropy(self) -> float:
        """H(value | key): the right value with probability 1 - noise + noise / values, each other noise / values."""
        right, other = 1 - self.noise + self.noise / self.values, self.noise / self.values
        return 0.0 - sum(q * math.log(q) * n for q, n in ((right, 1), (other, self.values - 1)) if q > 0)

    def entropy_per_token(self) -> float:
        """The stream's entropy rate in nats per token: the best loss any model can reach on it."""
        return (self.key_entropy() + self.value_entropy()) / FACT_TOKENS


class Source:
    """Uniforms in [0, 1) from PCG64's raw output, whose stream numpy keeps fixed across versions."""

    def __init__(self, seed: int):
        self.bits = np.random.PCG64(seed)

    def uniform(self, count: int) -> np.ndarray:
        return (self.bits.random_raw(count) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53

    def below(self, n: int, count: int) -> np.ndarray:
        return np.minimum((self.uniform(count) * n).astype(np.int64), n - 1)


def table(language: Language, seed: int) -> tuple:
    """(pairs, values): rank r's key is pairs[r] (an index first * 128 + second) and its value values[r]. Drawn
    from the seed alone, so the train and eval streams (other seeds of the stream) share them."""
    source = Source(seed)
    order = np.argsort(source.uniform(RANGE * RANGE), kind="stable")
    return order[:language.keys], source.below(language.values, language.keys)


def facts(language: Language, seed: int, stream_seed: int, count: int) -> np.ndarray:
    """[count, 3] token indices (first, second, value) of `count` facts: the table of `seed`, drawn by `stream_seed`."""
    pairs, values = table(language, seed)
    source = Source(stream_seed)
    cumulative = np.cumsum(language.key_probabilities())
    ranks = np.minimum(np.searchsorted(cumulative, source.uniform(count) * cumulative[-1], side="right"), language.keys - 1)
    noisy = source.uniform(count) < language.noise
    drawn = source.below(language.values, count)
    value = np.where(noisy, drawn, values[ranks])
    return np.stack([pairs[ranks] // RANGE, pairs[ranks] % RANGE, value], axis=1)


def text(rows: np.ndarray) -> str:
    """The facts as words: `a12 b7 v3 a0 b99 v41 ...`."""
    return " ".join(f"{FIRST}{a} {SECOND}{b} {VALUE}{v}" for a, b, v in rows.tolist())


def vocabulary() -> dict:
    words = list(SPECIAL) + [f"{kind}{i}" for kind in (FIRST, SECOND, VALUE) for i in range(RANGE)]
    return {word: index for index, word in enumerate(words)}


def tokenizer():
    """The word-level tokenizer of the language (what data/tokenizers/facts-word-387.json holds)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    backend = Tokenizer(models.WordLevel(vocab=vocabulary(), unk_token="<|unk|>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return backend


def empirical_entropy(rows: np.ndarray) -> float:
    """The plug-in estimate of the entropy per token from a sample of facts: the keys' and each key's values'
    observed frequencies (biased low by about (number of outcomes - 1) / 2n nats; a check, not the truth)."""
    keys = rows[:, 0] * RANGE + rows[:, 1]
    _, fact_counts = np.unique(keys * RANGE + rows[:, 2], return_counts=True)
    p = fact_counts / len(rows)
    return float(-(p * np.log(p)).sum() / FACT_TOKENS)


@dataclass(frozen=True)
class Split:
    name: str
    stream_seed: int
    documents: int


def generate(output_dir: str, name: str, language: Language, seed: int, train_tokens: int, eval_tokens: int,
             document_facts: int = 344, dataset_config_dir: Optional[str] = None, quiet: bool = True) -> dict:
    """Writes `output_dir/name/` (training) and `output_dir/name_eval/` (evaluation) tfrecords through
    create_tfrecords (manifests and all), `name.entropy.json` beside each, and, with `dataset_config_dir`, the
    dataset config `name.json` there. Returns what entropy.json holds."""
    from data import create_tfrecords as ct
    from data.documents import Document
    from data.tokenizer import load_tokenizer, vocabulary_sha256

    language.check()
    if document_facts < 43:
        raise DataError(f"--document_facts must be at least 43 (129 tokens, a window of n_ctx 128), got {document_facts}")
    if train_tokens < FACT_TOKENS * document_facts or eval_tokens < FACT_TOKENS * document_facts:
        raise DataError(f"--train_tokens and --eval_tokens must each hold a document ({FACT_TOKENS * document_facts} tokens)")
    loaded = load_tokenizer(TOKENIZER_PATH)
    if loaded.tokenizer_id.sha256 != vocabulary_sha256(tokenizer()):
        raise DataError(f"{TOKENIZER_PATH} is not the language's tokenizer: restore it from the repository")
    record = {"entropy_per_token_nats": language.entropy_per_token(), "key_entropy_nats": language.key_entropy(),
              "value_entropy_nats": language.value_entropy(), "language": asdict(language), "seed": seed,
              "document_facts": document_facts}
    splits = [Split(name, seed * 2 + 1, -(-train_tokens // (FACT_TOKENS * document_facts))),
              Split(f"{name}_eval", seed * 2 + 2, -(-eval_tokens // (FACT_TOKENS * document_facts)))]
    for split in splits:
        folder = os.path.join(output_dir, split.name)
        rows = facts(language, seed, split.stream_seed, split.documents * document_facts)
        documents = [Document(f"{split.name}/{i}", text(rows[i * document_facts:(i + 1) * document_facts]))
                     for i in range(split.documents)]
        summary = ct.Summary()
        ct._check_settings("documents", split.name, 1, 100, 1, 0)
        settings = ct.EncodingSettings("documents", (), 1, 0, 100, split.name)
        os.makedirs(folder, exist_ok=True)
        for old in os.listdir(folder):  # a dataset of other parameters: made again whole
            if old.startswith(split.name + "_") or old.startswith(split.name + "."):
                os.remove(os.path.join(folder, old))
        ct.write_json_atomically(os.path.join(folder, f"{split.name}.manifest.json"), {
            "settings": asdict(settings) | {"separator": []},
            "tokenizer_sha256": hashlib.sha256(loaded.backend.to_str().encode("utf-8")).hexdigest(),
            "inputs_sha256": hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest(),
            "tokenizer_id": {"sha256": loaded.tokenizer_id.sha256, "size": loaded.tokenizer_id.size}})
        for index, start in enumerate(range(0, len(documents), 100)):
            ct._encode_and_write_group(index, documents[start:start + 100], loaded, settings, folder)
        ct.write_json_atomically(os.path.join(folder, f"{split.name}.entropy.json"), record | {"facts": len(rows)})
        if dataset_config_dir is not None:
            ct.write_dataset_config(name, folder, split.name, loaded, "train" if split.name == name else "eval",
                                    dataset_config_dir, note_missing_split=False)
        if not quiet:
            print(f"{folder}: {split.documents} documents, {len(rows) * FACT_TOKENS} tokens")
    return record


def read_entropy(files_glob: str) -> Optional[float]:
    """The entropy per token recorded beside a dataset's files (`NAME.entropy.json` in their folder), or None."""
    folder = os.path.dirname(files_glob)
    if not os.path.isdir(folder):
        return None
    for entry in sorted(os.listdir(folder)):
        if entry.endswith(".entropy.json"):
            with open(os.path.join(folder, entry), encoding="utf-8") as handle:
                return float(json.load(handle)["entropy_per_token_nats"])
    return None


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", default="data", help="the splits go to OUTPUT_DIR/NAME and OUTPUT_DIR/NAME_eval")
    parser.add_argument("--name", default="facts", help="the dataset's name (and its dataset config's id)")
    defaults = Language()
    parser.add_argument("--keys", type=int, default=defaults.keys, help="how many keys (pairs of tokens) the Zipf distribution ranks")
    parser.add_argument("--zipf", type=float, default=defaults.zipf, help="the Zipf exponent of the keys' ranks")
    parser.add_argument("--values", type=int, default=defaults.values, help="how many value tokens")
    parser.add_argument("--noise", type=float, default=defaults.noise, help="probability that a fact's value is drawn uniformly instead")
    parser.add_argument("--seed", type=int, default=1, help="the key-value table's and the streams' seed")
    parser.add_argument("--train_tokens", type=int, default=12_000_000, help="at least the largest run's tokens (the CPU ladder's: 9M), so no fact is seen twice in order")
    parser.add_argument("--eval_tokens", type=int, default=66_048)
    parser.add_argument("--document_facts", type=int, default=344, help="facts per document (3 tokens each)")
    parser.add_argument("--dataset_config_dir", default=None, help="write the dataset config NAME.json here (the repository's configs/dataset_configs for the shipped one)")
    parser.add_argument("--entropy", action="store_true", help="print the language's entropy per token and write nothing")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    language = Language(args.keys, args.zipf, args.values, args.noise)
    try:
        language.check()
        if args.entropy:
            print(f"{language.entropy_per_token():.6f}")
            return 0
        record = generate(args.output_dir, args.name, language, args.seed, args.train_tokens, args.eval_tokens,
                          args.document_facts, args.dataset_config_dir, quiet=False)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"entropy per token: {record['entropy_per_token_nats']:.6f} nats (keys {record['key_entropy_nats']:.4f}, "
          f"value given key {record['value_entropy_nats']:.4f}, over {FACT_TOKENS} tokens)")
    return 0


if __name__ == "__main__":
    from console.stderr_filter import quiet_tensorflow
    quiet_tensorflow()  # create_tfrecords writes the splits with TensorFlow: its C++ start-up chatter stays off
    sys.exit(main())
