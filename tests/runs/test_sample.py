"""sample.py / hydra-dist-sample: text from a char LM that train.py trained (a shared run, then the real command), the
weights file's vocabulary, the seed, the prompt's refusal. Generation in-process: tests/unit/test_sample.py."""

import pytest

from framework.common.errors import ConfigError
from framework.config.sample import SampleConfig
from framework.results.trained_model import read_trained
from framework.sample import sample
from support.processes import SAMPLE, check_ok, run_train

PATTERN = "hello world\n"
TINY_LM = ["experiment=char_lm", "model.n_layer=1", "model.n_embd=32", "model.n_head=2", "dataset.block_size=13",
           "trainer.batch_size=32", "trainer.epochs=8", "trainer.max_steps=150", "trainer.log_every_n_steps=40",
           "trainer.progress_bar=false", "optimizer.lr=0.01", "lr_schedule=constant"]


@pytest.fixture(scope="module")
def char_lm_run(runs):
    """A tiny char LM trained on a text that repeats one line (12 characters; blocks of 13 start at every phase of
    it, as the cropped contexts of a long sample do): after training it continues the line."""
    text = runs.folder("one_line", lambda folder: (folder / "text.txt").write_text(PATTERN * 800)) / "text.txt"
    return runs.train([*TINY_LM, f"dataset.path={text}"]).ok().run_dir


def run_sample(args, cwd):
    """sample.py as a real process (its own `accelerator` key in args: it has no trainer group)."""
    return run_train(args, cwd, timeout=120, script=[str(SAMPLE)])


@pytest.mark.core
def test_sample_continues_the_prompt_with_what_the_model_learnt(char_lm_run, tmp_path):
    out = check_ok(run_sample([f"ckpt_path={char_lm_run}", "prompt=hello", "max_new_tokens=48", "temperature=0.2",
                               "num_samples=2", "accelerator=cpu"], tmp_path))
    first, second = out.rstrip("\n").split("\n" + "-" * 40 + "\n")
    for text in (first, second):
        assert text.startswith("hello") and len(text) == 5 + 48
        expected = (PATTERN * 6)[:53]
        agree = sum(a == b for a, b in zip(text, expected)) / len(expected)
        assert agree > 0.9, f"a trained model continues its one line: {text!r}"
    assert not list(tmp_path.iterdir()), "sample.py writes no folder and no log"
    assert set(read_trained(char_lm_run)["vocab"]) == set(PATTERN)


def test_seed_decides_the_sample(char_lm_run, capsys):
    options = dict(ckpt_path=str(char_lm_run), prompt="h", max_new_tokens=40, temperature=2.0, top_k=None,
                   weights="last", accelerator="cpu")
    first, again, other = (sample(SampleConfig(**options, seed=s)) for s in (1, 1, 2))
    assert first == again and first != other
    assert capsys.readouterr().out.split("\n")[0] == first[0].split("\n")[0], "the samples are printed"


def test_prompt_outside_the_vocabulary_is_refused(char_lm_run):
    with pytest.raises(ConfigError, match=r"^prompt='hello WORLD' is not allowed: 'D', 'L', 'O', 'R', 'W' not in the "
                                          r"model's vocabulary \(the 9 tokens of its training text\)$"):
        sample(SampleConfig(ckpt_path=str(char_lm_run), prompt="hello WORLD", accelerator="cpu"))
