"""How this process was started, and how it ends: read once, in one place (detect.py), and answered by one frozen
object per situation (situations.py: a direct run, a sweep's job, a joblib pool's job, a scheduler's task, rank 0 or
a follower under torchrun/horovodrun). Around it: the environment those programs leave (environment.py, slurm.py),
rank 0's word to the other ranks (channel.py, store.py), a pool job's share of the machine (slots.py,
pool_worker.py), the commands that resume (resume.py) and leaving a process cleanly (exit.py).

Low in the layers: it knows no strategy, config schema or result file. Each command asks it once (detect(), and a
worker that hydra-dist's starters started worker_ranks()) and hands the Ranks it answers to the strategy, its starter
and its group; nothing else reads them (tests/unit/test_layers.py holds it). A command with no job of a session ends
with refuse(exc)."""
