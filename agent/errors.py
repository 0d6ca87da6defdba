"""Error types shared by both halves; each carries a one-line, user-facing reason."""


class BoxwatchError(Exception):
    """Base class: the message is a complete one-line explanation for the user."""


class ArtifactError(BoxwatchError):
    """An artifact is malformed, tampered with, untrusted or of an unknown schema."""


class KeyFileError(BoxwatchError):
    """A key file is missing, unreadable, of the wrong type, or would be overwritten."""


class ConfigError(BoxwatchError):
    """A configuration or input file is invalid; ``problems`` lists every problem found."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


class MissingDependencyError(BoxwatchError):
    """An optional dependency the configuration chose is not installed; the message names
    the extra that installs it. Every CLI verb exits 3 for it (``boxwatch.cli`` decides)."""


class MissingFileError(BoxwatchError):
    """An input file the user named does not exist.

    Mixed into the error of the file's kind (artifact, key, model) so that the handlers of
    that kind still catch it; every CLI verb exits with the usage code for it, whatever code
    it gives other errors of that kind (``boxwatch.cli`` decides)."""


class MissingArtifactError(ArtifactError, MissingFileError):
    """The artifact file does not exist."""


class MissingKeyFileError(KeyFileError, MissingFileError):
    """A key file does not exist."""


class MissingModelError(ConfigError, MissingFileError):
    """The model file does not exist."""
