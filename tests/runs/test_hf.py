"""The models and data users bring from HuggingFace and timm (the hf extra), all made locally, never downloaded: a tiny
BERT and a tiny GPT-2 (random init from BertConfig / GPT2Config) train with step=model_loss under single, ddp, fsdp
and deepspeed (ZeRO-2) on a `datasets` dataset saved to disk (BERT: the Arrow table, map-style; GPT-2: its iterable
form, a stream split over the ranks by `datasets`), one sweep per model (a job per strategy); eval.py evaluates them
and from_pretrained loads the saved model with the same logits; a timm ViT trains under fsdp with activation
checkpointing. In-process: tests/unit/test_hf.py."""
import importlib.util
import json

import pytest
import torch

from support.driver import command_in_process
from support.hf_pieces import make_conf
from support.run_files import read_scalars, walk

datasets = pytest.importorskip("datasets", reason="the hf extra: pip install '.[hf]'")
transformers = pytest.importorskip("transformers", reason="the hf extra: pip install '.[hf]'")
timm = pytest.importorskip("timm", reason="the hf extra: pip install '.[hf]'")

TASKS = {
    "bert": ["model=tiny_bert", "dataset=classes", "metrics=accuracy"],
    "gpt2": ["model=tiny_gpt2", "dataset=counting", "~metrics", "trainer.objective=loss"],
}
RUN = ["step=model_loss", "trainer.max_steps=16", "trainer.batch_size=16", "trainer.log_every_n_steps=2",
       "optimizer=adamw", "optimizer.lr=0.003", "lr_schedule=constant", "trainer.eval_every_n_epochs=1"]
# On the CPU each engine's defaults are 2 gloo workers and ZeRO-2, so one sweep over the strategy trains them all
STRATEGIES = ["single", "ddp", "fsdp", "deepspeed"]


@pytest.fixture(scope="module")
def conf(runs):
    """The datasets and config dir, made once per session (shared runs name the same paths)."""
    return runs.folder("hf", make_conf) / "conf"


def strategy_jobs(runs, conf, task: str) -> dict:
    strategies = [s for s in STRATEGIES if s != "deepspeed" or importlib.util.find_spec("deepspeed")]
    sweep = runs.train(["-m", "--config-dir", str(conf), *TASKS[task], f"strategy={','.join(strategies)}", *RUN],
                       timeout=1200).ok()
    return {job.name.split("strategy=", 1)[1]: (job, sweep) for job in sweep.jobs}


def _first_test_batch(task: str, root) -> dict:
    rows = datasets.load_from_disk(str(root / ("classes/test" if task == "bert" else "counting")))
    rows = (rows if task == "bert" else rows["test"]).with_format("torch")[:8]
    return {k: v for k, v in rows.items() if k != "labels"}


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("task", list(TASKS))
def test_a_transformers_model_trains_with_its_own_loss_and_is_saved_in_its_own_format(runs, conf, tmp_path, task,
                                                                                     strategy, monkeypatch, capsys):
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed", reason="the deepspeed extra")
    run_dir, sweep = strategy_jobs(runs, conf, task)[strategy]
    assert "Writing model shards" not in sweep.stderr, "transformers' progress bar at each save_pretrained"
    losses = [v for _, v in read_scalars(run_dir)["loss/train"]]
    assert sum(losses[-2:]) < 0.85 * sum(losses[:2]), losses
    result = json.loads((run_dir / "result.json").read_text())
    assert result["steps"] == 16 and result["test_loss"] < losses[0]
    if task == "gpt2":  # its iterable form: one pass of 256 samples in 16 steps of 16, split over the ranks
        assert "epoch 1: the stream gave 256 samples" in (run_dir / "train.log").read_text()
    # the model in HuggingFace's format, loadable without hydra-dist, gives the weights file's logits
    from framework.results.trained_model import load_model

    ours = load_model(run_dir, which="last", allowed_targets=["transformers.*"])  # HF's loaders can run code
    theirs = getattr(transformers, type(ours).__name__).from_pretrained(run_dir / "pretrained" / "last").eval()
    batch = _first_test_batch(task, conf.parent)
    with torch.no_grad():
        assert torch.allclose(ours(**batch).logits, theirs(**batch).logits, atol=1e-5)
    if strategy in ("single", "fsdp"):  # eval.py on the run (its command in this process): its model, data and step
        (tmp_path / "eval").mkdir()
        code, out, err = command_in_process("eval_main", [
            "eval.py", "--config-dir", str(conf), f"ckpt_path='{run_dir}'",  # quoted: a sweep job's folder has an "="
            "strategy=single", "allowed_targets=[transformers.*,datasets.*]"], tmp_path / "eval", monkeypatch, capsys)
        assert code == 0, out + err
        [report] = walk(tmp_path / "eval", "eval.json")
        evaluated = json.loads(report.read_text())
        assert evaluated["test_loss"] == pytest.approx(result["test_loss"], rel=1e-4)


def test_a_timm_vit_trains_under_fsdp_with_activation_checkpointing(runs, conf):
    run = runs.train(["--config-dir", str(conf), "model=tiny_vit", "strategy=fsdp", "strategy.nproc_per_node=2",
                      "trainer.activation_checkpointing=true", "trainer.max_steps=12", "trainer.batch_size=32",
                      "trainer.log_every_n_steps=2", "optimizer=adamw", "optimizer.lr=0.003",
                      "dataset.max_train_samples=512", "dataset.max_test_samples=128"], timeout=600).ok()
    assert "training create_model on" in run.stdout and "with strategy=fsdp" in run.stdout
    losses = [v for _, v in read_scalars(run.run_dir)["loss/train"]]
    assert losses[-1] < losses[0], losses
