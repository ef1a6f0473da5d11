"""Per-GPU metrics that tell GPUs apart: busy vs wait time measured on each rank, FLOPs and MFU, the straggler
line, and the one-chart-per-metric layout. Real ddp runs on 2 gloo workers, event files read back with
TensorBoard's reader; a real fault (tests/support/faults/fault_injection.py: slow_rank) makes rank 1 the slow
GPU."""
import re

import pytest
import torch

from framework.models.lenet import LeNet
from framework.telemetry.flops import training_flops_per_sample
from framework.telemetry.gpu_peaks import gpu_model
from support.marks import needs_gpu, needs_gpus
from support.processes import TINY, check_ok, run_train
from support.run_files import read_scalars, run_dirs

SLOW_SECONDS = 0.2
# 24 steps of 2 x 32 samples, logged every 8: three intervals, each averaging 8 steps; a straggler is named once it
# persisted for trainer.straggler_intervals=2 of them (so at the second and the third)
RUN = ["strategy=ddp", "strategy.nproc_per_node=2", "model=lenet", *TINY, "trainer.max_steps=24",
       "trainer.log_every_n_steps=8"]


def _per_rank(scalars, tag, ranks=2):
    return [[v for _, v in scalars[f"{tag}/rank{r}"]] for r in range(ranks)]


@pytest.fixture(scope="module")
def slowed(runs):
    run = runs.train(RUN, faults=f"slow_rank:{SLOW_SECONDS}:1").ok()
    return run.stdout, run.run_dir, read_scalars(run.run_dir)


def test_the_slowed_rank_is_busier_its_peer_waits_and_the_straggler_line_names_it(slowed):
    out, _, scalars = slowed
    busy0, busy1 = _per_rank(scalars, "time/busy_ms")
    wait0, wait1 = _per_rank(scalars, "time/wait_ms")
    assert len(busy0) == len(busy1) == 3
    for b0, b1, w0, w1 in zip(busy0, busy1, wait0, wait1):
        assert b1 > 2 * b0, f"busy ms/step: rank 0 {busy0}, rank 1 {busy1}"
        assert w0 > 2 * w1, f"wait ms/step: rank 0 {wait0}, rank 1 {wait1}"
        assert b1 >= 0.8 * SLOW_SECONDS * 1000  # the sleep is rank 1's own work
    # lock-step: busy + wait is the step time, the same on both ranks (the second interval: the first one also
    # holds each rank's own start-up)
    assert busy0[-1] + wait0[-1] == pytest.approx(busy1[-1] + wait1[-1], rel=0.1)
    rate0, rate1 = _per_rank(scalars, "throughput/device/samples_per_busy_sec")
    assert all(r0 > 2 * r1 for r0, r1 in zip(rate0, rate1))
    ratios = [v for _, v in scalars["stragglers/busy_ratio/rank1"]]
    assert [step for step, _ in scalars["stragglers/busy_ratio/rank1"]] == [16, 24] and all(r > 1.5 for r in ratios)
    assert "stragglers/busy_ratio/rank0" not in scalars
    lines = [line for line in out.splitlines() if line.startswith("straggler at step")]
    assert len(lines) == 2
    assert all(re.search(r"rank 1 on \S+ \(cpu\) was busy [\d.]+ ms/step, [\d.]+x the median .*"
                         r"\d log intervals in a row", line) for line in lines)


def test_tflops_per_rank_come_from_the_counted_flops_and_cpus_get_no_mfu(slowed):
    out, _, scalars = slowed
    lenet = training_flops_per_sample(LeNet((1, 28, 28), 10), (1, 28, 28), 32)
    for r in range(2):
        tflops = [v for _, v in scalars[f"throughput/device/tflops/rank{r}"]]
        rates = [v for _, v in scalars[f"throughput/samples_per_sec/rank{r}"]]
        assert all(t > 0 for t in tflops)
        for t, rate in zip(tflops, rates):  # the same wall time: FLOP/s = FLOPs per sample x samples/s
            assert t == pytest.approx(lenet * rate / 1e12, rel=1e-3)
    assert not [tag for tag in scalars if tag.startswith("throughput/device/mfu/")]
    assert out.count("TFLOP/s without MFU: CPUs have no peak") == 1
    assert "13.26 MFLOP per training sample" in out


def test_one_multiline_chart_per_metric_is_read_back_from_the_event_file(slowed):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2

    _, run_dir, scalars = slowed
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    assert "custom_scalars__config__" in acc.PluginTagToContent("custom_scalars")
    [config] = acc.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(config.tensor_proto.string_val[0])
    charts = {chart.title: list(chart.multiline.tag) for category in layout.category for chart in category.chart}
    busy = charts["busy ms per step per rank"]
    assert len(busy) == 1
    matched = sorted(tag for tag in scalars if re.search(busy[0], tag))
    assert matched == ["time/busy_ms/rank0", "time/busy_ms/rank1"]  # one chart, one line per rank
    for title in ("samples/s per rank", "wait ms per step per rank (blocked on the others)", "TFLOP/s per rank",
                  "MFU per rank", "peak allocated GiB per rank (interval)"):
        assert title in charts
    rate_regex = charts["samples/s per rank"][0]
    assert sorted(t for t in scalars if re.search(rate_regex, t)) == ["throughput/samples_per_sec/rank0",
                                                                    "throughput/samples_per_sec/rank1"]


@pytest.mark.parametrize("strategy", [["strategy=horovod"], ["strategy=deepspeed", "strategy.zero_stage=1"]],
                         ids=["horovod", "deepspeed-zero1"])
def test_horovod_and_deepspeed_also_tell_the_slowed_rank_from_the_one_waiting(runs, strategy):
    # Horovod all-reduces behind optimizer.synchronize(), DeepSpeed inside its engine's backward: the wait runs from
    # the rank's last gradient until the engine hands the averaged gradients back
    run_dir = runs.train([*strategy, *RUN[2:]], faults=f"slow_rank:{SLOW_SECONDS}:1").ok().run_dir
    scalars = read_scalars(run_dir)
    busy0, busy1 = _per_rank(scalars, "time/busy_ms")
    wait0, wait1 = _per_rank(scalars, "time/wait_ms")
    assert len(busy0) == len(busy1) == 3
    for b0, b1, w0, w1 in zip(busy0, busy1, wait0, wait1):
        assert b1 > 2 * b0 and w0 > 2 * w1, f"busy {busy0} {busy1}, wait {wait0} {wait1}"
    log = (run_dir / "train.log").read_text()  # horovodrun prefixes the workers' console lines
    assert len(re.findall(r"straggler at step \d+: rank 1 on \S+ \(cpu\)", log)) == 2, log


def test_dp_times_its_replicas_forward_and_backward_and_one_replica_waits_for_none(runs):
    # under dp the slow_rank fault slows the replica's own forward: it shows there, not as time outside the replica
    run_dir = runs.train(["strategy=dp", "model=lenet", *TINY, "trainer.max_steps=16", "trainer.log_every_n_steps=8",
                          "trainer.grad_accum=2"], faults="slow_rank:0.03:0").ok().run_dir
    scalars = read_scalars(run_dir)
    step_ms = [v for _, v in scalars["time/step_ms"]]
    forward, backward = [[v for _, v in scalars[f"time/{phase}_ms/rank0"]] for phase in ("forward", "backward")]
    busy, wait = [[v for _, v in scalars[f"time/{kind}_ms/rank0"]] for kind in ("busy", "wait")]
    assert len(forward) == len(backward) == len(step_ms) == 2
    assert wait == [0.0, 0.0]  # measured: one replica never waits for another
    assert busy == pytest.approx(step_ms)
    for f, b, total in zip(forward, backward, step_ms):
        assert 2 * 30 <= f < total and 0 < b < total - 60 and f + b < total  # data and the optimizer are the rest
    assert "time/forward_ms/rank1" not in scalars


@needs_gpu
def test_busy_wait_tflops_and_mfu_on_one_gpu(tmp_path):
    check_ok(run_train(["strategy=ddp", "strategy.nproc_per_node=1", "trainer.accelerator=gpu", *TINY,
                        "trainer.max_steps=8"], tmp_path))
    [run_dir] = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    assert all(v > 0 for _, v in scalars["time/busy_ms/rank0"])
    assert all(v >= 0 for _, v in scalars["time/wait_ms/rank0"])
    assert all(v > 0 for _, v in scalars["throughput/device/tflops/rank0"])
    known = gpu_model(torch.cuda.get_device_name(0)) is not None
    assert ("throughput/device/mfu/rank0" in scalars) == known


@needs_gpu
def test_dp_replica_times_on_the_gpu_come_from_cuda_events(tmp_path):
    """One GPU: nn.DataParallel does not replicate, so the user's own parameters carry the backward hook (removed
    again every step); forward and backward are read from CUDA events on the replica's stream."""
    precision = "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16"  # the replica's autocast
    check_ok(run_train(["strategy=dp", "strategy.device_ids=[0]", "trainer.accelerator=gpu", *TINY,
                        "trainer.max_steps=16", "trainer.log_every_n_steps=8", f"trainer.precision={precision}"],
                       tmp_path))
    [run_dir] = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    step_ms = [v for _, v in scalars["time/step_ms"]]
    forward, backward = [[v for _, v in scalars[f"time/{phase}_ms/rank0"]] for phase in ("forward", "backward")]
    assert [v for _, v in scalars["time/wait_ms/rank0"]] == [0.0, 0.0]
    for f, b, total in zip(forward, backward, step_ms):
        assert 0 < f and 0 < b and f + b < total


@needs_gpus(2)
def test_dp_on_several_gpus_times_every_replica_and_names_the_slowed_one(tmp_path):
    gpus = torch.cuda.device_count()
    out = check_ok(run_train(["strategy=dp", "trainer.accelerator=gpu", *TINY, "trainer.batch_size=256",
                              "trainer.max_steps=16", "trainer.log_every_n_steps=8", "trainer.straggler_intervals=1"],
                             tmp_path,
                             faults="slow_rank:0.05:1"))
    [run_dir] = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    step_ms = [v for _, v in scalars["time/step_ms"]]
    times = {(kind, r): [v for _, v in scalars[f"time/{kind}_ms/rank{r}"]]
             for kind in ("forward", "backward", "wait") for r in range(gpus)}
    for r in range(gpus):
        for f, b, w, total in zip(times["forward", r], times["backward", r], times["wait", r], step_ms):
            assert f > 0 and b > 0 and w >= 0 and f + b + w <= total * 1.05
    assert f"time/forward_ms/rank{gpus}" not in scalars
    # replica 1 idles 50 ms inside its forward on its GPU; replica 0 waits that long for it
    assert all(f1 >= 45 for f1 in times["forward", 1])
    assert all(w0 > w1 + 40 for w0, w1 in zip(times["wait", 0], times["wait", 1]))
    lines = [line for line in out.splitlines() if line.startswith("straggler at step")]
    assert len(lines) == 2 and all("rank 1 on " in line and "(cuda:" in line for line in lines), out
