"""conf/experiment/: one preset per seed tutorial, composed by Hydra in this process: the tutorials' settings, every
preset in the matrix of tests/runs/test_experiments.py (which trains each with every strategy it claims), and the
presets whose data is not on this machine refused with the missing-data message."""
import pytest

from support.driver import composed, driver_says
from support.presets import SMALL_RUNS
from support.processes import REPO


def test_presets_compose_to_the_tutorials_settings():
    dp = composed("experiment=dp_tutorial")
    assert dp.model._target_.endswith("LinearModel") and dp.model.print_sizes
    assert (dp.dataset.name, list(dp.dataset.shape), dp.dataset.num_classes, dp.dataset.train_size) == ("synthetic", [5], 2, 100)
    assert (dp.strategy.name, dp.trainer.batch_size) == ("dp", 30)

    d2l = composed("experiment=d2l_lenet_data_parallel")
    assert d2l.model._target_.endswith("LeNet") and d2l.dataset.name == "fashion_mnist"
    assert (d2l.strategy.name, d2l.trainer.batch_size, d2l.optimizer.lr, d2l.trainer.epochs) == ("ddp", 256, 0.2, 10)

    mnist = composed("experiment=simple_cnn_mnist")
    assert mnist.model._target_.endswith("SimpleCNN") and (mnist.dataset.name, mnist.strategy.name) == ("mnist", "ddp")

    cifar = composed("experiment=cifar_net")
    assert cifar.model._target_.endswith("CifarNet") and cifar.dataset.name == "cifar10"
    assert (cifar.trainer.batch_size, cifar.optimizer.lr, cifar.optimizer.momentum) == (4, 0.001, 0.9)

    sweep = composed("experiment=compare_strategies", hydra=True)
    assert sweep.hydra.sweeper.params.strategy.split(",") == ["single", "dp", "ddp", "fsdp"]


def test_every_preset_with_a_strategies_line_is_in_the_matrix():
    presets = {p.stem for p in (REPO / "conf" / "experiment").glob("*.yaml")} - {"compare_strategies"}
    assert presets == set(SMALL_RUNS)


@pytest.mark.parametrize("preset,dataset", [("simple_cnn_mnist", "mnist"), ("cifar_net", "cifar10")])
def test_presets_without_local_data_stop_with_the_missing_data_message(tmp_path, monkeypatch, preset, dataset):
    monkeypatch.setenv("HYDRA_DIST_DATA", str(tmp_path))
    line = driver_says([f"experiment={preset}", "dataset.download=false", f"dataset.download_dir={tmp_path}"],
                       tmp_path)
    assert f"dataset={dataset}: no usable files found" in line, line
    assert "dataset.download=false" in line
