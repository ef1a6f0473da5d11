"""Where the configs live: conf/ in a checkout, framework/conf in an installed wheel."""
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent  # framework/
# conf/ lives at the repository root; an installed wheel ships it inside the package as framework/conf
# (setup.py maps it there), so both a checkout and `pip install .` find it.
CONF_DIR = _PACKAGE / "conf" if (_PACKAGE / "conf" / "config.yaml").is_file() else _PACKAGE.parent / "conf"


def config_dir_override(config_dir: str) -> str:
    """Hydra's --config-dir for the compose API: the folder's config groups join the search path (a relative
    folder is taken from the current directory, as train.py takes it)."""
    return f"hydra.searchpath=[file://{Path(config_dir).resolve()}]"
