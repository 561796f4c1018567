"""Model FLOPs and parameter counts from the config, for throughput, MFU and planning."""
from __future__ import annotations

import time
from typing import Optional

from models.config import GPTConfig


def parameter_count(cfg: GPTConfig) -> dict[str, int]:
    """Closed-form count for the default architecture (what models/gpt.py builds without extra options).

    Planning counts the built graph's variables instead (engine/model_graph.py), which stays exact whatever
    options the model grows; tests check that the two agree for the default architecture."""
    d, v, n = cfg.n_embd, cfg.n_vocab, cfg.n_ctx
    per_layer = (4 * d * d + d) + (2 * d) * 2 + (d * 4 * d + 4 * d) + (4 * d * d + d)
    embedding = v * d + n * d
    return {"embedding": embedding, "non_embedding": cfg.n_layer * per_layer + 2 * d,
            "total": embedding + cfg.n_layer * per_layer + 2 * d}


def training_flops_per_token(cfg: GPTConfig, params: Optional[dict] = None) -> float:
    """6N for the weights (forward + backward) plus the attention score/value matmuls, counting the keys
    each query really sees (all previous for global, the window for local), and the output projection.

    `params` is a count like parameter_count's (e.g. ModelGraph.parameter_count() of the built graph);
    default: the closed form."""
    params = params or parameter_count(cfg)
    dense = 6 * (params["non_embedding"] + cfg.n_vocab * cfg.n_embd)
    attention = sum(6 * 2 * _keys_per_query(cfg, kind) * cfg.n_embd for kind in cfg.attention_types)
    return float(dense + attention)


def _keys_per_query(cfg: GPTConfig, kind: str) -> float:
    """How many keys one query's score and value matmuls cover, on average, in a layer of this type."""
    if kind == "global":  # causal: half the context on average; MLM: all of it; plus memory key/values
        return (cfg.n_ctx / 2 if cfg.causal else cfg.n_ctx) + cfg.num_mem_kv
    if kind == "local":
        return min(cfg.local_attention_radius * (1 if cfg.causal else 2), cfg.n_ctx)
    if kind == "linear":  # a [head_size, head_size] state per head read and written, plus half a chunk
        return 1.5 * cfg.head_size
    return 0.0  # "none": no attention


def measure_matmul_peak(size: int = 1024, seconds: float = 1.0) -> float:
    """fp32 matmul FLOP/s this machine reaches in TF, the denominator of MFU when no --peak_tflops is given."""
    import tensorflow as tf

    a = tf.random.normal([size, size])
    b = tf.random.normal([size, size])
    matmul = tf.function(lambda x, y: tf.matmul(x, y))
    matmul(a, b).numpy()
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        matmul(a, b).numpy()
        runs += 1
    return 2 * size ** 3 * runs / (time.perf_counter() - start)
