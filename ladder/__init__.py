"""The scaling ladder: plan, train and fit a ladder of model sizes, and predict what a bigger run reaches.

    python -m ladder plan configs/ladders/cpu.json      # the table and the LR schedules; trains nothing
    python -m ladder run cpu                             # per size a WSD trunk and its decay branches (resumable)
    python -m ladder status cpu                          # the training overview, from the runs' model_paths
    python -m ladder fit cpu --hold_out n56K             # L(N, D) on annealed points, intervals, plots (no TensorFlow)

docs/ladder.md describes the spec, the rules and their sources, the schedule, the fit, and a measured ladder.
"""
