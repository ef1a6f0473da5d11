"""verify.py: is a run on several workers the run one process would train, and if not, why (found by experiment).
command.py is the command; runs.py starts the runs it compares (train.py itself, tethered.py: ended with verify.py),
each with what it takes from the strategy's run (shared.py); compare.py reads two run folders side by side, floor.py
picks the run that stands for rounding alone, verdict.py judges; causes.py lists what can make them differ and how
each is switched off."""
