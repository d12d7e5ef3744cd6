"""`vlrl submit` and `vlrl jobs list|status|logs|stop`: training runs as Ray Jobs on a cluster.

The cluster is reached through its dashboard (the Ray Jobs API, port 8265): `--address`, else
RAY_JOB_ADDRESS / RAY_API_SERVER_ADDRESS / RAY_ADDRESS. Its auth token comes from `--token`, else
RAY_AUTH_TOKEN, the file at RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from vlrl.errors import VlrlError

console = Console()
err_console = Console(stderr=True)

app = typer.Typer(
    help="List, inspect, follow and stop training jobs on a Ray cluster.",
    no_args_is_help=True,
    rich_markup_mode="rich",
)

ADDRESS_HELP = (
    "Ray dashboard (Jobs API) URL, e.g. http://127.0.0.1:8265. Default: $RAY_JOB_ADDRESS, $RAY_API_SERVER_ADDRESS, "
    "$RAY_ADDRESS."
)
TOKEN_HELP = (
    "Ray auth token. Default: $RAY_AUTH_TOKEN, the file at $RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token (prefer these: a "
    "--token shows in shell history)."
)
STATUS_STYLE = {
    "SUCCEEDED": "green",
    "RUNNING": "cyan",
    "PENDING": "yellow",
    "FAILED": "bold red",
    "STOPPED": "magenta",
}


def register(root: typer.Typer) -> None:
    """Mount `submit` and the `jobs` group on the root CLI."""
    root.command("submit")(submit)
    root.add_typer(app, name="jobs", help="List, inspect, follow and stop training jobs on a Ray cluster.")


def _client(address: str | None, token: str | None):
    from vlrl.runtime.jobs import JobsClient

    return JobsClient(address, token)


def _styled(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, 'white')}]{status}[/]"


def _write_logs(text: str) -> None:
    # Raw, not through rich: training output may contain [brackets] that rich would eat.
    sys.stdout.write(text)
    sys.stdout.flush()


def submit(
    config: Path = typer.Argument(..., help="YAML run config (resolved here, with the overrides)."),
    overrides: list[str] = typer.Argument(None, help="Dotted overrides, e.g. train.steps=50."),
    address: str | None = typer.Option(None, "--address", help=ADDRESS_HELP),
    token: str | None = typer.Option(None, "--token", help=TOKEN_HELP),
    name: str | None = typer.Option(
        None, "--name", help="Job name (default: the config file's name); the job id starts with it."
    ),
    resume: str | None = typer.Option(
        None, "--resume", help="Passed to `vlrl train --resume` on the cluster: 'auto' or a checkpoint path there."
    ),
    upload_code: bool | None = typer.Option(
        None,
        "--upload-code/--no-upload-code",
        help=(
            "Ship the local src/vlrl with the job (default: yes from a source checkout); --no-upload-code uses the "
            "vlrl of the cluster image."
        ),
    ),
    env: list[str] = typer.Option(
        [], "--env", "-e", help="Extra KEY=VALUE environment variable for the job; repeatable."
    ),
    wait: bool = typer.Option(
        False, "--wait/--no-wait", help="Follow the logs until the job ends (default: print the job id and return)."
    ),
) -> None:
    """Submit [bold]vlrl train[/] to a Ray cluster as a Ray Job; print its id and return.

    The config is resolved here (file + overrides) and travels with the job as vlrl-job.yaml; it is also stored in the
    job's metadata (`vlrl jobs status JOB --config`). The job keeps running after this command exits.

    Use absolute paths on shared storage (e.g. /fsx) for storage.root and model.path: relative ones resolve inside the
    job's temporary working directory.

    The job id goes to stdout alone, everything else to stderr, so `JOB=$(vlrl submit ...)` works.

    Examples:

      export RAY_ADDRESS=http://127.0.0.1:8265 RAY_AUTH_TOKEN=...

      vlrl submit configs/ci-tiny.yaml train.steps=5 storage.root=/fsx/vlrl/runs

      vlrl submit configs/qwen3vl-8b-6gpu.yaml --name maze-8b --resume auto --no-upload-code
    """
    from vlrl.runtime.jobs import parse_env, prepare_submission

    job = prepare_submission(
        config, overrides or [], name=name, resume=resume, upload_code=upload_code, env=parse_env(env)
    )
    client = _client(address, token)
    job_id = client.submit(job)
    for warning in job.warnings:
        err_console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    print(job_id, flush=True)
    err_console.print(
        f"submitted to {client.address}; the job writes to [bold]{job.run_dir}[/]", highlight=False, soft_wrap=True
    )
    if not wait:
        err_console.print(
            f"follow it: vlrl jobs logs {job_id} --follow   stop it: vlrl jobs stop {job_id}",
            highlight=False,
            soft_wrap=True,
        )
        return
    client.follow_logs(job_id, _write_logs)
    status = client.wait(job_id, timeout_s=60)
    err_console.print(f"job {job_id} {_styled(status)}", highlight=False)
    if status != "SUCCEEDED":
        raise typer.Exit(1)


@app.command("list")
def list_jobs(
    address: str | None = typer.Option(None, "--address", help=ADDRESS_HELP),
    token: str | None = typer.Option(None, "--token", help=TOKEN_HELP),
) -> None:
    """Every job on the cluster, oldest first.

    Example: vlrl jobs list --address http://127.0.0.1:8265
    """
    from vlrl.runtime.jobs import format_duration

    client = _client(address, token)
    jobs = client.list()
    table = Table(title=f"Ray jobs at {client.address}", title_justify="left")
    for column in ("job id", "name", "status", "duration", "run directory / entrypoint"):
        table.add_column(column, overflow="fold")
    for job in jobs:
        meta = job.metadata or {}
        table.add_row(
            job.submission_id or job.job_id or "-",
            meta.get("job_name", "-"),
            _styled(str(job.status.value)),
            format_duration(job),
            meta.get("vlrl_run_dir") or job.entrypoint,
        )
    if not jobs:
        console.print(f"no jobs on the Ray cluster at {client.address}")
        return
    console.print(table)


@app.command("status")
def status(
    job_id: str = typer.Argument(..., help="Job id, as printed by `vlrl submit`."),
    address: str | None = typer.Option(None, "--address", help=ADDRESS_HELP),
    token: str | None = typer.Option(None, "--token", help=TOKEN_HELP),
    show_config: bool = typer.Option(
        False, "--config", help="Print the resolved config the job was submitted with (YAML)."
    ),
) -> None:
    """Status, times, run directory and message of one job.

    Examples:

      vlrl jobs status ci-tiny-20260101-120000-ab12

      vlrl jobs status ci-tiny-20260101-120000-ab12 --config > resolved.yaml
    """
    from vlrl.runtime.jobs import job_summary

    job = _client(address, token).info(job_id)
    if show_config:
        config = (job.metadata or {}).get("vlrl_config")
        if not config:
            raise VlrlError(f"job {job_id} was not submitted by `vlrl submit`: it has no recorded config")
        _write_logs(config)
        return
    table = Table(show_header=False, title=f"job {job_id}", title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in job_summary(job).items():
        table.add_row(key, _styled(value) if key == "status" else value)
    console.print(table, highlight=False)


@app.command("logs")
def logs(
    job_id: str = typer.Argument(..., help="Job id, as printed by `vlrl submit`."),
    follow: bool = typer.Option(
        False, "--follow", "-f", help="Keep printing until the job ends (Ctrl-C stops following, not the job)."
    ),
    address: str | None = typer.Option(None, "--address", help=ADDRESS_HELP),
    token: str | None = typer.Option(None, "--token", help=TOKEN_HELP),
) -> None:
    """What the job's driver printed: the training progress, one line per step.

    Examples:

      vlrl jobs logs ci-tiny-20260101-120000-ab12

      vlrl jobs logs ci-tiny-20260101-120000-ab12 --follow
    """
    client = _client(address, token)
    if not follow:
        _write_logs(client.logs(job_id))
        return
    try:
        client.follow_logs(job_id, _write_logs)
    except KeyboardInterrupt:
        err_console.print(
            f"stopped following; the job runs on (vlrl jobs stop {job_id} stops it)", highlight=False, soft_wrap=True
        )
        raise typer.Exit(130) from None
    err_console.print(f"job {job_id} {_styled(client.wait(job_id, timeout_s=60))}", highlight=False)


@app.command("stop")
def stop(
    job_id: str = typer.Argument(..., help="Job id, as printed by `vlrl submit`."),
    wait: bool = typer.Option(True, "--wait/--no-wait", help="Wait until Ray reports the job stopped."),
    address: str | None = typer.Option(None, "--address", help=ADDRESS_HELP),
    token: str | None = typer.Option(None, "--token", help=TOKEN_HELP),
) -> None:
    """Stop a running job (Ray sends SIGTERM to its driver, then SIGKILL).

    Example: vlrl jobs stop ci-tiny-20260101-120000-ab12
    """
    client = _client(address, token)
    if not client.stop(job_id):
        console.print(f"job {job_id} had already ended: {_styled(client.status(job_id))}", highlight=False)
        return
    if not wait:
        console.print(f"asked Ray to stop job {job_id}", highlight=False)
        return
    console.print(f"job {job_id} {_styled(client.wait(job_id, timeout_s=60))}", highlight=False)
