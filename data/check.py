"""`main.py --check_dataset`: each dataset of the config read through (files, documents, tokens, the token id
range and document lengths), its ids checked against the model's and the dataset's n_vocab, its tokenizer file
checked against the tokenizer its config records as having encoded it, and the start of its first document
decoded with its tokenizer. Reads with data/inputs.py's CRC-checking reader, so a corrupt or foreign file is
named. (A dataset encoded with another tokenizer than the model's never gets here: the config is refused when
it is read, schema.py's check_tokenizer_ids.)"""
from __future__ import annotations

from schema import GPTConfig, warn_unrecorded_tokenizers
from data.errors import DataError
from data.inputs import first_document_tokens, token_stats
from data.tokenizer import load_for_dataset, not_the_encoder


def run(cfg: GPTConfig) -> int:
    """Prints what each dataset holds; a DataError naming every token id beyond a vocabulary."""
    warn_unrecorded_tokenizers(cfg)
    failures = []
    for use in cfg.datasets:
        ds = use.dataset
        for kind, path in (("train", ds.path), ("eval", ds.eval_path)):
            if not path:
                continue
            stats = token_stats(path)
            print(f"{ds.id} ({kind}) {path}: {stats['files']} files, {stats['documents']} documents, "
                  f"{stats['tokens']} tokens, token ids {stats['min_token_id']}..{stats['max_token_id']}, "
                  f"document lengths {stats['min_document_tokens']}..{stats['max_document_tokens']}")
            top = stats["max_token_id"]
            if top is not None and top >= cfg.n_vocab:
                failures.append(f"{ds.id} ({kind}) has token id {top} >= the model's n_vocab {cfg.n_vocab}: "
                                f"raise n_vocab or re-encode with a smaller tokenizer")
            elif top is not None and top >= ds.n_vocab:
                failures.append(f"{ds.id} ({kind}) has token id {top} >= its registered n_vocab {ds.n_vocab}: "
                                f"fix n_vocab in its dataset config to the tokenizer's size")
        if ds.tokenizer_path:
            tokenizer = load_for_dataset(ds)
            problem = not_the_encoder(ds, tokenizer)
            if problem:
                failures.append(problem)
            sample = first_document_tokens(ds.path or ds.eval_path, 64)
            print(f"{ds.id} decoded sample: {tokenizer.decode(sample)!r}")
    if failures:
        raise DataError("; ".join(failures))
    print("dataset check passed")
    return 0
