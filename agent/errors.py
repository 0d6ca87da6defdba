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
