"""Checkpoint files: atomic, verified, pruned, and loaded only through the safe (weights-only) path."""
import errno
import hashlib
import json

import pytest
import torch

from framework.checkpoints.store import (
    engine_folder,
    find_checkpoint,
    keep_apart,
    list_checkpoints,
    load_checkpoint,
    load_engine_piece,
    newest_valid,
    save_checkpoint,
    write_engine_piece,
)
from framework.common.errors import ConfigError


def _save(folder, step, keep=3):
    return save_checkpoint(folder, {"w": torch.full((4,), float(step))}, {"step": step, "epoch": 0}, keep)


def test_save_writes_file_and_manifest_and_prunes(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, keep=2)
    assert [c.step for c in list_checkpoints(tmp_path)] == [3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000003.json", "step-00000003.pt", "step-00000004.json", "step-00000004.pt"]
    manifest = json.loads((tmp_path / "step-00000004.json").read_text())
    assert manifest["step"] == 4 and len(manifest["sha256"]) == 64 and manifest["bytes"] > 0


def test_truncated_and_tampered_checkpoints_are_skipped_with_a_warning(tmp_path):
    _save(tmp_path, 1)
    second = _save(tmp_path, 2)
    third = _save(tmp_path, 3)
    third.path.write_bytes(third.path.read_bytes()[:20])  # truncated
    data = bytearray(second.path.read_bytes())
    data[-5] ^= 0xFF  # same size, wrong checksum
    second.path.write_bytes(bytes(data))
    warnings = []
    found = newest_valid(tmp_path, warnings.append)
    assert found.step == 1
    assert "step-00000003.pt: it is truncated" in warnings[0]
    assert "step-00000002.pt: its checksum does not match" in warnings[1]
    assert torch.equal(load_checkpoint(found)["w"], torch.full((4,), 1.0))


def test_a_half_written_checkpoint_does_not_count(tmp_path):
    _save(tmp_path, 1)
    (tmp_path / "step-00000002.pt.tmp").write_bytes(b"half")
    (tmp_path / "step-00000002.pt").write_bytes(b"renamed but no manifest yet")
    assert newest_valid(tmp_path, print).step == 1


def test_what_a_killed_writer_left_goes_at_the_next_commit(tmp_path):
    _save(tmp_path, 1)
    (tmp_path / "step-00000002.pt.tmp").write_bytes(b"half")
    (tmp_path / "step-00000003.pt").write_bytes(b"renamed but no manifest yet")
    (tmp_path / "step-00000003.json.tmp").write_bytes(b"half")
    _save(tmp_path, 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000001.json", "step-00000001.pt", "step-00000004.json", "step-00000004.pt"]


def _save_with_pieces(folder, step, keep=3, ranks=2):
    """A checkpoint whose ranks each wrote an engine piece (ddp's PowerSGD) before rank 0 committed it."""
    files = dict(write_engine_piece(folder, step, r, {"error": torch.full((3,), float(r))}) for r in range(ranks))
    return save_checkpoint(folder, {"w": torch.zeros(1)}, {"step": step, "epoch": 0, "engine": {"files": files}}, keep)


def test_engine_pieces_are_verified_read_by_their_own_rank_kept_apart_and_pruned_with_their_checkpoint(tmp_path):
    first = _save_with_pieces(tmp_path, 1, keep=2)
    (tmp_path / "step-00000002.engine").mkdir()  # a leftover: its ranks wrote, the commit never came
    second = _save_with_pieces(tmp_path, 3, keep=2)
    assert not (tmp_path / "step-00000002.engine").exists()
    assert torch.equal(load_engine_piece(second, rank=1, world_size=2)["error"], torch.ones(3))
    assert torch.equal(load_engine_piece(second, rank=2, world_size=3)["error"], torch.zeros(3)), "rank 0's"
    best = keep_apart(second.path, tmp_path / "best")
    assert sorted(p.name for p in engine_folder(best.path).iterdir()) == ["rank0.pt", "rank1.pt"]
    _save_with_pieces(tmp_path, 4, keep=2)
    assert not engine_folder(first.path).exists() and engine_folder(second.path).exists()
    piece = engine_folder(second.path) / "rank1.pt"
    piece.write_bytes(piece.read_bytes()[:10])
    warnings = []
    assert newest_valid(tmp_path, warnings.append).step == 4 and not warnings
    _save_with_pieces(tmp_path, 5, keep=3)
    (engine_folder(tmp_path / "step-00000005.pt") / "rank0.pt").unlink()
    assert newest_valid(tmp_path, warnings.append).step == 4
    assert "step-00000005.engine/rank0.pt: cannot read it" in warnings[0]


class RunsCode:
    def __reduce__(self):
        return (print, ("this would have run",))


def test_a_pickle_that_runs_code_is_refused(tmp_path):
    checkpoint = _save(tmp_path, 1)
    torch.save({"w": RunsCode()}, checkpoint.path)  # a real torch file whose pickle calls a function
    data = checkpoint.path.read_bytes()
    manifest = {**checkpoint.manifest, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    checkpoint.path.with_suffix(".json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="refused: it holds objects that would run code"):
        load_checkpoint(find_checkpoint(checkpoint.path, print))


def test_resume_path_errors_name_the_path(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer.resume=.*nothing-here is not allowed: no such file or folder"):
        find_checkpoint(tmp_path / "nothing-here", print)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no valid checkpoint"):
        find_checkpoint(tmp_path / "empty", print)


def test_a_dcp_tensor_that_does_not_fit_fails_with_the_disks_own_error(tmp_path):
    """A tensor's write goes through torch.save's C++ writer, whose RuntimeError ('unexpected pos') hides the OSError
    as its context, and DCP hands each rank's failure on pickled, without it: fsdp's shards on a full disk came out as
    DCP's CheckpointException (a run under load, tests/runs/test_disk_full.py). A file-size limit gives the same
    failure in this process (EFBIG where a full disk gives ENOSPC)."""
    import resource

    from framework.training.dcp import save_sharded

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
    try:
        with pytest.raises(OSError) as raised:
            save_sharded({"w": torch.zeros(1 << 20)}, tmp_path / "step-00000001")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert raised.value.errno == errno.EFBIG
