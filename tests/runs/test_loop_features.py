"""Loop features as real train.py runs where the behaviour is a process: evaluation every N steps driving early
stopping on every ddp rank and the best checkpoint in a one-epoch run, the model summary in train.log and in
TensorBoard's Text tab, the debug presets (fast_dev_run with ddp, overfit). In-process: tests/unit/
test_loop_features.py; under every engine with the EMA and a resume: tests/engines/test_rich_runs.py."""
import time

import torch

from support.processes import user_code_env
from support.references import rich_run
from support.run_files import read_scalars, walk

# one epoch of 16 steps (1024 samples, batch 64), an evaluation every 4 steps on 256 test samples
ONE_EPOCH = ["dataset.max_train_samples=1024", "dataset.max_test_samples=256", "trainer.epochs=1",
             "trainer.batch_size=64", "trainer.log_every_n_steps=2", "trainer.eval_every_n_steps=4"]


def test_evaluation_every_n_steps_in_one_epoch_keeps_the_best_checkpoint_and_a_model_summary(runs):
    """Four evaluations in one epoch (none twice at its end), the best of them kept apart and in weights/best.pt;
    the model summary in train.log and in TensorBoard's Text tab. The single process's rich run
    (support/references.py), which tests/engines/test_rich_runs.py reads too."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = runs.train(rich_run("single"), env=user_code_env()).ok()
    out, run_dir, result = run.stdout, run.run_dir, run.result()
    accuracies = dict(read_scalars(run_dir)["acc/val"])
    assert sorted(accuracies) == [4, 8, 12, 16] and result["steps"] == 16
    assert "epoch 1/1 step 4/16 test loss" in out
    best_step = max(accuracies, key=lambda s: (accuracies[s], -s))
    [best] = (run_dir / "checkpoints" / "best").glob("step-*.json")
    assert best.name == f"step-{best_step:08d}.json"
    assert torch.load(run_dir / "weights" / "best.pt", weights_only=True)["step"] == best_step

    log = (run_dir / "train.log").read_text()
    assert "model: LeNet, parameters per module" in log
    assert "features    Sequential     25,250       0" in log and "total                     129,068       0" in log
    events = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    events.Reload()
    [text] = events.Tensors("model/summary/text_summary")
    table = text.tensor_proto.string_val[0].decode()
    assert "| classifier | Sequential | 103,818 | 0 |" in table and "| total |  | 129,068 | 0 |" in table


def test_evaluation_every_n_steps_drives_early_stopping_on_every_ddp_rank(runs):
    """An lr too small to move anything: the objective stops improving, and with patience 1 the evaluation at step
    8 ends the one-epoch run on both ranks; the best (the first evaluation) is kept."""
    run = runs.train(["strategy=ddp", "callbacks=early_stopping", "callbacks.early_stopping.patience=1",
                      "optimizer.lr=1e-12", *ONE_EPOCH]).ok()
    out, run_dir, result = run.stdout, run.run_dir, run.result()
    assert "early stopping: acc has not improved" in out and "stopped after epoch 1, step 8" in out
    assert result["steps"] == 8 and result["processes"] == 2
    assert [s for s, _ in read_scalars(run_dir)["acc/val"]] == [4, 8]
    [best] = (run_dir / "checkpoints" / "best").glob("step-*.json")
    assert best.name == "step-00000004.json"


def test_fast_dev_run_with_ddp_trains_one_step_and_leaves_only_logs(runs):
    start = time.monotonic()
    run = runs.train(["debug=fast_dev_run", "strategy=ddp"]).ok()
    seconds = time.monotonic() - start
    out, run_dir, result = run.stdout, run.run_dir, run.result()
    assert result["steps"] == 1 and result["processes"] == 2 and "test accuracy" in out
    files = {p.relative_to(run_dir).parts[0] for p in walk(run_dir) if p.is_file()}
    assert not {"checkpoints", "weights", "profile"} & files
    assert {f for f in files if not f.startswith(("events.out.tfevents", "provenance"))} <= {
        ".hydra", "resolved_config.yaml", "result.json", "train.log", "worker_logs"}, files
    print(f"fast_dev_run with ddp: {seconds:.1f} s")


def test_overfit_drives_the_training_loss_down_on_a_few_batches(runs):
    """The preset's 4 batches of 64, here 20 times over (the preset's 50 take long on 2 shared cores)."""
    run = runs.train(["debug=overfit", "strategy=single", "trainer.epochs=20", "trainer.log_every_n_steps=4"]).ok()
    run_dir, result = run.run_dir, run.result()
    losses = [v for _, v in read_scalars(run_dir)["loss/train"]]
    assert result["steps"] == 4 * 20 and losses[-1] < 0.5 * losses[0], losses
