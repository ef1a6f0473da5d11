"""sample.py's generation in this process: GPT.generate with top_k=1 is greedy and runs past the block size, a model
that cannot generate is refused. sample.py on a trained char LM: tests/runs/test_sample.py."""
import pytest
import torch

from framework.checkpoints.weights import write_weights
from framework.common.errors import ConfigError
from framework.config.sample import SampleConfig
from framework.models.gpt import GPT
from framework.sample import sample


def test_generate_with_top_k_one_is_greedy_and_runs_past_the_block_size():
    torch.manual_seed(0)
    model = GPT(in_shape=(8,), num_classes=11, n_layer=1, n_head=2, n_embd=16).eval()
    ids = torch.tensor([[1, 2, 3]])
    out = model.generate(ids, max_new_tokens=20, temperature=1.0, top_k=1)
    assert out.shape == (1, 23) and torch.equal(out[:, :3], ids)
    greedy = ids
    for _ in range(20):
        greedy = torch.cat((greedy, model(greedy[:, -8:])[:, -1].argmax(-1, keepdim=True)), dim=1)
    assert torch.equal(out, greedy)


def test_a_model_that_cannot_generate_is_refused(tmp_path):
    from framework.models.linear import LinearModel

    model = LinearModel(in_shape=(4,), num_classes=3)
    record = {"model_config": {"_target_": "framework.models.linear.LinearModel"}, "in_shape": (4,), "num_classes": 3}
    path = write_weights(tmp_path, "best", model.state_dict(), {**record, "vocab": list("abc")}, step=1, objective={})
    with pytest.raises(ConfigError, match=r"its model \(LinearModel\) has no generate\("):
        sample(SampleConfig(ckpt_path=str(path), prompt="ab", accelerator="cpu"))
    plain = write_weights(tmp_path, "last", model.state_dict(), record, step=1, objective={})
    with pytest.raises(ConfigError, match="holds no vocabulary"):
        sample(SampleConfig(ckpt_path=str(plain), prompt="ab", accelerator="cpu"))
