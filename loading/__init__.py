"""Reading configs and the one check of a config (loading/config.py): below the jobs, above the registries in
models/ and data/ that the check reads."""
