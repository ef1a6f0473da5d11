"""trainer.async_checkpoint's writer in this process (framework/training/async_save.py, through the loop's
Checkpointer): the state is staged before training goes on, a failed write leaves the checkpoint before it as the
newest and nothing half-written, and at most one write is in flight. A write is held where it touches the disk
(store.write_atomically, wrapped here), so the test acts while it is in flight, whatever the machine's speed."""
import errno
import os
import sys
import threading
import time

import pytest
import torch
from torch import nn

import framework.checkpoints.store as store
import framework.training.checkpointing as checkpointing
from framework.checkpoints.disk import CheckpointNotWritten
from framework.checkpoints.position import Position
from framework.checkpoints.store import list_checkpoints, load_checkpoint, newest_valid
from framework.common.errors import ConfigError
from framework.config.trainer import TrainerConfig
from framework.training.async_save import CheckpointWrites, async_refusal, dcp_stager, staged
from framework.training.checkpoint_io import CheckpointIO
from framework.training.checkpointing import Checkpointer
from framework.training.engine import LocalGroup, Wrapped
from framework.training.precision import Precision
from support.driver import driver_says
from support.processes import TINY


class HeldWrites:
    """The writer held where it begins to write: the single-file write of step `hold` (checkpointing's
    save_checkpoint, which serializes, writes and commits it) waits until release(). Also the names of the files
    written (store.write_atomically), in order, each with whether step 1's manifest was on disk when it started."""

    def __init__(self, monkeypatch, folder, hold: int):
        self.started = []
        self.released, self.waiting = threading.Event(), threading.Event()
        real_write, real_save = store.write_atomically, checkpointing.save_checkpoint

        def recorded(path, data):
            self.started.append((path.name, (folder / "step-00000001.json").exists()))
            return real_write(path, data)

        def held(folder, state, manifest, keep):
            if manifest["step"] == hold:
                self.waiting.set()
                assert self.released.wait(30), "the test never released the write"
            return real_save(folder, state, manifest, keep)
        monkeypatch.setattr(store, "write_atomically", recorded)
        monkeypatch.setattr(checkpointing, "save_checkpoint", held)


def _checkpointer(tmp_path, behind=True, keep=3):
    options = TrainerConfig(checkpoint_every_n_steps=1, keep_checkpoints=keep, batch_size=4, async_checkpoint=behind)
    return Checkpointer(LocalGroup(torch.device("cpu")), tmp_path, options, {}, lambda line: None)


def _wrapped():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()  # momentum buffers: optimizer state that later steps change in place
    return Wrapped(model, optimizer, Precision("fp32", torch.device("cpu")), CheckpointIO(0, 1, []), model)


def _save(checkpointer, wrapped, step):
    return checkpointer.save(wrapped, Position(step, 0, 4 * step, 4), {}, {})


def test_a_save_behind_the_loop_writes_the_state_of_its_step_not_of_the_steps_after_it(tmp_path, monkeypatch):
    writes = HeldWrites(monkeypatch, tmp_path / "checkpoints", hold=1)
    checkpointer, wrapped = _checkpointer(tmp_path), _wrapped()
    at_save = {k: v.clone() for k, v in wrapped.model.state_dict().items()}
    momentum = wrapped.optimizer.state[wrapped.model.weight]["momentum_buffer"].clone()
    assert _save(checkpointer, wrapped, 1) is None  # returned at once: the write is behind the loop
    assert writes.waiting.wait(30) and checkpointer.writes.in_flight
    with torch.no_grad():  # the steps after it, while its write waits
        for p in wrapped.model.parameters():
            p.add_(100.0)
        wrapped.optimizer.state[wrapped.model.weight]["momentum_buffer"].mul_(-3.0)
    writes.released.set()
    checkpointer.finish()
    [(step, path)] = checkpointer.committed()
    saved = load_checkpoint(newest_valid(tmp_path / "checkpoints"))
    assert step == 1 and path == checkpointer.last_saved() == tmp_path / "checkpoints" / "step-00000001.pt"
    for name, value in at_save.items():
        assert torch.equal(saved["model"][name], value), name
    assert torch.equal(saved["optimizer"]["state"][0]["momentum_buffer"], momentum)


def test_a_failed_write_behind_the_loop_is_said_in_one_line_and_the_one_before_stays_the_newest(tmp_path, monkeypatch):
    checkpointer, wrapped = _checkpointer(tmp_path), _wrapped()
    _save(checkpointer, wrapped, 1)
    real_replace = os.replace

    def disk_full_at_step_2(source, target, *args, **kwargs):  # the .tmp is whole, the rename finds the disk full
        if str(target).endswith("step-00000002.pt"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_replace(source, target, *args, **kwargs)
    monkeypatch.setattr(os, "replace", disk_full_at_step_2)
    _save(checkpointer, wrapped, 2)  # waits for step 1's, commits it, then writes step 2's behind the loop
    with pytest.raises(CheckpointNotWritten) as failed:
        checkpointer.finish()
    line = str(failed.value)
    assert "\n" not in line and "step 2" in line and "rank 0" in line and "No space left on device" in line
    folder = tmp_path / "checkpoints"
    assert [c.step for c in list_checkpoints(folder)] == [1] and newest_valid(folder).step == 1
    assert checkpointer.last_saved() == folder / "step-00000001.pt"
    assert sorted(p.name for p in folder.iterdir()) == ["step-00000001.json", "step-00000001.pt"]  # no .tmp


def test_the_next_save_starts_writing_only_once_the_one_in_flight_is_committed(tmp_path, monkeypatch):
    writes = HeldWrites(monkeypatch, tmp_path / "checkpoints", hold=1)
    checkpointer, wrapped = _checkpointer(tmp_path), _wrapped()
    _save(checkpointer, wrapped, 1)
    assert writes.waiting.wait(30)
    loop = threading.main_thread()

    def release_once_the_loop_waits():  # the loop's thread blocked in the writer's wait, or step 2 already writing
        while not any(name.startswith("step-00000002") for name, _ in writes.started):
            frame = sys._current_frames().get(loop.ident)
            if frame is not None and _waiting_in(frame, CheckpointWrites.wait.__code__):
                break
            time.sleep(0.01)
        writes.released.set()
    releaser = threading.Thread(target=release_once_the_loop_waits, daemon=True)
    releaser.start()
    _save(checkpointer, wrapped, 2)
    checkpointer.finish()
    releaser.join(30)
    step_2 = [committed for name, committed in writes.started if name.startswith("step-00000002")]
    assert step_2 and all(step_2), "step 2's files were written before step 1's manifest"
    assert [step for step, _ in checkpointer.committed()] == [1, 2]


def test_a_stop_waits_for_the_write_in_flight_and_keeps_its_commit(tmp_path, monkeypatch):
    """What Trainer.fit does when a signal (or an error) ends the loop: Checkpointer.abandon on this rank alone."""
    writes = HeldWrites(monkeypatch, tmp_path / "checkpoints", hold=1)
    checkpointer, wrapped = _checkpointer(tmp_path), _wrapped()
    _save(checkpointer, wrapped, 1)
    assert writes.waiting.wait(30)
    said = []
    stopping = threading.Thread(target=lambda: said.append(checkpointer.abandon()), daemon=True)
    stopping.start()
    while not _waiting_in(sys._current_frames().get(stopping.ident), CheckpointWrites.wait.__code__):
        assert stopping.is_alive(), "abandon() returned while the write was held"
        time.sleep(0.01)
    writes.released.set()
    stopping.join(30)
    assert said == [None] and newest_valid(tmp_path / "checkpoints").step == 1
    assert checkpointer.last_saved() == tmp_path / "checkpoints" / "step-00000001.pt"


def _waiting_in(frame, code) -> bool:
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def test_a_second_write_cannot_start_before_the_first_was_waited_for():
    writes = CheckpointWrites(behind=True)
    release = threading.Event()
    writes.start(1, lambda: release.wait(30) and None)
    with pytest.raises(RuntimeError, match="step 2 was started while the one of step 1"):
        writes.start(2, lambda: None)
    release.set()
    assert writes.wait().step == 1 and writes.wait() is None


def test_a_blocking_save_is_committed_when_save_returns(tmp_path):
    checkpointer, wrapped = _checkpointer(tmp_path, behind=False), _wrapped()
    path = _save(checkpointer, wrapped, 1)
    assert path == tmp_path / "checkpoints" / "step-00000001.pt" and newest_valid(path.parent).step == 1
    assert checkpointer.committed() == [(1, path)]


def test_on_gpus_the_staged_copy_is_pinned_memory(monkeypatch):
    """The GPU branch on a CPU: pinning needs CUDA, so pin_memory is recorded and copied instead."""
    pinned_shapes = []

    def pin_memory(tensor):
        pinned_shapes.append(tuple(tensor.shape))
        return tensor.clone()
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    state = {"model": {"w": torch.ones(2, 3)}, "groups": [{"lr": 0.1}], "step": 4}
    copy = staged(state, pin=True)
    assert pinned_shapes == [(2, 3)] and torch.equal(copy["model"]["w"], state["model"]["w"])
    assert copy["model"]["w"] is not state["model"]["w"] and copy["groups"][0] is not state["groups"][0]
    assert staged(state, pin=False) and pinned_shapes == [(2, 3)]  # CPU workers: nothing pinned
    assert dcp_stager(cuda=True)._config.use_pinned_memory  # DCP's own stager pins on GPUs, stages on the caller
    assert not dcp_stager(cuda=False)._config.use_pinned_memory and not dcp_stager(cuda=True)._config.use_async_staging


def test_only_formats_written_behind_the_loop_take_async_checkpoint():
    for name in ("file", "dcp"):
        async_refusal(True, name, "ddp")
    async_refusal(False, "deepspeed", "deepspeed")
    with pytest.raises(ConfigError) as refused:
        async_refusal(True, "deepspeed", "deepspeed")
    line = str(refused.value)
    assert line.startswith("trainer.async_checkpoint=true is not allowed with strategy=deepspeed") and "false" in line


def test_the_driver_refuses_async_checkpoint_where_nothing_can_be_written_behind_the_loop(tmp_path):
    none_kept = driver_says(["trainer.async_checkpoint=true", "trainer.keep_checkpoints=0", *TINY], tmp_path)
    assert none_kept.startswith("trainer.async_checkpoint=true is not allowed with trainer.keep_checkpoints=0"), \
        none_kept
    deepspeed = driver_says(["trainer.async_checkpoint=true", "strategy=deepspeed", *TINY], tmp_path)
    assert deepspeed.startswith("trainer.async_checkpoint=true is not allowed with strategy=deepspeed"), deepspeed
    assert driver_says(["trainer.async_checkpoint=true", "strategy=fsdp", *TINY], tmp_path) == ""
