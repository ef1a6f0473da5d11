"""The models and data users bring from HuggingFace and timm (the hf extra), all made locally, never downloaded:
a tiny BERT and a tiny GPT-2 (random init from BertConfig / GPT2Config) train with step=model_loss under single, ddp,
fsdp and deepspeed (ZeRO-2) on a `datasets` dataset saved to disk (BERT: the Arrow table, map-style; GPT-2: its
iterable form, a stream split over the ranks by `datasets`), eval.py evaluates them and from_pretrained loads the
saved model with the same logits; a timm ViT trains under fsdp with activation checkpointing. In-process: outputs
with logits under the standard step, the blocks found in these models, and the refusals."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO, check_ok, driver_says, pin_accelerator, read_scalars, run_dirs, run_train

datasets = pytest.importorskip("datasets", reason="the hf extra: pip install '.[hf]'")
transformers = pytest.importorskip("transformers", reason="the hf extra: pip install '.[hf]'")
timm = pytest.importorskip("timm", reason="the hf extra: pip install '.[hf]'")

VOCAB, LENGTH = 32, 16
BERT = f"""
_target_: transformers.BertForSequenceClassification
config:
  _target_: transformers.BertConfig
  vocab_size: {VOCAB}
  hidden_size: 32
  num_hidden_layers: 2
  num_attention_heads: 2
  intermediate_size: 64
  max_position_embeddings: {LENGTH}
  num_labels: 3
"""
GPT2 = f"""
_target_: transformers.GPT2LMHeadModel
config:
  _target_: transformers.GPT2Config
  vocab_size: {VOCAB}
  n_embd: 32
  n_layer: 2
  n_head: 2
  n_positions: {LENGTH}
  bos_token_id: 0
  eos_token_id: 0
  use_cache: false
"""
CLASSES = """
train: {{_target_: datasets.load_from_disk, dataset_path: {root}/classes/train}}
test: {{_target_: datasets.load_from_disk, dataset_path: {root}/classes/test}}
"""
COUNTING = """
train: {{_target_: framework.data.hf.from_disk, path: {root}/counting, split: train, streaming: true, num_shards: 2}}
test: {{_target_: framework.data.hf.from_disk, path: {root}/counting, split: test, streaming: true, num_shards: 2}}
"""
VIT = """
_target_: timm.create_model
model_name: vit_tiny_patch16_224
num_classes: 10
img_size: 28
patch_size: 7
in_chans: 1
depth: 2
embed_dim: 32
num_heads: 2
"""


def _classes(count: int, seed: int):
    """Token sequences whose class is their first token mod 3 (BERT's pooler reads the first position)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (count, LENGTH), generator=g)
    return {"input_ids": ids.tolist(), "attention_mask": torch.ones_like(ids).tolist(),
            "labels": (ids[:, 0] % 3).tolist()}


def _counting(count: int, seed: int):
    """Sequences that count up mod the vocabulary from a random start: a language model learns them fast."""
    g = torch.Generator().manual_seed(seed)
    ids = (torch.randint(0, VOCAB, (count, 1), generator=g) + torch.arange(LENGTH)) % VOCAB
    return {"input_ids": ids.tolist(), "labels": ids.tolist()}


@pytest.fixture(scope="module")
def conf(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    for split, (count, seed) in {"train": (256, 0), "test": (64, 1)}.items():
        datasets.Dataset.from_dict(_classes(count, seed)).save_to_disk(str(root / "classes" / split))
    datasets.DatasetDict({split: datasets.Dataset.from_dict(_counting(count, seed))
                          for split, (count, seed) in {"train": (256, 0), "test": (64, 1)}.items()}
                         ).save_to_disk(str(root / "counting"))
    conf = root / "conf"
    for group, name, text in [("model", "tiny_bert", BERT), ("model", "tiny_gpt2", GPT2), ("model", "tiny_vit", VIT),
                              ("dataset", "classes", CLASSES.format(root=root)),
                              ("dataset", "counting", COUNTING.format(root=root))]:
        (conf / group).mkdir(parents=True, exist_ok=True)
        (conf / group / f"{name}.yaml").write_text(text)
    return conf


TASKS = {
    "bert": ["model=tiny_bert", "dataset=classes", "metrics=accuracy"],
    "gpt2": ["model=tiny_gpt2", "dataset=counting", "~metrics", "trainer.objective=loss"],
}
RUN = ["step=model_loss", "trainer.max_steps=16", "trainer.batch_size=16", "trainer.log_every_n_steps=2",
       "optimizer=adamw", "optimizer.lr=0.003", "lr_schedule=constant", "trainer.eval_every_n_epochs=1"]
STRATEGIES = {"single": ["strategy=single"], "ddp": ["strategy=ddp", "strategy.nproc_per_node=2"],
              "fsdp": ["strategy=fsdp", "strategy.nproc_per_node=2"],
              "deepspeed": ["strategy=deepspeed", "strategy.nproc_per_node=2", "strategy.zero_stage=2"]}


def _first_test_batch(task: str, root) -> dict:
    rows = datasets.load_from_disk(str(root / ("classes/test" if task == "bert" else "counting")))
    rows = (rows if task == "bert" else rows["test"]).with_format("torch")[:8]
    return {k: v for k, v in rows.items() if k != "labels"}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("task", list(TASKS))
def test_a_transformers_model_trains_with_its_own_loss_and_is_saved_in_its_own_format(conf, tmp_path, task, strategy):
    if strategy == "deepspeed":
        pytest.importorskip("deepspeed", reason="the deepspeed extra")
    proc = run_train(["--config-dir", str(conf), *TASKS[task], *STRATEGIES[strategy], *RUN], tmp_path, timeout=400)
    out = check_ok(proc)
    assert "Writing model shards" not in proc.stderr, "transformers' progress bar at each save_pretrained"
    [run_dir] = run_dirs(tmp_path)
    losses = [v for _, v in read_scalars(run_dir)["loss/train"]]
    assert sum(losses[-2:]) < 0.85 * sum(losses[:2]), losses
    result = json.loads((run_dir / "result.json").read_text())
    assert result["steps"] == 16 and result["test_loss"] < losses[0]
    if task == "gpt2":  # its iterable form: one pass of 256 samples in 16 steps of 16, split over the ranks
        assert "epoch 1: the stream gave 256 samples" in out
    # the model in HuggingFace's format, loadable without hydra-dist, gives the weights file's logits
    sys.path.insert(0, str(REPO))
    from framework.results.trained_model import load_model
    ours = load_model(run_dir, which="last", allowed_targets=["transformers.*"])  # HF's loaders can run code
    theirs = getattr(transformers, type(ours).__name__).from_pretrained(run_dir / "pretrained" / "last").eval()
    batch = _first_test_batch(task, conf.parent)
    with torch.no_grad():
        assert torch.allclose(ours(**batch).logits, theirs(**batch).logits, atol=1e-5)
    if strategy in ("single", "fsdp"):  # eval.py on the run: its model, data and step
        cwd = tmp_path / "eval"
        cwd.mkdir()
        proc = subprocess.run([sys.executable, str(REPO / "eval.py"), "--config-dir", str(conf),
                               *pin_accelerator([f"ckpt_path={run_dir}", "strategy=single",
                                                 "allowed_targets=[transformers.*,datasets.*]"])], cwd=cwd,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True, text=True, timeout=300)
        check_ok(proc)
        [report] = cwd.rglob("eval.json")
        evaluated = json.loads(report.read_text())
        assert evaluated["test_loss"] == pytest.approx(result["test_loss"], rel=1e-4)


@pytest.mark.slow
def test_a_timm_vit_trains_under_fsdp_with_activation_checkpointing(conf, tmp_path):
    out = check_ok(run_train(["--config-dir", str(conf), "model=tiny_vit", "strategy=fsdp", "strategy.nproc_per_node=2",
                              "trainer.activation_checkpointing=true", "trainer.max_steps=12",
                              "trainer.batch_size=32", "trainer.log_every_n_steps=2", "optimizer=adamw",
                              "optimizer.lr=0.003", "dataset.max_train_samples=512", "dataset.max_test_samples=128"],
                             tmp_path, timeout=400))
    assert "training create_model on" in out and "with strategy=fsdp" in out
    [run_dir] = run_dirs(tmp_path)
    losses = [v for _, v in read_scalars(run_dir)["loss/train"]]
    assert losses[-1] < losses[0], losses


def test_the_blocks_of_library_models_are_their_layers():
    from framework.models.blocks import auto_units

    bert = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=LENGTH))
    assert [type(u).__name__ for u in auto_units(bert)] == \
        ["BertEmbeddings", "BertLayer", "BertLayer", "BertLayer", "BertPooler", "Linear"]
    vit = timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=28, patch_size=7, in_chans=1, depth=3,
                            embed_dim=32, num_heads=2)
    assert [u for u in auto_units(vit) if type(u).__name__ == "Block"] == list(vit.blocks)


def test_outputs_with_logits_work_with_the_standard_step_loss_and_metrics():
    from framework.training.metrics import Accuracy
    from framework.training.step import Supervised

    bert = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=LENGTH, num_labels=3)).eval()
    rows = _classes(4, 0)
    ids, labels = torch.tensor(rows["input_ids"]), torch.tensor(rows["labels"])
    out = Supervised()(bert, (ids, labels), torch.nn.CrossEntropyLoss(reduction="none"))
    with torch.no_grad():
        logits = bert(ids).logits
    assert torch.equal(out.outputs, logits)
    assert torch.allclose(out.loss, torch.nn.functional.cross_entropy(logits, labels, reduction="none"))
    assert Accuracy()(out.outputs, labels) == (logits.argmax(1) == labels).sum()

    class DictModel(torch.nn.Module):
        def forward(self, x):
            return {"logits": x * 2, "features": x}
    out = Supervised()(DictModel(), (torch.ones(2, 3), torch.tensor([0, 1])), torch.nn.CrossEntropyLoss())
    assert torch.equal(out.outputs, torch.full((2, 3), 2.0))


def test_model_loss_refuses_what_it_cannot_use_in_one_line(conf, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "tests" / "user_code"))
    said = driver_says(["model._target_=keyword_model.LogitsOnly", "dataset=classes", "step=model_loss"], tmp_path, conf)
    assert said == ("step=model_loss is not allowed for LogitsOnly: its output has no loss (keys logits); it needs a "
                    "model that computes its own loss and returns it as `loss` (HuggingFace models do when the batch "
                    "has `labels`), or use step=supervised with a loss")
    said = driver_says(["step=model_loss", "dataset=synthetic", "dataset.shape=[5]", "model=linear"], tmp_path, conf)
    assert said.startswith("step=model_loss is not allowed for these batches (batch[0]: float32 [2, 5], "), said


def test_without_the_hf_extra_a_model_from_it_is_one_line_naming_the_install(conf, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    said = driver_says([*TASKS["bert"], "step=model_loss"], tmp_path, conf)
    assert said == ("model._target_=transformers.BertForSequenceClassification is not allowed here: transformers is "
                    "not installed (the hf extra); install it with `pip install 'hydra-dist[hf]'` (or `make setup`, "
                    "which installs every extra)")
