"""scripts/gpu_smoke.py (`make test-gpu`), the parts a CPU can show with a real run: a cell past its time ends every
process it started, so the next cell finds the GPUs free."""
import subprocess
import uuid
from types import SimpleNamespace

import pytest

from support.processes import TINY, faults_env, gpu_smoke_script, held_at, processes_tagged, wait_until_held


def test_a_run_past_the_cells_time_is_stopped_with_every_worker_it_started(tmp_path, monkeypatch):
    """The cell's time runs out while its ddp run trains (the run waits at the end of step 1, its workers and the
    elastic agent up): the cell ends every process of the run. The time running out is made to happen at that point,
    not raced against the machine's speed."""
    smoke = gpu_smoke_script()

    class TimeRunsOutWhileHeld(subprocess.Popen):
        def communicate(self, input=None, timeout=None):
            if timeout is None:
                return super().communicate(input)
            wait_until_held(self, tmp_path)
            raise subprocess.TimeoutExpired(self.args, timeout)

    monkeypatch.setattr(smoke, "subprocess", SimpleNamespace(**{**vars(subprocess), "Popen": TimeRunsOutWhileHeld}))
    tag = uuid.uuid4().hex
    args = held_at(["strategy=ddp", "strategy.nproc_per_node=2", "trainer.accelerator=cpu", *TINY,
                    "trainer.epochs=1000"], step=1)
    with pytest.raises(smoke.CellTimeout):
        smoke.train(args, tmp_path, env={**faults_env(), "HYDRA_DIST_TEST_TAG": tag})
    assert processes_tagged(tag) == []
    assert (tmp_path / "outputs").is_dir()  # it was training, not refused
