"""strategy.compression in this process: what the driver refuses (one line naming what the engine allows, before any
worker starts), the run's summary line, the totals it comes from, and what a resume says it resets of PowerSGD's
state. The hooks' arithmetic on two gloo ranks: tests/dist/test_compression_hooks.py; real runs:
tests/engines/test_compression.py."""
import math

import pytest
import torch

from framework.config.strategy_options import PowerSGDOptions
from framework.results.run_result import RunResult
from framework.strategies.mesh.ddp_hooks import GradientHook
from framework.telemetry.meter import MeterSources, StepRecord
from framework.telemetry.meters import COLUMNS, IntervalMeter, IntervalSummary
from framework.telemetry.traffic import GradientBytesMeter, Traffic
from framework.training.loop_state import RunTotals
from support.driver import driver_says
from support.fake_cuda import cuda_reported
from support.references import ADAM

DDP = ["strategy=ddp", "strategy.nproc_per_node=2"]
ALL_FOUR = "(strategy=ddp compresses them: none, fp16, bf16, powersgd); allowed: none"


@pytest.mark.parametrize("overrides,line", [
    ([*DDP, "strategy.compression=int8"],
     "strategy.compression='int8' is not allowed: expected one of none, fp16, bf16, powersgd"),
    ([*DDP, "strategy.compression=powersgd", "strategy.powersgd.start_step=2"],
     "strategy.powersgd.start_step=2 is not allowed: expected an integer >= 3 with error feedback or warm start (DDP "
     "rebuilds its gradient buckets after step 1, and PowerSGD keeps their state from step 3 on)"),
    ([*DDP, "strategy.compression=powersgd", "strategy.powersgd.rank=0"],
     "strategy.powersgd.rank=0 is not allowed: expected an integer >= 1 (the rank of each gradient's low-rank "
     "approximation)"),
    ([*DDP, "strategy.compression=fp16", "strategy.powersgd.rank=4"],
     "strategy.powersgd.rank=4 is not allowed with strategy.compression=fp16: it sets PowerSGD, which runs with "
     "strategy.compression=powersgd"),
    (["strategy=dp", "strategy.compression=powersgd"],
     "strategy.compression=powersgd is not allowed with strategy=dp: nn.DataParallel sums its replicas' gradients on "
     f"the first GPU inside backward, with no all-reduce to compress {ALL_FOUR}"),
    (["strategy=single", "strategy.compression=fp16"],
     f"strategy.compression=fp16 is not allowed with strategy=single: one process sends no gradients {ALL_FOUR}"),
    (["strategy=fsdp", "strategy.compression=fp16"],
     "strategy.compression=fp16 is not allowed with strategy=fsdp: FSDP2 reduce-scatters gradients in its reduce "
     "dtype, and bf16 is the one that needs no loss scaler (PowerSGD is a DDP hook); allowed: none, bf16"),
    (["strategy=fsdp", "strategy.compression=powersgd"],
     "strategy.compression=powersgd is not allowed with strategy=fsdp"),
    (["strategy=tp", "strategy.compression=bf16", "experiment=char_lm"],
     "strategy.compression=bf16 is not allowed with strategy=tp: the mesh's gradient reductions (FSDP2 over the "
     "data-parallel axes, tensor-parallel partial sums) have no compression proven equal here; strategy=fsdp reduces "
     "in bf16, strategy=ddp compresses; allowed: none"),
    (["strategy=pp", "strategy.compression=fp16", "experiment=char_lm"],
     "strategy.compression=fp16 is not allowed with strategy=pp"),
], ids=["unknown", "start_step", "rank", "powersgd_keys_without_powersgd", "dp", "single", "fsdp_fp16",
        "fsdp_powersgd", "tp", "pp"])
def test_what_an_engine_cannot_do_is_one_line_before_any_worker_starts(tmp_path, overrides, line):
    said = driver_says([*overrides, *ADAM], tmp_path)
    assert said.startswith(line) and "\n" not in said, said


@pytest.mark.parametrize("overrides", [
    ["strategy.compression=fp16"], ["strategy.compression=bf16"],
    ["strategy.compression=powersgd", "strategy.powersgd.rank=1", "strategy.powersgd.start_step=5"],
    ["strategy.compression=powersgd", "strategy.powersgd.start_step=1", "strategy.powersgd.error_feedback=false",
     "strategy.powersgd.warm_start=false"],
], ids=["fp16", "bf16", "powersgd", "powersgd_without_state"])
def test_ddp_takes_every_compression_on_gloo(tmp_path, overrides):
    assert driver_says([*DDP, *overrides, *ADAM], tmp_path) == ""


def test_fsdp_reduces_in_bf16_and_horovod_sends_fp16(tmp_path):
    assert driver_says(["strategy=fsdp", "strategy.compression=bf16", *ADAM], tmp_path) == ""
    assert driver_says(["strategy=horovod", "strategy.compression=fp16", *ADAM], tmp_path) == ""


def test_deepspeed_has_no_compression_of_ours_and_its_one_bit_optimizers_are_refused(tmp_path):
    pytest.importorskip("deepspeed")
    said = driver_says(["strategy=deepspeed", "strategy.compression=fp16", *ADAM], tmp_path)
    assert said.startswith("strategy.compression=fp16 is not allowed with strategy=deepspeed: DeepSpeed compresses "
                           "gradients with its own optimizers (1-bit Adam, 0/1 Adam, 1-bit LAMB), which need NCCL or "
                           "MPI"), said
    assert said.endswith("allowed: none"), said
    said = driver_says(["strategy=deepspeed", "+strategy.config.optimizer.type=OneBitAdam", *ADAM], tmp_path)
    assert said.startswith("strategy.config.optimizer.type=OneBitAdam is not allowed: DeepSpeed's compressed "
                           "optimizers (OneBitAdam, ZeroOneAdam, OneBitLamb) need NCCL or MPI"), said


@pytest.mark.skipif(torch.cuda.device_count() > 1, reason="strategy=auto is ddp on a machine with several GPUs")
def test_auto_that_becomes_one_process_refuses_compression_instead_of_dropping_it(tmp_path):
    assert driver_says(["strategy=auto", "strategy.compression=fp16", *ADAM], tmp_path) == (
        "strategy.compression=fp16 is not allowed with strategy=auto here: auto chose single (at most one GPU), and "
        "one process sends no gradients; use strategy=ddp (CPU workers, or one per GPU)")


def test_powersgd_with_cpu_workers_where_gpus_are_visible_is_refused(tmp_path, monkeypatch):
    """torch's PowerSGD hook calls torch.cuda.synchronize(the bucket's device) whenever CUDA is available, which a CPU
    worker's bucket is not: the run would fail at its first compressed step. The machine is made to show a GPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    said = driver_says([*DDP, "trainer.accelerator=cpu", "strategy.compression=powersgd", *ADAM], tmp_path)
    assert said.startswith("strategy.compression=powersgd is not allowed with CPU workers on a machine with GPUs"), said


def _result(**traffic) -> RunResult:
    return RunResult(test_metrics={"acc": 0.9}, objective="acc", test_loss=0.3, train_loss=0.3, samples_per_sec=100.0,
                     per_rank_samples_per_sec=[50.0, 50.0], per_rank_max_memory_gib=[0.0, 0.0], train_seconds=1.0,
                     steps=10, skipped_steps=0, epochs=1, processes=2, global_batch=32, micro_batch=16, strategy="ddp",
                     device="cpu", resumed_from_step=0, checkpoint="", **traffic)


@pytest.mark.parametrize("traffic,line", [
    (dict(compression="powersgd rank 2", compression_ratio=36.9, wait_ms_uncompressed=12.14, wait_ms_compressed=3.41),
     "powersgd rank 2: 37x fewer gradient bytes; wait 12.1 -> 3.4 ms per step"),
    (dict(compression="fp16", compression_ratio=2.0, wait_ms_compressed=3.4), "fp16: 2.0x fewer gradient bytes; wait "
                                                                              "3.4 ms per step"),
    (dict(compression="bf16", compression_ratio=2.0), "bf16: 2.0x fewer gradient bytes"),  # fsdp: no wait clock
    (dict(compression="powersgd rank 1", compression_ratio=1.0, wait_ms_uncompressed=5.0),
     "powersgd rank 1: no step sent compressed"),
    (dict(compression="none", compression_ratio=1.0, wait_ms_uncompressed=5.0), ""),
    (dict(), ""),
])
def test_the_runs_last_line_says_what_compression_did(traffic, line):
    assert _result(**traffic).compression_line() == line


def _interval(steps: int, compressed: int, sent: float, full: float, waits_ms: tuple[float, float]) -> IntervalSummary:
    rows = torch.zeros(2, len(COLUMNS), dtype=torch.float64)
    given = {"samples": 16 * steps, "seconds": 1.0, "steps": steps, "bytes_sent": sent, "bytes_uncompressed": full,
             "compressed_steps": compressed,
             "wait_seconds": torch.tensor(waits_ms, dtype=torch.float64) * steps / 1000}
    for name, value in given.items():
        rows[:, COLUMNS.index(name)] = value
    return IntervalSummary.from_rows(rows)


def test_totals_compare_the_wait_of_plain_and_compressed_steps_and_skip_an_interval_with_both():
    totals = RunTotals()
    totals.add(_interval(4, 0, 4000, 4000, (10.0, 14.0)))  # warm-up: plain all-reduce
    totals.add(_interval(4, 2, 2100, 4000, (99.0, 99.0)))  # the interval compression starts in
    totals.add(_interval(4, 4, 100, 4000, (2.0, 4.0)))
    totals.add(_interval(4, 4, 100, 4000, (3.0, 3.0)))
    report = totals.traffic()
    assert report["wait_ms_uncompressed"] == pytest.approx(12.0)
    assert report["wait_ms_compressed"] == pytest.approx(3.0)
    assert report["compression_ratio"] == pytest.approx(40.0)
    assert report["gradient_bytes_per_step"] == pytest.approx(25.0)  # 200 bytes over 8 steps of each of 2 ranks
    restored = RunTotals(**{**totals.__dict__})  # what a checkpoint gives back
    assert restored.traffic() == report


def test_the_run_totals_of_the_traffic_are_the_meters_own():
    """The meter's file holds the arithmetic; RunTotals only keeps the two phases (checkpointed) and asks it."""
    uncompressed, compressed = {}, {}
    for interval in (_interval(2, 0, 2000, 2000, (8.0, 8.0)), _interval(2, 2, 100, 2000, (1.0, 3.0))):
        GradientBytesMeter.add_to_run(interval, uncompressed, compressed)
    assert GradientBytesMeter.run_result(uncompressed, compressed) == pytest.approx(
        {"compression_ratio": 20.0, "gradient_bytes_per_step": 50.0, "wait_ms_uncompressed": 8.0,
         "wait_ms_compressed": 2.0})


def test_uncounted_engines_report_no_traffic():
    totals = RunTotals()
    totals.add(_interval(4, 0, math.nan, math.nan, (1.0, 1.0)))
    assert totals.traffic() == {}


def test_the_meter_counts_bytes_and_compressed_steps_per_interval():
    traffic = Traffic("powersgd rank 2")
    meter = IntervalMeter(MeterSources([16], torch.device("cpu"), traffic=traffic))
    counts = [COLUMNS.index(name) for name in ("bytes_sent", "bytes_uncompressed", "compressed_steps")]
    traffic.add(400, 400)
    meter.add(StepRecord(1))
    traffic.add(10, 400)
    meter.add(StepRecord(2))
    assert meter.rows()[0, counts].tolist() == [410, 800, 1]
    meter.reset()
    assert meter.rows()[0, counts].tolist() == [0, 0, 0]
    assert math.isnan(IntervalMeter(MeterSources([16], torch.device("cpu"))).rows()[0, counts[0]])


# ---- what a resume resets of PowerSGD's state (the state's round trip itself: tests/dist/) ----------------------

def _powersgd(rank: int = 2, start_step: int = 3) -> GradientHook:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 8))
    return GradientHook("powersgd", PowerSGDOptions(rank=rank, start_step=start_step), list(model.parameters()))


def _saved(ranks: int, rank: int = 2) -> list[dict]:
    """What `ranks` ranks of a powersgd run left in a checkpoint at step 8: each rank's error feedback and Q factor."""
    states = []
    for r in range(ranks):
        hook = _powersgd(rank)
        hook.powersgd.iter = 8
        hook.pending = {0: {"error": torch.full((512,), float(r)), "q": torch.ones(16 * rank)}}
        states.append(hook.state_dict())
    return states


def test_the_same_world_gets_every_piece_back_and_nothing_is_reset():
    hook = _powersgd()
    assert hook.load_state_dict(_saved(2)[1], 2, world_size=2, step=8) == ""
    assert hook.powersgd.iter == 8
    assert torch.equal(hook.pending[0]["error"], torch.full((512,), 1.0)) and "q" in hook.pending[0]


def test_another_world_size_resets_the_error_feedback_each_rank_kept_and_keeps_the_factors():
    hook = _powersgd()
    said = hook.load_state_dict(_saved(2)[0], 2, world_size=1, step=8)
    assert said == "PowerSGD resets its error feedback (each rank's own: written by 2 ranks, continuing on 1)"
    assert set(hook.pending[0]) == {"q"} and hook.powersgd.iter == 8


def test_another_rank_resets_the_warm_start_factors():
    hook = _powersgd(rank=4)
    said = hook.load_state_dict(_saved(2, rank=2)[0], 2, world_size=2, step=8)
    assert said == "PowerSGD resets its warm-start factors (rank 2 -> 4)"
    assert set(hook.pending[0]) == {"error"}


def test_another_compression_says_what_it_drops_or_starts_without():
    plain = GradientHook("none", PowerSGDOptions(), [])
    assert plain.load_state_dict(_saved(2)[0], 2, world_size=2, step=8) == (
        "strategy.compression was powersgd rank 2, now none: the checkpoint's PowerSGD state (error feedback, "
        "warm-start factors) is dropped")
    hook = _powersgd()
    said = hook.load_state_dict(plain.state_dict(), 2, world_size=2, step=8)
    assert said == ("strategy.compression was none, now powersgd rank 2: PowerSGD goes on from step 9 with no error "
                    "feedback and fresh factors")
    assert hook.powersgd.iter == 8 and not hook.pending
    later = _powersgd(start_step=20)  # still in its warm-up: nothing of PowerSGD's to reset
    assert later.load_state_dict(plain.state_dict(), 2, world_size=2, step=8) == (
        "strategy.compression was none, now powersgd rank 2")


def test_horovods_compressor_counts_what_it_hands_to_the_all_reduce():
    hvd = pytest.importorskip("horovod.torch")
    from framework.strategies.horovod import CountedCompression

    traffic = Traffic("fp16")
    compressed, context = CountedCompression(hvd.Compression.fp16, traffic).compress(torch.ones(10))
    assert compressed.dtype == torch.float16 and (traffic.sent, traffic.uncompressed) == (20, 40)


@pytest.mark.parametrize("engine,instead", [("ddp", "none or fp16"), ("fsdp", "none")])
def test_a_bf16_reduce_on_gpus_without_bf16_is_refused_by_the_engine_that_allows_it(tmp_path, monkeypatch, engine,
                                                                                    instead):
    """The check lives with the options that allow bf16 (ddp's and fsdp's validate), not in their shared base."""
    cuda_reported(monkeypatch, 2, bf16=False)
    args = [f"strategy={engine}", "strategy.nproc_per_node=2", "trainer.accelerator=gpu", "strategy.compression=bf16",
            *ADAM]
    assert driver_says(args, tmp_path / "v100") == (
        "strategy.compression=bf16 is not allowed on these GPUs: gradients reduced in bf16 need GPUs with bf16 "
        f"(torch.cuda.is_bf16_supported) and NCCL >= 2.10; use strategy.compression={instead}")
    cuda_reported(monkeypatch, 2, bf16=True)
    assert driver_says(args, tmp_path / "h100") == ""
