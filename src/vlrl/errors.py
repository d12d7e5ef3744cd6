"""The one exception type users see.

Every error caused by bad input (a wrong config key, a missing path, a corrupt file, a model of
the wrong kind) is raised as a `VlrlError` with a message that fits on one line and says what to
fix. The CLI prints that line and exits with status 2, without a traceback.
"""


class VlrlError(Exception):
    """An error in the user's input or environment, reported as one clear line."""


class ConfigError(VlrlError):
    """A configuration file or override is invalid."""


class TimeLimitReached(VlrlError):
    """`train.max_minutes` ran out: the run checkpointed and stopped; `--resume auto` continues it.

    The CLI exits with status 75 (EX_TEMPFAIL, "try again") so job scripts can tell a paused run
    from a finished one (0) and from a failed one (2)."""

    exit_code = 75


class WorkerDiedError(VlrlError):
    """A worker's process is gone (killed, out of memory, node lost); its group is unusable.

    Raised by `vlrl.runtime.worker_group.RayWorkerGroup`, caught by the trainer, which rebuilds
    the group and resumes from its last checkpoint (`vlrl.training.recovery`). It lives here, at
    the bottom of the layers, so the trainer need not import the Ray runtime to catch it.
    """
