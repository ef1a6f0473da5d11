"""A user's own experiment from outside this repository: their package (a Dataset, a model, a loss, a strategy,
callbacks), their config dir (`--config-dir`), selected on the command line like the built-ins. Real train.py
processes (the refusals of bad components, in-process: tests/unit/test_user_project.py)."""
import importlib.util
import json
import textwrap

import numpy as np
import pytest

from support.processes import check_ok, run_train, torchrun
from support.run_cache import example_project
from support.run_files import losses_by_step, read_scalars, run_dirs

COMMON = ["trainer.epochs=3", "trainer.batch_size=32", "trainer.log_every_n_steps=4", "optimizer=sgd",
          "optimizer.lr=0.05", "lr_schedule=constant", "model=mlp"]
ENGINES = {"single": 1, "ddp": 2, "dp": 1, "deepspeed": 2, "horovod": 2}
NEEDS = {"deepspeed": "deepspeed", "horovod": "horovod.torch"}


def _installed(strategy: str) -> bool:
    return strategy not in NEEDS or importlib.util.find_spec(NEEDS[strategy].split(".")[0]) is not None


@pytest.fixture(scope="module")
def project(runs):
    return example_project(runs)


@pytest.mark.parametrize("strategy,ranks", list(ENGINES.items()))
def test_own_dataset_and_model_train_from_their_own_package_and_config_dir(runs, project, strategy, ranks):
    """Every strategy installed here in one sweep (`-m strategy=...`), a job each."""
    if strategy in NEEDS:
        pytest.importorskip(NEEDS[strategy])
    strategies = ",".join(s for s in ENGINES if _installed(s))
    sweep = runs.train(project.args("-m", f"strategy={strategies}", "dataset=blobs", *COMMON), env=project.env(),
                       timeout=900).ok()
    [run_dir] = [job for job in sweep.jobs if job.name.endswith(f"_strategy={strategy}")]
    out = (run_dir / "train.log").read_text()
    assert "training MLP on Blobs" in out
    result = json.loads((run_dir / "result.json").read_text())
    assert result["processes"] == ranks and result["test_acc"] > 0.9  # three well separated blobs
    scalars = read_scalars(run_dir)
    for r in range(ranks):
        assert f"throughput/samples_per_sec/rank{r}" in scalars and f"loss/train/rank{r}" in scalars
    losses = [v for _, v in scalars["loss/train"]]
    assert losses[-1] < losses[0] * 0.5


def test_own_strategy_under_torchrun(project, tmp_path):
    """The other ranks never run Hydra, but compose the config to join: from the user's --config-dir too, where
    their own strategy lives. A run of its own: its launcher is the subject."""
    out = check_ok(run_train(project.args("strategy=announcing_ddp", "strategy.banner=hi", "dataset=blobs", *COMMON),
                             tmp_path, env=project.env(), launcher=torchrun()))
    assert out.count("done: test accuracy") == 1
    [run_dir] = run_dirs(tmp_path)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["strategy"] == "announcing_ddp" and result["processes"] == 2 and result["test_acc"] > 0.9


def test_own_strategy_from_their_package_trains_with_two_gloo_workers(runs, project):
    """conf/strategy/announcing_ddp.yaml in the user's config dir names mypkg's DDPStrategy subclass; the elastic
    agent's workers import it from the user's package, and its name is the run's strategy name."""
    run = runs.train(project.args("strategy=announcing_ddp", "strategy.banner=hi there", "dataset=blobs",
                                  "trainer.log_all_ranks=true", *COMMON), env=project.env()).ok()
    assert "rank 0/2 joined: hi there" in run.stdout and "rank 1/2 joined: hi there" in run.stdout
    assert "announcing_ddp" in run.run_dir.name
    result = run.result()
    assert result["strategy"] == "announcing_ddp" and result["processes"] == 2 and result["test_acc"] > 0.9


def test_own_callbacks_from_their_package_watch_and_stop_a_two_worker_run(runs, project):
    """conf/callbacks/with_history.yaml in the user's config dir adds mypkg's Callback to the built-in ones; it
    gets every log interval and evaluation on rank 0 and writes its file there. StopAtTarget (the example of
    docs/loop-features.md, "Writing a callback") ends both ranks after the second epoch's evaluation: rank 0 decides
    on its result, every rank hears it through the state's broadcast."""
    run = runs.train(project.args("strategy=ddp", "dataset=blobs", "callbacks=with_history", *COMMON,
                                  "+callbacks.stop._target_=mypkg.callbacks.StopAtTarget",
                                  "+callbacks.stop.target=0.0", "trainer.eval_every_n_epochs=2"),
                     env=project.env()).ok()
    rows = (run.run_dir / "loss_history.csv").read_text().splitlines()
    assert rows[0] == "step,kind,loss,samples_per_sec"
    kinds = [row.split(",")[1] for row in rows[1:]]
    assert kinds.count("test") == 1 and kinds.count("train") == 8  # 16 steps a epoch / 4 per log, 2 of 3 epochs
    assert "stopped after epoch 2, step 32: acc reached 0 at step 32" in run.stdout, run.stdout
    result = run.result()
    assert (result["epochs"], result["steps"]) == (2, 32)
    assert "throughput/samples_per_sec" in read_scalars(run.run_dir), "the built-in callbacks still run"


def test_under_torchrun_the_refusal_lists_the_strategies_of_every_config_dir(project, tmp_path):
    """Which strategies fit workers that torchrun started comes from each strategy class (outer_kinds), the user's own
    included, not from a list of names. A process of its own: the strategies are the user's --config-dir's as Hydra
    searches it at start-up, which the compose API in a test's process does not reproduce."""
    proc = run_train(project.args("strategy=dp", "dataset=blobs", *COMMON), tmp_path, env=project.env(), timeout=120,
                     launcher=torchrun(1))
    assert proc.returncode != 0
    assert "strategy=dp is not allowed under torchrun" in proc.stderr, proc.stderr
    fits = "use strategy=announcing_ddp, ddp, deepspeed, fsdp, hsdp, pp, tp, tp_function, tp_plan or auto"
    assert fits in proc.stderr, proc.stderr


def test_dataloader_and_in_memory_paths_give_the_same_losses_for_a_dataset_built_by_a_function(runs, project):
    args = ["strategy=ddp", "dataset=blobs_tensors", *COMMON, "trainer.epochs=1", "trainer.log_every_n_steps=1"]
    fast = runs.train(project.args(*args), env=project.env()).ok().run_dir
    slow = runs.train(project.args(*args, "dataset.in_memory=false", "trainer.num_workers=1"),
                      env=project.env()).ok().run_dir
    a, b = losses_by_step(fast), losses_by_step(slow)
    assert sorted(a) == sorted(b) and len(a) == 16
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-6), f"step {step}"


def test_loss_metrics_and_objective_are_components(runs, project):
    run = runs.train(project.args("strategy=single", "dataset=blobs", *COMMON, "trainer.epochs=1", "loss=focal",
                                  "metrics=top5", "metrics.top5_acc.top_k=2",
                                  "+dataset.train._partial_=true",  # a factory the framework calls
                                  "trainer.objective=loss"), env=project.env()).ok()
    result = run.result()
    assert result["metrics"] == ["acc", "top5_acc"] and result["test_top5_acc"] >= result["test_acc"]
    assert result["objective"] == "loss"
    scalars = read_scalars(run.run_dir)
    assert "acc/val" in scalars and "top5_acc/val" in scalars and "hparam/test_top5_acc" in scalars
    assert "test top5_acc" in run.stdout


def _png_folder(root, classes=2, per_class=12, size=16):
    from PIL import Image

    g = np.random.default_rng(0)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(per_class):
            base = 200 if c else 40  # a bright class and a dark one: learnable
            pixels = np.clip(base + g.normal(0, 20, (size, size, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(root / f"class{c}" / f"{i}.png")


def test_image_folder_with_a_torchvision_transform_pipeline(project, tmp_path):
    """A run of its own: a copy of the project gets a dataset config of its own."""
    mine = project.copy_to(tmp_path / "project")
    _png_folder(tmp_path / "images")
    split = """
          _target_: torchvision.datasets.ImageFolder
          root: {root}
          transform:
            _target_: torchvision.transforms.Compose
            transforms:
              - _target_: torchvision.transforms.Grayscale
              - _target_: torchvision.transforms.ToTensor
    """
    (mine.conf / "dataset" / "pngs.yaml").write_text(
        "train:" + textwrap.indent(textwrap.dedent(split.format(root=tmp_path / "images")), "  ")
        + "test:" + textwrap.indent(textwrap.dedent(split.format(root=tmp_path / "images")), "  "))
    (tmp_path / "run").mkdir()
    out = check_ok(run_train(mine.args("strategy=ddp", "dataset=pngs", "model=simple_cnn", "trainer.batch_size=8",
                                       "trainer.epochs=2", "trainer.log_every_n_steps=1", "optimizer=sgd",
                                       "optimizer.lr=0.05", "lr_schedule=constant"), tmp_path / "run", env=mine.env()))
    assert "training SimpleCNN on ImageFolder" in out
    [run_dir] = run_dirs(tmp_path / "run")
    result = json.loads((run_dir / "result.json").read_text())
    # 24 images, 12 per rank, micro-batches of 4: 3 steps per epoch; 2 classes found from the folders
    assert result["processes"] == 2 and result["steps"] == 6 and result["test_acc"] >= 0.5


def test_a_bad_user_component_stops_the_run_with_one_line_and_no_worker(project, tmp_path):
    """A dataset factory of the user's that returns a generator: the one line, as a real process (exit code, no
    traceback, no worker). A process of its own, with a copy of the project holding the bad piece."""
    mine = project.copy_to(tmp_path / "project")
    (mine.root / "mypkg" / "bad.py").write_text("def not_a_dataset(train: bool = True):\n"
                                                "    return (i for i in range(3))\n")
    proc = run_train(mine.args("strategy=ddp", *COMMON, "dataset=blobs",
                               "dataset.train._target_=mypkg.bad.not_a_dataset"), tmp_path, env=mine.env(),
                     timeout=120)
    assert proc.returncode != 0
    assert ("dataset.train._target_=mypkg.bad.not_a_dataset is not allowed: it returned a generator, which is neither "
            "a map-style torch Dataset") in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "training MLP" not in proc.stdout
