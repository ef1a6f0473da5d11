"""Parallel sweep jobs keep their slots busy: a joblib worker process keeps its slot (and its pinned GPUs and
cores) for the whole sweep, even when its first job was reported in milliseconds and the next one trains."""

from support.processes import USER_CODE, check_ok, run_train
from support.run_files import run_dirs

JOBS = ["-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "strategy=single", "dataset=synthetic",
        "dataset.train_size=8192", "dataset.test_size=64", "trainer.batch_size=32", "trainer.max_steps=4",
        "hydra.sweep.dir=outputs/sweep", "+hydra.callbacks.job_pid._target_=job_pid_probe.JobPid"]
TESTS = str(USER_CODE)  # job_pid_probe.py


def test_a_sweep_run_again_keeps_its_two_workers_when_finished_jobs_come_first(tmp_path):
    env = {"PYTHONPATH": TESTS}
    check_ok(run_train([*JOBS, "trainer.seed=1,2"], tmp_path, timeout=300, env=env))
    out = check_ok(run_train([*JOBS, "trainer.seed=1,2,3,4,5,6"], tmp_path, timeout=300, env=env))
    assert out.count("finished before in") == 2 and out.count("done: ") == 4
    jobs = run_dirs(tmp_path)
    assert len(jobs) == 6
    # loky would replace a worker whose memory grew 300 MB past its first, tiny, task (jobs 0 and 1, reported from
    # their results): jobs 4 and 5 would then run in two new processes, each starting Python and its imports again.
    assert len({(job / "job.pid").read_text() for job in jobs[2:]}) == 2
