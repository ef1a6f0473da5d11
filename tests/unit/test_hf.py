"""The models users bring from HuggingFace and timm, in this process (the hf extra; nothing downloaded): outputs with
logits under the standard step, the blocks found in these models, and the refusals of step=model_loss and of a
model from a missing extra. As real runs: tests/runs/test_hf.py."""
import sys

import pytest
import torch

from support.driver import driver_says
from support.hf_pieces import LENGTH, VOCAB, classes, make_conf
from support.processes import USER_CODE

datasets = pytest.importorskip("datasets", reason="the hf extra: pip install '.[hf]'")
transformers = pytest.importorskip("transformers", reason="the hf extra: pip install '.[hf]'")
timm = pytest.importorskip("timm", reason="the hf extra: pip install '.[hf]'")

TASKS = {"bert": ["model=tiny_bert", "dataset=classes", "metrics=accuracy"]}


@pytest.fixture(scope="module")
def conf(tmp_path_factory):
    return make_conf(tmp_path_factory.mktemp("hf"))


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
    rows = classes(4, 0)
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
    monkeypatch.syspath_prepend(str(USER_CODE))
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
