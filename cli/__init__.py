"""The command line's own pieces: reading configs (with the checks against the model registries) and the
flags of the planning and multi-host jobs. main.py and tools/ import these; nothing below them does."""
