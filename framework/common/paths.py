"""Where the configs live: conf/ in a checkout, framework/conf in an installed wheel; a composing command's own
arguments (overrides and --config-dir)."""
import argparse
from pathlib import Path

from framework.common.errors import ConfigError

_PACKAGE = Path(__file__).resolve().parent.parent  # framework/
# conf/ lives at the repository root; an installed wheel ships it inside the package as framework/conf
# (setup.py maps it there), so both a checkout and `pip install .` find it.
CONF_DIR = _PACKAGE / "conf" if (_PACKAGE / "conf" / "config.yaml").is_file() else _PACKAGE.parent / "conf"


def config_dir_override(config_dir: str) -> str:
    """Hydra's --config-dir for the compose API: the folder's config groups join the search path (a relative
    folder is taken from the current directory, as train.py takes it)."""
    return f"hydra.searchpath=[file://{Path(config_dir).resolve()}]"


def overrides_and_config_dir(argv: list[str], prog: str) -> tuple[list[str], str | None]:
    """(overrides, --config-dir/-cd) of a command that composes the config as train.py does without being a Hydra app
    (hydra-dist-devices, hydra-dist-plan; Hydra's parser is not public API)."""
    parser = argparse.ArgumentParser(prog=prog, add_help=False)
    parser.add_argument("--config-dir", "-cd")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if args.config_dir is not None and not Path(args.config_dir).is_dir():
        raise ConfigError(f"--config-dir={args.config_dir} is not allowed: no such folder")
    return args.overrides, args.config_dir
