"""`vlrl registry ...` and `vlrl lineage models:/...` through typer's CliRunner, on real MLflow (SQLite)."""

from __future__ import annotations

import pytest
from tracking_helpers import copy_db, make_adapter, write_eval
from typer.testing import CliRunner

from vlrl.cli import app
from vlrl.errors import VlrlError
from vlrl.models.fingerprint import model_fingerprint
from vlrl.tracking.registry import model_name_for

runner = CliRunner()


def flat(output: str) -> str:
    return " ".join(output.split())


@pytest.fixture
def cli(tracked_run, reg_config, tmp_path):
    db = copy_db(tracked_run.db, tmp_path / "store")

    def invoke(*args: str, ok: bool = True):
        result = runner.invoke(app, [*args, "--uri", str(db)])
        if ok:
            assert result.exit_code == 0, (result.output, result.exception)
        return result

    return invoke


def eval_dirs(tmp_path, cfg, tag: str, models: dict) -> list[str]:
    out = tmp_path / f"eval-{tag}"
    for label, (adapter, holdout, adversarial) in models.items():
        write_eval(out, cfg, f"{label}-holdout", adapter, "holdout", holdout, 30)
        write_eval(out, cfg, f"{label}-adversarial", adapter, "adversarial", adversarial, 16)
    return ["--eval", str(out)]


def test_register_promote_refuse_rollback_and_history_on_the_command_line(cli, tracked_run, reg_config, tmp_path):
    cfg = reg_config()
    name = model_name_for("{env}-{base}", "maze", model_fingerprint(cfg.model.path))
    v1 = tracked_run.adapter
    out = cli(
        "registry",
        "register",
        str(v1),
        *eval_dirs(tmp_path, cfg, "v1", {"base": (None, 2, 2), "grpo": (v1, 16, 6)}),
        "--reason",
        "first run",
    )
    assert f"registered as {name} v1 (candidate)" in flat(out.output) and "holdout 53.3%" in flat(out.output)
    assert name in cli("registry", "list").output
    assert "now in staging" in flat(cli("registry", "promote", name, "1").output)
    assert "now in production" in flat(cli("registry", "promote", name, "1", "--to", "production").output)

    weak = make_adapter(cfg, tmp_path / "weak" / "adapter", seed=5)
    cli(
        "registry", "register", str(weak), *eval_dirs(tmp_path, cfg, "weak", {"v1": (v1, 16, 6), "weak": (weak, 15, 6)})
    )
    refused = cli("registry", "promote", name, "2", ok=False)
    assert isinstance(refused.exception, VlrlError) and "\n" not in str(refused.exception)
    assert "promotion of" in str(refused.exception) and "refused" in str(refused.exception)
    assert "FAIL" in refused.output and "production v1" in refused.output  # the gate table came first

    strong = make_adapter(cfg, tmp_path / "strong" / "adapter", seed=6)
    cli(
        "registry",
        "register",
        str(strong),
        *eval_dirs(tmp_path, cfg, "strong", {"v1": (v1, 16, 6), "strong": (strong, 29, 7)}),
    )
    cli("registry", "promote", name, "3")
    assert "replacing v1" in flat(cli("registry", "promote", name, "3", "--to", "production").output)
    assert f"{name}: production v3 -> v1" in flat(cli("registry", "rollback", name, "--reason", "latency").output)

    shown = flat(cli("registry", "show", name, "production").output)
    assert f"{name} v1 (production)" in shown and "adapter files unchanged" in shown and tracked_run.run_id in shown
    history = flat(cli("registry", "history", name).output)
    for word in ("register", "promote", "passed", "refused", "rollback", "latency"):
        assert word in history, word

    chain = flat(cli("lineage", f"models:/{name}@production").output)
    assert str(tracked_run.run_dir) in chain and "files unchanged" in chain

    missing = runner.invoke(app, ["registry", "list", "--uri", str(tmp_path / "none.db")])
    assert isinstance(missing.exception, VlrlError) and "does not exist" in str(missing.exception)
    unknown = cli("registry", "show", name, "7", ok=False)
    assert isinstance(unknown.exception, VlrlError) and "has no version 7" in str(unknown.exception)
