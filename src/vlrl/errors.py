"""The one exception type users see.

Every error caused by bad input (a wrong config key, a missing path, a corrupt file, a model of
the wrong kind) is raised as a `VlrlError` with a message that fits on one line and says what to
fix. The CLI prints that line and exits with status 2, without a traceback.
"""


class VlrlError(Exception):
    """An error in the user's input or environment, reported as one clear line."""


class ConfigError(VlrlError):
    """A configuration file or override is invalid."""
