"""Run `vlrl train` on a Ray cluster as a Ray Job, and watch it (list, status, logs, stop).

A submission is self-contained: the config is resolved here (file + overrides, run name fixed)
and shipped as `vlrl-job.yaml` in a tiny working directory, so the job trains exactly what was
validated on the submitting machine, and the same YAML is stored in the job's metadata. From a
source checkout the local `vlrl` package goes along as a `py_modules` upload (a few hundred KB);
a cluster image with vlrl installed needs no code upload (`upload_code=False`).

Every request carries `Authorization: Bearer <token>` when a token is found (`--token`,
RAY_AUTH_TOKEN, the file at RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token — Ray's own order). The
header is sent by us, not left to Ray's client, because Ray only adds it when the *client's*
RAY_AUTH_MODE is `token`; the cluster's mode is what matters. The job itself inherits the
cluster's RAY_AUTH_MODE/RAY_AUTH_TOKEN from its node, so the token is never put in the job's
environment (which the dashboard shows).

Every failure a user can cause (wrong address, missing or wrong token, unknown job id) is a
`VlrlError` with one line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import shlex
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import vlrl
from vlrl.config import config_to_yaml, load_config
from vlrl.errors import VlrlError

if TYPE_CHECKING:
    from ray.job_submission import JobDetails

DASHBOARD_PORT = 8265
# Most specific first; RAY_API_SERVER_ADDRESS is what Ray's own `ray job` CLI reads.
ADDRESS_ENV_VARS = ("RAY_JOB_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
JOB_CONFIG_FILE = "vlrl-job.yaml"
TERMINAL_STATES = ("SUCCEEDED", "FAILED", "STOPPED")
# Set in every job: nothing may reach a model hub; logs arrive line by line.
JOB_ENV_VARS = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
# The cluster's own auth settings reach the job from its node; copies in the job's environment
# would be shown by the dashboard (the token) or could disagree with the cluster (the mode).
FORBIDDEN_JOB_ENV = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE")
PORT_FORWARD_HINT = "on Kubernetes: kubectl port-forward svc/<cluster>-head-svc 8265:8265"


# --------------------------------------------------------------------------------------------
# address and token


def dashboard_address(address: str | None = None) -> str:
    """The Jobs API URL (http://HEAD:8265) from `address` or the RAY_*ADDRESS env vars, checked."""
    source = "--address"
    if not address:
        for var in ADDRESS_ENV_VARS:
            if os.environ.get(var):
                address, source = os.environ[var], var
                break
    if not address:
        raise VlrlError(
            f"no Ray cluster address: pass --address http://HEAD:{DASHBOARD_PORT} or set RAY_ADDRESS "
            f"(the Ray dashboard, {PORT_FORWARD_HINT})"
        )
    address = address.strip().rstrip("/")
    if address == "auto" or address.startswith("ray://"):
        raise VlrlError(
            f"{source}={address} is a Ray cluster (GCS / Ray Client) address; Ray Jobs go through the "
            f"dashboard: use --address http://HEAD:{DASHBOARD_PORT}"
        )
    if "://" not in address:
        address = "http://" + address
    if not address.startswith(("http://", "https://")):
        raise VlrlError(f"{source}={address}: the Ray dashboard address must start with http:// or https://")
    return address


@dataclass(frozen=True)
class AuthToken:
    """A Ray auth token and where it came from (named in error messages, never the value)."""

    value: str
    source: str


def find_token(token: str | None = None) -> AuthToken | None:
    """The token to send: `token`, else RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH's file, ~/.ray/auth_token."""
    if token:
        return AuthToken(token.strip(), "--token")
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return AuthToken(os.environ["RAY_AUTH_TOKEN"].strip(), "RAY_AUTH_TOKEN")
    path_var = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path_var:
        path = Path(path_var).expanduser()
        try:
            value = path.read_text().strip()
        except OSError as exc:
            raise VlrlError(f"RAY_AUTH_TOKEN_PATH={path_var}: cannot read the token file ({exc.strerror})") from None
        if not value:
            raise VlrlError(f"RAY_AUTH_TOKEN_PATH={path_var}: the token file is empty")
        return AuthToken(value, f"RAY_AUTH_TOKEN_PATH ({path})")
    default = Path.home() / ".ray" / "auth_token"
    if default.is_file() and default.read_text().strip():
        return AuthToken(default.read_text().strip(), str(default))
    return None


# --------------------------------------------------------------------------------------------
# the client


def _connection_reason(exc: Exception) -> str:
    """A few words for why a connection failed (refused, unknown host, timeout)."""
    text = str(exc)
    for needle, reason in (
        ("Connection refused", "connection refused"),
        ("Name or service not known", "unknown host"),
        ("nodename nor servname", "unknown host"),
        ("Temporary failure in name resolution", "unknown host"),
        ("No route to host", "no route to host"),
        ("timed out", "timed out"),
        ("RemoteDisconnected", "the server closed the connection: not an HTTP dashboard?"),
        ("BadStatusLine", "the server does not speak HTTP/1.1: not the dashboard port?"),
    ):
        if needle in text:
            return reason
    return type(exc).__name__


class JobsClient:
    """Ray's `JobSubmissionClient` for one cluster, with token auth and one-line errors."""

    def __init__(self, address: str | None = None, token: str | None = None, connect_timeout_s: float = 5.0):
        """Connect to the dashboard at `address` (see `dashboard_address`) and check the token."""
        self.address = dashboard_address(address)
        self.token = find_token(token)
        self.headers = {"Authorization": f"Bearer {self.token.value}"} if self.token else {}
        self._check_dashboard(connect_timeout_s)
        from ray.job_submission import JobSubmissionClient

        # Ray logs each package upload at INFO on stderr; a CLI user only needs the job id.
        for name in ("ray", "ray.dashboard.modules.dashboard_sdk", "ray.dashboard.modules.job.sdk"):
            logging.getLogger(name).setLevel(logging.WARNING)
        with self._errors():
            self._client = JobSubmissionClient(self.address, headers=dict(self.headers))

    def _check_dashboard(self, connect_timeout_s: float) -> None:
        # Ray's client sends requests without a timeout: an unreachable host would hang for minutes.
        import requests

        url = f"{self.address}/api/version"
        try:
            reply = requests.get(url, headers=self.headers, timeout=(connect_timeout_s, 30.0))
        except requests.exceptions.RequestException as exc:
            raise VlrlError(
                f"cannot reach the Ray dashboard at {self.address} ({_connection_reason(exc)}); check the "
                f"address and the dashboard port ({DASHBOARD_PORT} by default; {PORT_FORWARD_HINT})"
            ) from None
        self._check_auth(reply.status_code)
        try:
            version = reply.json()["ray_version"] if reply.ok else None
        except (ValueError, KeyError, TypeError):
            version = None
        if version is None:
            raise VlrlError(
                f"{self.address} is not a Ray dashboard (GET /api/version answered HTTP {reply.status_code}); "
                f"the Jobs API listens on the dashboard port, {DASHBOARD_PORT} by default"
            )

    def _check_auth(self, status: int) -> None:
        if status == 401:
            raise VlrlError(
                f"the Ray cluster at {self.address} requires a token: set RAY_AUTH_TOKEN "
                "(or RAY_AUTH_TOKEN_PATH, or --token) to the cluster's auth token"
            )
        if status == 403:
            source = self.token.source if self.token else "the request"
            raise VlrlError(
                f"the Ray cluster at {self.address} rejected the token from {source}: it is not this "
                "cluster's token (on KubeRay it is in the RayCluster's auth Secret)"
            )

    @contextlib.contextmanager
    def _errors(self, job_id: str | None = None) -> Iterator[None]:
        """Turn Ray client failures into one-line VlrlErrors."""
        import requests
        from ray.exceptions import AuthenticationError

        try:
            yield
        except AuthenticationError as exc:
            text = str(exc)
            self._check_auth(403 if "Forbidden" in text or "invalid" in text else 401)
            raise VlrlError(f"Ray token authentication failed at {self.address}: {text.splitlines()[0]}") from None
        except requests.exceptions.ConnectionError as exc:
            raise VlrlError(
                f"lost the connection to the Ray dashboard at {self.address} ({_connection_reason(exc)})"
            ) from None
        except RuntimeError as exc:
            text = str(exc)
            if job_id is not None and "404" in text:
                raise VlrlError(
                    f"no job '{job_id}' on the Ray cluster at {self.address}; `vlrl jobs list` shows the jobs"
                ) from None
            raise VlrlError(f"the Ray Jobs API at {self.address} refused the request: {text.splitlines()[0]}") from None

    def submit(self, submission: JobSubmission) -> str:
        """Submit a prepared job; returns its id. The job runs on without this process."""
        with tempfile.TemporaryDirectory(prefix="vlrl-job-") as staging:
            # The working dir holds only the resolved config; Ray uploads it (content-addressed).
            (Path(staging) / JOB_CONFIG_FILE).write_text(submission.config_yaml)
            runtime_env = dict(submission.runtime_env, working_dir=staging)
            with self._errors():
                return self._client.submit_job(
                    entrypoint=submission.entrypoint,
                    submission_id=submission.submission_id,
                    runtime_env=runtime_env,
                    metadata=submission.metadata,
                )

    def list(self) -> list[JobDetails]:
        """Every job the cluster knows, oldest first."""
        with self._errors():
            jobs = self._client.list_jobs()
        return sorted(jobs, key=lambda job: job.start_time or 0)

    def info(self, job_id: str) -> JobDetails:
        """Status, times, entrypoint and metadata of one job."""
        with self._errors(job_id):
            return self._client.get_job_info(job_id)

    def status(self, job_id: str) -> str:
        """PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED."""
        return str(self.info(job_id).status.value)

    def logs(self, job_id: str) -> str:
        """Everything the job's driver has printed so far."""
        with self._errors(job_id):
            return self._client.get_job_logs(job_id)

    def follow_logs(self, job_id: str, write: Callable[[str], None]) -> None:
        """Pass the job's log to `write`, chunk by chunk as the driver prints it, until the job ends."""
        import aiohttp

        self.info(job_id)  # a clear error for an unknown id before opening the websocket

        async def follow() -> None:
            async for chunk in self._client.tail_job_logs(job_id):
                write(chunk)

        try:
            # asyncio.run cancels the task cleanly on Ctrl-C (the KeyboardInterrupt then propagates).
            asyncio.run(follow())
        except (aiohttp.ClientError, RuntimeError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise VlrlError(
                f"lost the connection to the Ray dashboard at {self.address} while following job {job_id} "
                f"({reason}); the job itself may still run"
            ) from None

    def stop(self, job_id: str) -> bool:
        """Ask Ray to stop the job; False when it had already ended."""
        with self._errors(job_id):
            return self._client.stop_job(job_id)

    def wait(self, job_id: str, timeout_s: float = 60.0, poll_s: float = 0.5) -> str:
        """Poll until the job ends; returns its final status, or raises after timeout_s."""
        deadline = time.monotonic() + timeout_s
        while (status := self.status(job_id)) not in TERMINAL_STATES:
            if time.monotonic() > deadline:
                raise VlrlError(f"job {job_id} is still {status} after {timeout_s:.0f} s")
            time.sleep(poll_s)
        return status


# --------------------------------------------------------------------------------------------
# what is submitted


@dataclass
class JobSubmission:
    """Everything a job needs, resolved on the submitting machine."""

    submission_id: str
    entrypoint: str
    config_yaml: str
    run_dir: str
    runtime_env: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def source_checkout() -> Path | None:
    """The `src/vlrl` directory when vlrl runs from a source checkout (editable install), else None."""
    package = Path(vlrl.__file__).resolve().parent
    if package.parent.name == "src" and (package.parent.parent / "pyproject.toml").is_file():
        return package
    return None


def _slug(text: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", text).strip("-")
    return slug[:48] or "vlrl"


def parse_env(pairs: list[str]) -> dict[str, str]:
    """`["KEY=VALUE", ...]` -> dict, refusing the cluster's own auth variables."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise VlrlError(f"--env {pair!r} must look like KEY=VALUE")
        if key in FORBIDDEN_JOB_ENV:
            raise VlrlError(f"--env {key}: the job inherits the cluster's auth settings from its node; do not set them")
        env[key] = value
    return env


def prepare_submission(
    config_path: str | Path,
    overrides: list[str] | None = None,
    *,
    name: str | None = None,
    resume: str | None = None,
    upload_code: bool | None = None,
    env: dict[str, str] | None = None,
) -> JobSubmission:
    """Resolve the config and build the job: entrypoint, runtime env, metadata, run directory.

    The run name is fixed here so the run directory is known before the job starts: the config's
    `storage.run_name`, else the job id — or, with `resume="auto"`, the job name, so resubmitting
    the same config resumes the same run.
    """
    overrides = list(overrides or [])
    config = load_config(config_path, overrides)
    name = _slug(name or Path(config_path).stem)
    submission_id = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    if config.storage.run_name is None:
        config.storage.run_name = name if resume == "auto" else submission_id
    warnings = [
        f"{key} '{value}' is relative: the job resolves it inside its temporary working directory on the "
        f"cluster; use an absolute path on shared storage (e.g. /fsx/...)"
        for key, value in (("storage.root", config.storage.root), ("model.path", config.model.path))
        if "://" not in value and not Path(value).is_absolute()
    ]
    if config.runtime.address:
        # A job's driver joins the cluster it runs on, through the RAY_ADDRESS that Ray Jobs sets.
        warnings.append(f"runtime.address '{config.runtime.address}' is dropped: the job joins the cluster it runs on")
        config.runtime.address = None
    config_yaml = config_to_yaml(config)
    run_dir = config.storage.root.rstrip("/") + "/" + config.storage.run_name

    entrypoint = ["vlrl", "train", JOB_CONFIG_FILE, "--quiet"]
    if resume:
        entrypoint += ["--resume", resume]
    runtime_env: dict[str, Any] = {"env_vars": {**JOB_ENV_VARS, **(env or {})}}
    package = source_checkout()
    if upload_code is None:
        upload_code = package is not None
    if upload_code:
        if package is None:
            raise VlrlError("--upload-code needs vlrl installed from a source checkout (pip install -e .)")
        # Ahead of the image's vlrl on the job's and its workers' PYTHONPATH.
        runtime_env["py_modules"] = [str(package)]
        runtime_env["excludes"] = ["__pycache__", "*.pyc"]
    metadata = {
        "job_name": name,
        "vlrl_version": vlrl.__version__,
        "vlrl_config_source": shlex.join([str(config_path), *overrides]),
        "vlrl_run_dir": run_dir,
        "vlrl_code": "uploaded from a source checkout" if upload_code else "installed on the cluster",
        "vlrl_config": config_yaml,
    }
    return JobSubmission(
        submission_id=submission_id,
        entrypoint=shlex.join(entrypoint),
        config_yaml=config_yaml,
        run_dir=run_dir,
        runtime_env=runtime_env,
        metadata=metadata,
        warnings=warnings,
    )


def job_summary(job: JobDetails) -> dict[str, str]:
    """The fields `vlrl jobs status` shows, as display strings."""

    def when(ms: int | None) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms else "-"

    meta = job.metadata or {}
    rows = {
        "job id": job.submission_id or job.job_id or "-",
        "name": meta.get("job_name", "-"),
        "status": str(job.status.value),
        "message": job.message or "-",
        "started": when(job.start_time),
        "ended": when(job.end_time),
        "duration": format_duration(job),
        "entrypoint": job.entrypoint,
        "config": meta.get("vlrl_config_source", "-"),
        "run directory": meta.get("vlrl_run_dir", "-"),
        "code": meta.get("vlrl_code", "-"),
    }
    if job.runtime_env and job.runtime_env.get("env_vars"):
        rows["environment"] = json.dumps(job.runtime_env["env_vars"], sort_keys=True)
    return rows


def format_duration(job: JobDetails) -> str:
    """Run time so far (or in total) as 1h02m03s / 4m05s / 6s."""
    if not job.start_time:
        return "-"
    end = job.end_time or time.time() * 1000
    seconds = max(0, int((end - job.start_time) / 1000))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{seconds:02d}s"
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
