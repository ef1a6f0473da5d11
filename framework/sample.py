"""`python sample.py ckpt_path=<run> prompt="..."` (`hydra-dist-sample`): text from a trained language model, as
nanoGPT's sample.py. The run's weights file holds the model's config and the vocabulary of its training text; any
model with `generate(ids, max_new_tokens, temperature, top_k, generator)` (framework/models/gpt.py's GPT, or a
user's) can be sampled. The samples go to stdout, what was loaded to stderr; nothing is written."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from framework.checkpoints.weights import find_weights
from framework.config.sample import SampleConfig
from framework.config.targets import TargetAllowlist, allowing
from framework.config.typed import typed
from framework.data.text import Vocabulary
from framework.common.errors import ConfigError
from framework.results.trained_model import model_from, read_trained, weights_path
from framework.session.situations import refuse

SEPARATOR = "-" * 40


def sample_command(cfg: DictConfig) -> None:
    """Hydra's task function for sample.py."""
    try:
        if OmegaConf.is_missing(cfg, "ckpt_path"):
            raise ConfigError("ckpt_path is missing: name a run folder or a weights file, e.g. "
                              "python sample.py ckpt_path=outputs/runs/<run> prompt='...'")
        sample(typed(SampleConfig, cfg, ""))
    except ConfigError as exc:
        refuse(exc)


def sample(options: SampleConfig) -> list[str]:
    source = _weights_file(options)
    saved = read_trained(source)
    if not saved.get("vocab"):
        raise ConfigError(f"ckpt_path={options.ckpt_path} is not allowed: {source} holds no vocabulary (its dataset has "
                          "no `vocab`, or the run predates sample.py); sample.py needs a text model's run")
    device = _device(options)
    with allowing(TargetAllowlist().extended(options.allowed_targets)):  # a run folder is data, not code
        model = model_from(saved, device)
    if not callable(getattr(model, "generate", None)):
        raise ConfigError(f"ckpt_path={options.ckpt_path} is not allowed: its model ({type(model).__name__}) has no "
                          "generate(ids, max_new_tokens, temperature, top_k, generator) method")
    vocabulary = Vocabulary(saved["vocab"])
    prompt = _prompt(options)
    ids = torch.tensor([vocabulary.encode(prompt, "prompt_file" if options.prompt_file else "prompt")], device=device)
    generator = torch.Generator(device=device).manual_seed(options.seed)
    print(f"sampling {options.num_samples} x {options.max_new_tokens} tokens from {source} on {device}",
          file=sys.stderr, flush=True)
    texts, started = [], time.perf_counter()
    for index in range(options.num_samples):
        out = model.generate(ids, options.max_new_tokens, temperature=options.temperature, top_k=options.top_k,
                             generator=generator)
        texts.append(vocabulary.decode(out[0].tolist()))
        print(texts[-1], flush=True)
        if index + 1 < options.num_samples:
            print(SEPARATOR, flush=True)
    seconds = time.perf_counter() - started
    print(f"{options.num_samples * options.max_new_tokens / seconds:,.0f} tokens/s", file=sys.stderr, flush=True)
    return texts


def _weights_file(options: SampleConfig) -> Path:
    """A run folder's weights/best.pt, else its weights/last.pt (weights=last: last.pt only), or the file given."""
    which, path = str(options.weights), Path(options.ckpt_path)
    if not path.exists():
        raise ConfigError(f"ckpt_path={path} is not allowed: no such run folder or weights file")
    if path.is_dir() and which == "best" and find_weights(path, ("best",)) is None:
        which = "last"  # a run without an evaluation that improved its objective: its final weights
    return weights_path(path, which)


def _prompt(options: SampleConfig) -> str:
    if options.prompt_file is None:
        if not options.prompt:
            raise ConfigError("prompt='' is not allowed: give at least one token to continue (the default is a newline)")
        return options.prompt
    path = Path(options.prompt_file)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"prompt_file={path} cannot be read as UTF-8 text ({exc})") from None
    if not text:
        raise ConfigError(f"prompt_file={path} is not allowed: the file is empty")
    return text


def _device(options: SampleConfig) -> torch.device:
    if options.accelerator == "gpu" and not torch.cuda.is_available():
        raise ConfigError("accelerator=gpu is not allowed here: this machine has no CUDA GPU (auto or cpu)")
    return torch.device("cuda" if options.accelerator != "cpu" and torch.cuda.is_available() else "cpu")
