"""Command-line tools: checkpoint conversion (tools/hf.py)."""
