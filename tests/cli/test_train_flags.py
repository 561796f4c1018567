"""cli/train_flags.py: the training flags' options, checked before anything runs (one error line from main.py)."""
import main
from tests.scenarios.test_bad_inputs import error_line


def test_checkpoint_minutes_must_be_positive(capsys):
    assert main.main(["--model", "default", "--checkpoint_minutes", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --checkpoint_minutes must be more than 0"), err


def test_checkpoint_minutes_must_be_finite(capsys):
    import main
    assert main.main(["--model", "default", "--checkpoint_minutes", "inf"]) == 1
    assert error_line(capsys.readouterr().err).startswith("error: --checkpoint_minutes must be more than 0 (a finite")
