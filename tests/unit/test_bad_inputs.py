"""Bad values fail in the driver, before any worker starts, with one short message naming key, value and what is
allowed. Every case goes through the driver's own composition, typing and checks in this process
(support.driver.driver_says); tests/runs/test_refusals.py runs some as real `python train.py` commands, for what only
a process shows (exit code 2, the one `error:` line with no traceback, no worker started), and the case that needs
the run folder of another model."""
import pytest

from support.bad_inputs import CASES, corrupt_copy_of_fashion_mnist
from support.driver import driver_says
from support.processes import TINY

NEED_A_RUN = ("resume_other_model", "unwritable_output")  # tests/runs/test_refusals.py


@pytest.fixture(scope="module")
def placeholders(tmp_path_factory):
    """Real files the bad inputs point at: a dataset folder with a truncated file."""
    return {"corrupt_root": str(corrupt_copy_of_fashion_mnist(tmp_path_factory.mktemp("inputs") / "corrupt"))}


@pytest.mark.parametrize("name", [n for n in CASES if n not in NEED_A_RUN])
def test_bad_value_is_refused_by_the_driver(placeholders, tmp_path, name):
    args, expected = CASES[name]
    line = driver_says([a.format(**placeholders) for a in args], tmp_path)
    assert expected.format(**placeholders).removeprefix("error: ") in line, line


def test_a_good_run_passes_the_driver(tmp_path):
    assert driver_says(["trainer.epochs=1", "dataset.max_train_samples=256"], tmp_path) == ""


def test_a_torchvision_model_that_cannot_take_the_input_is_refused_with_one_line(tmp_path):
    line = driver_says(["model._target_=torchvision.models.mobilenet_v3_small", *TINY], tmp_path)
    assert line.startswith("model=torchvision.models.mobilenet_v3_small cannot take the dataset's batches (input: "
                           "float32 [2, 1, 28, 28]; target: int64 [2]): RuntimeError: "), line
