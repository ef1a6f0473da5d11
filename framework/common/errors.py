"""The exceptions whose message is shown as-is, without a traceback: bad user input (ConfigError) and its carrier
out of Hydra's callbacks (RefusedInHydra), and a run every rank stops on purpose (TrainingStopped), whichever layer
finds out; and the two ways a library's exception is quoted in such a one-line message."""
import re


class ConfigError(ValueError):
    """A config value (or a file it points to) that cannot work; the message names key, value and what is allowed.
    It is one line, whatever a library it quotes put in its own message (Hydra's blocklist text spans four)."""

    def __init__(self, message: object = "") -> None:
        super().__init__(re.sub(r"\s*\n\s*", " ", str(message)).strip())


def first_line(exc: BaseException) -> str:
    """The exception's first line of text ('' without any): where most libraries say what failed."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def on_one_line(exc: BaseException) -> str:
    """All of the exception's text, every run of spaces and line breaks one space."""
    return " ".join(str(exc).split())


class RefusedInHydra(BaseException):
    """A ConfigError raised inside Hydra's callbacks (the run folder that cannot be made), where Hydra turns any
    Exception into a warning and goes on: as a BaseException it reaches the command, which refuses the run with it as
    with any other (framework/cli.py)."""

    def __init__(self, error: ConfigError) -> None:
        super().__init__(str(error))
        self.error = error


class TrainingStopped(RuntimeError):
    """The run stopped on purpose, every rank at the same point (a NaN/inf loss; a stream epoch without a sample); the
    message says why and what is kept."""
