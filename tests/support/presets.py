"""The presets of conf/experiment/ and the strategies each says it trains with (its `# strategies: a, b` line, which
docs/configuration.md repeats): tests/runs/test_experiments.py trains each one with each of them."""
from __future__ import annotations

import re

from support.processes import REPO, TINY

SMALL = ["trainer.max_steps=4", "trainer.log_every_n_steps=2"]
# Few steps of each preset on this machine (MNIST and CIFAR-10 as random data of their shape).
SMALL_RUNS = {
    "char_lm": ["model.n_layer=2", "model.n_embd=32", "model.n_head=2", "dataset.block_size=32",  # pp: 2 blocks
                "trainer.max_steps=6", "trainer.log_every_n_steps=2", "trainer.batch_size=32"],
    "d2l_lenet_data_parallel": [*TINY, *SMALL],
    "dp_tutorial": [],
    "simple_cnn_mnist": ["dataset=synthetic", "dataset.shape=[1,28,28]", *SMALL],
    "cifar_net": ["dataset=synthetic", "dataset.shape=[3,32,32]", *SMALL],
}


def claimed_strategies(preset: str) -> list[str]:
    """The strategies a preset says it trains with: its `# strategies: a, b` line."""
    text = (REPO / "conf" / "experiment" / f"{preset}.yaml").read_text()
    found = re.search(r"^# strategies: ([\w, ]+?)\s*(\(|$)", text, re.M)
    assert found, f"conf/experiment/{preset}.yaml has no '# strategies: ...' line"
    return [name.strip() for name in found.group(1).split(",")]
