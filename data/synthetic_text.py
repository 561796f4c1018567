"""Python-like source text, generated: the same bytes on every Python version and machine (integer arithmetic
only; no `random`, whose algorithms may change between versions, no set or dict order left to string hashing, no
files of the interpreter's standard library, which change), and close enough to what the committed tokenizer
(data/tokenizers/stdlib-bpe-4096.json, trained on Python's standard library) was trained on that it encodes to ~4
characters a token, as real source does.

The tests' text (tests/corpus.py's splits) and bench/bench_harness.py's task examples are drawn from it. Nothing
here imports the rest of the project.
"""
from __future__ import annotations

VERBS = ["get", "set", "read", "write", "parse", "load", "dump", "make", "find", "check", "update", "encode",
         "decode", "split", "join", "format", "close", "open", "add", "remove", "copy", "convert", "build", "scan"]
NOUNS = ["name", "value", "header", "line", "item", "key", "path", "data", "buffer", "token", "message", "part",
         "address", "charset", "payload", "object", "field", "number", "string", "list", "index", "result", "text"]
MODULES = ["os", "re", "sys", "io", "json", "codecs", "string", "collections", "functools", "itertools", "time"]
EXCEPTIONS = ["ValueError", "TypeError", "KeyError", "IndexError", "AttributeError", "RuntimeError"]
WORDS = ["the", "a", "of", "to", "is", "and", "in", "for", "if", "this", "that", "be", "not", "it", "with", "as",
         "an", "value", "return", "object", "string", "list", "header", "message", "should", "must", "will",
         "when", "each", "first", "default", "given", "new", "used", "encoded", "decoded", "empty", "none"]


class Stream:
    """A 64-bit linear congruential generator (Knuth's MMIX constants): plain integer arithmetic."""

    def __init__(self, seed: int):
        self.state = seed * 0x9E3779B97F4A7C15 % 2 ** 64

    def below(self, n: int) -> int:
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) % 2 ** 64
        return (self.state >> 33) % n

    def pick(self, options: list):
        return options[self.below(len(options))]


def words(s: Stream, n: int) -> str:
    """`n` words of prose and names, space-separated."""
    return " ".join(s.pick(WORDS + NOUNS) for _ in range(n))


def _sentence(s: Stream) -> str:
    chosen = [s.pick(WORDS) for _ in range(4 + s.below(9))]
    return " ".join(chosen).capitalize() + "."


def _function(s: Stream, indent: str) -> str:
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
                     f"        {var}.append({item})", "    else:",
                     f"        {var}.extend({s.pick(MODULES)}.{s.pick(VERBS)}({item}))"]
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


def document(s: Stream, size: int) -> str:
    """One module of at least `size` characters: a docstring, imports, `__all__`, then functions and classes."""
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


def documents(seed: int, count: int, size: int) -> list[str]:
    """`count` documents of at least `size` characters each, drawn in turn from one stream of `seed`."""
    stream = Stream(seed)
    return [document(stream, size) for _ in range(count)]
