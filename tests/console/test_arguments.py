"""console/arguments.py: the command lines' parser and its number checks, whose errors are one `error:` line
naming the fix (exit status 2), for every flag they check, also where nothing else would look at it."""
import pytest

from tests.scenarios.test_bad_inputs import error_line


@pytest.mark.parametrize("flags, expected", [
    (["--peak_tflops", "-5"], "--peak_tflops: must be more than 0, got -5"),  # printed MFU -0.4%
    (["--peak_tflops", "0"], "--peak_tflops: must be more than 0, got 0"),
    (["--peak_tflops", "nan"], "--peak_tflops: takes a finite number, got 'nan'"),
    (["--gpu_memory", "1.5"], "--gpu_memory: takes 'growth' or a fraction of each GPU's memory in (0, 1]"),
    (["--gpu_memory", "0"], "--gpu_memory: takes 'growth' or a fraction of each GPU's memory in (0, 1]"),
    (["--tpu_timeout", "inf"], "--tpu_timeout: takes a finite number, got 'inf'"),
    (["--worker_timeout", "-1"], "--worker_timeout: must be more than 0, got -1"),
    (["--num_devices", "0"], "--num_devices: must be at least 1, got 0"),
    (["--task_index", "-1"], "--task_index: must be at least 0, got -1"),
])
def test_numbers_out_of_range_on_the_command_line_are_one_argparse_line(capsys, flags, expected):
    """Checked when the command line is read, also where nothing would look at them (--gpu_memory without GPUs)."""
    import main
    with pytest.raises(SystemExit) as exited:
        main.parse_args(["--model", "default", *flags])
    assert exited.value.code == 2
    line = error_line(capsys.readouterr().err)
    assert line.startswith(f"error: argument {expected}") and line.endswith("--help` lists the flags)"), line
    for accepted in (["--peak_tflops", "0.5"], ["--gpu_memory", "1"], ["--gpu_memory", "growth"], ["--task_index", "0"]):
        main.parse_args(["--model", "default", *accepted])
