"""train/divergence.py: what in a step's fetched scalars stops a run (`problem`), and the one line a stopped run
ends with (`Diverged`): the step, what was not finite, the newest checkpoint and what to change."""
from modelpath import checkpoints
from tiny import tiny_config
from train import divergence


def test_an_overflow_at_a_loss_scale_above_1_is_skipped_and_at_1_stops_the_run():
    """train/divergence.py's reading of a float16 step: inf gradients at a scale above 1 are loss scaling's
    skipped step (the run goes on, as tests/train/test_loss_scale.py's overflow test trains through two of
    them); at a scale of 1 halving cannot help and the run stops; a non-finite loss stops it at any scale. Bug
    caught: a stop on every overflow (float16 runs die at their first skipped step) or on none at scale 1
    (skipping forever)."""
    inf = float("inf")
    assert divergence.problem({"loss": 4.0, "grad_norm": inf, "loss_scale": 2.0}) is None
    assert "loss scale 1" in divergence.problem({"loss": 4.0, "grad_norm": inf, "loss_scale": 1.0})
    assert divergence.problem({"loss": inf, "grad_norm": inf, "loss_scale": 2.0 ** 15}) == "loss inf, grad_norm inf"
    assert divergence.problem({"loss": 4.0, "grad_norm": inf}) == "grad_norm inf"  # no loss scaling: a stop


def test_the_stop_names_the_checkpoint_to_resume_from_and_the_changes_this_config_lacks(tmp_path):
    """One line: with no checkpoint the run starts over; with model.ckpt-1 and -2, step 3's loss was computed from
    model.ckpt-2's weights, so the line says so and names model.ckpt-1 as the one before (not for weights found
    non-finite at a save, nor for a step that did not start from the newest); the remedies are the ones the config
    lacks (warmup, clipping, a wider precision). Bug caught: the note keyed to the wrong step (`saved == step`:
    a user resumes from the checkpoint that already diverges, never told of the one before)."""
    bare = tiny_config(model_path=str(tmp_path / "run"), lr=3e-3, warmup_steps=0, gradient_clipping=0.0,
                       precision="bfloat16")
    line = str(divergence.Diverged(bare, 3, "loss nan"))
    assert line.startswith("training diverged at step 3: loss nan; nothing was saved: ") and "\n" not in line
    assert line.endswith(": lower lr (now 0.003), add warmup_steps, set gradient_clipping (e.g. 1.0), train in "
                         "float32 precision, then run again (the run starts from scratch)"), line

    (tmp_path / "run").mkdir()
    for step in (1, 2):
        (tmp_path / "run" / f"{checkpoints.PREFIX}-{step}.index").write_bytes(b"")  # found by its index file
    from_newest = str(divergence.Diverged(bare, 3, "loss nan"))
    assert ("nothing after step 2 was saved (model.ckpt-2 holds the weights this step started from; model.ckpt-1 is "
            "the one before): ") in from_newest
    assert from_newest.endswith("then run again to resume from model.ckpt-2")
    weights = divergence.weights_problem(checkpoints.NonFiniteWeights(bare.model_path, 3, ["gpt2/wte", "gpt2/wpe"]))
    assert weights == ("the weights hold inf or NaN (gpt2/wte and 1 more variables) while every loss and gradient "
                       "norm was finite")
    for later in (divergence.Diverged(bare, 3, weights, from_newest=False), divergence.Diverged(bare, 5, "loss nan")):
        assert "nothing after step 2 was saved: lower lr" in str(later), str(later)

    tuned = tiny_config(model_path=bare.model_path, lr=3e-3, warmup_steps=10, gradient_clipping=1.0,
                        precision="float32")
    assert divergence.remedies(tuned) == ["lower lr (now 0.003)"]
    assert divergence.remedies(tiny_config(precision="float16"))[-1] == "train in bfloat16 or float32 precision"
