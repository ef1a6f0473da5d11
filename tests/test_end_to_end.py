"""train.py as a user runs it: real processes, real gloo process groups, real TensorBoard files."""
import json

import pytest

from conftest import TINY, check_ok, read_scalars, run_dirs, run_train


def _lenet_parameters() -> int:
    from framework.models.lenet import LeNet

    return sum(p.numel() for p in LeNet((1, 28, 28), 10).parameters())


def _decreasing(series):
    values = [v for _, v in series]
    return values[-1] < values[0]


@pytest.mark.parametrize("strategy,ranks", [("single", 1), ("dp", 1), ("ddp", 2)])
def test_strategy_trains_and_logs_per_rank_metrics(tmp_path, strategy, ranks):
    out = check_ok(run_train([f"strategy={strategy}", "model=lenet", *TINY], tmp_path))
    [run_dir] = run_dirs(tmp_path)
    assert run_dir.name.endswith(f"_{strategy}_lenet")
    scalars = read_scalars(run_dir)
    for r in range(ranks):
        rates = scalars[f"throughput/samples_per_sec/rank{r}"]
        assert rates and all(v > 0 for _, v in rates)
        assert _decreasing(scalars[f"loss/train/rank{r}"])
    assert f"throughput/samples_per_sec/rank{ranks}" not in scalars
    # the default optimizer, SGD with momentum: one fp32 momentum buffer per parameter, replicated per rank
    momentum_state_mib = 4 * _lenet_parameters() / 2**20
    for r in range(ranks):
        for _, mib in scalars[f"memory/optimizer_state_mib/rank{r}"]:
            assert momentum_state_mib <= mib < momentum_state_mib * 1.01
    assert _decreasing(scalars["loss/train"])
    assert {"loss/val", "acc/val", "time/step_ms", "time/data_ms", "lr", "throughput/samples_per_sec"} <= set(scalars)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["processes"] == ranks and len(result["per_rank_samples_per_sec"]) == ranks
    assert result["test_acc"] > 0.5  # 10 classes: chance is 0.1
    assert "done: test accuracy" in out and str(run_dir) in out
    if strategy == "dp":
        assert out.count("nn.DataParallel runs the model on the CPU") == 1


def test_ddp_progress_lines_come_from_rank_0_only(tmp_path):
    out = check_ok(run_train(["strategy=ddp", "strategy.nproc_per_node=2", *TINY, "trainer.epochs=1"], tmp_path))
    assert out.count("training LeNet") == 1
    assert out.count("test accuracy") == 2  # the epoch line and the final line, once each


def test_hparams_are_written_for_the_hparams_tab(tmp_path):
    check_ok(run_train(["strategy=single", *TINY, "trainer.epochs=1"], tmp_path))
    [run_dir] = run_dirs(tmp_path)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert session.hparams["strategy"].string_value == "single"
    assert session.hparams["global_batch"].number_value == 64
    assert "hparam/test_acc" in acc.Tags()["scalars"]
