"""Python-like source text for the tests' tfrecords, generated: the same bytes on every Python version and
machine (integer arithmetic only; no `random`, whose algorithms may change between versions, no files of the
interpreter's standard library, which do), and close enough to what the committed tokenizer
(data/tokenizers/stdlib-bpe-4096.json, trained on Python's standard library) was trained on that it encodes
to ~4 characters a token, as real source does.

    train: 5 documents of ~10 KB; eval: 3 of ~14 KB; eval_large: 5 of ~30 KB (the sizes of the standard
    library files the tests read before); ladder: 20 of ~30 KB (tests/ladder/test_ladder.py's sizes train on it without
    repeating it much)."""
from __future__ import annotations

import os

SPLITS = {"train": (1, 5, 10_000), "eval": (2, 3, 14_000), "eval_large": (3, 5, 30_000),
          "ladder": (4, 20, 30_000)}  # seed, documents, bytes

VERBS = ["get", "set", "read", "write", "parse", "load", "dump", "make", "find", "check", "update", "encode",
         "decode", "split", "join", "format", "close", "open", "add", "remove", "copy", "convert", "build", "scan"]
NOUNS = ["name", "value", "header", "line", "item", "key", "path", "data", "buffer", "token", "message", "part",
         "address", "charset", "payload", "object", "field", "number", "string", "list", "index", "result", "text"]
MODULES = ["os", "re", "sys", "io", "json", "codecs", "string", "collections", "functools", "itertools", "time"]
EXCEPTIONS = ["ValueError", "TypeError", "KeyError", "IndexError", "AttributeError", "RuntimeError"]
WORDS = ["the", "a", "of", "to", "is", "and", "in", "for", "if", "this", "that", "be", "not", "it", "with", "as",
         "an", "value", "return", "object", "string", "list", "header", "message", "should", "must", "will",
         "when", "each", "first", "default", "given", "new", "used", "encoded", "decoded", "empty", "none"]


class _Stream:
    """A 64-bit linear congruential generator (Knuth's MMIX constants): plain integer arithmetic."""

    def __init__(self, seed: int):
        self.state = seed * 0x9E3779B97F4A7C15 % 2 ** 64

    def below(self, n: int) -> int:
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) % 2 ** 64
        return (self.state >> 33) % n

    def pick(self, options: list):
        return options[self.below(len(options))]


def _sentence(s: _Stream) -> str:
    words = [s.pick(WORDS) for _ in range(4 + s.below(9))]
    return " ".join(words).capitalize() + "."


def _function(s: _Stream, indent: str) -> str:
    name = f"{s.pick(VERBS)}_{s.pick(NOUNS)}"
    args = ["self"] if indent else []
    args += sorted({s.pick(NOUNS) for _ in range(1 + s.below(3))})
    arg, var, item = args[-1], s.pick(NOUNS) + "s", s.pick(NOUNS)
    body = [f'"""{_sentence(s)}', "", f"{_sentence(s)} {_sentence(s)}", '"""']
    body += [f"if {arg} is None:", f"    raise {s.pick(EXCEPTIONS)}('{s.pick(WORDS)} {s.pick(NOUNS)} %r' % ({arg},))",
             f"{var} = []"]
    for _ in range(1 + s.below(3)):
        kind = s.below(4)
        if kind == 0:
            body += [f"for {item} in {arg}:", f"    if {item}.{s.pick(VERBS)}_{s.pick(NOUNS)}():",
                     f"        {var}.append({item})", "    else:", f"        {var}.extend({s.pick(MODULES)}.{s.pick(VERBS)}({item}))"]
        elif kind == 1:
            body += [f"{item} = {arg}.get({s.pick(NOUNS)!r}, {s.below(100)})",
                     f"# {_sentence(s)}", f"{var}.append(str({item}) + {s.pick(WORDS)!r})"]
        elif kind == 2:
            body += ["try:", f"    {item} = {s.pick(MODULES)}.{s.pick(VERBS)}_{s.pick(NOUNS)}({arg}[{s.below(8)}:])",
                     f"except {s.pick(EXCEPTIONS)}:", f"    {item} = None", f"{var}.append({item})"]
        else:
            body += [f"while len({var}) < {2 + s.below(30)}:", f"    {var}.insert(0, {s.pick(NOUNS)!r})"]
    body.append(s.pick([f"return {var}", f"return ''.join({var})", f"return {var}[{s.below(4)}]",
                        f"return len({var}) > {s.below(10)}"]))
    lines = [f"{indent}def {name}({', '.join(args)}):"] + [f"{indent}    {line}" if line else "" for line in body]
    return "\n".join(lines) + "\n"


def _document(s: _Stream, size: int) -> str:
    parts = [f'"""{_sentence(s)}\n\n{_sentence(s)} {_sentence(s)}\n"""\n\n']
    parts += [f"import {m}\n" for m in sorted({s.pick(MODULES) for _ in range(3)})]
    parts.append(f"\n__all__ = [{', '.join(repr(s.pick(VERBS) + '_' + s.pick(NOUNS)) for _ in range(3))}]\n\n")
    while sum(map(len, parts)) < size:
        if s.below(3) == 0:
            parts.append(f"\nclass {s.pick(NOUNS).capitalize()}{s.pick(VERBS).capitalize()}er:\n"
                         f'    """{_sentence(s)}"""\n\n')
            for _ in range(2 + s.below(3)):
                parts.append(_function(s, "    ") + "\n")
        else:
            parts.append("\n" + _function(s, "") + "\n")
    return "".join(parts)


def documents(split: str) -> list[str]:
    """The split's documents ("train", "eval", "eval_large" or "ladder"): always the same text."""
    seed, count, size = SPLITS[split]
    stream = _Stream(seed)
    return [_document(stream, size) for _ in range(count)]


def write_documents(folder, split: str) -> None:
    """The split's documents as folder/doc_<i>.txt (the folder is made if missing)."""
    os.makedirs(folder, exist_ok=True)
    for index, text in enumerate(documents(split)):
        with open(os.path.join(folder, f"doc_{index}.txt"), "w", encoding="utf-8") as f:
            f.write(text)
