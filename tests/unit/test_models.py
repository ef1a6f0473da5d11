import pytest
import torch
from omegaconf import OmegaConf

from framework.common.errors import ConfigError
from framework.common.paths import CONF_DIR
from framework.models.build import build_model

SHAPES = {"fashion_mnist": (1, 28, 28), "cifar10": (3, 32, 32)}


@pytest.mark.parametrize("model", ["lenet", "simple_cnn", "cifar_net", "resnet18", "alexnet", "linear"])
@pytest.mark.parametrize("dataset", list(SHAPES))
def test_every_model_takes_shape_and_classes_from_the_dataset(model, dataset):
    cfg = OmegaConf.load(CONF_DIR / "model" / f"{model}.yaml")
    net = build_model(cfg, SHAPES[dataset], 7).eval()
    with torch.no_grad():
        out = net(torch.randn(2, *SHAPES[dataset]))
    assert out.shape == (2, 7)


def test_lenet_is_the_d2l_layout():
    cfg = OmegaConf.load(CONF_DIR / "model" / "lenet.yaml")
    net = build_model(cfg, (1, 28, 28), 10)
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    fcs = [m for m in net.modules() if isinstance(m, torch.nn.Linear)]
    assert [(c.in_channels, c.out_channels, c.kernel_size) for c in convs] == [(1, 20, (3, 3)), (20, 50, (5, 5))]
    assert [(f.in_features, f.out_features) for f in fcs] == [(800, 128), (128, 10)]


def test_image_model_on_flat_features_is_a_clear_error():
    cfg = OmegaConf.load(CONF_DIR / "model" / "lenet.yaml")
    with pytest.raises(ConfigError, match=r"model=lenet needs image input"):
        build_model(cfg, (5,), 2)


def test_too_small_input_is_caught_on_the_meta_device():
    cfg = OmegaConf.load(CONF_DIR / "model" / "cifar_net.yaml")
    with pytest.raises(ConfigError, match=r"model=cifar_net cannot take the dataset's input shape \(1, 8, 8\)"):
        build_model(cfg, (1, 8, 8), 10)
