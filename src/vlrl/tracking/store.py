"""Where MLflow lives: tracking and registry URIs, a client, and MLflow failures as one clear line.

By default a run's MLflow store is a SQLite file next to the runs, `<storage.root>/mlflow.db`
(`sqlite:////abs/path/mlflow.db`), with artifacts in `<storage.root>/mlartifacts`. `tracking.uri`
points at an MLflow server instead (a managed one, or `mlflow server --backend-store-uri ...`);
`registry.uri` may name another store for the model registry, else the registry shares the
tracking store. Only `mlflow-skinny` + `sqlalchemy` + `alembic` are needed (the `tracking` extra).

SQLite is checked before MLflow touches it: a missing database is an error for commands that only
read or change an existing registry, and a database locked by another process is reported after
`registry.lock_timeout_s` instead of surfacing as a SQLAlchemy traceback.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from vlrl.errors import VlrlError

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from vlrl.config import RunConfig

SQLITE_PREFIX = "sqlite:///"


def default_sqlite_uri(storage_root: str) -> str:
    """`sqlite:///<abs storage_root>/mlflow.db`; a remote storage root needs an explicit tracking.uri."""
    root = storage_root.removeprefix("file://")
    if "://" in root:
        raise VlrlError(
            f"storage.root {storage_root} is a URL, and SQLite needs a local file: set tracking.uri to an MLflow server"
        )
    return SQLITE_PREFIX + str(Path(root).expanduser().resolve() / "mlflow.db")


def normalize_uri(uri: str) -> str:
    """An MLflow URI as given, or a plain path to a .db file turned into `sqlite:///<abs path>`."""
    if "://" in uri or uri.startswith("sqlite:"):
        return uri
    return SQLITE_PREFIX + str(Path(uri).expanduser().resolve())


def tracking_uri(config: RunConfig) -> str:
    """The tracking store of a run: `tracking.uri`, else SQLite under `storage.root`."""
    return normalize_uri(config.tracking.uri) if config.tracking.uri else default_sqlite_uri(config.storage.root)


def registry_uri(config: RunConfig) -> str:
    """The model registry store: `registry.uri`, else the tracking store."""
    return normalize_uri(config.registry.uri) if config.registry.uri else tracking_uri(config)


def sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///` URI (query string dropped), None for other stores."""
    if not uri.startswith(SQLITE_PREFIX):
        return None
    return Path(uri[len(SQLITE_PREFIX) :].split("?", 1)[0])  # sqlite:////abs/x.db -> /abs/x.db; sqlite:///x.db -> x.db


def default_artifact_location(uri: str) -> str | None:
    """`file://<db dir>/mlartifacts` for a SQLite store (MLflow would use ./mlruns of the current
    directory otherwise); None lets a tracking server choose."""
    path = sqlite_path(uri)
    return (path.parent / "mlartifacts").as_uri() if path is not None else None


def check_sqlite(uri: str, *, must_exist: bool, lock_timeout_s: float = 5.0, what: str = "MLflow database") -> None:
    """For a SQLite URI: the file exists (or its folder is created), is a database and is not locked.

    The lock test takes SQLite's RESERVED lock and releases it at once (`BEGIN IMMEDIATE`), so it
    fails exactly when another connection is writing or holds an exclusive lock.
    """
    path = sqlite_path(uri)
    if path is None:
        return
    if not path.is_file():
        if must_exist:
            raise VlrlError(f"{what} {path} does not exist; check --uri / registry.uri, or register an adapter first")
        path.parent.mkdir(parents=True, exist_ok=True)
        return
    try:
        con = sqlite3.connect(str(path), timeout=lock_timeout_s, isolation_level=None)
    except sqlite3.Error as exc:
        raise VlrlError(f"{what} {path} cannot be opened ({exc})") from None
    try:
        con.execute("BEGIN IMMEDIATE")
        con.execute("ROLLBACK")
        con.execute("PRAGMA schema_version").fetchone()
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise VlrlError(
                f"{what} {path} is locked by another process (waited {lock_timeout_s:g}s); nothing was changed, "
                "try again"
            ) from None
        raise VlrlError(f"{what} {path} cannot be used ({exc})") from None
    except sqlite3.DatabaseError as exc:
        raise VlrlError(f"{what} {path} is not a SQLite database ({exc})") from None
    finally:
        con.close()


def quiet_mlflow_logs() -> None:
    """MLflow and alembic log every table migration at INFO; keep the CLI output to our own lines."""
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


def mlflow_client(uri: str) -> MlflowClient:
    """An MlflowClient whose tracking and registry stores are both `uri`."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError:
        raise VlrlError("MLflow is not installed; install the tracking extra: pip install 'vlrl[tracking]'") from None
    quiet_mlflow_logs()
    with mlflow_errors(f"opening MLflow store {uri}"):
        return MlflowClient(tracking_uri=uri, registry_uri=uri)


@contextmanager
def mlflow_errors(what: str) -> Iterator[None]:
    """Turn MLflow, SQLAlchemy and I/O failures inside the block into one VlrlError line."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        from mlflow.exceptions import MlflowException
    except ImportError:  # pragma: no cover - mlflow_client reports the missing extra first
        MlflowException = RuntimeError  # noqa: N806
    try:
        yield
    except VlrlError:
        raise
    except (MlflowException, SQLAlchemyError, OSError) as exc:
        text = str(getattr(exc, "message", None) or exc).strip().splitlines()
        line = text[0] if text else exc.__class__.__name__
        if "database is locked" in line:
            raise VlrlError(f"{what}: the database is locked by another process; try again") from None
        raise VlrlError(f"{what}: {line}") from None
