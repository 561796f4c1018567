"""Size -> shape: a target non-embedding parameter count N becomes n_layer, n_embd and n_head.

The rule, anchored on GPT-3's table of shapes (Brown et al. 2020, table 2.1):
* heads are `head_width` wide (GPT-3 Small and Medium: 64), so n_embd is a multiple of it;
* among the shapes whose N is within `size_tolerance` (5%) of the target, the one whose aspect ratio
  n_embd / n_layer is nearest (in log) to `aspect_ratio` (GPT-3 Small 768 / 12 = 64, Large 1536 / 24 = 64);
  ties go to the smaller miss;
* N counts what models/flops.py's closed form counts for the base config's architecture: the blocks and the final
  norm, not the token and position embeddings (Kaplan et al. 2020's non-embedding count). The plan then counts
  the built graph (plan/model_graph.py) and says so where model options make the two differ.

A target no shape reaches within the tolerance (too small for one head, or a head too wide for a fine enough
step) is an error naming the nearest shape and the rule to change.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Optional

from schema import GPTConfig
from models import flops

from ladder.spec import LadderError, Rules, short_count

MAX_LAYERS = 256


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_embd: int
    n_head: int
    non_embedding: int            # the closed form's count

    @property
    def aspect(self) -> float:
        return self.n_embd / self.n_layer


def non_embedding(base: GPTConfig, n_layer: int, n_embd: int) -> int:
    """The closed-form non-embedding count (models/flops.py) of the base architecture at this depth and width:
    `flops.parameter_count` of the base with this n_layer and n_embd, which reads nothing else of it. Counted
    without building that config (a dataclasses.replace of its ~100 fields: 27 us, where the count takes 1; a plan
    counts ~48,000 shapes for its FLOPs-per-token curve)."""
    return flops.non_embedding_count(n_layer, n_embd)


def _widths(count: Callable[[int, int], int], n_layer: int, target: float, step: int,
            most: Optional[int] = None) -> list:
    """The two widths whose counts bracket the target at this depth: k and k + 1 times `step`, k the most steps
    (at least one) whose count is below the target. `most`: a k known not to be exceeded (one layer shallower's: at
    a given width a deeper model counts more), searched down from rather than up from one step."""
    def below(k):
        return count(n_layer, k * step) < target

    if most is None:
        lo, hi = 1, 2
        while below(hi):
            lo, hi = hi, hi * 2
    else:  # galloping down from `most`: a few counts where the width changes little from one depth to the next
        lo, hi, down = most, most + 1, 1
        while lo > 1 and not below(lo):
            lo, hi, down = max(1, lo - down), lo, down * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if below(mid):
            lo = mid
        else:
            hi = mid
    return [k * step for k in (lo, hi)]


def shape_for(base: GPTConfig, target: float, rules: Rules) -> Shape:
    """The rule above; raises LadderError when no shape is within the tolerance."""
    step = rules.head_width
    count_of = functools.lru_cache(maxsize=None)(functools.partial(non_embedding, base))  # each shape counted once
    best, nearest, most = None, None, None
    for n_layer in range(1, MAX_LAYERS + 1):
        if count_of(n_layer, step) > target * (1 + rules.size_tolerance):
            break  # one head per layer is already too many parameters: deeper is worse
        widths = _widths(count_of, n_layer, target, step, most)
        most = widths[0] // step
        for n_embd in widths:
            count = count_of(n_layer, n_embd)
            miss = abs(count / target - 1)
            shape = Shape(n_layer, n_embd, n_embd // step, count)
            if nearest is None or miss < abs(nearest.non_embedding / target - 1):
                nearest = shape
            if miss > rules.size_tolerance:
                continue
            key = (abs(math.log(shape.aspect / rules.aspect_ratio)), miss)
            if best is None or key < best[0]:
                best = (key, shape)
    if best is None:
        if nearest is None:
            nearest = Shape(1, step, 1, non_embedding(base, 1, step))
        raise LadderError(
            f"size {short_count(target)} cannot be shaped within {rules.size_tolerance:.0%}: the nearest shape is "
            f"{nearest.n_layer} layer(s) x {nearest.n_embd} wide with N {nearest.non_embedding:,} "
            f"({nearest.non_embedding / target - 1:+.0%}); with heads {step} wide the width moves in steps of {step}: "
            f"lower \"rules\".head_width, or choose another size")
    return best[1]


def attention_types_for(base: GPTConfig, n_layer: int) -> list:
    """The base config's per-layer attention types, cycled over n_layer layers (global, local, global, ...)."""
    pattern = list(base.attention_types) or ["global"]
    return [pattern[i % len(pattern)] for i in range(n_layer)]
