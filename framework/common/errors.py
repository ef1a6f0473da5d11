"""The one exception type for bad user input: its message is shown as-is, without a traceback."""


class ConfigError(ValueError):
    """A config value (or a file it points to) that cannot work; the message names key, value and what is allowed."""
