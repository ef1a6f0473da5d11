"""Streaming splits in-process (framework/data/streams.py): how a stream is dealt over ranks and DataLoader workers,
that every sample goes to exactly one of them, that the steps taken so far are the stream's first samples whatever
the world size, resuming by the dataset's state or by count, the agreed steps of ranks with uneven shares (a 1-rank
group whose peer is simulated by what the all-reduce adds), and the refusals, each one line."""
import itertools

import pytest
import torch
from stream_probe import CountingStream, ProbeCollate, StatefulStream, UnevenStream

from framework.checkpoints.position import Position
from framework.common.errors import TrainingStopped
from framework.data.collate import Collate
from framework.data.source import DataShare, Filler, Peers
from framework.data.streams import StreamLoader, eval_stream
from support.driver import driver_says
from support.processes import USER_CODE

PROBE_COLLATE = Collate(ProbeCollate(), "probe", own=True)


CPU = torch.device("cpu")


def _loader(dataset, rank=0, world=1, micro=4, workers=0, agree=None, k=1, say=print):
    peers = Peers(agree=agree) if agree else Peers()
    return StreamLoader(dataset, None, DataShare(rank, world, CPU, micro, k, workers, peers=peers), say=say)


def _ids(batch) -> list[int]:
    return [int(i) for i in batch[0][:, 0].tolist()]


def _steps(loader, count=None):
    """The ids of each step's real micro-batches of epoch 0, for `count` steps (or all)."""
    return [[i for b in itertools.islice(s.batches, s.real) for i in _ids(b)]
            for s in itertools.islice(loader.shares(0), count)]


def _record(loader) -> dict:
    """The loader's own record of its epoch (a rank alone: what every rank's gather would hold for it)."""
    [record] = loader.state().records
    return record


@pytest.mark.parametrize("world,micro,workers", [(1, 4, 0), (2, 4, 0), (3, 3, 0), (2, 4, 2)])
def test_every_sample_goes_to_exactly_one_rank_and_worker(world, micro, workers):
    stream = CountingStream(37)
    per_rank = [sum(_steps(_loader(stream, r, world, micro, workers)), []) for r in range(world)]
    assert sorted(sum(per_rank, [])) == sorted(stream.order())
    # ranks differ by at most one micro-batch: blocks of `micro` are dealt in turn
    batches = [-(-len(ids) // micro) for ids in per_rank]
    assert max(batches) - min(batches) <= 1


def test_the_steps_taken_are_the_streams_first_samples_and_the_rest_reshards_onto_another_world_size():
    stream, micro, k = CountingStream(50), 3, 2
    order = stream.order()
    loaders = [_loader(stream, r, 2, micro, k=k) for r in range(2)]
    taken = [sum(_steps(loader, count=3), []) for loader in loaders]
    done = 3 * k * micro * 2  # three steps of a global batch of 12
    assert sorted(taken[0] + taken[1]) == sorted(order[:done])
    records = [_record(loader) for loader in loaders]
    rest = []
    for rank in range(3):  # three ranks go on from there, micro-batches of 2
        loader = _loader(stream, rank, 3, 2)
        loader.restore(Position(samples_in_epoch=done, streams=records))
        rest += sum(_steps(loader), [])
    assert sorted(rest) == sorted(order[done:])


def test_a_stateful_stream_resumes_from_its_own_state(tmp_path, monkeypatch):
    monkeypatch.setenv("STREAM_PROBE_DIR", str(tmp_path))
    stream = StatefulStream(40)
    loader = _loader(stream, 0, 1, 4)
    first = sum(_steps(loader, count=3), [])
    record = _record(loader)
    assert record["state"] == {"epoch": 0, "next": 12} and record["position"] == 12
    said = []
    again = _loader(StatefulStream(40), 0, 1, 4, say=said.append)
    again.restore(Position(samples_in_epoch=12, streams=[record]))
    rest = sum(_steps(again), [])
    assert said[0] == "the stream continues after 12 samples of its epoch, by the dataset's state nearest it"
    assert first + rest == stream.order()
    assert "loaded 12" in (tmp_path / "rank0.txt").read_text()  # read from its state, not re-read from the start


def test_a_stream_without_state_is_fast_forwarded_by_count():
    stream = CountingStream(40)
    loader = _loader(stream, 0, 1, 4)
    first = sum(_steps(loader, count=2), [])
    said = []
    again = _loader(CountingStream(40), 0, 1, 4, say=said.append)
    again.restore(Position(samples_in_epoch=8, streams=[_record(loader)]))
    assert first + sum(_steps(again), []) == stream.order()
    assert said[0] == "the stream continues after 8 samples of its epoch, by count (each of 1 readers re-reads those " \
                      "samples)"


def test_a_self_sharded_stream_resumes_each_worker_where_it_was():
    stream = UnevenStream(big=30, small=10)
    reference = sum(_steps(_loader(stream, 0, 1, 4, workers=2)), [])
    loader = _loader(stream, 0, 1, 4, workers=2)
    first = sum(_steps(loader, count=3), [])  # worker 0, 1, 0
    record = _record(loader)
    assert record["next"] == 1 and [r["items"] for r in record["readers"]] == [8, 4]
    again = _loader(stream, 0, 1, 4, workers=2)
    again.restore(Position(samples_in_epoch=12, streams=[record]))
    assert first + sum(_steps(again), []) == reference
    assert sorted(reference) == list(range(30))


def test_steps_of_uneven_ranks_agree_and_weigh_the_samples_they_had():
    # alone: 10 samples in micro-batches of 4, grad_accum 2 -> a step of 8, then one of 2 (and a filler) that ends it
    shares = list(_loader(CountingStream(10), micro=4, k=2).shares(0))
    assert [(s.real, s.samples, s.last) for s in shares] == [(2, 8, False), (1, 2, True)]
    assert shares[1].scale == pytest.approx(1 / 2)
    assert len(list(shares[1].batches)) == 2  # the filler runs too: every rank runs grad_accum micro-batches

    # a peer with 6 samples more per step and more data after: this rank runs fillers, weighted 0, until it is done
    def peer(t):
        here, more = t.tolist()
        return torch.tensor([here + 6, more or 1])
    loader = _loader(CountingStream(4), micro=4, agree=peer)
    shares = list(itertools.islice(loader.shares(0), 3))
    assert [(s.real, s.samples, s.last) for s in shares] == [(1, 10, False), (0, 6, False), (0, 6, False)]
    assert shares[0].scale == pytest.approx(1 / 10)
    filler = next(shares[1].batches)
    assert _ids(filler) == [int(i) for i in CountingStream(4).order()]  # its last batch again


def test_a_streams_epoch_ends_without_another_agreement_says_its_samples_and_stops_the_run_when_it_had_none():
    agreed = []

    def alone(t):
        agreed.append(t.tolist())
        return t
    said = []
    loader = _loader(CountingStream(10), micro=4, k=2, agree=alone, say=said.append)
    shares = loader.shares(0)
    assert [s.last for s in itertools.islice(shares, 2)] == [False, True]
    assert loader.state().samples == 10 and said == []
    assert next(shares, None) is None  # asked past its last step: every rank knew no rank had more
    assert len(agreed) == 2 and said == ["epoch 1: the stream gave 10 samples"]

    said.clear()  # resumed at the epoch's end: nothing left, and the epoch's line again
    again = _loader(CountingStream(10), micro=4, k=2, say=said.append)
    again.restore(Position(samples_in_epoch=10, streams=[_record(loader)]))
    assert list(again.shares(0)) == []
    assert said == ["the stream continues after 10 samples of its epoch, by count (each of 1 readers re-reads "
                    "those samples)", "epoch 1: the stream gave 10 samples"]

    with pytest.raises(TrainingStopped, match=r"^dataset.train yielded no sample in epoch 2: an epoch iterates the "
                                              r"stream again \(its __iter__ must start over"):
        next(_loader(CountingStream(0)).shares(1))


def test_evaluation_over_a_stream_gives_fillers_while_a_peer_has_batches():
    stream = CountingStream(5, shuffle=False)
    prepare = lambda b: b  # noqa: E731
    seen = list(eval_stream(stream, prepare, DataShare(0, 1, CPU, 4), Collate(torch.utils.data.default_collate), None))
    assert [_ids(b) for b in seen] == [[0, 1, 2, 3], [4]]
    calls = iter([1, 1, 1, 0])  # the peer has three batches
    peer = Peers(agree=lambda t: t + next(calls) * (1 - t))
    seen = list(eval_stream(stream, prepare, DataShare(0, 1, CPU, 4, peers=peer),
                            Collate(torch.utils.data.default_collate), None))
    assert [isinstance(b, Filler) for b in seen] == [False, False, True]
    assert _ids(seen[2].batch) == [4]  # its last batch again, not scored


STREAM_YAML = """
train:
  _target_: stream_probe.CountingStream
  size: 100
test:
  _target_: stream_probe.CountingStream
  size: 40
  seed: 1
"""


@pytest.fixture
def stream_conf(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(USER_CODE))
    conf = tmp_path / "conf"
    (conf / "dataset").mkdir(parents=True)
    (conf / "dataset" / "stream.yaml").write_text(STREAM_YAML)
    return conf


BASE = ["dataset=stream", "model=linear", "trainer.batch_size=16", "lr_schedule=constant"]


def test_the_driver_accepts_a_stream_and_refuses_what_it_cannot_use(stream_conf, tmp_path):
    assert driver_says([*BASE, "strategy=ddp"], tmp_path, stream_conf) == ""
    said = driver_says([*BASE, "dataset.train._target_=stream_probe.Nothing", "~dataset.train.size"], tmp_path,
                       stream_conf)
    assert said == ("dataset.train._target_=stream_probe.Nothing is not allowed: the stream (Nothing) yielded no "
                    "sample; a streaming dataset (an IterableDataset) must yield at least one sample each time it is "
                    "iterated")
    said = driver_says([*BASE, "lr_schedule=warmup_cosine"], tmp_path, stream_conf)
    assert said.startswith("lr_schedule=warmup_cosine is not allowed without trainer.max_steps: dataset.train is a "
                           "stream")
    assert driver_says([*BASE, "lr_schedule=warmup_cosine", "trainer.max_steps=20"], tmp_path, stream_conf) == ""
    said = driver_says([*BASE, "dataset.train_share=0.5"], tmp_path, stream_conf)
    assert said.startswith("dataset.train_share=0.5 is not allowed: dataset.train is a stream")


def test_a_run_whose_last_step_ends_a_stream_epoch_still_says_what_the_epoch_gave(stream_conf, tmp_path):
    """trainer.max_steps on the last step of the stream's first epoch (100 samples: 6 steps of 16 and one of 4): the
    loop's last step is the epoch's, and it ends the epoch as when the stream has no step left. A single-process run,
    in this process: the driver's plan, then the worker's run (worker_entry less its allocator setting, which would
    outlive the test)."""
    from hydra import compose, initialize_config_dir

    from framework.common.paths import config_dir_override
    from framework.config.hydra_versions import version_base
    from framework.config.targets import allowing
    from framework.run import plan_run
    from framework.worker import _worker
    from support.processes import REPO, pin_accelerator

    overrides = [*pin_accelerator([*BASE, "strategy=single", "trainer.max_steps=7", "trainer.keep_checkpoints=0"]),
                 config_dir_override(str(stream_conf))]
    with initialize_config_dir(config_dir=str(REPO / "conf"), **version_base()):
        strategy, payload, _ = plan_run(compose("config", overrides=overrides), tmp_path, None)
    with allowing(payload.settings.targets):
        result = _worker(payload, payload.settings, strategy, None)
    assert result.steps == 7
    assert (tmp_path / "train.log").read_text().count("epoch 1: the stream gave 100 samples") == 1


def test_a_stream_that_shards_itself_is_refused_a_resume_on_another_world_size(tmp_path):
    from types import SimpleNamespace

    from framework.checkpoints.store import Checkpoint
    from framework.common.errors import ConfigError
    from framework.preflight import _resume_stream
    from support.driver import strategy_for

    settings = SimpleNamespace(trainer=SimpleNamespace(resume="auto"))
    checkpoint = Checkpoint(tmp_path / "step-00000009", {"world_size": 2})
    single, ddp = strategy_for("strategy=single"), strategy_for("strategy=ddp", "strategy.nproc_per_node=2")
    _resume_stream(settings, ddp, checkpoint, UnevenStream(8, 4))  # the same world size
    _resume_stream(settings, single, checkpoint, CountingStream(8))  # the framework deals it anew
    with pytest.raises(ConfigError) as refused:
        _resume_stream(settings, single, checkpoint, UnevenStream(8, 4))
    assert str(refused.value) == (
        f"trainer.resume=auto is not allowed with 1 worker(s): checkpoint {tmp_path / 'step-00000009'} stopped "
        "mid-stream on 2 workers, and dataset.train (UnevenStream) shards itself, so its position is per rank and "
        "cannot be split anew; use 2 workers, or trainer.resume=none")


def test_model_parallel_peers_read_the_same_stream_batches_and_data_parallel_ranks_their_own():
    """A 2 x 2 mesh (dp_shard=2 x tp=2): the worker deals a stream by the data-parallel place (group.dp_rank,
    dp_size), so both tensor-parallel peers of a data-parallel rank get its batches, and the two data-parallel ranks
    share the stream out between them."""
    from framework.strategies.mesh.dims import MeshDims

    dims = MeshDims(dp_shard=2, tp=2)
    by_rank = {rank: _steps(_loader(CountingStream(40), dims.dp_rank(rank), dims.dp_size,
                                    agree=lambda t: t * dims.dp_size))
               for rank in range(dims.workers)}
    peers = [[r for r in by_rank if dims.dp_rank(r) == d] for d in range(dims.dp_size)]
    assert all(len(group) == 2 for group in peers)
    for group in peers:
        assert by_rank[group[0]] == by_rank[group[1]]
    first, second = (sum(by_rank[group[0]], []) for group in peers)
    assert not set(first) & set(second) and sorted(first + second) == list(range(40))


def test_a_mesh_refuses_the_streams_it_cannot_read_alike_on_its_peers():
    from framework.common.errors import ConfigError
    from support.driver import strategy_for

    tp, pp = strategy_for("strategy=tp"), strategy_for("strategy=pp")
    tp._check_stream(CountingStream(8))  # dealt by the framework: tensor-parallel peers read the same blocks
    with pytest.raises(ConfigError, match=r"^strategy.tp=2 is not allowed with a dataset.train that shards itself"):
        tp._check_stream(UnevenStream(8, 4))
    with pytest.raises(ConfigError, match=r"^strategy.pp=2 is not allowed with a streaming dataset.train"):
        pp._check_stream(CountingStream(8))
