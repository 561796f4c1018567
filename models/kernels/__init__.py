"""Faster formulations of the operations that dominated a training or decoding step after the matmuls
(profiled with TF's step timelines on the benchmark model, bench/bench_train.py and bench/bench_decode.py).
Each gives mesh-tensorflow's values (the same formulas; only rounding differs), and tests/models/kernels/ checks
values and gradients on split layouts. Callers import the module they use:

* `matmul`      -- einsums that are one matrix product, as tf.matmul on 2-D reshapes (the projections).
* `lookups`     -- embedding lookups as tf.gather, with a segment-sum gradient (token and position tables).
* `loss`        -- cross-entropy and log Z from one logsumexp, with a fused gradient (the output layer).
* `attention`   -- attention with the logits laid out for batched matmuls, a fused softmax, blocked local
                   attention on top of it.
* `elementwise` -- GELU and LayerNorm, one XLA-fused pass each way.
* `decode`      -- the key/value cache's writes and one query's attention over it (incremental decoding).
* `native`      -- C++ matrix-vector products (`matvec.cc`) for the compiled decoder's steps, on every core, bf16
                   weights read as stored; built once per machine, XLA's products where it cannot be.
* `traces`      -- the compiled decoder's traced program kept on disk beside XLA's compiled ones, read back by
                   later builds instead of tracing it again.
* `common`      -- what several of them share: fp32 compute, XLA fusion with a small-tensor bypass, the mesh
                   axes a gradient is summed over.

A kernel that needs a dimension whole on each device (the embedding, cross-entropy and softmax reduce or look
up over one) takes whether the layout splits it as an argument (`split`, `memory_split`, ...); callers work
that out from the config (`schema.dimension_is_split`), and a split dimension keeps mtf's formulation,
which reduces across devices. The kernels take tensors, dimensions and flags, never the config.
"""
