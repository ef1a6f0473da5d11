"""How this process was started, and how it ends: read once, in one place (detect.py), and answered by one frozen
object per situation (situations.py: a direct run, a sweep's job, a joblib pool's job, a scheduler's task, rank 0 or
a follower under torchrun/horovodrun). Around it: the environment those programs leave (environment.py, slurm.py),
rank 0's word to the other ranks (channel.py, store.py), a pool job's share of the machine (slots.py,
pool_worker.py), the commands that resume (resume.py) and leaving a process cleanly (exit.py).

Low in the layers: it knows no strategy, config schema or result file; the driver (framework/run.py) asks it."""
