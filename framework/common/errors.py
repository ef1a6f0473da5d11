"""The one exception type for bad user input: its message is shown as-is, without a traceback."""
import re


class ConfigError(ValueError):
    """A config value (or a file it points to) that cannot work; the message names key, value and what is allowed.
    It is one line, whatever a library it quotes put in its own message (Hydra's blocklist text spans four)."""

    def __init__(self, message: object = "") -> None:
        super().__init__(re.sub(r"\s*\n\s*", " ", str(message)).strip())
