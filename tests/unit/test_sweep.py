"""Sweeps in this process: what varies comes from the sweep's overrides and the sweeper's params, job names are short
and fit a folder, seed groups count failures and mark the best, a finished job of another config is refused. Real
sweeps: tests/runs/test_sweep.py."""
import pytest
from omegaconf import OmegaConf

from framework.common.errors import ConfigError
from framework.results.job_names import job_name, short_keys, short_value, varying_keys
from framework.results.result_file import write_result
from framework.results.seed_groups import Job, group_by_seed
from framework.results.sweep_resume import finished_before


def test_what_varies_comes_from_sweep_overrides_and_the_sweepers_params():
    assert varying_keys(["strategy=single", "optimizer.lr=0.1,0.01", "trainer.seed=range(1,4)", "+x.y=1,2"],
                        None) == ["optimizer.lr", "trainer.seed", "x.y"]
    # an experiment's (or Optuna's) params, unless the command line pins the key to one value
    params = {"strategy": "single,dp,ddp", "model": "choice(lenet, simple_cnn)", "trainer.epochs": "2",
              "optimizer.lr": "tag(log, interval(0.0001, 0.01))"}
    assert varying_keys(["model=lenet"], params) == ["strategy", "optimizer.lr"]
    assert varying_keys(["strategy=single,ddp"], params) == ["strategy", "model", "optimizer.lr"]


def test_job_names_are_short_and_fit_a_folder():
    assert short_keys(["optimizer.lr", "trainer.seed", "model.width", "dataset.width", "model"]) == {
        "optimizer.lr": "lr", "trainer.seed": "seed", "model.width": "model.width",
        "dataset.width": "dataset.width", "model": "model"}
    assert short_value("0.0012345678912") == "0.001235"  # Optuna's floats
    assert short_value("/data/sets/imagenet/") == "imagenet"
    assert short_value("'[1, 2]'") == "-1,-2-"
    long = short_value("a" * 30 + "b")
    assert len(long) == 24 and long != short_value("a" * 30 + "c")
    overrides = ["strategy=ddp", "optimizer.lr=0.01", "++trainer.seed=3", "model=lenet"]
    assert job_name(["optimizer.lr", "trainer.seed"], overrides) == "lr=0.01_seed=3"
    assert len(job_name(["a", "b", "c", "d", "e"], [f"{k}={'x' * 40}" for k in "abcde"])) == 120


def test_seed_groups_count_failures_and_mark_the_lowest_loss_for_a_loss_objective():
    def result(loss):
        return {"objective": "loss", "objective_higher_is_better": False, "test_loss": loss, "train_loss": loss,
                "samples_per_sec": 10.0, "metrics": []}

    jobs = [Job(0, ["optimizer.lr=0.1", "trainer.seed=1"], result(1.0)),
            Job(1, ["optimizer.lr=0.1", "trainer.seed=2"], result(3.0)),
            Job(2, ["optimizer.lr=0.2", "trainer.seed=1"], result(1.5)),
            Job(3, ["optimizer.lr=0.2", "trainer.seed=2"], None)]
    first, second = group_by_seed(jobs)
    assert (first.n, first.failed, first.mean("test_loss"), first.sd("test_loss")) == (2, 0, 2.0, 2 ** 0.5)
    assert (second.n, second.failed, second.mean("test_loss"), second.sd("test_loss")) == (1, 1, 1.5, None)
    assert (first.best, second.best) == (False, True)
    assert group_by_seed([Job(0, ["optimizer.lr=0.1"], result(1.0)), Job(1, ["optimizer.lr=0.2"], result(2.0))]) == []


def test_a_finished_job_of_another_config_is_refused_not_overwritten(tmp_path):
    job = tmp_path / "0_seed=1"
    job.mkdir()
    assert finished_before(job, OmegaConf.create({"trainer": {"seed": 1}})) is None  # nothing finished there yet
    (job / "resolved_config.yaml").write_text("trainer:\n  seed: 1\n  max_steps: 12\n")
    write_result(job, {"objective": "acc", "test_acc": 0.5})
    assert finished_before(job, OmegaConf.create({"trainer": {"seed": 1, "max_steps": 12}}))["test_acc"] == 0.5
    with pytest.raises(ConfigError, match=r"0_seed=1 finished there with another config \(trainer.max_steps differ\)"):
        finished_before(job, OmegaConf.create({"trainer": {"seed": 1, "max_steps": 20}}))


def test_a_key_added_after_the_job_finished_differs_only_when_it_leaves_its_default(tmp_path):
    """A sweep started before an upgrade that added trainer keys (deterministic, async_checkpoint) resumes after it;
    the same key set otherwise is a change. tests/runs/test_compat_fixtures.py: a sweep written by an older commit."""
    job = tmp_path / "0_seed=1"
    job.mkdir()
    (job / "resolved_config.yaml").write_text("trainer:\n  seed: 1\n")
    write_result(job, {"objective": "acc", "test_acc": 0.5})
    now = {"trainer": {"seed": 1, "deterministic": False, "async_checkpoint": False}}
    assert finished_before(job, OmegaConf.create(now))["test_acc"] == 0.5
    with pytest.raises(ConfigError, match=r"\(trainer.deterministic differ\)"):
        finished_before(job, OmegaConf.create({"trainer": {**now["trainer"], "deterministic": True}}))
    with pytest.raises(ConfigError, match=r"\(trainer.no_such_key differ\)"):  # no schema says what leaving it out meant
        finished_before(job, OmegaConf.create({"trainer": {"seed": 1, "no_such_key": 1}}))


def test_a_failed_jobs_row_says_why_from_its_train_log(tmp_path):
    """The reason the run noted in its folder (framework/results/failure_note.py); a job that noted none says where
    to look. The markdown cell keeps a '|' of the reason from ending it."""
    from framework.results.failure_note import note_failure
    from framework.results.sweep_summary import write_summary

    for number, name in enumerate(["0_seed=1", "1_seed=2", "2_seed=3"]):
        (tmp_path / name / ".hydra").mkdir(parents=True)
        (tmp_path / name / ".hydra" / "overrides.yaml").write_text(f"- trainer.seed={number + 1}\n")
        (tmp_path / name / ".hydra" / "hydra.yaml").write_text(f"hydra:\n  job:\n    num: {number}\n")
    write_result(tmp_path / "0_seed=1", {"job": 0, "overrides": ["trainer.seed=1"], "objective": "loss",
                                         "test_loss": 1.0, "train_loss": 1.0, "samples_per_sec": 10.0,
                                         "per_rank_samples_per_sec": [10.0], "metrics": []})
    note_failure(tmp_path / "1_seed=2", "an earlier reason")
    note_failure(tmp_path / "1_seed=2", "strategy.tp=2 is not allowed for LeNet: a | b\n(second line)")
    markdown = write_summary(tmp_path)
    rows = markdown.splitlines()[2:]
    assert rows[0].endswith("|  |")
    assert rows[1].endswith("| strategy.tp=2 is not allowed for LeNet: a \\| b (second line) |")
    assert rows[2].endswith(f"| no reason noted: see {tmp_path / '2_seed=3'}/train.log |")
