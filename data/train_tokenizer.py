"""Train a byte-level BPE tokenizer and save it as one ``tokenizers`` JSON file.

Byte-level BPE (the GPT-2 scheme) can encode any text without unknown tokens and decodes
back to exactly the input, which matters for source code where whitespace is meaningful.
The special tokens come first so their ids are fixed (``<|endoftext|>`` = 0 by default),
independent of the training text.

Example (the tokenizer committed as data/tokenizers/stdlib-bpe-4096.json):

    STDLIB=$(python -c "import sysconfig; print(sysconfig.get_path('stdlib'))")
    python -m data.train_tokenizer --input_dir "$STDLIB" --glob '*.py' --vocab_size 4096 \
        --output data/tokenizers/stdlib-bpe-4096.json
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Iterator, Optional, Sequence

if __package__ in (None, ""):  # allow `python data/train_tokenizer.py` as well as `-m`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from tqdm import tqdm

from console.arguments import ArgumentParser
from data.documents import check_whole, iter_documents, list_input_files
from data.errors import DataError

DEFAULT_SPECIAL_TOKENS = ("<|endoftext|>", "<|padding|>", "[MASK]", "[CLS]")


def train_tokenizer(
    input_path: str,
    output_path: str,
    vocab_size: int,
    pattern: Optional[str] = None,
    special_tokens: Sequence[str] = DEFAULT_SPECIAL_TOKENS,
    min_frequency: int = 2,
    show_progress: bool = True,
) -> Tokenizer:
    """Train on every document under ``input_path`` and write the tokenizer JSON atomically.

    Returns the trained tokenizer. Undecodable documents are skipped and counted on stderr.
    """
    if vocab_size <= len(special_tokens) + 256:
        raise DataError(f"--vocab_size {vocab_size} is too small: it must exceed 256 byte tokens + {len(special_tokens)} special tokens")
    if len(set(special_tokens)) != len(special_tokens):
        raise DataError(f"--special_tokens has duplicates: {list(special_tokens)}")
    files = list_input_files(input_path, pattern)
    check_whole(files)
    tokenizer = _empty_byte_level_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    counts = {"documents": 0, "undecodable": 0}
    tokenizer.train_from_iterator(_texts(files, counts, show_progress), trainer=trainer)
    if counts["documents"] == 0:
        raise DataError(f"no decodable text found in {input_path} ({counts['undecodable']} undecodable documents)")
    if counts["undecodable"]:
        print(f"warning: skipped {counts['undecodable']} undecodable documents", file=sys.stderr)
    _save_atomically(tokenizer, output_path)
    print(
        f"trained byte-level BPE: vocab {tokenizer.get_vocab_size()} from {counts['documents']} documents "
        f"in {len(files)} files -> {output_path}",
        file=sys.stderr,
    )
    return tokenizer


def _empty_byte_level_bpe() -> Tokenizer:
    """A BPE model with GPT-2 style byte-level pre-tokenisation and decoding (lossless)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _texts(files: list[str], counts: dict, show_progress: bool) -> Iterator[str]:
    """Decodable document texts, counting both kinds; the bar shows files read."""
    for document in tqdm(iter_documents(files), desc="reading documents", unit="doc", disable=not show_progress):
        if document.decodable:
            counts["documents"] += 1
            yield document.text
        else:
            counts["undecodable"] += 1


def _save_atomically(tokenizer: Tokenizer, output_path: str) -> None:
    folder = os.path.dirname(os.path.abspath(output_path))
    os.makedirs(folder, exist_ok=True)
    temporary = output_path + ".tmp"
    tokenizer.save(temporary)
    os.replace(temporary, output_path)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = ArgumentParser(prog="python data/train_tokenizer.py", description="Train a byte-level BPE tokenizer (tokenizers library) and save it as JSON.")
    parser.add_argument("--input_dir", required=True, help="folder of text files, or an lm_dataformat archive (jsonl, jsonl.zst, ...)")
    parser.add_argument("--glob", default=None, help="files to read inside --input_dir, e.g. '*.py' or '**/*.txt' (default: .txt and lm_dataformat archives, recursively)")
    parser.add_argument("--vocab_size", type=int, default=32768, help="vocabulary size including special tokens")
    parser.add_argument("--special_tokens", nargs="+", default=list(DEFAULT_SPECIAL_TOKENS), help="special tokens, given ids 0, 1, ... in this order")
    parser.add_argument("--min_frequency", type=int, default=2, help="minimum count for a merge to be learned")
    parser.add_argument("--output", required=True, help="path of the tokenizer json to write")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        train_tokenizer(args.input_dir, args.output, args.vocab_size, args.glob, args.special_tokens, args.min_frequency)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
