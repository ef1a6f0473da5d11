"""train.py as a user runs it: real processes, real gloo process groups, real TensorBoard files. The three runs here
(TINY: 2 epochs of 2,048 Fashion-MNIST images) are shared with other tests through the run cache; README's first
command runs as written, the one run of the suite with no accelerator pinned."""
import json
import os
import re
import shlex
import subprocess
import sys

import pytest
import torch
import yaml

from support.processes import (EVAL, REPO, TINY, TRAIN, check_ok, command_of, pin_accelerator,
                               processes_tagged, run_in_own_session)
from support.run_files import read_scalars, run_dirs


def _lenet_parameters() -> int:
    from framework.models.lenet import LeNet

    return sum(p.numel() for p in LeNet((1, 28, 28), 10).parameters())


def _decreasing(series):
    values = [v for _, v in series]
    return values[-1] < values[0]


def tiny(runs, strategy: str):
    return runs.train([f"strategy={strategy}", *TINY]).ok()


@pytest.mark.core
@pytest.mark.parametrize("strategy,ranks", [("single", 1), ("dp", 1), ("ddp", 2)])
def test_strategy_trains_and_logs_per_rank_metrics(runs, strategy, ranks):
    run = tiny(runs, strategy)
    run_dir, out = run.run_dir, run.stdout
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
    result = run.result()
    assert result["processes"] == ranks and len(result["per_rank_samples_per_sec"]) == ranks
    assert result["test_acc"] > 0.5  # 10 classes: chance is 0.1
    assert "done: test accuracy" in out and str(run_dir) in out
    if strategy == "dp":
        assert out.count("nn.DataParallel runs the model on the CPU") == 1


@pytest.mark.core
def test_ddp_progress_lines_come_from_rank_0_only(runs):
    out = tiny(runs, "ddp").stdout
    assert out.count("training LeNet") == 1
    assert out.count("test accuracy") == 3  # each epoch's line (2 epochs) and the final line, once each


def test_eval_py_under_ddp_leaves_no_process_behind(runs, tmp_path):
    """eval.py's workers' template (started by ddp's starter) is stopped before the command ends: it outlived it by
    about 1.5 s, unloading torch (checked). The run read is the one above."""
    temp = runs.root / "temp_folder_of_a_ddp_run"
    temp.mkdir(exist_ok=True)
    run = runs.train(["strategy=ddp", "trainer.max_steps=2", "dataset.max_train_samples=256",
                      "dataset.max_test_samples=64"], env={"TMPDIR": str(temp)}).ok()
    tag = f"eval-{os.getpid()}-{tmp_path.name}"
    # its output in files: a pipe's reader would wait for every process holding it, the template too
    with (tmp_path / "eval.out").open("w") as out, (tmp_path / "eval.err").open("w") as err:
        proc = subprocess.Popen([sys.executable, str(EVAL), *pin_accelerator([f"ckpt_path={run.run_dir}",
                                                                              "strategy=ddp"])],
                                cwd=tmp_path, stdout=out, stderr=err,
                                env={**os.environ, "HYDRA_DIST_TEST_TAG": tag, "PYTHONUNBUFFERED": "1"})
        assert proc.wait(timeout=240) == 0, (tmp_path / "eval.err").read_text()
    left = processes_tagged(tag)
    assert not left, [command_of(pid) for pid in left]


@pytest.mark.core
def test_hparams_are_written_for_the_hparams_tab(runs):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(tiny(runs, "single").run_dir))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"]).session_start_info
    assert session.hparams["strategy"].string_value == "single"
    assert session.hparams["global_batch"].number_value == 64
    assert "hparam/test_acc" in acc.Tags()["scalars"]


def readme_first_command() -> list[str]:
    """The words of the command under README.md's "The first run"."""
    section = (REPO / "README.md").read_text().split("\n## The first run\n", 1)[1]
    [line] = section.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    return shlex.split(line)


@pytest.mark.core
def test_readmes_first_command_chooses_for_this_machine_and_trains(tmp_path):
    """A run of its own: README's first command as a user types it, started by neither run_train nor the run cache,
    which pin the accelerator (support.processes.pin_accelerator), so trainer.accelerator=auto and strategy=auto choose
    for this machine: one process on the CPU here, as README says (ddp over the GPUs where several are visible).
    `.venv/bin/python` is this interpreter."""
    words = readme_first_command()
    assert words[:2] == [".venv/bin/python", "train.py"], words
    assert not [w for w in words if w.startswith(("trainer.accelerator=", "strategy="))], "nothing chosen for it"
    out = check_ok(run_in_own_session([sys.executable, str(TRAIN), *words[2:]], tmp_path,
                                      {**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=300))
    gpus = torch.cuda.device_count()
    chosen, processes = ("ddp", gpus) if gpus > 1 else ("single", 1)
    device = "cuda" if gpus else "cpu"
    said = "several GPUs/workers" if gpus > 1 else "at most one GPU"
    assert f"strategy=auto chose {chosen} ({said})\n" in out, out
    assert re.search(rf"^training LeNet on fashion_mnist with strategy={chosen}: {processes} process\(es\) on "
                     rf"{device}, global batch 128 = .*, 16 steps$", out, re.M), out
    assert re.search(r"^done: test accuracy 0\.\d{4} \| .* run folder .*_auto_lenet$", out, re.M), out
    [run_dir] = run_dirs(tmp_path)
    assert yaml.safe_load((run_dir / ".hydra" / "overrides.yaml").read_text()) == words[2:], "README's, nothing added"
    assert yaml.safe_load((run_dir / "resolved_config.yaml").read_text())["trainer"]["accelerator"] == "auto"
    result = json.loads((run_dir / "result.json").read_text())
    assert (result["strategy"], result["processes"], result["steps"], result["device"]) == (chosen, processes, 16,
                                                                                             device)
