"""strategy.compression in real runs (support/references.py's LeNet, Adam, 2 gloo workers): ddp's PowerSGD equal to
ddp without compression before its start and training after it with a fraction of the bytes, fp16 and bf16 within a
percent of fp32 ddp, fsdp's bf16 reduce likewise, their bytes in TensorBoard and on the run's last line, a killed
PowerSGD run resumed onto the uninterrupted curve, and a resume on one worker saying what it resets. Runs are shared
through the run cache; the killed one is its own. The hooks' arithmetic: tests/dist/test_compression_hooks.py."""
import re

import pytest

from support.processes import check_ok, run_train
from support.references import STEPS, adam
from support.run_files import assert_resumed_from, assert_same_losses, losses_by_step, read_scalars, run_dirs

START = 5  # of STEPS = 12, a checkpoint every 4 (the newest 2 kept)
POWERSGD = [*adam("ddp"), "strategy.compression=powersgd", "strategy.powersgd.rank=1",
            f"strategy.powersgd.start_step={START}"]
LENET_GRADIENT_BYTES = 4 * 129_068  # LeNet's parameters, fp32


def _tag(run, tag: str) -> dict[int, float]:
    return dict(read_scalars(run.run_dir)[tag])


def test_powersgd_before_its_start_step_is_ddp_without_compression(runs):
    plain, powersgd = runs.train(adam("ddp")).ok(), runs.train(POWERSGD).ok()
    assert_same_losses(losses_by_step(plain.run_dir), losses_by_step(powersgd.run_dir), range(1, START), 1e-6,
                       ("ddp", "ddp powersgd before its start"))
    ratio = _tag(powersgd, "comm/compression_ratio")
    assert all(ratio[step] == 1.0 for step in range(1, START))
    assert all(_tag(powersgd, f"comm/bytes_sent/rank{r}")[1] == LENET_GRADIENT_BYTES for r in (0, 1))


def test_powersgd_rank_1_trains_after_its_start_with_a_fraction_of_the_bytes(runs):
    run = runs.train(POWERSGD).ok()
    losses = losses_by_step(run.run_dir)
    first, last = (sum(losses[s] for s in range(a, a + 4)) / 4 for a in (START, STEPS - 3))
    assert last < first, f"compressed steps {START}-{START + 3}: {first:.4f}, the last four: {last:.4f}"
    ratio = _tag(run, "comm/compression_ratio")
    assert min(ratio[step] for step in range(START, STEPS + 1)) >= 4
    for r in (0, 1):
        assert _tag(run, f"comm/bytes_sent/rank{r}")[STEPS] * 4 <= LENET_GRADIENT_BYTES
    result = run.result()
    assert result["compression"] == "powersgd rank 1" and result["compression_ratio"] >= 4
    assert result["wait_ms_uncompressed"] >= 0 and result["wait_ms_compressed"] >= 0
    [done] = [line for line in run.stdout.splitlines() if line.startswith("done: ")]
    assert f"| powersgd rank 1: {result['compression_ratio']:.0f}x fewer gradient bytes; wait " in done, done


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_precision_gradients_stay_within_a_percent_of_fp32_ddp(runs, dtype):
    plain, half = runs.train(adam("ddp")).ok(), runs.train([*adam("ddp"), f"strategy.compression={dtype}"]).ok()
    assert_same_losses(losses_by_step(plain.run_dir), losses_by_step(half.run_dir), range(1, 7), 1e-2,
                       ("ddp", f"ddp {dtype}"))
    assert set(_tag(half, "comm/compression_ratio").values()) == {2.0}
    assert _tag(half, "comm/bytes_sent/rank1")[STEPS] * 2 == LENET_GRADIENT_BYTES
    assert f"| {dtype}: 2.0x fewer gradient bytes; wait " in half.stdout


def test_fsdp_reduces_in_bf16_within_a_percent_of_fp32(runs):
    plain, bf16 = runs.train(adam("fsdp")).ok(), runs.train([*adam("fsdp"), "strategy.compression=bf16"]).ok()
    assert_same_losses(losses_by_step(plain.run_dir), losses_by_step(bf16.run_dir), range(1, 7), 1e-2,
                       ("fsdp", "fsdp bf16 reduce"))
    assert set(_tag(bf16, "comm/compression_ratio").values()) == {2.0}
    assert set(_tag(plain, "comm/compression_ratio").values()) == {1.0}
    # the mesh times FSDP2's collectives on CPU workers (strategy.comm_clock), so the line has the wait, as ddp's has
    assert re.search(r"\| bf16: 2\.0x fewer gradient bytes; wait [\d.]+ ms per step \| ", bf16.stdout), bf16.stdout


def test_a_killed_powersgd_run_resumes_onto_the_uninterrupted_curve(runs, tmp_path):
    """Its own run: it is killed (rank 1, after step 10, past the step-8 checkpoint) and the elastic agent restarts
    both workers, whose new DDPs lay their buckets out as a fresh one does."""
    reference = losses_by_step(runs.train(POWERSGD).ok().run_dir)
    out = check_ok(run_train([*POWERSGD, "strategy.max_restarts=1"], tmp_path, timeout=300,
                             faults="kill_after_step:10:1"))
    assert_resumed_from(out, 8)
    [run_dir] = run_dirs(tmp_path)
    assert_same_losses(reference, losses_by_step(run_dir), range(1, STEPS + 1), 1e-6,
                       ("uninterrupted", "killed at step 10 and resumed from step 8"))


def test_a_resume_on_one_worker_says_it_resets_each_ranks_error_feedback(runs):
    checkpoint = sorted((runs.train(POWERSGD).ok().run_dir / "checkpoints").glob("step-*.pt"))[0]  # past the start
    run = runs.train([*POWERSGD, "strategy.nproc_per_node=1", f"trainer.resume={checkpoint}"]).ok()
    [line] = [line for line in run.stdout.splitlines() if line.startswith("resumed from")]
    assert line.endswith("; PowerSGD resets its error feedback (each rank's own: written by 2 ranks, continuing on "
                         "1)"), line


def test_one_non_finite_powersgd_step_is_skipped_and_the_run_trains_on(runs):
    """A new user's run (issue 55): PowerSGD rank 1, trainer.on_nonfinite=skip, one step's loss NaN on rank 1. Before
    the hook let its state go, every later step was skipped, the run ended with exit 0, and TensorBoard showed a loss
    of 0.0 and 0 samples/s at each skipped step."""
    bad = START + 2
    run = runs.train([*POWERSGD, "trainer.on_nonfinite=skip"], faults=f"nan_loss:{bad}:1").ok()
    assert [line for line in run.stdout.splitlines() if "step skipped" in line] == [
        f"step {bad}: non-finite loss or gradient, step skipped (trainer.on_nonfinite=skip)"]
    assert run.result()["skipped_steps"] == 1
    scalars = read_scalars(run.run_dir)
    losses = dict(scalars["loss/train"])
    assert sorted(losses) == [s for s in range(1, STEPS + 1) if s != bad], "no loss point at the skipped step"
    assert all(0 < v < 10 for v in losses.values())
    assert sorted(dict(scalars["throughput/samples_per_sec"])) == sorted(losses)
    assert scalars["train/skipped_steps"] == [(bad, 1.0)]
