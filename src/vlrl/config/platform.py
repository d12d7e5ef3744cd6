"""Where and how a run executes and is kept: Ray runtime, storage, tracking, the adapter registry
and serving."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from vlrl.sections import Section

# runtime, storage, tracking, serving


class RuntimeConfig(Section):
    backend: Literal["ray", "local"] = Field(
        "ray",
        description=(
            "`ray`: workers are Ray actors in a placement group (a local Ray instance is started when no "
            "address is given); `local`: one in-process worker, no Ray (unit tests, notebooks)."
        ),
    )
    address: str | None = Field(
        None,
        description="Ray cluster to join (host:port of the GCS, ray://host:10001, or auto); None: RAY_ADDRESS, else a "
        "local instance.",
    )
    num_workers: int = Field(
        1,
        ge=1,
        description="Worker actors, one per device (GPU, or CPU slot without GPUs); >1 shards the policy with FSDP2.",
    )
    use_gpu: bool = Field(False, description="One GPU per worker; False runs workers on CPU slots.")
    cpus_per_worker: int = Field(1, ge=1, description="CPU cores reserved for each worker.")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = Field(
        "PACK", description="Ray placement group strategy; STRICT_SPREAD puts each worker on its own node."
    )
    placement_timeout_s: float = Field(
        120.0, gt=0, description="Give up with an error if the placement group is not ready by then."
    )
    collective_timeout_s: float = Field(
        600.0,
        gt=0,
        description="torch.distributed timeout: a collective waiting longer (a dead peer) fails instead of hanging.",
    )
    torch_threads: int | None = Field(
        None, ge=1, description="torch intra-op threads per worker (None: torch's default; Ray sets cpus_per_worker)."
    )
    object_store_memory_mb: int = Field(300, ge=64, description="Object store of a local Ray instance, in MiB.")
    max_restarts: int = Field(
        3,
        ge=0,
        description=(
            "When a worker actor dies (its process or node lost), rebuild the worker group, reload the last checkpoint "
            "and continue, at most this many times per `vlrl train` process (0: the run fails at the first death). "
            "Each restart is logged and counted in the metric `run/restarts`."
        ),
    )

    @model_validator(mode="after")
    def _check(self) -> RuntimeConfig:
        if self.backend == "local" and self.num_workers > 1:
            raise ValueError(
                f"num_workers = {self.num_workers} needs backend 'ray' (the local backend runs one in-process worker)"
            )
        return self


class StorageConfig(Section):
    root: str = Field(
        "runs", description="Shared storage: a POSIX path (e.g. /fsx) or fsspec URL for runs and artifacts."
    )
    run_name: str | None = Field(None, description="Run directory name under root/ (default: a timestamp).")


class TrackingConfig(Section):
    enabled: bool = Field(False, description="Log to MLflow.")
    uri: str | None = Field(
        None,
        description="MLflow tracking URI (e.g. http://mlflow:5000 for a server); None uses SQLite at "
        "<storage.root>/mlflow.db.",
    )
    experiment: str = Field("vlrl", description="MLflow experiment name.")
    log_artifacts: bool = Field(
        True,
        description="At the end of a tracked run, copy the adapter, lineage, config and metrics into MLflow's "
        "artifact store.",
    )
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Ray's metrics export port on every node (`ray start --metrics-export-port`); the cluster "
        "manifests declare it and the PodMonitor scrapes it. vlrl's own training metrics use exporter_port.",
    )
    exporter_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Serve the run's training metrics (vlrl_*, docs/observability.md) for Prometheus on this port "
        "of the driver; 0 picks a free port, None turns the exporter off. Must differ from metrics_port: "
        "on a Ray head the driver and Ray's metrics agent share the pod.",
    )
    exporter_host: str = Field(
        "127.0.0.1",
        description="Address the exporter binds: 127.0.0.1 on a workstation, 0.0.0.0 in a pod that Prometheus scrapes.",
    )


class RegistryConfig(Section):
    uri: str | None = Field(
        None,
        description="MLflow model registry URI (or a path to a .db file); None uses the tracking store (tracking.uri, "
        "else <storage.root>/mlflow.db).",
    )
    model_name: str = Field(
        "{env}-{base}",
        description="Registered model name, one per task and base model: {env} is env.name, {base} the first 12 hex "
        "digits of the base fingerprint.",
    )
    holdout_margin: float = Field(
        0.02,
        ge=0,
        le=1,
        description="Promotion gate: holdout success must beat production (or the base model) by at least this much "
        "(0.02 = 2 points), and pass the paired test (registry.max_p_value).",
    )
    max_p_value: float = Field(
        0.05,
        gt=0,
        le=1,
        description="Promotion gate: McNemar's exact two-sided p-value on the holdout tasks only one of candidate and "
        "production (or the base model) solved must be below this, with the candidate solving more of them.",
    )
    max_adversarial_drop: float = Field(
        0.02,
        ge=0,
        le=1,
        description="Promotion gate: adversarial success may fall at most this much below production (or the base "
        "model).",
    )
    decoding: Literal["greedy", "sampled"] = Field(
        "greedy", description="Which decoding's evaluation summaries the gate compares."
    )
    audit_log: str | None = Field(
        None,
        description="JSONL audit log of registrations, promotions and rollbacks; None: registry-audit.jsonl next to "
        "the SQLite DB (or under storage.root).",
    )
    lock_timeout_s: float = Field(
        5.0, gt=0, description="How long to wait for a locked SQLite registry before giving up with an error."
    )
    access_dir: str | None = Field(
        None,
        description="Identities and roles (docs/security.md): a directory of NAME.sha256 digests (or NAME.token "
        "files) and roles.yaml. When set, register needs the role trainer, "
        "promote and rollback approver, and the acting identity is the one whose token is in --identity-file (or "
        "$VLRL_IDENTITY_FILE); "
        "None: no roles, anyone who can write the registry acts (the audit log records the OS user).",
    )
    two_person_rule: bool = Field(
        False,
        description="Promotion to production needs an identity other than the one that registered the version (needs "
        "access_dir). Off for local use; on in the cluster config.",
    )

    @model_validator(mode="after")
    def _check(self) -> RegistryConfig:
        if self.two_person_rule and not self.access_dir:
            raise ValueError(
                "registry.two_person_rule needs registry.access_dir: without identities there is no second person "
                "to tell apart"
            )
        return self


class ServingConfig(Section):
    host: str = Field("127.0.0.1", description="Address the OpenAI-compatible server binds.")
    port: int = Field(8000, ge=1, le=65535, description="Port of the server.")
    max_model_len: int = Field(4096, ge=64, description="Longest request in tokens.")
    max_loras: int = Field(4, ge=1, description="Adapters resident at once.")
    max_lora_rank: int | None = Field(
        None,
        ge=1,
        description="Largest LoRA rank a (later swapped-in) adapter may have; None: the smallest vLLM rank that fits "
        "the adapters served at start.",
    )
    kv_cache_mb: int | None = Field(
        None,
        ge=16,
        description="KV cache size in MiB (vLLM's --kv-cache-memory-bytes); None: vLLM's default on GPU, 256 on CPU, "
        "where it must be set.",
    )
    max_images: int = Field(
        20,
        ge=1,
        description="Images per request; a multi-turn conversation re-sends every turn's image (up to env.max_turns "
        "of them).",
    )
    ready_timeout_s: float = Field(
        900.0, gt=0, description="Give up when the server is not ready (all adapters loaded) by then."
    )
