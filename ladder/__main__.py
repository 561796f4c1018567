"""python -m ladder {plan,run,status,fit} SPEC: see ladder/__init__.py and docs/ladder.md."""
import sys

from ladder.cli import main

if __name__ == "__main__":
    from console.stderr_filter import quiet_tensorflow
    quiet_tensorflow()  # before TensorFlow is imported: its C++ start-up chatter stays off the console
    sys.exit(main())
