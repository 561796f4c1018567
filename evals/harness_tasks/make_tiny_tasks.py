"""Writes the tiny task files beside it (run from anywhere: python evals/harness_tasks/make_tiny_tasks.py): a few
examples per task, generated from tests/corpus.py's word lists with its integer random stream, so the same bytes
on every machine. They exercise each request type of lm-evaluation-harness offline (tests/test_harness.py):

    tiny_choice     multiple choice, answers of several tokens, one empty question (loglikelihood)
    tiny_lambada    LAMBADA's last word, as lambada_openai defines it; long texts    (loglikelihood)
    tiny_rolling    perplexity over texts longer than a tiny model's context        (loglikelihood_rolling)
    tiny_generate   a completion until a newline, exact match                        (generate_until)
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests"))

from corpus import NOUNS, VERBS, WORDS, _Stream  # noqa: E402


def words(s: _Stream, n: int) -> str:
    return " ".join(s.pick(WORDS + NOUNS) for _ in range(n))


def write(name: str, records: list) -> None:
    with open(os.path.join(HERE, name + ".jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def main() -> None:
    s = _Stream(7)
    write("tiny_choice", [{"question": f"To {s.pick(VERBS)} the {s.pick(NOUNS)}, call",
                           "choices": [f"{s.pick(VERBS)}_{s.pick(NOUNS)}()" for _ in range(3)], "label": s.below(3)}
                          for _ in range(4)] +
          [{"question": "", "choices": [f"{s.pick(NOUNS)}.{verb}()" for verb in ("read", "write")], "label": 0}])
    write("tiny_lambada", [{"text": words(s, n) + " " + s.pick(NOUNS)} for n in (4, 9, 30, 60)])
    write("tiny_rolling", [{"text": "\n".join(words(s, 12) for _ in range(n))} for n in (1, 4, 9)])
    write("tiny_generate", [{"prompt": f"def {s.pick(VERBS)}_{s.pick(NOUNS)}(", "answer": s.pick(NOUNS)}
                            for _ in range(4)])


if __name__ == "__main__":
    main()
