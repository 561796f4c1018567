"""Model FLOPs and parameter counts from the config, for throughput, MFU and planning."""
from __future__ import annotations

from typing import Optional

from schema import GPTConfig
from models.attention import ATTENTION


def parameter_count(cfg: GPTConfig) -> dict[str, int]:
    """Closed-form count for the default architecture (what models/gpt.py builds without extra options).

    Planning counts the built graph's variables instead (plan/model_graph.py), which stays exact whatever
    options the model grows; tests check that the two agree for the default architecture."""
    d, v, n = cfg.n_embd, cfg.n_vocab, cfg.n_ctx
    embedding = v * d + n * d
    non_embedding = non_embedding_count(cfg.n_layer, d)
    return {"embedding": embedding, "non_embedding": non_embedding, "total": embedding + non_embedding}


def non_embedding_count(n_layer: int, n_embd: int) -> int:
    """parameter_count's "non_embedding" (the blocks and the final norm), which depends on the depth and the width
    alone: ladder/shapes.py counts tens of thousands of shapes with it, where building a config for each cost 27 us."""
    d = n_embd
    per_layer = (4 * d * d + d) + (2 * d) * 2 + (d * 4 * d + 4 * d) + (4 * d * d + d)
    return n_layer * per_layer + 2 * d


def training_flops_per_token(cfg: GPTConfig, params: Optional[dict] = None) -> float:
    """6N for the weights (forward + backward) plus the attention score/value matmuls, counting the keys
    each query really sees (each attention type's registry entry says how many: all previous for global,
    the window for local), and the output projection.

    `params` is a count like parameter_count's (e.g. ModelGraph.parameter_count() of the built graph);
    default: the closed form."""
    params = params or parameter_count(cfg)
    dense = 6 * (params["non_embedding"] + cfg.n_vocab * cfg.n_embd)
    attention = sum(6 * 2 * ATTENTION[kind].keys_per_query(cfg) * cfg.n_embd for kind in cfg.attention_types)
    return float(dense + attention)
