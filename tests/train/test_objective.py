"""train/objective.py: the objective and its gradients over micro-batches, a step equal to the whole batch's."""
import pytest

from config import replace
from schema import num_microbatches
from tests.train.test_training_options import GRADIENT_STEP, MLM, MOE, assert_same_step, lm_batch, mlm_batch
from tiny import devices_for, run_training, tiny_config


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [{}, dict(MLM, **MOE)], ids=["lm", "mlm_moe"])
def test_a_step_in_micro_batches_equals_a_step_on_the_whole_batch(overrides):
    """Losses, objective and gradients (GRADIENT_STEP: the weights after the step) of four micro-batches of one
    sequence each equal the whole batch's, for the language model and for MLM with MoE (whose loss weights and
    load-balancing loss are each micro-batch's share). Bugs it guards (train/objective.py, models/moe.py): a
    micro-batch's objective not divided by their count, the MoE layers not told the count, the gradients taken of
    another value than the objective's share (its `loss` times 1.5)."""
    whole = tiny_config(**overrides, **GRADIENT_STEP)
    split = replace(whole, tokens_per_mb_per_replica=whole.n_ctx)  # one sequence per micro-batch
    assert num_microbatches(split, split.train_batch_size) == 4
    batch = (mlm_batch if whole.mlm_training else lm_batch)(whole)
    a = run_training(whole, [batch], devices_for(whole), steps=1)
    b = run_training(split, [batch], devices_for(split), steps=1)
    assert_same_step(a, b, atol=1e-5)
