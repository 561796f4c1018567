"""Bad inputs found by a sweep of the command lines, each one `error:` line (argparse's own errors too) and a
non-zero exit: flags of the wrong type, --log_every 0."""
import pytest

from data import create_tfrecords as ct
from workspace import run_main


def error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def test_flags_of_the_wrong_type_and_log_every_0_are_one_error_line_naming_the_fix(tmp_path):
    for flags, expected in ((["--steps_per_checkpoint", "ten"], "--steps_per_checkpoint: invalid int value: 'ten'"),
                            (["--log_every", "0"], "--log_every: must be at least 1, got 0"),
                            (["--no_such_flag"], "unrecognized arguments: --no_such_flag")):
        result = run_main("--model", "default", *flags, "--dry_run")
        assert result.returncode == 2, (flags, result.stdout, result.stderr)
        line = error_line(result.stderr)
        assert expected in line and "python main.py --help" in line, line


def test_create_tfrecords_flag_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exited:
        ct.main(["--input_dir", "x", "--name", "x", "--output_dir", "y", "--processes", "two"])
    assert exited.value.code == 2
    assert "--processes: invalid int value: 'two'" in error_line(capsys.readouterr().err)
