"""How this process was started and how it ends: the environment a launcher left (environment.py, slurm.py) and
leaving a worker process cleanly (clean_exit.py). The ground floor: imports nothing else of the framework."""
