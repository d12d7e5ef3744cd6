"""`vlrl submit` / `vlrl jobs` against a real local Ray head with token authentication.

One head per module (`ray start --head --block` in its own session, every port on 127.0.0.1,
2 CPUs, a small object store). Teardown signals only that process tree — never `ray stop`,
which would kill every Ray instance on the machine, other test runs' included.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

pytest.importorskip("ray.job_submission")
import psutil  # noqa: E402  (a dependency of ray[default])
import requests  # noqa: E402

from vlrl.errors import VlrlError  # noqa: E402
from vlrl.runtime.jobs import JobsClient, dashboard_address, parse_env, prepare_submission  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CI_CONFIG = ROOT / "configs" / "ci-tiny.yaml"
CLIENT_VARS = (
    "RAY_ADDRESS",
    "RAY_JOB_ADDRESS",
    "RAY_API_SERVER_ADDRESS",
    "RAY_AUTH_MODE",
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_TOKEN_PATH",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class JobsHead:
    """A running local Ray head: its dashboard URL, token and GCS port."""

    address: str
    token: str
    gcs_port: int
    home: Path  # an empty HOME for clients, so no ~/.ray/auth_token is picked up
    pid: int  # of `ray start --block`, the root of the head's process tree

    def client_env(self, token: str | None = "default", **extra: str) -> dict[str, str]:
        """The environment of a `vlrl` client: the address, and the right token unless told otherwise."""
        env = {k: v for k, v in os.environ.items() if k not in CLIENT_VARS}
        env.update(HOME=str(self.home), RAY_ADDRESS=self.address, COLUMNS="200")
        if token is not None:
            env["RAY_AUTH_TOKEN"] = self.token if token == "default" else token
        env.update(extra)
        return env

    def vlrl(self, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run the venv's `vlrl` script as a separate process."""
        return subprocess.run(
            [str(BIN / "vlrl"), *args],
            env=env or self.client_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
        )


@pytest.fixture(scope="module")
def jobs_head():
    """A token-authenticated Ray head on 127.0.0.1 for this module's tests."""
    temp = Path(tempfile.mkdtemp(prefix="vlrlj-", dir="/tmp"))  # short: Ray's socket paths have a length limit
    token = secrets.token_hex(32)
    ports = {
        name: free_port()
        for name in (
            "port",
            "dashboard-port",
            "ray-client-server-port",
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "metrics-export-port",
            "runtime-env-agent-port",
            "node-manager-port",
            "object-manager-port",
        )
    }
    env = {k: v for k, v in os.environ.items() if k not in CLIENT_VARS}
    # Without RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 Ray swaps 127.0.0.1 for the host's IP and the GCS,
    # raylet and agents listen on every interface, --node-ip-address notwithstanding.
    env.update(
        RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"
    )
    # Jobs run their entrypoint (`vlrl train ...`) with the head's PATH: like a cluster image with
    # vlrl installed, the venv's bin must be on it even when the tests run without activating it.
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    command = [
        str(BIN / "ray"),
        "start",
        "--head",
        "--block",
        "--node-ip-address",
        "127.0.0.1",
        "--dashboard-host",
        "127.0.0.1",
        "--num-cpus",
        "2",
        "--object-store-memory",
        str(250 * 1024**2),
        "--temp-dir",
        str(temp / "ray"),
        "--include-log-monitor",
        "false",
        "--disable-usage-stats",
    ]
    command += [f"--{name}={port}" for name, port in ports.items()]
    log = open(temp / "ray-start.log", "w")
    head = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{ports['dashboard-port']}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if head.poll() is not None:
                pytest.fail(f"ray start exited with {head.returncode}:\n{(temp / 'ray-start.log').read_text()[-3000:]}")
            try:
                if requests.get(f"{address}/api/jobs/", headers={"Authorization": f"Bearer {token}"}, timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                pytest.fail("the Ray dashboard did not come up within 90 s")
            time.sleep(0.3)
        (temp / "home").mkdir()
        yield JobsHead(address=address, token=token, gcs_port=ports["port"], home=temp / "home", pid=head.pid)
    finally:
        # `ray start --block` takes its processes down on SIGTERM (~5 s); whatever is left of the
        # tree (job drivers run in sessions of their own) is killed.
        descendants = []
        with contextlib.suppress(psutil.NoSuchProcess):
            descendants = psutil.Process(head.pid).children(recursive=True)
        if head.poll() is None:
            head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=20)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        _, alive = psutil.wait_procs(descendants, timeout=10)
        for proc in alive:
            proc.kill()
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def one_error_line(result: subprocess.CompletedProcess) -> str:
    """The CLI's error: exit status 2 and exactly one line on stderr, no traceback."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# --------------------------------------------------------------------------------------------
# without a cluster


def test_prepare_submission_resolves_the_config(ci_model_dir, tmp_path):
    job = prepare_submission(
        CI_CONFIG,
        [f"model.path={ci_model_dir}", f"storage.root={tmp_path}", "train.steps=3"],
        name="my run",
        resume="/fsx/ckpts",
        upload_code=True,
        env={"NCCL_DEBUG": "INFO"},
    )
    config = yaml.safe_load(job.config_yaml)
    assert config["train"]["steps"] == 3 and config["model"]["path"] == str(ci_model_dir)
    assert job.submission_id.startswith("my-run-") and config["storage"]["run_name"] == job.submission_id
    assert job.run_dir == f"{tmp_path}/{job.submission_id}" and job.metadata["vlrl_run_dir"] == job.run_dir
    assert job.metadata["vlrl_config"] == job.config_yaml and job.metadata["job_name"] == "my-run"
    assert job.entrypoint == "vlrl train vlrl-job.yaml --quiet --resume /fsx/ckpts"
    assert job.runtime_env["env_vars"]["HF_HUB_OFFLINE"] == "1" and job.runtime_env["env_vars"]["NCCL_DEBUG"] == "INFO"
    assert Path(job.runtime_env["py_modules"][0]) == ROOT / "src" / "vlrl"
    assert job.warnings == []
    # --resume auto keeps one run directory across resubmissions; relative paths get a warning, and
    # a runtime.address meant for the submitting machine is dropped (the job joins its own cluster).
    again = prepare_submission(CI_CONFIG, ["runtime.address=auto"], resume="auto", upload_code=False)
    resolved = yaml.safe_load(again.config_yaml)
    assert resolved["storage"]["run_name"] == "ci-tiny" and resolved["runtime"]["address"] is None
    assert "py_modules" not in again.runtime_env
    assert any("storage.root 'runs' is relative" in w for w in again.warnings)
    assert any("runtime.address 'auto' is dropped" in w for w in again.warnings)


def test_addresses_and_job_env_are_checked(monkeypatch):
    for var in ("RAY_JOB_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(VlrlError, match="no Ray cluster address"):
        dashboard_address(None)
    monkeypatch.setenv("RAY_ADDRESS", "head:8265")
    assert dashboard_address(None) == "http://head:8265"
    monkeypatch.setenv("RAY_JOB_ADDRESS", "https://ray.example.com/")
    assert dashboard_address(None) == "https://ray.example.com"
    assert dashboard_address("http://10.0.0.1:8265") == "http://10.0.0.1:8265"
    with pytest.raises(VlrlError, match="dashboard"):
        dashboard_address("ray://head:10001")
    with pytest.raises(VlrlError, match="inherits the cluster's auth"):
        parse_env(["RAY_AUTH_TOKEN=x"])
    with pytest.raises(VlrlError, match="KEY=VALUE"):
        parse_env(["oops"])


# --------------------------------------------------------------------------------------------
# against the head


@pytest.mark.slow
def test_submitted_job_runs_to_completion_after_the_cli_exits(jobs_head, ci_model_dir, tmp_path):
    started = time.monotonic()
    submit = jobs_head.vlrl(
        "submit",
        str(CI_CONFIG),
        f"model.path={ci_model_dir}",
        f"storage.root={tmp_path / 'runs'}",
        "train.steps=1",
        "--address",
        jobs_head.address,
    )
    assert submit.returncode == 0, submit.stderr
    assert time.monotonic() - started < 20  # returns at once; it does not wait for the training
    job_id = submit.stdout.strip()
    assert job_id.startswith("ci-tiny-") and "\n" not in job_id, submit.stdout

    client = JobsClient(jobs_head.address, jobs_head.token)
    assert client.status(job_id) in ("PENDING", "RUNNING")  # the submitting process is gone already
    assert client.wait(job_id, timeout_s=180) == "SUCCEEDED", client.logs(job_id)

    status = jobs_head.vlrl("jobs", "status", job_id)
    assert status.returncode == 0 and "SUCCEEDED" in status.stdout and job_id in status.stdout, status.stderr
    logs = jobs_head.vlrl("jobs", "logs", job_id)
    assert "step 1/1 |" in logs.stdout and "adapter written to" in logs.stdout, logs.stdout
    run_dir = tmp_path / "runs" / job_id
    assert (run_dir / "adapter" / "adapter_model.safetensors").is_file()

    recorded = yaml.safe_load(jobs_head.vlrl("jobs", "status", job_id, "--config").stdout)
    assert recorded["train"]["steps"] == 1 and recorded["storage"]["run_name"] == job_id
    assert recorded["model"]["path"] == str(ci_model_dir)
    listed = jobs_head.vlrl("jobs", "list")  # address from RAY_ADDRESS
    assert listed.returncode == 0 and job_id in listed.stdout and "SUCCEEDED" in listed.stdout


def test_head_listens_on_loopback_only(jobs_head):
    head = psutil.Process(jobs_head.pid)
    listening = {
        conn.laddr.ip
        for proc in [head, *head.children(recursive=True)]
        for conn in proc.net_connections("inet")
        if conn.status == psutil.CONN_LISTEN
    }
    assert listening and listening <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening


def test_requests_without_the_token_are_refused(jobs_head, tmp_path):
    url = f"{jobs_head.address}/api/jobs/"
    assert requests.get(url, timeout=5).status_code == 401
    assert requests.get(url, headers={"Authorization": "Bearer wrong"}, timeout=5).status_code == 403
    assert requests.get(url, headers={"Authorization": f"Bearer {jobs_head.token}"}, timeout=5).status_code == 200

    # The token is also found through RAY_AUTH_TOKEN_PATH and --token.
    token_file = tmp_path / "token"
    token_file.write_text(jobs_head.token + "\n")
    by_path = jobs_head.vlrl("jobs", "list", env=jobs_head.client_env(token=None, RAY_AUTH_TOKEN_PATH=str(token_file)))
    assert by_path.returncode == 0, by_path.stderr
    by_option = jobs_head.vlrl("jobs", "list", "--token", jobs_head.token, env=jobs_head.client_env(token=None))
    assert by_option.returncode == 0, by_option.stderr


def test_bad_input_gives_one_clear_line(jobs_head):
    # RAY_AUTH_MODE=token without a token is what a user who forgot the export has.
    missing = one_error_line(
        jobs_head.vlrl("jobs", "list", env=jobs_head.client_env(token=None, RAY_AUTH_MODE="token"))
    )
    assert "requires a token: set RAY_AUTH_TOKEN" in missing and jobs_head.address in missing
    wrong = one_error_line(jobs_head.vlrl("jobs", "list", env=jobs_head.client_env(token="not-the-token")))
    assert "rejected the token from RAY_AUTH_TOKEN" in wrong

    closed = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    unreachable = one_error_line(jobs_head.vlrl("jobs", "list", "--address", closed))
    assert time.monotonic() - started < 15
    assert (
        f"cannot reach the Ray dashboard at {closed}" in unreachable
        and "8265" in unreachable
        and "port-forward" in unreachable
    )
    gcs = one_error_line(jobs_head.vlrl("jobs", "list", "--address", f"127.0.0.1:{jobs_head.gcs_port}"))
    assert "8265" in gcs
    assert "use --address http://HEAD:8265" in one_error_line(
        jobs_head.vlrl("jobs", "list", "--address", "ray://127.0.0.1:10001")
    )

    assert "no job 'no-such-job'" in one_error_line(jobs_head.vlrl("jobs", "status", "no-such-job"))
    assert "no job 'no-such-job'" in one_error_line(jobs_head.vlrl("jobs", "logs", "no-such-job", "--follow"))


@pytest.mark.slow
def test_stop_ends_a_long_running_job(jobs_head, ci_model_dir, tmp_path):
    submit = jobs_head.vlrl(
        "submit",
        str(CI_CONFIG),
        f"model.path={ci_model_dir}",
        f"storage.root={tmp_path}",
        "train.steps=1000",
        "--name",
        "long",
    )
    assert submit.returncode == 0, submit.stderr
    job_id = submit.stdout.strip()
    client = JobsClient(jobs_head.address, jobs_head.token)
    deadline = time.monotonic() + 60
    while client.status(job_id) == "PENDING" and time.monotonic() < deadline:
        time.sleep(0.3)
    assert client.status(job_id) == "RUNNING", client.logs(job_id)

    stop = jobs_head.vlrl("jobs", "stop", job_id)
    assert stop.returncode == 0 and "STOPPED" in stop.stdout, (stop.stdout, stop.stderr)
    assert client.status(job_id) == "STOPPED"
    assert not (tmp_path / job_id / "adapter").exists()
    again = jobs_head.vlrl("jobs", "stop", job_id)
    assert again.returncode == 0 and "already ended" in again.stdout
