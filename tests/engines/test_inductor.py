"""torch.compile's default backend, inductor, in the workers of each engine family: ddp and deepspeed compile the whole
model (DeepSpeed through its engine), fsdp each of its units, the mesh (tensor parallel, pipeline parallel) each block
of its own, all with activation checkpointing on, on the char LM of the model-parallel tests (support/mesh_runs.py:
CHAR_LM). Each run has the loss of one process at every step, to 1e-5: the eager single-process run those tests share
(inductor's kernels change only the order of float sums: about 1e-7 measured). inductor writes C++ kernels and builds
them with the machine's compiler; each run gets an empty cache folder of its own (TORCHINDUCTOR_CACHE_DIR), so the
kernels found there were built by its workers, not taken from an earlier run or session. The rich runs
(test_rich_runs.py) compile with aot_eager, dynamo and AOTAutograd without code generation; these are the suite's runs
of the backend users get. Real train.py runs, shared through the run cache; `make test-all` only (docs/testing.md
says what each costs)."""
import json

import pytest
import torch

from support.mesh_runs import CHAR_LM, REL, STEPS, assert_same_losses, result, train
from support.processes import user_code_env
from support.run_files import losses_by_step, walk

BLOCKS = [f"blocks.{i}" for i in range(4)]
# engine: its overrides, and what each rank compiles (support/user_code/speedup_probe.py), by rank
ENGINES = {
    "ddp": (["strategy=ddp", "strategy.nproc_per_node=2"], [[""]] * 2),
    "fsdp": (["strategy=fsdp", "strategy.nproc_per_node=2"], [["wpe", *BLOCKS, "ln_f"]] * 2),  # its units
    "tp": (["strategy=tp"], [BLOCKS] * 2),
    "pp": (["strategy=pp", "strategy.schedule=1F1B"], [BLOCKS[:2], BLOCKS[2:]]),  # each stage its own blocks
    "zero2": (["strategy=deepspeed", "strategy.nproc_per_node=2", "strategy.zero_stage=2"], [[""]] * 2),
}
# the first step's compile of forward and backward takes minutes on a loaded machine: the stall watchdog (CHAR_LM's
# 120 s) would take it for a hang; it still ends a run that hangs (the run's own limit, 840 s, is the test's less
# a minute)
COMPILED = ["trainer.compile=true", "trainer.activation_checkpointing=true", "trainer.stall_timeout=480",
            "strategy.timeout=600", "+callbacks.probe._target_=speedup_probe.SpeedupProbe"]


def compiled_run(runs, engine: str):
    """The engine's run with inductor, its kernels built into a folder of its own (made empty for this session)."""
    if engine == "zero2":
        pytest.importorskip("deepspeed")
    kernels = runs.folder(f"inductor_{engine}", lambda folder: None)
    run = runs.train([*CHAR_LM, *ENGINES[engine][0], *COMPILED],
                     env=user_code_env(env={"TORCHINDUCTOR_CACHE_DIR": str(kernels)}), timeout=840).ok()
    return run, kernels


@pytest.mark.parametrize("engine", list(ENGINES))
def test_inductor_compiles_in_every_worker_with_the_loss_of_one_process(runs, engine):
    run, kernels = compiled_run(runs, engine)
    single = train(runs, [*CHAR_LM, "strategy=single"])
    assert_same_losses(losses_by_step(single), run.run_dir)
    done = result(run.run_dir)
    assert (done["processes"], done["steps"]) == (2, STEPS)
    assert done["test_loss"] == pytest.approx(result(single)["test_loss"], rel=REL), "the compiled evaluation"
    probes = [json.loads(p.read_text()) for p in sorted(run.run_dir.glob("speedup_probe.rank*.json"))]
    assert [p["compiled"] for p in probes] == ENGINES[engine][1], probes
    for probe in probes:  # the blocks a rank compiles (all of them in a whole model) also run again in backward
        assert set(BLOCKS if probe["compiled"] == [""] else probe["compiled"]) <= set(probe["recomputed"]), probes
    assert walk(kernels, "*.cpp") and walk(kernels, "*.so"), f"inductor built no kernel in {kernels}"
    weights = torch.load(run.run_dir / "weights" / "last.pt", weights_only=True)["model"]
    plain = torch.load(single / "weights" / "last.pt", weights_only=True)["model"]
    assert list(weights) == list(plain), "the weights keep the model's own names (no _orig_mod.)"
