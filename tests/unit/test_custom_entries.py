"""A newcomer's own model, loss and data from the command line (docs/your-own-code.md, "From the command line"):
pytorch/examples' MNIST `Net` with NLLLoss and the DDP tutorial's `MyTrainDataset` (tests/support/user_code/),
typed as a newcomer types them. The first tries, merged into a built-in entry, are refused with where the foreign
keys came from and the overrides that leave them out; those overrides pass the driver; the tutorial's commands
train in this process. The MNIST Net under ddp as a real run: tests/runs/test_newcomer_commands.py."""
import json
import shlex

import pytest

from framework.config.hydra_versions import VERSION
from support.driver import command_in_process, driver_says
from support.processes import USER_CODE
from support.run_files import run_dirs

NET = ["model._target_=mnist_example.Net"]
NLL = "loss._target_=torch.nn.NLLLoss"
TUTORIAL_MODEL = ["model=custom", "model._target_=torch.nn.Linear", "model.in_features=20", "model.out_features=1",
                  "loss=mse", "metrics=regression", "trainer.objective=loss"]
TRAIN_SPLIT = "dataset.train={_target_: ddp_tutorial_data.MyTrainDataset, size: 2048}"
TEST_SPLIT = "dataset.test={_target_: ddp_tutorial_data.MyTrainDataset, size: 256}"
ONE_DATASET = ["dataset._target_=ddp_tutorial_data.MyTrainDataset", "dataset.size=2048", "dataset.val_fraction=0.1"]
QUICK = ["strategy=single", "trainer.epochs=1", "trainer.batch_size=64"]
NLL_TAKES = "weight, size_average, ignore_index, reduce, reduction"

# a newcomer's first try -> (the one line, the overrides it says leave the foreign keys out, or None)
FIRST_TRIES = {
    "nll_loss_in_cross_entropys_entry": (
        [*NET, NLL],
        "loss key label_smoothing comes from loss=cross_entropy (conf/loss/cross_entropy.yaml), and torch.nn.NLLLoss "
        f"does not take it (it takes: {NLL_TAKES}); leave that entry's keys out: loss=custom {NLL}",
        ["loss=custom", NLL]),
    "splits_in_fashion_mnists_entry": (
        [*TUTORIAL_MODEL, TRAIN_SPLIT, TEST_SPLIT],
        "dataset.train keys kind, train, root, download and download_dir come from dataset=fashion_mnist "
        "(conf/dataset/fashion_mnist.yaml), and ddp_tutorial_data.MyTrainDataset does not take them (it takes: "
        "size); leave that entry's keys out: dataset=custom " + " ".join(map(shlex.quote, [TRAIN_SPLIT, TEST_SPLIT])),
        ["dataset=custom", TRAIN_SPLIT, TEST_SPLIT]),
    "one_dataset_beside_fashion_mnists_splits": (
        [*TUTORIAL_MODEL, *ONE_DATASET],
        "dataset._target_ is not allowed beside dataset.train and dataset.test: name either one Dataset (with "
        "val_fraction) or the two splits; dataset.train comes from dataset=fashion_mnist "
        "(conf/dataset/fashion_mnist.yaml); leave that entry's keys out: dataset=custom " + " ".join(ONE_DATASET),
        ["dataset=custom", *ONE_DATASET]),
    "one_dataset_in_fashion_mnists_entry": (
        [*TUTORIAL_MODEL, "~dataset.train", "~dataset.test", *ONE_DATASET],
        "dataset keys root, download and download_dir come from dataset=fashion_mnist "
        "(conf/dataset/fashion_mnist.yaml), and ddp_tutorial_data.MyTrainDataset does not take them (it takes: size); "
        "leave that entry's keys out: dataset=custom " + " ".join(ONE_DATASET),
        ["dataset=custom", *ONE_DATASET]),
    "splits_taken_out_of_fashion_mnists_entry": (
        [*TUTORIAL_MODEL, "~dataset.train", "~dataset.test"],
        "dataset key root comes from dataset=fashion_mnist (conf/dataset/fashion_mnist.yaml), and none of the "
        "components named now uses it; leave that entry's keys out: dataset=custom",
        None),
    "own_key_on_the_command_line": (
        [*NET, "loss=custom", NLL, "+loss.smoothing=0.1"],
        "loss key smoothing comes from the command line (+loss.smoothing=0.1), and torch.nn.NLLLoss does not take it "
        f"(it takes: {NLL_TAKES}); drop that override",
        None),
    "interpolated_key_deleted": (
        [*TUTORIAL_MODEL, "~dataset.download"],
        "dataset.train.download is ${dataset.download}, and the config has no dataset.download; dataset.train.download "
        "comes from dataset=fashion_mnist (conf/dataset/fashion_mnist.yaml); leave that entry's keys out: "
        "dataset=custom",
        None),
    "null_key_deleted": (
        [*TUTORIAL_MODEL, "~dataset.root"],
        # Hydra 1.3 takes a key whose value is null for one that is not there; 1.4 deletes it
        "Could not delete from config. 'dataset.root' does not exist. (Hydra says that of a key whose value is null "
        "too; a dataset with none of the chosen entry's keys starts from dataset=custom: docs/your-own-code.md)"
        if VERSION < (1, 4) else
        "dataset.train.root is ${dataset.root}, and the config has no dataset.root; dataset.train.root comes from "
        "dataset=fashion_mnist (conf/dataset/fashion_mnist.yaml); leave that entry's keys out: dataset=custom",
        None),
    "custom_entry_with_no_class": (
        ["model=custom"],
        "model._target_ is not set: name the class (or function) to build, e.g. model._target_=mypkg.MyClass",
        None),
}


@pytest.fixture
def user_code(monkeypatch):
    """tests/support/user_code importable, as a run has it on PYTHONPATH."""
    monkeypatch.syspath_prepend(str(USER_CODE))
    monkeypatch.chdir(USER_CODE.parents[2])  # entries' files are named relative to here: conf/loss/...


@pytest.mark.parametrize("name", list(FIRST_TRIES))
def test_a_first_try_says_where_the_key_came_from_and_what_leaves_it_out(user_code, tmp_path, name):
    overrides, line, _ = FIRST_TRIES[name]
    assert driver_says(overrides, tmp_path) == line


@pytest.mark.parametrize("name", [n for n, (_, _, fix) in FIRST_TRIES.items() if fix])
def test_the_overrides_the_line_suggests_pass_the_driver(user_code, tmp_path, name):
    """The suggestion read from the line itself, in place of the first try's overrides of that group."""
    overrides, _, fix = FIRST_TRIES[name]
    said = driver_says(overrides, tmp_path)
    suggested = shlex.split(said.split("leave that entry's keys out: ", 1)[1])
    assert suggested == fix
    group = fix[0].split("=")[0]
    kept = [o for o in overrides if not o.lstrip("~+").startswith(group)]
    assert driver_says([*kept, *suggested], tmp_path) == ""


def test_a_key_an_experiment_sets_is_said_to_come_from_its_file(user_code, tmp_path):
    """A preset of the global package (experiment=...) sets keys of any group: the line names its file."""
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    preset = tmp_path / "conf" / "experiment" / "smooth.yaml"
    preset.write_text("# @package _global_\nloss:\n  label_smoothing: 0.1\n")
    line = driver_says(["experiment=smooth", *NET, "loss=custom", NLL], tmp_path / "run",
                       config_dir=tmp_path / "conf")
    assert line == (f"loss key label_smoothing comes from experiment=smooth ({preset}), and torch.nn.NLLLoss does "
                    f"not take it (it takes: {NLL_TAKES}); leave it out of that file")


def test_a_custom_entry_takes_its_arguments_without_a_plus(user_code, tmp_path):
    """model.in_features=20 on model=custom: the entry is open (framework/config/custom_entry.py), as dataset is."""
    assert driver_says([*TUTORIAL_MODEL, "dataset=custom", TRAIN_SPLIT, TEST_SPLIT], tmp_path) == ""


@pytest.mark.parametrize("data", [[TRAIN_SPLIT, TEST_SPLIT], ONE_DATASET], ids=["two_splits", "val_fraction"])
def test_the_ddp_tutorials_dataset_trains_from_the_command_line(user_code, tmp_path, monkeypatch, capsys, data):
    """python train.py as the newcomer types it, in this process (strategy=single trains here)."""
    argv = ["train.py", "dataset=custom", *data, *TUTORIAL_MODEL, *QUICK]
    code, out, err = command_in_process("main", argv, tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert "training Linear on MyTrainDataset" in out and "done: test mse" in out
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["steps"] == 32 if data[1] == TEST_SPLIT else 29  # 2048 samples, or 90% of them, in batches of 64


@pytest.mark.parametrize("overrides,key", [
    (["model=custom", "model._target_=mypkg.Nope"], "model._target_=mypkg.Nope"),
    (["model._target_=torchvision.models.nosuch"], "model._target_=torchvision.models.nosuch"),
    (["strategy=ddp", "strategy._target_=mypkg.Nope"], "strategy._target_=mypkg.Nope"),
])
def test_a_target_that_does_not_import_is_said_in_one_line(tmp_path, monkeypatch, capsys, overrides, key):
    """Hydra's name lookups log an ERROR (three lines) before they raise: the driver's printed them above its line."""
    code, out, err = command_in_process("main", ["train.py", *overrides], tmp_path, monkeypatch, capsys)
    lines = f"{out}{err}".splitlines()
    assert code == 2 and len(lines) == 1, out + err
    assert lines[0].startswith(f"error: {key} is not allowed: it cannot be imported ("), lines
