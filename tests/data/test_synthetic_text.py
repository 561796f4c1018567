"""data/synthetic_text.py: the generated text is the same bytes whatever the interpreter's string hashing, and its
documents have the sizes asked for (the tests' splits: tests/corpus.py; bench/bench_harness.py's tasks)."""
import hashlib
import os
import subprocess
import sys

from data import synthetic_text

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DIGEST = ("import hashlib; from data.synthetic_text import documents; "
          "print(hashlib.sha256(''.join(documents(1, 5, 10_000)).encode()).hexdigest())")


def test_the_text_is_the_same_whatever_the_hash_seed_and_documents_have_their_size():
    """Five documents of at least 10,000 characters, the same bytes in this process and in two others whose string
    hashing differs (PYTHONHASHSEED 1 and 2), as on another machine or Python. (Bug: a set's order left to hashing,
    `sorted(...)` dropped around a document's imports: the text, and every tokenized test dataset, changes from run
    to run.)"""
    texts = synthetic_text.documents(1, 5, 10_000)
    assert len(texts) == 5 and all(len(t) >= 10_000 for t in texts)
    here = hashlib.sha256("".join(texts).encode()).hexdigest()
    for seed in ("1", "2"):
        done = subprocess.run([sys.executable, "-c", DIGEST], capture_output=True, text=True, cwd=REPO,
                              env=dict(os.environ, PYTHONHASHSEED=seed), timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == here, seed
