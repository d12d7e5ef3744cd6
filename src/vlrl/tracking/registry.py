"""The adapter registry: MLflow registered models, stage aliases, a promotion gate, rollback.

One registered model per task and base model, named by `registry.model_name` (default
`{env}-{base}`, e.g. `maze-3f2a9c0d1b7e`). A version is one adapter directory (MLflow `source`
= its absolute path; the registry references adapters, it does not copy them, and the adapter
fingerprint tag detects a changed or missing directory). Versions carry their lineage as tags.

Stages are aliases: `register` gives the new version `candidate`; `promote` moves a version to
`staging`, then `staging` -> `production`; every promotion runs the gate (`tracking.gate`) against
the current production version, or the base model when there is none. `rollback` points
`production` back at the previous production version (the model's `production_history` tag).

Where the gate's numbers come from: evaluation summaries written by `vlrl eval -o DIR`, given at
registration (`register ADAPTER --eval DIR ...`). The candidate's own summaries become version
tags `eval.<split>.*`; the summaries of the other models evaluated in the same run (the base model,
other adapters) on the same tasks are kept as `eval.<split>.peers`, so the gate compares models
that played exactly the same tasks. Registering the same adapter again updates its evaluations.

Every decision (registration, promotion passed or refused, rollback) is appended to a JSONL audit
log (`registry.audit_log`, default registry-audit.jsonl next to the SQLite database) with who
(user, host), when, why (`--reason`) and the numbers; the version's `gate.<stage>` tag keeps the
last decision. Bad input (unknown model or version, an adapter of another base, a missing or
locked database) raises VlrlError before anything is written.

Roles (`registry.access_dir`, `vlrl.access`, docs/security.md): when set, the acting identity is
the one whose token is in `identity_file` (--identity-file, else $VLRL_IDENTITY_FILE); register
needs `trainer`, promote and rollback `approver`. With `registry.two_person_rule`, promotion to
production is refused to the identity that registered the version (tag `registered_identity`).
A refusal for a role or the two-person rule changes nothing but is recorded in the audit log,
whose entries name the identity and its role.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from vlrl.access import Identity, identity_from_file
from vlrl.config import RunConfig
from vlrl.errors import VlrlError
from vlrl.tracking.gate import EvalRecord, GateDecision, promotion_gate
from vlrl.tracking.lineage import adapter_fingerprint, adapter_info, now_iso, read_adapter_lineage, who
from vlrl.tracking.registry_tags import (
    BASE_PEER,
    SPLITS,
    discordant_from_files,
    eval_tags,
    evals_from_tags,
    read_eval_summaries,
    version_tags,
)
from vlrl.tracking.store import check_sqlite, mlflow_client, mlflow_errors, registry_uri, sqlite_path

STAGES = ("candidate", "staging", "production")


def model_name_for(template: str, env: str, base_fingerprint: str) -> str:
    """The registered model's name from `registry.model_name`, e.g. '{env}-{base}' -> 'maze-3f2a9c0d1b7e'."""
    base = base_fingerprint.split(":", 1)[-1][:12]
    try:
        return template.format(env=env, base=base, fingerprint=base_fingerprint.split(":", 1)[-1])
    except (KeyError, IndexError, ValueError) as exc:
        raise VlrlError(
            f"registry.model_name {template!r} is not a valid template ({exc}); use {{env}} and {{base}}"
        ) from None


class AdapterRegistry:
    """Registered adapters in an MLflow model registry, with the gate and the audit log."""

    def __init__(self, uri: str, config: RunConfig, *, create: bool = False, identity_file: str | Path | None = None):
        self.uri = uri
        self.settings = config.registry
        self.storage_root = config.storage.root
        self.identity_file = identity_file
        check_sqlite(uri, must_exist=not create, lock_timeout_s=self.settings.lock_timeout_s, what="registry database")
        self.client = mlflow_client(uri)

    @classmethod
    def from_config(
        cls, config: RunConfig, uri: str | None = None, *, create: bool = False, identity_file: str | Path | None = None
    ) -> AdapterRegistry:
        """The registry of `config` (`registry.uri`, else the tracking store), or `uri` when given."""
        from vlrl.tracking.store import normalize_uri

        return cls(
            normalize_uri(uri) if uri else registry_uri(config), config, create=create, identity_file=identity_file
        )

    # -- who acts ----------------------------------------------------------------------------
    def actor(self) -> Identity | None:
        """The acting identity (None when registry.access_dir is unset: no roles)."""
        token_file = self.identity_file or os.environ.get("VLRL_IDENTITY_FILE") or None
        if not self.settings.access_dir:
            if self.identity_file:
                raise VlrlError(
                    "--identity-file was given but registry.access_dir is not set, so no identity can be checked; "
                    "set registry.access_dir or drop --identity-file"
                )
            return None
        if token_file is None:
            raise VlrlError(
                f"registry.access_dir is set ({self.settings.access_dir}): say who acts with --identity-file PATH "
                "or VLRL_IDENTITY_FILE (the file holding your token)"
            )
        return identity_from_file(self.settings.access_dir, token_file)

    def _authorize(self, needed: str, action: str, entry: dict[str, Any]) -> Identity | None:
        """The actor, after checking its role; a refusal is audited, then raised (nothing else changes)."""
        actor = self.actor()
        if actor is not None and not actor.may(needed):
            why = f"identity {actor.name} ({actor.role}) may not {action}: that needs the role {needed} or higher"
            self._audit({**entry, "decision": "refused", "why": why}, actor)
            raise VlrlError(why)
        return actor

    # -- audit -------------------------------------------------------------------------------
    @property
    def audit_path(self) -> Path:
        """registry.audit_log, else registry-audit.jsonl next to the SQLite file (or under storage.root)."""
        if self.settings.audit_log:
            return Path(self.settings.audit_log)
        db = sqlite_path(self.uri)
        return (db.parent if db is not None else Path(self.storage_root)) / "registry-audit.jsonl"

    def _audit(self, entry: dict[str, Any], actor: Identity | None = None) -> dict[str, Any]:
        acting = {"identity": actor.name, "role": actor.role} if actor else {}
        record = {
            "time": now_iso(),
            **who(),
            **acting,
            "registry": self.uri,
            "command": " ".join(sys.argv[1:]) or None,
            **entry,
        }
        path = self.audit_path
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=str) + "\n")
        return record

    def history(self, name: str | None = None) -> list[dict[str, Any]]:
        """Audit log entries, oldest first (only those of model `name` when given)."""
        if name is not None:
            self._model(name)
        path = self.audit_path
        if not path.is_file():
            return []
        entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [e for e in entries if name is None or e.get("model") == name]

    # -- reading -----------------------------------------------------------------------------
    def _model(self, name: str):
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_registered_model(name)
        except MlflowException:
            known = [m["name"] for m in self.list_models()]
            raise VlrlError(
                f"no registered model '{name}'; known: {', '.join(known) or 'none (register an adapter first)'}"
            ) from None

    def _version(self, name: str, version: str | int):
        """A version by number ('3', 'v3') or by alias ('@production', 'production')."""
        from mlflow.exceptions import MlflowException

        model = self._model(name)
        text = str(version).strip()
        alias = text.lstrip("@")
        if alias in STAGES or text.startswith("@"):
            if alias not in model.aliases:
                raise VlrlError(f"model '{name}' has no {alias} version; aliases: {model.aliases or 'none'}")
            text = str(model.aliases[alias])
        text = text.lstrip("vV")
        if not text.isdigit():
            raise VlrlError(f"version {version!r} is not a number or a stage ({', '.join(STAGES)})")
        try:
            return self.client.get_model_version(name, text)
        except MlflowException:
            known = sorted(int(v.version) for v in self.client.search_model_versions(f"name='{name}'"))
            raise VlrlError(
                f"model '{name}' has no version {text}; versions: {', '.join(map(str, known)) or 'none'}"
            ) from None

    def list_models(self) -> list[dict[str, Any]]:
        """Registered models with their base, stage aliases and number of versions."""
        with mlflow_errors(f"reading the registry {self.uri}"):
            models = self.client.search_registered_models(max_results=1000)
            return [
                {
                    "name": m.name,
                    "base_fingerprint": m.tags.get("base_fingerprint"),
                    "env": m.tags.get("env"),
                    "aliases": dict(m.aliases),
                    "versions": len(self.client.search_model_versions(f"name='{m.name}'")),
                }
                for m in models
            ]

    def versions(self, name: str) -> list[dict[str, Any]]:
        """Every version of a model, newest first: stage, adapter, holdout/adversarial success."""
        with mlflow_errors(f"reading the registry {self.uri}"):
            model = self._model(name)
            stage_of = {int(v): a for a, v in model.aliases.items()}
            rows = []
            for v in sorted(self.client.search_model_versions(f"name='{name}'"), key=lambda v: -int(v.version)):
                evals = evals_from_tags(v.tags)
                rows.append(
                    {
                        "version": int(v.version),
                        "stage": stage_of.get(int(v.version), "-"),
                        "source": v.source,
                        "created": v.creation_timestamp,
                        **{s: evals[s].describe() if s in evals else "-" for s in SPLITS},
                    }
                )
            return rows

    def show(self, name: str, version: str | int | None = None) -> dict[str, Any]:
        """One version (default: production, else the newest) with its tags, stage and file check."""
        with mlflow_errors(f"reading the registry {self.uri}"):
            model = self._model(name)
            if version is None:
                version = model.aliases.get("production") or max(
                    (int(v.version) for v in self.client.search_model_versions(f"name='{name}'")), default=None
                )
                if version is None:
                    raise VlrlError(f"model '{name}' has no versions")
            v = self._version(name, version)
            stages = [a for a, n in model.aliases.items() if str(n) == str(v.version)]
            return {
                "name": name,
                "version": int(v.version),
                "stages": stages,
                "source": v.source,
                "run_id": v.run_id,
                "tags": dict(v.tags),
                "files": self._files_state(v),
                "model_tags": dict(model.tags),
            }

    @staticmethod
    def _files_state(v) -> str:
        path = Path(v.source)
        if not path.is_dir():
            return "MISSING"
        try:
            return "unchanged" if adapter_fingerprint(path) == v.tags.get("adapter_fingerprint") else "CHANGED"
        except VlrlError:
            return "CHANGED"

    # -- register ----------------------------------------------------------------------------
    def register(
        self,
        adapter_dir: str | Path,
        eval_dirs: Iterable[str | Path] = (),
        *,
        name: str | None = None,
        reason: str | None = None,
    ) -> dict[str, Any]:
        """Register an adapter (with its lineage and evaluations) as the model's `candidate`.

        Registering an adapter that is already a version of the model (same fingerprint) updates
        that version's evaluations instead of adding a version.
        """
        actor = self._authorize("trainer", "register adapters", {"action": "register", "adapter": str(adapter_dir)})
        info = adapter_info(adapter_dir)
        lineage = read_adapter_lineage(adapter_dir)
        if lineage is None:
            raise VlrlError(
                f"adapter {adapter_dir} has no vlrl_lineage.json, so it cannot be traced; register adapters "
                "saved by a tracked run (tracking.write_adapter_lineage)"
            )
        base_fp = info["base_fingerprint"]
        env = lineage.get("data", {}).get("env", "env")
        name = name or model_name_for(self.settings.model_name, env, base_fp)
        tags = version_tags(info, lineage)
        if actor is not None:
            tags["registered_identity"] = actor.name  # what the two-person rule compares
        tags.update(eval_tags(info, read_eval_summaries(eval_dirs), self.settings.decoding))
        with mlflow_errors(f"registering {adapter_dir} in {self.uri}"):
            from mlflow.exceptions import MlflowException

            try:
                model = self.client.get_registered_model(name)
            except MlflowException:
                model = None
            if model is not None and model.tags.get("base_fingerprint") != base_fp:
                raise VlrlError(
                    f"registered model '{name}' is for base model {model.tags.get('base_fingerprint')}, but adapter "
                    f"{adapter_dir} was trained on {base_fp}; adapters of another base go to another model"
                )
            existing = [
                v
                for v in (self.client.search_model_versions(f"name='{name}'") if model else [])
                if v.tags.get("adapter_fingerprint") == info["fingerprint"]
            ]
            if model is None:
                self.client.create_registered_model(
                    name,
                    tags={
                        "env": env,
                        "base_fingerprint": base_fp,
                        "base_model": lineage.get("model", {}).get("path", ""),
                        "production_history": "[]",
                    },
                    description=f"LoRA adapters for {env} on base model {base_fp}",
                )
            if existing:
                # The same weights (possibly saved by another run, e.g. a GRPO run that changed nothing):
                # the version keeps the lineage it was registered with; only evaluations are updated.
                version = existing[0].version
                for key, value in tags.items():
                    if key.startswith("eval.") or (key == "registered_identity" and key not in existing[0].tags):
                        # a version registered before identities were required gets its registrant now
                        self.client.set_model_version_tag(name, version, key, value)
                action = "update-evals"
                if existing[0].source != info["path"]:
                    reason = f"{reason + '; ' if reason else ''}same weights as {existing[0].source}"
            else:
                run_id = info.get("mlflow_run_id")
                if run_id:
                    try:
                        self.client.get_run(run_id)
                    except MlflowException:
                        run_id = None  # the run lives in another tracking store; the tag keeps its id
                v = self.client.create_model_version(
                    name, source=info["path"], run_id=run_id, tags=tags, description=f"adapter {info['path']}"
                )
                version = v.version
                self.client.set_registered_model_alias(name, "candidate", version)
                action = "register"
        evals = evals_from_tags(tags)
        source = existing[0].source if existing else info["path"]
        entry = self._audit(
            {
                "action": action,
                "model": name,
                "version": int(version),
                "adapter": info["path"],
                "source": source,
                "adapter_fingerprint": info["fingerprint"],
                "reason": reason,
                "evals": {s: e.to_json() for s, e in evals.items()},
            },
            actor,
        )
        return {
            "name": name,
            "version": int(version),
            "action": action,
            "evals": evals,
            "source": source,
            "audit": entry,
        }

    # -- promote -----------------------------------------------------------------------------
    def _baseline(self, name: str, model, candidate) -> tuple[str, dict[str, EvalRecord]]:
        """The records to beat: production's on the candidate's tasks, or the base model's."""
        cand = evals_from_tags(candidate.tags)
        prod_version = model.aliases.get("production")
        if prod_version is not None and str(prod_version) != str(candidate.version):
            prod = self.client.get_model_version(name, str(prod_version))
            if prod.tags.get("base_fingerprint") != candidate.tags.get("base_fingerprint"):
                raise VlrlError(
                    f"production v{prod.version} of '{name}' has base {prod.tags.get('base_fingerprint')}, "
                    f"v{candidate.version} has {candidate.tags.get('base_fingerprint')}; they cannot be compared"
                )
            label, key, own = (
                f"production v{prod.version}",
                prod.tags.get("adapter_fingerprint"),
                evals_from_tags(prod.tags),
            )
            own_tags = dict(prod.tags)
        else:
            label, key, own, own_tags = "base model", BASE_PEER, {}, {}
        baseline = {}
        for split, record in cand.items():
            peers = json.loads(candidate.tags.get(f"eval.{split}.peers", "{}"))
            if key in peers:  # evaluated in the same run as the candidate: the same tasks by construction
                successes, n, *pair = peers[key]
                baseline[split] = EvalRecord(
                    split,
                    int(successes),
                    int(n),
                    record.decoding,
                    record.split_version,
                    record.tasks_hash,
                    (int(pair[0]), int(pair[1])) if pair else None,
                )
            elif split in own:
                same = own[split].same_tasks(record)  # otherwise the gate refuses: evaluated on different tasks
                baseline[split] = replace(
                    own[split], discordant=discordant_from_files(candidate.tags, own_tags, split) if same else None
                )
        return label, baseline

    def promote(self, name: str, version: str | int, to: str | None = None, reason: str | None = None) -> GateDecision:
        """Run the gate and, when it passes, move the stage alias `to` (default: the next stage).

        Returns the decision; a refusal changes no alias (it is recorded in the audit log and the
        version's `gate.<stage>` tag).
        """
        what = f"promoting {name} v{version}"
        attempt = {"action": "promote", "model": name, "version": str(version).lstrip("vV"), "to": to, "reason": reason}
        actor = self._authorize("approver", "promote", attempt)
        with mlflow_errors(what):
            model = self._model(name)
            v = self._version(name, version)
            stages = [a for a, n in model.aliases.items() if str(n) == str(v.version)]
            if to is None:
                to = "production" if "staging" in stages else "staging"
            if to not in ("staging", "production"):
                raise VlrlError(f"promote --to must be staging or production, got {to!r}")
            if to in stages or "production" in stages:
                raise VlrlError(f"{name} v{v.version} is already in {'production' if 'production' in stages else to}")
            if to == "production" and "staging" not in stages:
                raise VlrlError(f"{name} v{v.version} is not in staging; promote it to staging first")
            if to == "production" and self.settings.two_person_rule:
                self._check_two_persons(
                    name, v, actor, {**attempt, "version": int(v.version), "to": to, "from": stages}
                )
            if v.tags.get("base_fingerprint") != model.tags.get("base_fingerprint"):
                raise VlrlError(
                    f"{name} v{v.version} was trained on base model {v.tags.get('base_fingerprint')}, but '{name}' "
                    f"is for {model.tags.get('base_fingerprint')}; it cannot be promoted here"
                )
            files = self._files_state(v)
            if files != "unchanged":
                raise VlrlError(
                    f"the adapter of {name} v{v.version} at {v.source} is {files} since registration; register it again"
                )
            baseline_label, baseline = self._baseline(name, model, v)
            decision = promotion_gate(
                evals_from_tags(v.tags),
                baseline,
                candidate_label=f"v{v.version}",
                baseline_label=baseline_label,
                holdout_margin=self.settings.holdout_margin,
                max_adversarial_drop=self.settings.max_adversarial_drop,
                max_p_value=self.settings.max_p_value,
            )
        previous = model.aliases.get(to)
        entry = self._audit(
            {
                "action": "promote",
                "model": name,
                "version": int(v.version),
                "from": stages or ["-"],
                "to": to,
                "decision": "passed" if decision.passed else "refused",
                "why": decision.reasons(),
                "reason": reason,
                "replaces": previous,
                "gate": decision.to_json(),
                "settings": {
                    "holdout_margin": self.settings.holdout_margin,
                    "max_p_value": self.settings.max_p_value,
                    "max_adversarial_drop": self.settings.max_adversarial_drop,
                    "decoding": self.settings.decoding,
                    "two_person_rule": self.settings.two_person_rule,
                },
            },
            actor,
        )
        with mlflow_errors(what):
            self.client.set_model_version_tag(
                name,
                v.version,
                f"gate.{to}",
                json.dumps(
                    {
                        "time": entry["time"],
                        "by": _by(entry),
                        "decision": entry["decision"],
                        "why": entry["why"],
                        "reason": reason,
                    }
                ),
            )
            if decision.passed:
                self.client.set_registered_model_alias(name, to, v.version)
                if (
                    to == "staging"
                    and model.aliases.get("candidate") is not None
                    and str(model.aliases["candidate"]) == str(v.version)
                ):
                    self.client.delete_registered_model_alias(name, "candidate")
                if to == "production":
                    self.client.delete_registered_model_alias(name, "staging")
                    history = json.loads(model.tags.get("production_history", "[]"))
                    self.client.set_registered_model_tag(
                        name, "production_history", json.dumps(history + [int(v.version)])
                    )
        return decision

    # -- rollback ----------------------------------------------------------------------------
    def rollback(self, name: str, reason: str | None = None) -> dict[str, Any]:
        """Point `production` back at the previous production version; returns {from, to}."""
        what = f"rolling back {name}"
        actor = self._authorize(
            "approver", "roll back", {"action": "rollback", "model": name, "to": "production", "reason": reason}
        )
        with mlflow_errors(what):
            model = self._model(name)
            current = model.aliases.get("production")
            if current is None:
                raise VlrlError(f"model '{name}' has no production version to roll back")
            history = [int(x) for x in json.loads(model.tags.get("production_history", "[]"))]
            earlier = [x for x in history if x != int(current)]
            if not earlier:
                raise VlrlError(f"{name} v{current} is the first production version; there is nothing to roll back to")
            target = self._version(name, earlier[-1])
            if target.tags.get("base_fingerprint") != model.tags.get("base_fingerprint"):
                raise VlrlError(f"{name} v{target.version} has another base model; refusing to roll back to it")
            files = self._files_state(target)
            if files != "unchanged":
                raise VlrlError(
                    f"the adapter of {name} v{target.version} at {target.source} is {files}; cannot roll back to it"
                )
        entry = self._audit(
            {
                "action": "rollback",
                "model": name,
                "version": int(target.version),
                "from": int(current),
                "to": "production",
                "decision": "rolled back",
                "reason": reason,
                "why": f"production v{current} -> v{target.version}",
            },
            actor,
        )
        with mlflow_errors(what):
            self.client.set_registered_model_alias(name, "production", target.version)
            # history without the rolled-back version's last entry, so a second rollback goes further back
            trimmed = (
                history[: len(history) - 1 - history[::-1].index(int(current))] if int(current) in history else history
            )
            self.client.set_registered_model_tag(name, "production_history", json.dumps(trimmed))
            self.client.set_model_version_tag(
                name,
                str(current),
                "rolled_back",
                json.dumps({"time": entry["time"], "by": _by(entry), "to": int(target.version), "reason": reason}),
            )
        return {"name": name, "from": int(current), "to": int(target.version), "audit": entry}

    def _check_two_persons(self, name: str, v, actor: Identity | None, attempt: dict[str, Any]) -> None:
        """Refuse (audited, nothing else changed) a promotion to production by the version's registrant."""
        registrant = v.tags.get("registered_identity")
        if registrant is None:
            why = (
                f"two-person rule: {name} v{v.version} was registered without an identity, so nobody can tell "
                "who registered it; register its adapter again (that records the identity), then let another "
                "approver promote it"
            )
        elif actor is not None and registrant == actor.name:
            why = (
                f"two-person rule: {actor.name} registered {name} v{v.version}, so another approver must promote it "
                "to production"
            )
        else:
            return
        self._audit({**attempt, "decision": "refused", "why": why, "registered_identity": registrant}, actor)
        raise VlrlError(why)


def _by(entry: dict[str, Any]) -> str:
    """Who acted, for version tags: the identity when there is one, and always user@host."""
    where = f"{entry['user']}@{entry['host']}"
    return f"{entry['identity']} ({where})" if entry.get("identity") else where
