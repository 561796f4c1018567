"""modelpath/checkpoints.py's one definition of a model_path's checkpoints and its newest, read without
TensorFlow; a trunk's branch points kept through rotation and copied whole (the bigger scenarios:
tests/scenarios/test_checkpoint_safety.py)."""
import os
import subprocess
import sys

from modelpath import checkpoints

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def touch_checkpoint(folder, step, index=True):
    (folder / f"model.ckpt-{step}.data-00000-of-00001").write_bytes(b"x")
    if index:
        (folder / f"model.ckpt-{step}.index").write_bytes(b"x")


def test_the_latest_checkpoint_is_the_newest_index_file_whatever_the_state_file_says(tmp_path):
    """The `checkpoint` state file (TensorFlow's) names step 3, the files hold 2, 10 and a save of 12 cut short
    (no index): latest is 10 and latest_step 10, from the files. Bug caught: latest_step read from the state file
    (run_experiment's old definition), or sorting the steps as strings ("10" < "2")."""
    for step in (2, 10):
        touch_checkpoint(tmp_path, step)
    touch_checkpoint(tmp_path, 12, index=False)
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-3"\n')
    assert checkpoints.steps(str(tmp_path)) == [2, 10]
    assert checkpoints.latest(str(tmp_path)) == checkpoints.prefix_of(str(tmp_path), 10)
    assert checkpoints.latest_step(str(tmp_path)) == 10
    assert checkpoints.latest_step(str(tmp_path / "none")) == 0 and checkpoints.latest(str(tmp_path / "none")) is None


def test_reading_a_model_path_needs_no_tensorflow(tmp_path):
    """Tools, the ladder's fit and run_experiment read model_paths without importing TensorFlow. Bug caught: a
    module-level `import tensorflow` in modelpath/checkpoints.py (or any module it imports)."""
    touch_checkpoint(tmp_path, 5)
    code = ("import sys; from modelpath import checkpoints, run_info, eval_results, events, tokenizer_record, lock; "
            f"assert checkpoints.latest_step({str(tmp_path)!r}) == 5; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr


def test_a_trunks_branch_points_survive_rotation_and_copy_whole(tmp_path):
    """A CheckpointWriter keeping one checkpoint (keep_checkpoint_max 1) with step 2 among its keep_checkpoint_steps:
    after saves at steps 1 to 4, steps 2 and 4 are left (2 unlisted in the state file, as an hours-kept one is), and
    modelpath/checkpoints.copy puts step 2 into another model_path as a checkpoint that holds the same values and is
    restorable there, listed in the branch's new state file. (Bugs: _rotate deleting a keep step, `if old in
    self.keep_steps` dropped; copy leaving the state file to training's start, which then says it repaired one.)"""
    import tensorflow.compat.v1 as tf
    from modelpath import checkpoints
    trunk, branch = str(tmp_path / "trunk"), str(tmp_path / "branch")
    with tf.Graph().as_default(), tf.Session() as session:
        weight = tf.get_variable("w", initializer=tf.zeros([3]))
        session.run(tf.global_variables_initializer())
        writer = checkpoints.CheckpointWriter(trunk, tf.train.Saver(sharded=True), keep=1, keep_steps=(2,))
        for step in range(1, 5):
            session.run(weight.assign(tf.fill([3], float(step))))
            writer.save(session, step)
    assert checkpoints.steps(trunk) == [2, 4]
    assert [checkpoints.step_of(p) for p in tf.train.get_checkpoint_state(trunk).all_model_checkpoint_paths] == [4]
    copied = checkpoints.copy(checkpoints.prefix_of(trunk, 2), branch)
    assert copied == checkpoints.prefix_of(branch, 2) and checkpoints.restorable(branch) == copied
    assert tf.train.load_variable(copied, "w").tolist() == [2.0, 2.0, 2.0]
    assert sorted(os.listdir(branch)) == sorted(["checkpoint"] + [n for n in os.listdir(trunk)
                                                                  if n.startswith("model.ckpt-2.")])
    assert tf.train.latest_checkpoint(branch) == copied  # the state file lists it: nothing for training to repair
