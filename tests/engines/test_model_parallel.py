"""strategy=tp and strategy=pp train the built-in char LM (a 4-block GPT, 32 wide, its head tied to the token
embedding) on CPU workers (gloo) with the loss of one process at every step, to 1e-5 in fp32, clipping and
accumulation on: tensor parallel over 2 workers (its sequence-parallel plan: norms and residuals split along the
sequence), pipeline parallel over 2 with each schedule (GPipe cut at a split point, 1F1B, Interleaved1F1B with 2
stages per rank, the zero-bubble InterleavedZeroBubble and ZBVZeroBubble, whose V puts the first and the last stage,
and so both copies of the tied head, on rank 0), a 2 x 2 mesh (FSDP2 over dp_shard=2 x tp=2, 4 workers) and HSDP (strategy=hsdp: 2 replicas x dp_shard=2, 4 workers). Pipeline stages
report their compute, bubble and communication per rank; the other meshes their collectives as each rank's wait. A run killed on one mesh resumes in its folder on another
(tp=2 -> ddp, pp=2 -> tp=2) and continues the uninterrupted run's curve. Real train.py processes, shared through the
run cache (the killed runs are their own);
tests/unit/test_model_parallel_checks.py has the refusals, tests/engines/test_model_parallel_user.py a user's model
with a plan from YAML. Under torchrun the mesh is built from the ranks it started, with the same losses."""
import pytest
import torch

from support.mesh_runs import (
    CHAR_LM,
    MESH,
    STEPS,
    assert_same_losses,
    killed_then_resumed,
    pipeline,
    result,
    train,
)
from support.processes import torchrun
from support.run_files import losses_by_step, read_scalars

MESHES = {
    "tp2_sequence_parallel": ["strategy=tp", "strategy.sequence_parallel=true", *MESH],
    "pp2_GPipe_split_at_blocks.3": [*pipeline("GPipe"), "strategy.split_points=[blocks.3]"],
    "pp2_1F1B": pipeline("1F1B"),
    "pp2_Interleaved1F1B": pipeline("Interleaved1F1B"),
    "pp2_InterleavedZeroBubble": pipeline("InterleavedZeroBubble"),
    "pp2_ZBVZeroBubble": pipeline("ZBVZeroBubble"),
    "dp_shard2_x_tp2": ["strategy=tp", "strategy.dp_shard=2", *MESH],
    "hsdp_dp_replicate2_x_dp_shard2": ["strategy=hsdp", "strategy.dp_replicate=2", "strategy.dp_shard=2", *MESH],
}
WORKERS = {"dp_shard2_x_tp2": 4, "hsdp_dp_replicate2_x_dp_shard2": 4}  # the others: 2
PEERS = {"hsdp_dp_replicate2_x_dp_shard2": 1}  # ranks that read the same share; the others: 2 (tp or pp peers)


@pytest.fixture(scope="module")
def single(runs):
    run_dir = train(runs, [*CHAR_LM, "strategy=single"])
    return {"losses": losses_by_step(run_dir), "result": result(run_dir)}


CORE = ("tp2_sequence_parallel", "pp2_1F1B")  # make test's: one tensor and one pipeline parallel run


@pytest.mark.parametrize("mesh", [pytest.param(m, marks=pytest.mark.core) if m in CORE else m for m in MESHES])
def test_the_char_lm_on_a_mesh_has_the_loss_of_one_process_at_every_step(runs, single, mesh):
    run_dir = train(runs, [*CHAR_LM, *MESHES[mesh]])
    assert_same_losses(single["losses"], run_dir)
    done = result(run_dir)
    workers = WORKERS.get(mesh, 2)
    assert done["processes"] == workers and done["steps"] == STEPS
    assert done["test_loss"] == pytest.approx(single["result"]["test_loss"], rel=1e-5), "evaluation on every rank"
    assert done["test_bits_per_char"] == pytest.approx(single["result"]["test_bits_per_char"], rel=1e-5)
    scalars = read_scalars(run_dir)
    peers = PEERS.get(mesh, 2)  # the ranks of one data-parallel rank (tp or pp peers: neighbours) report the same loss
    for r in range(workers):
        assert scalars[f"loss/train/rank{r}"] == scalars[f"loss/train/rank{r - r % peers}"]
    # each rank counts its share of the samples, over the interval's wall time: the ranks add up to the job exactly
    # (up to TensorBoard's float32; tests/unit/test_interval_rates.py has the arithmetic with unequal windows)
    shares = [scalars[f"throughput/samples_per_sec/rank{r}"][-1][1] for r in range(workers)]
    assert sum(shares) == pytest.approx(scalars["throughput/samples_per_sec"][-1][1], rel=1e-6)
    if mesh.startswith("pp"):  # each stage's compute, bubble and communication per step, one line per rank
        for r in range(2):
            for tag in ("time/wait_ms", "time/comm_ms", "time/forward_ms", "time/backward_ms", "time/busy_ms"):
                values = [v for _, v in scalars[f"{tag}/rank{r}"]]
                assert len(values) == STEPS and min(values) >= 0, (tag, r, values)
            assert scalars[f"time/forward_ms/rank{r}"][-1][1] > 0
        # the first stage waits for the last stage's first backward: its bubble is real
        assert sum(v for _, v in scalars["time/wait_ms/rank0"]) > 0
    else:  # the mesh's collectives, timed as waits (framework/strategies/mesh/comm_clock.py), on every rank
        for r in range(workers):
            values = [v for _, v in scalars[f"time/wait_ms/rank{r}"]]
            assert len(values) == STEPS and min(values) > 0, (r, values)
    checkpoint = run_dir / "checkpoints" / f"step-{STEPS:08d}"
    assert {".metadata", "training_state.pt"} | {f"__{r}_0.distcp" for r in range(workers)} <= {
        p.name for p in checkpoint.iterdir()}
    _assert_whole_weights(run_dir)


def _assert_whole_weights(run_dir):
    """weights/last.pt holds every tensor of the whole model, as one process writes it (a pipeline's stages gathered
    to rank 0, tensor-parallel shards made whole), and loads into the plain GPT."""
    from framework.results.trained_model import load_model

    saved = torch.load(run_dir / "weights" / "last.pt", weights_only=True)["model"]
    model = load_model(run_dir, "last")
    assert list(saved) == list(model.state_dict())
    assert all(saved[k].shape == v.shape for k, v in model.state_dict().items())
    assert torch.equal(saved["wte.weight"], saved["head.weight"]), "the tied copies stepped alike"


@pytest.mark.parametrize("mesh", ["tp2_sequence_parallel", "pp2_1F1B"])
def test_under_torchrun_the_mesh_is_made_of_its_ranks_with_the_loss_of_one_process(runs, single, mesh):
    run = runs.train([*CHAR_LM, *MESHES[mesh]], launcher=torchrun()).ok()
    assert_same_losses(single["losses"], run.run_dir)
    done = result(run.run_dir)
    assert (done["processes"], done["strategy"]) == (2, mesh[:2])
    assert len(run.jobs) == 1, "one run folder: the ranks torchrun started follow rank 0's"


def test_a_tensor_parallel_run_killed_resumes_under_ddp(runs, tmp_path):
    """A run of its own (killed, then resumed in its folder): DCP shards of tp=2 read by ddp's two workers, each
    loading the whole model (a single-file engine reads DCP); the curve is the uninterrupted tp run's."""
    uninterrupted = train(runs, [*CHAR_LM, *MESHES["tp2_sequence_parallel"]])
    run_dir, _ = killed_then_resumed(tmp_path, [*CHAR_LM, *MESHES["tp2_sequence_parallel"]],
                                     [*CHAR_LM, "strategy=ddp", "strategy.nproc_per_node=2"])
    assert_same_losses(losses_by_step(uninterrupted), run_dir)
    done = result(run_dir)
    assert (done["strategy"], done["resumed_from_step"], done["steps"]) == ("ddp", 4, STEPS)


def test_a_pipeline_run_killed_resumes_under_tensor_parallel(runs, tmp_path):
    """A run of its own (killed, then resumed in its folder): stage shards (the tied head's optimizer state under the
    embedding's name) read by tp=2's ranks; the curve is the uninterrupted 1F1B run's."""
    uninterrupted = train(runs, [*CHAR_LM, *MESHES["pp2_1F1B"]])
    run_dir, _ = killed_then_resumed(tmp_path, [*CHAR_LM, *MESHES["pp2_1F1B"]], [*CHAR_LM, "strategy=tp", *MESH])
    assert_same_losses(losses_by_step(uninterrupted), run_dir)
    done = result(run_dir)
    assert (done["strategy"], done["resumed_from_step"], done["steps"]) == ("tp", 4, STEPS)


def test_a_batchnorm_model_trains_in_bf16_under_the_meshs_fsdp2(runs):
    """ResNet-18 (BatchNorm) on dp_shard=2 in bf16: the mesh's FSDP2 cast BatchNorm's weight to bf16 but not its
    running statistics, and the first forward failed ("expected scalar type BFloat16 but found Float"); fsdp.py had
    the fix, and both now apply FSDP2 by one function (framework/strategies/mesh/fsdp.py)."""
    run = runs.train(["strategy=tp", "strategy.tp=1", "strategy.dp_shard=2", "model=resnet18",
                      "trainer.precision=bf16", "trainer.max_steps=2", "trainer.batch_size=8",
                      "dataset.max_train_samples=64", "dataset.max_test_samples=16"]).ok()
    done = result(run.run_dir)
    assert done["steps"] == 2 and done["processes"] == 2 and done["train_loss"] == done["train_loss"]


PARAM_GROUPS = ["+optimizer/param_groups=no_decay", "optimizer.weight_decay=0.5"]


def test_param_groups_name_the_parameters_of_pipeline_stages_split_by_tensor_parallel(runs):
    """The issue's command, `experiment=char_lm strategy=pp strategy.pp=2 strategy.tp=2 +optimizer/param_groups=
    no_decay`, stopped before training ("the engine gave its optimizer 18 parameters that are neither the model's own
    nor its 35 parameters in order"): a stage holds some of the model's parameters, tensor parallel replaced them.
    The engine names them by the whole model's names; with weight decay on the default group only, the losses are
    one process's with the same groups, step by step."""
    reference = losses_by_step(train(runs, [*CHAR_LM, *PARAM_GROUPS, "strategy=single"]))
    run_dir = train(runs, [*CHAR_LM, *PARAM_GROUPS, *pipeline("1F1B"), "strategy.tp=2"])
    assert_same_losses(reference, run_dir)
    assert result(run_dir)["processes"] == 4
    assert {f"lr/{name}" for name in ("default", "no_decay")} <= set(read_scalars(run_dir))
