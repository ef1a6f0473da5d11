"""Per-GPU metrics' arithmetic in this process: the straggler rule, replica waits, dp replicas timing their backward,
FLOPs counted by hand, the GPUs' peaks, the wait clock, the slow_rank fault's parsing, a bad straggler threshold.
Real runs with one rank slowed: tests/runs/test_per_gpu_metrics.py."""
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from framework.config.trainer import TrainerConfig
from framework.models.lenet import LeNet
from framework.models.linear import LinearModel
from framework.telemetry.flops import training_flops_per_sample
from framework.telemetry.gpu_peaks import gpu_model, peak_tflops
from framework.telemetry.meters import IntervalSummary
from framework.telemetry.per_gpu import PerGpu, Slot
from support.driver import driver_says
from support.marks import needs_gpu
from support.processes import FAULTS, TINY


def _interval(busy_ms):
    n = len(busy_ms)
    return IntervalSummary(steps=8, samples=64.0 * n, seconds=1.0, loss=1.0, per_slot_samples_per_sec=[64.0] * n,
                           per_slot_loss=[1.0] * n, step_ms=50.0, per_slot_samples=[64.0] * n,
                           per_slot_busy_ms=list(busy_ms),
                           per_slot_wait_ms=[5.0] * n)


def _named(busy_series, trainer=None):
    """Which ranks the default straggler rule names at each log boundary of a series of busy ms per rank."""
    t = trainer or TrainerConfig()
    slots = [Slot("vm", "cpu", "cpu", None) for _ in busy_series[0]]
    per_gpu = PerGpu(slots, None, t.straggler_threshold, t.straggler_intervals, t.straggler_min_gap_ms)
    return [[s.rank for s in per_gpu.stragglers(_interval(busy))] for busy in busy_series]


def test_a_loaded_machine_s_passing_gaps_name_no_straggler_under_the_default_rule():
    """Unequal slices of busy cores make one rank slower for an interval now and then, which is no straggler: the
    default rule names one only when its gap persists (2 boundaries in a row) and is 10 ms/step or more. Checked on
    the rule itself: a process test with a CPU hog only races the machine."""
    # with 2 ranks the median is their mean: 40 vs 61 ms is 1.21x it, a gap of 10.5 ms
    noisy = [[40.0, 61.0], [61.0, 40.0], [40.0, 61.0], [10.0, 16.0], [10.0, 16.0]]  # alternating; then 3 ms gaps
    assert _named(noisy) == [[], [], [], [], []]
    persistent = [[40.0, 61.0], [40.0, 62.0], [40.0, 70.0], [40.0, 40.0]]
    assert _named(persistent) == [[], [1], [1], []]
    assert _named([[40.0, 61.0], [61.0, 40.0]], TrainerConfig(straggler_intervals=1)) == [[1], [0]]


def test_replica_waits_are_each_phases_slowest_replica_minus_its_own():
    from framework.telemetry.replica_clock import ReplicaClock, _Marks

    def marks(forward, backward):
        m = _Marks()
        m.forward_start, m.forward_end = 0.0, forward
        m.backward_start, m.backward_end = 10.0, 10.0 + backward
        return m

    def micro_batch(forwards, backwards):
        return {slot: marks(f, b) for slot, (f, b) in enumerate(zip(forwards, backwards))}

    unfinished = micro_batch([1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
    unfinished[2].backward_end = None  # its backward never ran
    cpu = torch.device("cpu")
    clock = ReplicaClock([cpu, cpu, cpu])
    clock.micro_batches = [
        micro_batch([2.0, 1.0, 1.0], [2.0, 2.0, 1.0]),
        micro_batch([1.0, 1.0, 1.0], [1.0, 1.0, 1.0]),
        micro_batch([1.0, 3.0], [1.0, 1.0]),  # a micro-batch smaller than the replicas: not counted
        unfinished,  # not counted
    ]
    # forward: slot 0 was the slowest (2 s), slots 1 and 2 waited 1 s; backward: slot 2 waited 1 s
    assert clock.read(3) == pytest.approx([0.0, 1.0, 2.0])
    assert clock.phases(3) == {"forward": pytest.approx([3.0, 2.0, 2.0]), "backward": pytest.approx([3.0, 3.0, 2.0])}
    # the micro-batch that ran on the first 2 replicas only, read as what a run of 2 slots has
    assert clock.read(2) == pytest.approx([2.0, 0.0]) and clock.phases(2)["forward"] == pytest.approx([1.0, 3.0])
    clock.reset()
    assert clock.read(3) == [0.0, 0.0, 0.0]


class _BroadcastLike(torch.autograd.Function):
    """What torch.nn.parallel's Broadcast is to autograd (it needs CUDA, so it is not callable here): one node whose
    outputs are every replica's copy of every parameter, and whose backward sums the replicas' gradients."""

    @staticmethod
    def forward(ctx, replicas, *params):
        ctx.count = len(params)
        return tuple(p.clone() for _ in range(replicas) for p in params)

    @staticmethod
    def backward(ctx, *grads):
        per_param = [sum(g for g in grads[i::ctx.count] if g is not None) for i in range(ctx.count)]
        return (None, *per_param)


def _replicas_as_data_parallel_builds_them(module: nn.Module, count: int) -> list[nn.Module]:
    """What torch.nn.parallel.replicate builds for each GPU: every module copied by _replicate_for_data_parallel
    (empty parameters()), each parameter a differentiable non-leaf copy out of one broadcast node, set as a plain
    attribute and listed in _former_parameters."""
    params = list(module.parameters())
    copies = _BroadcastLike.apply(count, *params)
    index = {p: i for i, p in enumerate(params)}
    replicas = []
    for r in range(count):
        modules = {m: m._replicate_for_data_parallel() for m in module.modules()}
        for original, replica in modules.items():
            replica._former_parameters = {}
            for key, child in original._modules.items():
                setattr(replica, key, modules[child])
            for key, param in original._parameters.items():
                replica._former_parameters[key] = copies[r * len(params) + index[param]]
                setattr(replica, key, replica._former_parameters[key])
        replicas.append(modules[module])
    return replicas


def test_data_parallel_replicas_time_their_backward_through_their_parameter_copies():
    from framework.telemetry.replica_clock import ReplicaClock, time_replicas

    model = LeNet((1, 28, 28), 10)
    clock = ReplicaClock([torch.device("cpu")] * 2)
    time_replicas(model, clock, replicated=True)  # nn.DataParallel's replicas carry the module's hooks
    for _ in range(2):
        clock.begin_micro_batch()
        replicas = _replicas_as_data_parallel_builds_them(model, 2)  # anew each forward, as nn.DataParallel does
        assert list(replicas[0].parameters()) == []  # what nn.DataParallel's replicas look like
        outputs = []
        for slot, replica in enumerate(replicas):
            clock.slot_of = lambda args, slot=slot: slot  # two "GPUs" that are both the CPU
            outputs.append(replica(torch.randn(4, 1, 28, 28)))
        torch.cat(outputs).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    seconds = clock.phase_seconds(2)
    assert len(seconds["backward"]) == 2  # both micro-batches complete: each replica's backward end was marked
    assert all(s > 0 for per_micro_batch in seconds.values() for row in per_micro_batch for s in row)


def _conv(c_in, c_out, k, out_hw):  # multiply-adds x 2 of one convolution's output
    return 2 * c_out * out_hw * out_hw * c_in * k * k


def test_lenet_training_flops_per_sample_equal_the_hand_count():
    # forward, then backward: weight gradient (same count) + input gradient (same count) except for the first
    # layer, whose input (the image) needs no gradient. Pooling, ReLU and bias adds are not matmul FLOPs.
    conv1 = _conv(1, 20, 3, 26)  # 28 -> 26, pool -> 13
    conv2 = _conv(20, 50, 5, 9)  # 13 -> 9, pool -> 4: 50 x 4 x 4 = 800 features
    fc1, fc2 = 2 * 800 * 128, 2 * 128 * 10
    expected = 2 * conv1 + 3 * (conv2 + fc1 + fc2)
    assert expected == 13_258_800
    assert training_flops_per_sample(LeNet((1, 28, 28), 10), (1, 28, 28), 32) == expected


def test_linear_model_training_flops_per_sample_equal_the_hand_count():
    # forward 2*784*10, backward only the weight gradient (the input needs none)
    assert training_flops_per_sample(LinearModel((1, 28, 28), 10), (1, 28, 28), 16) == 2 * (2 * 784 * 10)


def test_counting_flops_leaves_weights_grads_and_batchnorm_statistics_alone():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 26 * 26, 10))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert training_flops_per_sample(model, (1, 28, 28), 8) > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert all(p.device.type == "cpu" for p in model.parameters())


@pytest.mark.parametrize("name,model", [
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA A100 80GB PCIe", "A100"), ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H200", "H200"), ("NVIDIA L40S", "L40S"), ("NVIDIA B200", "B200"),
    ("NVIDIA H100 NVL", None), ("NVIDIA H200 NVL", None), ("NVIDIA L40", None), ("NVIDIA GeForce RTX 4090", None),
])
def test_gpus_are_matched_by_their_cuda_name_and_unknown_ones_get_no_peak(name, model):
    assert gpu_model(name) == model


def test_peaks_are_dense_and_follow_the_precision_actually_used():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == pytest.approx(989.4)  # 1,979 with sparsity
    assert peak_tflops("NVIDIA A100-SXM4-40GB", "fp16") == 312.0
    previous = (torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision(),
                torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = True  # torch's default
        assert peak_tflops("NVIDIA A100-SXM4-40GB", "fp32") == 19.5  # an MLP: fp32 matmuls
        assert peak_tflops("NVIDIA A100-SXM4-40GB", "fp32", convolutions=True) == 156.0  # cuDNN convs in TF32
        torch.backends.cudnn.allow_tf32 = False
        assert peak_tflops("NVIDIA A100-SXM4-40GB", "fp32", convolutions=True) == 19.5
        torch.set_float32_matmul_precision("high")  # TF32 matmuls allowed: the TF32 Tensor Core peak
        assert peak_tflops("NVIDIA A100-SXM4-40GB", "fp32") == 156.0
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous[0]
        torch.set_float32_matmul_precision(previous[1])
        torch.backends.cudnn.allow_tf32 = previous[2]


def test_slow_rank_fault_is_parsed_with_seconds_and_refuses_a_bad_value(monkeypatch):
    monkeypatch.syspath_prepend(str(FAULTS))
    from fault_injection import planned_faults

    assert planned_faults("slow_rank:0.05:1,kill_after_step:3:0") == [("slow_rank", 0.05, 1), ("kill_after_step", 3, 0)]
    with pytest.raises(ValueError, match="expected a number of seconds and a rank"):
        planned_faults("slow_rank:fast:1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # a restarted group runs clean
    assert planned_faults("slow_rank:0.05:1") == []


def test_wait_clock_counts_only_from_the_last_start_to_stop_and_resets(monkeypatch):
    """On a clock the test moves (the perf_counter the CPU clock reads): which intervals count, not how long the
    machine took to wake a sleeping thread."""
    from framework.telemetry import wait_clock

    now = [100.0]
    monkeypatch.setattr(wait_clock, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    clock = wait_clock.WaitClock(torch.device("cpu"))
    clock.start()
    now[0] += 0.5  # own work: a later start() (the next bucket) moves the mark past it
    clock.start()
    now[0] += 0.25
    clock.stop()
    now[0] += 1.0
    clock.stop()  # no start pending: nothing added
    with clock.blocking():
        now[0] += 0.125
    now[0] += 2.0  # after the block: not waiting
    assert clock.read() == 0.375
    clock.reset()
    assert clock.read() == 0.0


@needs_gpu
def test_wait_clock_on_a_gpu_times_the_stream_between_its_events():
    from framework.telemetry.wait_clock import WaitClock

    clock = WaitClock(torch.device("cuda", 0))
    a = torch.randn(2048, 2048, device="cuda")
    clock.start()
    for _ in range(20):
        a = a @ a / 2048
    clock.stop()
    torch.cuda.synchronize()
    assert clock.read() > 0


def test_straggler_threshold_must_be_a_number_above_one(tmp_path):
    line = driver_says(["strategy=single", "trainer.straggler_threshold=1", *TINY], tmp_path)
    assert "trainer.straggler_threshold=1.0 is not allowed: expected a number > 1" in line, line
