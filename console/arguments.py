"""The command lines' parser and number checks: argparse with errors in the project's form (one `error:` line
that names the fix), for main.py and every other command line."""
from __future__ import annotations

import argparse
import math


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser with its own errors (a mistyped flag, a value of the wrong type, a missing required
    flag) in the project's form: one `error:` line that names the fix, exit status 2. argparse's default
    prints the whole usage block and `PROG: error: ...` instead."""

    def error(self, message: str):
        command = self.prog if self.prog.startswith("python") else f"python {self.prog}"
        self.exit(2, f"error: {message}: fix the command line (`{command} --help` lists the flags)\n")


def whole_number(minimum: int):
    """An argparse type: a whole number >= minimum, with a message that says so."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value
    parse.__name__ = f"whole number >= {minimum}"
    return parse


def number_above(bound: float, inclusive: bool = False):
    """An argparse type: a finite number more than `bound` (at least it, inclusive). float() reads "nan" and
    "inf" too: `--peak_tflops -5` printed MFU -0.4%, and no comparison refuses NaN."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"takes a finite number, got {text!r}")
        if value < bound or (value == bound and not inclusive):
            raise argparse.ArgumentTypeError(f"must be {'at least' if inclusive else 'more than'} {bound:g}, got "
                                             f"{value:g}")
        return value
    parse.__name__ = f"number {'>=' if inclusive else '>'} {bound:g}"
    return parse
