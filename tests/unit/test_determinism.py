"""trainer.deterministic in this process (framework/training/determinism.py): its bad values and conflicts refused in
one line, an op with no deterministic CPU kernel (max_unpool2d) failing a run with torch's message and the key's
line, warn only warning, the flags and the environment a GPU worker gets, and the DataLoader workers' seeds taken
from the run's seed and rank. Two real runs bitwise equal: tests/runs/test_determinism.py."""
import os

import pytest
import torch
from torch.utils.data import default_collate

from support.driver import command_in_process, driver_says
from support.fake_cuda import cuda_reported
from support.processes import USER_CODE

CPU = torch.device("cpu")
UNPOOLING = ["train.py", "model=custom", "model._target_=unpooling_model.Unpooling", "dataset=synthetic",
             "dataset.train_size=256", "dataset.test_size=64", "strategy=single", "trainer.epochs=1",
             "trainer.batch_size=64", "trainer.progress_bar=false", "trainer.keep_checkpoints=0"]
TORCH_SAYS = "max_unpooling2d_forward_out does not have a deterministic implementation"


@pytest.fixture
def torch_defaults_after(monkeypatch):
    """The process's deterministic mode, cuDNN's flags and CUBLAS_WORKSPACE_CONFIG as they were, after the test."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    yield
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2:]


@pytest.fixture
def user_code(monkeypatch):
    monkeypatch.syspath_prepend(str(USER_CODE))


@pytest.mark.parametrize("value, shown", [("maybe", "'maybe'"), ("1", "1")])
def test_a_bad_value_is_one_line_naming_the_key_and_what_is_allowed(tmp_path, value, shown):
    assert driver_says([f"trainer.deterministic={value}"], tmp_path) == (
        f"trainer.deterministic={shown} is not allowed: expected false, true or warn")


def test_a_callback_that_turns_timed_kernels_on_is_refused(tmp_path):
    other = "+callbacks.other._target_=framework.callbacks.other_kernels.OtherKernels"
    assert driver_says(["trainer.deterministic=true", other], tmp_path) == (
        "callbacks.other is not allowed with trainer.deterministic=true: it turns cuDNN's timed choice of algorithms "
        "(benchmark) on, on GPUs; drop the callback or set trainer.deterministic=false")
    assert driver_says(["trainer.deterministic=false", other], tmp_path) == ""


def test_a_cublas_workspace_that_is_not_deterministic_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    assert driver_says(["trainer.deterministic=true"], tmp_path) == (
        "trainer.deterministic=true is not allowed with CUBLAS_WORKSPACE_CONFIG=:0:0 (the environment): cuBLAS is "
        "deterministic only with :4096:8 or :16:8; unset it or use one of them")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert driver_says(["trainer.deterministic=true"], tmp_path) == ""


def test_an_op_without_a_deterministic_kernel_fails_the_run_with_torchs_message_and_the_key(
        user_code, torch_defaults_after, tmp_path, monkeypatch, capsys):
    code, out, err = command_in_process("main", [*UNPOOLING, "trainer.deterministic=true"], tmp_path, monkeypatch,
                                        capsys)
    assert code == 1, out + err
    assert TORCH_SAYS in err and "Traceback" not in err
    assert err.rstrip().endswith("raised by trainer.deterministic=true; set trainer.deterministic=warn to only warn, "
                                 "or false"), err



def test_eval_py_says_the_key_too_when_an_op_has_no_deterministic_kernel(
        user_code, torch_defaults_after, tmp_path, monkeypatch, capsys):
    code, out, err = command_in_process("main", [*UNPOOLING[:-1], f"hydra.run.dir={tmp_path / 'run'}"], tmp_path,
                                        monkeypatch, capsys)
    assert code == 0, out + err
    code, out, err = command_in_process("eval_main", ["eval.py", f"ckpt_path={tmp_path / 'run'}",
                                                      "trainer.deterministic=true", "allowed_targets=[unpooling_model.*]"],
                                        tmp_path, monkeypatch, capsys)
    assert code == 1, out + err
    assert TORCH_SAYS in err and "Traceback" not in err
    assert err.rstrip().endswith("raised by trainer.deterministic=true; set trainer.deterministic=warn to only warn, "
                                 "or false"), err

def test_warn_only_warns_and_the_run_finishes(user_code, torch_defaults_after, tmp_path, monkeypatch, capsys):
    with pytest.warns(UserWarning, match=TORCH_SAYS):
        code, out, err = command_in_process("main", [*UNPOOLING, "trainer.deterministic=warn"], tmp_path,
                                            monkeypatch, capsys)
    assert code == 0, out + err
    assert "done: test accuracy" in out


def test_false_leaves_the_op_alone(user_code, torch_defaults_after, tmp_path, monkeypatch, capsys):
    code, out, err = command_in_process("main", UNPOOLING, tmp_path, monkeypatch, capsys)
    assert code == 0, out + err


def test_a_gpu_worker_gets_cudnns_flags_and_cublas_workspace_before_cuda_starts(torch_defaults_after, monkeypatch):
    """The GPU's path, forced on this machine: train_rank sets CUBLAS_WORKSPACE_CONFIG before the strategy joins
    (join() is where a worker first touches CUDA), and the task's assembly turns cuDNN deterministic and untimed."""
    from types import SimpleNamespace

    from framework.training.determinism import apply_determinism
    from framework.worker import train_rank

    cuda_reported(monkeypatch, gpus=2, bf16=True)
    seen = {}

    class Joined(Exception):
        pass

    def join():
        seen["env"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        raise Joined

    trainer = SimpleNamespace(deterministic=True, cuda=True)
    payload = SimpleNamespace(settings=SimpleNamespace(trainer=trainer, targets=None), run_dir="unused")
    strategy = SimpleNamespace(join=join, trainer=trainer, starter=SimpleNamespace(runs_in_process=True))
    with pytest.raises(Joined):
        train_rank(payload, strategy)
    assert seen["env"] == ":4096:8"

    torch.backends.cudnn.benchmark = True
    apply_determinism(True)
    assert torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    apply_determinism("warn")
    assert torch.is_deterministic_algorithms_warn_only_enabled()
    apply_determinism(False)
    assert not torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.deterministic


def test_dataloader_workers_draw_from_the_runs_seed_and_rank_not_the_processs_generator(user_code):
    """What a dataset's transform draws in the DataLoader's workers repeats whatever the main process drew before
    (a model's initialization, another run in this process). Without the loader's
    generator torch takes the workers' seeds from the process's global generator: the first check fails."""
    from jittered_data import Jittered

    from framework.data.collate import Collate
    from framework.data.loaders import BatchPipeline, DataLoaderLoader
    from framework.data.source import DataShare

    def first_batch(rank, drawn_before):
        torch.manual_seed(0)
        torch.rand(drawn_before)
        loader = DataLoaderLoader(Jittered(size=64), BatchPipeline(None, None, CPU), DataShare(rank, 2, CPU, 8, 1, 2),
                                  seed=42, collate=Collate(default_collate))
        return next(iter(loader))[0]

    assert torch.equal(first_batch(0, 1), first_batch(0, 1000))
