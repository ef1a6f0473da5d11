"""A seed sweep's configs in TensorBoard's HParams tab: one run per config under <sweep>/seeds/, named like a job
folder by what varies (framework/results/job_names.py), its hyperparameters the config's overrides (and `seeds`,
`best`), its metrics the means over the seeds under the jobs' own tags (hparam/test_acc, ...) beside their
standard deviations (hparam/test_acc_sd), so the configs line up with the single jobs in one table."""
from __future__ import annotations

import shutil
from pathlib import Path

from framework.results.job_names import job_name, overrides_by_key
from framework.results.seed_groups import SeedGroup

SEEDS_DIR = "seeds"


def hparam_value(text: str) -> float | str:
    try:
        return float(text)
    except ValueError:
        return text


def write_seed_hparams(sweep_dir: Path, groups: list[SeedGroup], keys: list[str], metrics: list[str]) -> None:
    """Written afresh each time the summary is (a resumed sweep's runs replace the earlier ones)."""
    # here: Hydra builds the sweep summary's callback before the driver imports torch (framework/cli.py)
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import hparams  # (the same)

    shutil.rmtree(sweep_dir / SEEDS_DIR, ignore_errors=True)
    for number, group in enumerate(groups):
        values = overrides_by_key(group.overrides)
        params = {**{key: hparam_value(values[key]) for key in keys if key in values}, "seeds": group.n,
                  "best": group.best}
        scores = {f"hparam/{m}": group.mean(m) for m in metrics if group.mean(m) is not None}
        scores.update({f"hparam/{m}_sd": group.sd(m) for m in metrics if group.sd(m) is not None})
        folder = sweep_dir / SEEDS_DIR / f"{number}_{job_name(keys, group.overrides) or 'all'}"
        with SummaryWriter(str(folder)) as writer:  # the run's own event file, as the jobs' (no add_hparams sub-run)
            for summary in hparams(params, scores):
                writer.file_writer.add_summary(summary)
            for tag, value in scores.items():
                writer.add_scalar(tag, value)
