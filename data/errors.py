"""The one exception type the data tools raise for bad input.

Callers (main.py, the CLIs) print it as ``error: <message>`` and exit 1, so every message
is a single line that says what is wrong and, where possible, how to fix it.
"""


class DataError(ValueError):
    """Bad user input to the data tools: missing files, wrong formats, impossible settings."""
