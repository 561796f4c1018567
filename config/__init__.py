"""The config schema: the typed, validated GPTConfig and dataset config. Imports nothing of the project."""
