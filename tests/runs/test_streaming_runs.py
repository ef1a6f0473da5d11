"""Streaming splits as real runs (train.py, gloo workers): a stream whose ranks get different numbers of samples
trains three epochs under ddp and fsdp with no hang, every sample once per epoch (tests/support/user_code/stream_probe.py records the
batches each rank made) and the same losses as one process taking the same global batches (each step's loss is the
mean over the samples it really had); a run killed mid-epoch resumes to the same losses, from the dataset's own state
or by count, on the same or another world size and number of DataLoader workers."""
import json
import re

import pytest
from stream_probe import trained_epochs

from support.processes import check_ok, run_train, user_code_env
from support.run_files import losses_by_step, run_dirs

STREAMS = """
train:
  _target_: stream_probe.{kind}
  size: 100
  probe: true
  collate_fn:
    _target_: stream_probe.ProbeCollate
test:
  _target_: stream_probe.CountingStream
  size: 40
  seed: 1
  shuffle: false
  collate_fn:
    _target_: stream_probe.ProbeCollate
    kind: eval
"""
UNEVEN = """
train:
  _target_: stream_probe.UnevenStream
  big: 40
  small: 20
  probe: true
  collate_fn:
    _target_: stream_probe.ProbeCollate
test:
  _target_: stream_probe.CountingStream
  size: 40
  seed: 1
"""
MODEL = "model._target_=stream_probe.IdBlindMLP"
RUN = ["trainer.epochs=3", "trainer.batch_size=16", "trainer.log_every_n_steps=1", "lr_schedule=constant",
       "optimizer=sgd", "optimizer.lr=0.1", "+callbacks.fit_mark._target_=stream_probe.FitMark"]
STEPS = 3 * 7  # 100 samples in global batches of 16: 6 steps of 16 and one of 4, per epoch


@pytest.fixture(scope="module")
def conf(tmp_path_factory):
    conf = tmp_path_factory.mktemp("stream_conf")
    (conf / "dataset").mkdir()
    (conf / "dataset" / "stream.yaml").write_text(STREAMS.format(kind="CountingStream"))
    (conf / "dataset" / "stateful_stream.yaml").write_text(STREAMS.format(kind="StatefulStream"))
    (conf / "dataset" / "uneven.yaml").write_text(UNEVEN)
    return conf


def _train(conf, cwd, args, probe=None, faults=None):
    cwd.mkdir(parents=True, exist_ok=True)
    env = user_code_env()
    if probe is not None:
        probe.mkdir(parents=True, exist_ok=True)
        env["STREAM_PROBE_DIR"] = str(probe)
    return run_train(["--config-dir", str(conf), MODEL, *args], cwd, env=env, timeout=300, faults=faults)


def _epochs_per_rank(probe, ranks: int) -> list[list[list[int]]]:
    return [trained_epochs((probe / f"rank{r}.txt").read_text().splitlines()) for r in range(ranks)]


def _evaluated(probe, ranks: int) -> list[int]:
    """Ids of the last evaluation's batches over every rank (each rank's last `eval` lines of its share)."""
    ids = []
    for r in range(ranks):
        lines = [line.split()[1:] for line in (probe / f"rank{r}.txt").read_text().splitlines()
                 if line.startswith("eval")]
        ids += [int(i) for line in lines for i in line]
    return ids


@pytest.fixture(scope="module")
def reference(conf, tmp_path_factory):
    """One process, global batch 16: the losses every other run must give."""
    cwd = tmp_path_factory.mktemp("stream_reference")
    out = check_ok(_train(conf, cwd, ["dataset=stream", "strategy=single", *RUN], cwd / "probe"))
    assert out.count("the stream gave 100 samples") == 3
    [run_dir] = run_dirs(cwd)
    return run_dir


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_stream_trains_three_epochs_each_sample_once_with_the_losses_of_one_process(conf, tmp_path, reference,
                                                                                      strategy):
    out = check_ok(_train(conf, tmp_path, ["dataset=stream", f"strategy={strategy}", "strategy.nproc_per_node=2",
                                           *RUN], tmp_path / "probe"))
    assert out.count("the stream gave 100 samples") == 3
    epochs = _epochs_per_rank(tmp_path / "probe", 2)
    assert len(epochs[0]) == len(epochs[1]) == 3
    # rank 0 had 52 samples an epoch, rank 1 48: one micro-batch fewer
    assert [len(e) for e in epochs[0]] == [52] * 3 and [len(e) for e in epochs[1]] == [48] * 3
    for e in range(3):
        assert sorted(epochs[0][e] + epochs[1][e]) == list(range(100)), f"epoch {e + 1}"
    assert epochs[0][0] != epochs[0][1]  # set_epoch reshuffled the stream
    [run_dir] = run_dirs(tmp_path)
    expected, got = losses_by_step(reference), losses_by_step(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-5), f"step {step}"
    # the streaming test split: each of its 40 samples scored once in the last evaluation, whatever rank had it
    assert sorted(_evaluated(tmp_path / "probe", 2)[-40:]) == list(range(40))
    result = json.loads((run_dir / "result.json").read_text())
    assert result["steps"] == STEPS and result["test_loss"] == pytest.approx(
        json.loads((reference / "result.json").read_text())["test_loss"], rel=1e-5)


def test_ranks_whose_own_shares_differ_end_each_epoch_together(conf, tmp_path):
    """A stream that shards itself: rank 0 has 40 samples, rank 1 20, read by two DataLoader workers each."""
    out = check_ok(_train(conf, tmp_path, ["dataset=uneven", "strategy=fsdp", "strategy.nproc_per_node=2",
                                           "trainer.num_workers=2", *RUN], tmp_path / "probe"))
    assert out.count("the stream gave 60 samples") == 3
    epochs = _epochs_per_rank(tmp_path / "probe", 2)
    for e in range(3):
        assert sorted(epochs[0][e]) == list(range(40)) and sorted(epochs[1][e]) == list(range(40, 60))
    [run_dir] = run_dirs(tmp_path)
    # rank 0's two workers each give 20 samples as micro-batches of 8, 8 and 4: 6 steps an epoch; rank 1's 4
    assert sorted(losses_by_step(run_dir)) == list(range(1, 3 * 6 + 1))


@pytest.mark.parametrize("dataset,resumed_with", [
    ("stateful_stream", ["strategy=ddp", "strategy.nproc_per_node=2", "trainer.num_workers=2"]),
    ("stream", ["strategy=single"]),  # fast-forwarded by count, on another world size
])
def test_a_stream_killed_mid_epoch_resumes_to_the_same_losses(conf, tmp_path, reference, dataset, resumed_with):
    args = [f"dataset={dataset}", *RUN, "trainer.checkpoint_every_n_steps=3"]
    killed = _train(conf, tmp_path, [*args, "strategy=ddp", "strategy.nproc_per_node=2"], faults="kill_after_step:11:1")
    assert killed.returncode != 0
    [run_dir] = run_dirs(tmp_path)
    out = check_ok(_train(conf, tmp_path, [*args, *resumed_with, f"hydra.run.dir={run_dir}"], tmp_path / "probe"))
    assert "step-00000009" in out  # 2 steps (32 samples) into epoch 2
    how = "the dataset's state nearest it" if dataset == "stateful_stream" else "count"
    assert re.search(rf"the stream continues after 32 samples of its epoch, by {re.escape(how)}", out), out
    expected, got = losses_by_step(reference), losses_by_step(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=1e-5), f"step {step}"
    if dataset == "stateful_stream":
        loaded = [line for r in range(2) for line in (tmp_path / "probe" / f"rank{r}.txt").read_text().splitlines()
                  if line.startswith("loaded")]
        assert loaded and all(line == "loaded 32" for line in loaded)  # every reader: the state at 32 samples
