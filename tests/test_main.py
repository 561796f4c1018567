"""main.py: the switchboard's choice of one job from the flags (its runs end to end are tests/scenarios/')."""
import pytest

import jobs
import main
from tiny import tiny_config


@pytest.mark.parametrize("flags,kind", [
    ([], jobs.Training), (["--new"], jobs.Training), (["--eval"], jobs.Evaluation),
    (["--predict"], jobs.Prediction), (["--export"], jobs.Export), (["--check_dataset"], jobs.DatasetCheck),
    (["--dry_run"], jobs.DryRun), (["--auto_layout"], jobs.AutoLayout),
    (["--auto_layout_and_mesh_shape", "--num_devices", "4"], jobs.AutoLayout),
    # --check_dataset and the planning flags read nothing of model_path's: they win over --eval and --predict
    (["--check_dataset", "--eval"], jobs.DatasetCheck), (["--dry_run", "--predict"], jobs.DryRun),
])
def test_the_flags_pick_one_job(flags, kind):
    """Bug caught: job_for testing --eval before --check_dataset or the planning flags (a dry run that trains)."""
    job = main.job_for(main.parse_args(flags), tiny_config())
    assert type(job) is kind
    assert job.uses_devices == (kind in (jobs.Training, jobs.Evaluation, jobs.Prediction, jobs.Export))
    if kind is jobs.AutoLayout:
        assert job.n_devices == (4 if "--num_devices" in flags else None)


def test_the_parser_and_help_do_not_wait_for_tensorflow():
    """main.py's flags are parsed (and --help answered) before TensorFlow loads, so `--help` is instant and the
    "loading TensorFlow ..." line comes before the wait it names. Bug caught: a package the flag modules import
    (devices/, through cli/device_flags.py) importing `models` at its top, which loads TensorFlow."""
    import os
    import subprocess
    import sys
    probe = ("import sys, main\nmain.parse_args(['--model', 'x', '--tpu', 'local'])\n"
             "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
