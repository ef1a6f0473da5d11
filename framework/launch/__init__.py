"""The programs that start a strategy's workers: torch's elastic agent (elastic.py) and Horovod's runner
(horovod_runner.py). They take what they need from the session (framework/session/), never from the environment: in
each worker, the entry is handed the ranks its starter gave that worker (worker_ranks())."""
