"""cli/plan_flags.py: which planning job the flags ask for, and the flags that do not go together."""
import pytest

import main
from schema import ConfigError
from tiny import tiny_config


@pytest.mark.parametrize("flags,message", [
    (["--dry_run", "--auto_layout"], "pass one of --dry_run, --auto_layout"),
    (["--device_memory", "16GB"], "--device_memory goes with --dry_run"),
    (["--write_config", "x.json"], "--write_config goes with --auto_layout"),
])
def test_planning_flags_that_do_not_go_together_are_one_line(flags, message):
    with pytest.raises(ConfigError) as info:
        main.job_for(main.parse_args(flags), tiny_config())
    assert message in str(info.value) and "\n" not in str(info.value)
