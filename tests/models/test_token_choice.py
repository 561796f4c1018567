"""models/token_choice.py: the draw of a token from a row of logits, against NumPy's softmax and its filters.

Each test draws many tokens from one row of logits (the row repeated, each copy with its own row index, which the
stateless noise hashes) and compares the counts with the probabilities NumPy computes: the draw must be a
sample of softmax(logits / temperature) restricted to what top-k and top-p keep, not merely a plausible token."""
import numpy as np
import pytest
import tensorflow.compat.v1 as tf
from scipy import stats

from models.sampling import SamplingOptions
from models.token_choice import is_one_of_tf, stateless_uniform
from tiny import choose_tokens

LOGITS = np.array([2.0, 1.2, 0.9, 0.3, -0.4, -1.5], np.float32)
DRAWS = 20_000


def run_tf(fn, *arrays):
    with tf.Graph().as_default(), tf.Session() as session:
        return session.run(fn(*[tf.constant(a) for a in arrays]))


def counts(options: SamplingOptions, seed: int = 5, position: int = 3) -> np.ndarray:
    tiled = np.tile(LOGITS, (DRAWS, 1))
    rows = np.arange(DRAWS, dtype=np.int32)
    seeds = np.full(DRAWS, seed, np.int32)
    chosen = run_tf(lambda lg, sd, rw: choose_tokens(lg, sd, rw, position, options), tiled, seeds, rows)
    return np.bincount(chosen, minlength=len(LOGITS))


def softmax(z: np.ndarray) -> np.ndarray:
    z = np.asarray(z, np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def assert_sample_of(found: np.ndarray, probs: np.ndarray):
    """Counts drawn from `probs`: zero where it is zero, and a chi-square test over the rest (p > 1e-4, so a
    correct draw fails about once in 10,000 runs; a wrong temperature or filter fails with p near 0)."""
    assert found[probs == 0].sum() == 0, f"tokens of probability 0 drawn: {found}"
    kept = probs > 0
    expected = probs[kept] / probs[kept].sum() * found.sum()
    assert stats.chisquare(found[kept], expected).pvalue > 1e-4, f"counts {found} against expected {expected}"


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_draws_are_a_sample_of_the_softmax_over_temperature(temperature):
    """Bug it catches: the logits not divided by the temperature, or the Gumbel noise's sign flipped."""
    assert_sample_of(counts(SamplingOptions(1, temperature=temperature)), softmax(LOGITS / temperature))


def test_top_k_and_top_p_draw_from_what_they_keep_in_proportion():
    """Bug it catches: top-k keeping one token too few (`logits <= kth`), or top-p's nucleus cut after the token
    that crosses p instead of at it."""
    probs = softmax(LOGITS)
    top3 = np.where(np.arange(len(LOGITS)) < 3, probs, 0.0)
    assert_sample_of(counts(SamplingOptions(1, top_k=3)), top3 / top3.sum())
    # top-p 0.7: the smallest prefix of the sorted tokens whose mass reaches 0.7 (each token kept while the mass
    # before it is under p).
    before = np.concatenate([[0.0], np.cumsum(probs)[:-1]])
    nucleus = np.where(before < 0.7, probs, 0.0)
    assert 1 < np.count_nonzero(nucleus) < len(LOGITS)
    assert_sample_of(counts(SamplingOptions(1, top_p=0.7)), nucleus / nucleus.sum())


def test_temperature_zero_takes_the_argmax():
    found = counts(SamplingOptions(1, temperature=0.0))
    assert found[np.argmax(LOGITS)] == DRAWS


def test_the_noise_is_uniform_and_a_pure_function_of_seed_row_and_position():
    """Bug it catches: a stateful random op in place of the hash (the same seeds give other tokens on a second
    run), or the position left out of the hash (every step of a row draws with the same noise)."""
    rows = np.arange(64, dtype=np.int32)

    def noise(seed, position):
        return run_tf(lambda sd, rw: stateless_uniform(sd, rw, tf.constant(position), 512),
                      np.full(64, seed, np.int32), rows)

    first = noise(7, 10)
    np.testing.assert_array_equal(first, noise(7, 10))  # another graph and session: the same numbers
    assert not np.array_equal(first, noise(7, 11)) and not np.array_equal(first, noise(8, 10))
    assert first.min() > 0.0 and first.max() < 1.0
    assert stats.kstest(first.ravel(), "uniform").pvalue > 1e-4


def test_is_one_of_marks_every_listed_id():
    ids = np.array([[3, 7, 9], [0, 7, 2]], np.int32)
    np.testing.assert_array_equal(run_tf(lambda t: is_one_of_tf(t, (7, 2)), ids),
                                  [[False, True, False], [False, True, True]])
