"""verify.py: is a run on several workers the run one process would train, and if not, why (found by experiment).
command.py is the command; runs.py starts the runs it compares (train.py itself); compare.py reads two run folders
side by side; causes.py lists what can make them differ and how each is switched off."""
