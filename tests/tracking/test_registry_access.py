"""Roles and the two-person rule on the registry (real MLflow on SQLite), and the audit log's identities."""

from __future__ import annotations

import json

import pytest
from tracking_helpers import copy_db, snapshot, write_eval
from typer.testing import CliRunner

from vlrl.cli import app
from vlrl.errors import ConfigError, VlrlError
from vlrl.tracking.registry import AdapterRegistry

ROLES = {"tara": "trainer", "abe": "approver", "ann": "approver", "vic": "viewer"}


@pytest.fixture
def guarded(tracked_run, reg_config, access_dir, tmp_path):
    """A registry with roles and the two-person rule on, and `as_(identity)` -> that identity's registry."""
    files = access_dir(ROLES)
    copy_db(tracked_run.db, tmp_path / "runs")
    cfg = reg_config(f"registry.access_dir={tmp_path / 'access'}", "registry.two_person_rule=true")
    out = tmp_path / "eval"
    for label, adapter, h, a in (("base", None, 2, 2), ("grpo", tracked_run.adapter, 16, 6)):
        write_eval(out / "holdout", cfg, label, adapter, "holdout", h, 30)
        write_eval(out / "adversarial", cfg, label, adapter, "adversarial", a, 16)

    def as_(identity: str | None) -> AdapterRegistry:
        return AdapterRegistry.from_config(cfg, create=True, identity_file=files[identity] if identity else None)

    return cfg, as_, tracked_run.adapter, [out / "holdout", out / "adversarial"], files


def test_roles_gate_every_change_and_the_registrant_cannot_promote_to_production(guarded, monkeypatch):
    cfg, as_, adapter, eval_dirs, _ = guarded
    monkeypatch.delenv("VLRL_IDENTITY_FILE", raising=False)
    with pytest.raises(VlrlError, match="say who acts with --identity-file"):
        as_(None).register(adapter, eval_dirs)
    with pytest.raises(
        VlrlError, match=r"identity vic \(viewer\) may not register adapters: that needs the role trainer"
    ):
        as_("vic").register(adapter, eval_dirs)
    name = as_("abe").register(adapter, eval_dirs)[
        "name"
    ]  # an approver may register too (roles include the ones below)
    reg = as_("abe")
    assert reg.show(name, 1)["tags"]["registered_identity"] == "abe"

    with pytest.raises(VlrlError, match=r"identity tara \(trainer\) may not promote: that needs the role approver"):
        as_("tara").promote(name, 1)
    assert as_("abe").promote(name, 1).passed  # to staging: the two-person rule is about production

    before = snapshot(reg)
    with pytest.raises(VlrlError) as refused:
        as_("abe").promote(name, 1, "production")
    assert (
        str(refused.value)
        == f"two-person rule: abe registered {name} v1, so another approver must promote it to production"
    )
    assert snapshot(reg) == before and before[name]["aliases"] == {"staging": 1}  # nothing changed
    assert as_("ann").promote(name, 1, "production").passed
    assert reg.client.get_registered_model(name).aliases == {"production": 1}
    with pytest.raises(VlrlError, match=r"identity tara \(trainer\) may not roll back"):
        as_("tara").rollback(name)

    log = reg.history(name)
    assert [(e["action"], e.get("identity"), e.get("role"), e.get("to"), e.get("decision")) for e in log] == [
        ("register", "abe", "approver", None, None),
        ("promote", "tara", "trainer", None, "refused"),
        ("promote", "abe", "approver", "staging", "passed"),
        ("promote", "abe", "approver", "production", "refused"),
        ("promote", "ann", "approver", "production", "passed"),
        ("rollback", "tara", "trainer", "production", "refused"),
    ]
    assert log[3]["registered_identity"] == "abe" and log[4]["settings"]["two_person_rule"] is True
    assert json.loads(reg.show(name, 1)["tags"]["gate.production"])["by"].startswith("ann (")


def test_bad_identity_files_are_one_clear_line_and_write_nothing(guarded, tmp_path):
    cfg, as_, adapter, eval_dirs, files = guarded
    files["tara"].chmod(0o644)
    with pytest.raises(VlrlError, match="readable or writable by every user"):
        as_("tara").register(adapter, eval_dirs)
    files["tara"].chmod(0o600)
    files["tara"].write_text("")
    with pytest.raises(VlrlError, match="is empty"):
        as_("tara").register(adapter, eval_dirs)
    reg = as_("abe")
    assert reg.list_models() == [] and not reg.audit_path.exists()  # nothing registered, nothing logged


def test_two_person_rule_needs_identities():
    from vlrl.config import load_config

    with pytest.raises(ConfigError, match="registry.two_person_rule needs registry.access_dir"):
        load_config(None, ["registry.two_person_rule=true"])


def test_cli_refuses_then_allows_a_promotion_and_history_names_the_identities(guarded, monkeypatch):
    cfg, as_, adapter, eval_dirs, files = guarded
    uri = ["--uri", str(as_("abe").uri), f"registry.access_dir={files['abe'].parent}", "registry.two_person_rule=true"]
    runner = CliRunner()

    def vlrl(identity: str, *args: str):
        monkeypatch.setenv("VLRL_IDENTITY_FILE", str(files[identity]))
        return runner.invoke(app, ["registry", *args, *uri])

    assert vlrl("abe", "register", str(adapter), *sum((["--eval", str(d)] for d in eval_dirs), [])).exit_code == 0
    name = as_("abe").list_models()[0]["name"]
    assert vlrl("abe", "promote", name, "1", "--to", "staging").exit_code == 0
    refused = vlrl("abe", "promote", name, "1", "--to", "production")
    assert isinstance(refused.exception, VlrlError) and "two-person rule: abe registered" in str(refused.exception)
    allowed = vlrl("ann", "promote", name, "1", "--to", "production", "--reason", "second pair of eyes")
    assert allowed.exit_code == 0 and "is now in production" in allowed.output, allowed.output
    print(
        "".join(line + "\n" for line in as_("abe").audit_path.read_text().splitlines())
    )  # the evidence, with `pytest -s`
    shown = runner.invoke(app, ["registry", "history", name, "--uri", str(as_("abe").uri)], terminal_width=200)
    print(shown.output)
    assert "abe (approver)" in shown.output and "ann (approver)" in shown.output and "two-person rule" in shown.output
