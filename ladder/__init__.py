"""The scaling ladder: plan, train and fit a ladder of model sizes, and predict what a bigger run reaches.

    python -m ladder plan configs/ladders/cpu.json      # the table and the LR schedules; trains nothing
    python -m ladder run cpu                             # trains every size (resumable); on a cluster: scripts
    python -m ladder status cpu                          # the training overview, from the sizes' model_paths
    python -m ladder fit cpu --hold_out n200K            # L(N, D), intervals, compute-optimal sizes, plots

docs/ladder.md describes the spec, the rules and their sources, and a measured ladder.
"""
