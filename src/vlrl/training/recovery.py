"""Resume and recover: putting a run back to a checkpoint, and writing the checkpoints.

`RecoveryMixin` is the checkpoint side of `vlrl.training.trainer.GRPOTrainer`, kept apart from
the step loop:

    save_checkpoint       every train.checkpoint_every steps and at the end (format: checkpoint.py)
    load_checkpoint       `--resume auto|PATH`: the newest valid checkpoint, config changes checked
    recover               a worker died (`WorkerDiedError`): new worker group, newest valid
                          checkpoint (or step 0), at most runtime.max_restarts times per process
    newest_restorable     where a restart or a guard's rollback goes back to
    _restore              the one path all of them take: workers, sampler, history, random states

Restoring puts back everything a step depends on, random states last, so a resumed, restarted or
rolled-back run replays the steps it lost exactly (tests/training/test_checkpoint.py,
tests/runtime/test_recovery.py).

The mixin works on the trainer's state (declared at the top of the class) and uses its
run-directory helpers (`_make_workers`, `_write_config`, `_rewrite_metrics`, `_event`).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from vlrl.config import RunConfig, config_to_yaml
from vlrl.envs.base import build_split, split_version
from vlrl.errors import VlrlError, WorkerDiedError
from vlrl.runtime.worker_api import WorkerGroup
from vlrl.training.checkpoint import CheckpointStore, check_resume_config, find_checkpoint, read_checkpoint, verify
from vlrl.training.guards import GuardState
from vlrl.training.sampler import TaskSampler
from vlrl.training.seeding import rng_state, set_rng_state

log = logging.getLogger(__name__)


class RecoveryMixin:
    """Checkpoints, resume and restart of `GRPOTrainer` (see the module docstring)."""

    # The trainer's state this side reads and restores (set by GRPOTrainer.__init__ and setup).
    config: RunConfig
    worker: WorkerGroup
    checkpoints: CheckpointStore
    sampler: TaskSampler
    step_idx: int
    history: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    restarts: int  # over the whole run (kept in checkpoints)
    session_restarts: int  # by this process: runtime.max_restarts bounds these
    config_changes: list[dict[str, Any]]
    guard_state: GuardState
    resumed_from: str | None
    _fingerprint: str | None
    _checkpoint_s: float
    _start_rng: dict[str, Any]

    # -- checkpoints -----------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        """Checkpoint the current step: adapter, optimizer and scheduler (sharded), every worker's
        random states, sampler position, metric history and evaluations, config, manifest."""
        rng_states = self.worker.rng_states()
        trainer = {
            "sampler": self.sampler.state_dict(),
            "split_versions": self._split_versions(),
            "base_fingerprint": self._base_fingerprint(),
            "history": self.history,
            "evals": self.evals,
            "restarts": self.restarts,
            "config_changes": self.config_changes,
            "guards": self.guard_state.as_dict(),
            "driver_rng": rng_state(),
        }
        start = time.perf_counter()
        path = self.checkpoints.save(
            self.step_idx,
            adapter=self.worker.adapter_state(),
            write_optimizer=self.worker.save_optimizer_state,
            rng_states=rng_states,
            trainer=trainer,
            config_yaml=config_to_yaml(self.config),
        )
        self._checkpoint_s += time.perf_counter() - start
        return Path(path)

    def load_checkpoint(self, resume: str | Path) -> Path | None:
        """Resume: `auto` takes this run's newest valid checkpoint (a fresh start, logged, when
        there is none); a path may name a checkpoint, a checkpoints directory or a run directory.
        A damaged checkpoint is reported and the one before it used; a config that changed in a
        way that would change the run is refused (`vlrl.training.checkpoint.RESUME_SAFE_KEYS`)."""
        path = find_checkpoint(str(resume), self.checkpoints.root)
        if path is None:
            log.info("no checkpoint in %s yet: starting the run from step 0", self.checkpoints.root)
            return None
        self._restore(path)
        log.info("resumed from %s (step %d of %d)", path, self.step_idx, self.config.train.steps)
        return Path(path)

    def _restore(self, path: str, after_restart: bool = False, event: str | None = None, **event_fields: Any) -> None:
        """Put the trainer and its workers in the state of checkpoint `path` (verified).

        A resume also takes the guards' state (LR scale, rollbacks) from the checkpoint; a restart
        or a guard's rollback (`after_restart`) keeps this process's, which is newer."""
        ckpt = read_checkpoint(path)
        changes = check_resume_config(ckpt.config, self.config.model_dump(mode="json"), f"from {path}")
        self._check_same_base_and_tasks(ckpt.trainer, path)
        if os.path.dirname(path) == self.checkpoints.root:
            self.checkpoints.remove_newer_than(ckpt.step)
        self.worker.load_adapter_state(ckpt.adapter)
        self.worker.load_optimizer_state(ckpt.optimizer_path)
        self.worker.sync_adapter(ckpt.step)
        state = ckpt.trainer
        self.step_idx = ckpt.step
        self.sampler.load_state_dict(state["sampler"])
        self.history, self.evals = state["history"], state["evals"]
        self.config_changes = state.get("config_changes", [])
        if not after_restart:
            self.restarts = int(state.get("restarts", 0))
            self.guard_state = GuardState.from_dict(state.get("guards"))
        if self.guard_state.lr_scale != 1.0:
            self.worker.set_lr_scale(self.guard_state.lr_scale)
        if changes:
            self.config_changes.append({"step": ckpt.step, "changed": changes})
            log.info(
                "resuming with changed config: %s", ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in changes.items())
            )
        # Random states last: nothing above may draw from them after they are set.
        self.worker.load_rng_states(ckpt.rng_states)
        set_rng_state(state["driver_rng"])
        self._rewrite_metrics()
        self._write_config()
        kind = event or ("restart" if after_restart else "resume")
        self._event(kind, checkpoint=path, step=ckpt.step, changed=changes, **event_fields)
        self.resumed_from = path

    def _check_same_base_and_tasks(self, state: dict[str, Any], path: str) -> None:
        """Refuse other base weights or another task generator than the checkpoint's."""
        saved = state.get("base_fingerprint")
        if saved and saved != self._base_fingerprint():
            raise VlrlError(
                f"cannot resume from {path}: model.path holds other base weights (fingerprint "
                f"{self._base_fingerprint()}, the checkpoint's {saved})"
            )
        for split, version in state.get("split_versions", {}).items():
            if split_version(self.config.env, split) != version:
                raise VlrlError(
                    f"cannot resume from {path}: the {split} split's tasks differ from the checkpoint's "
                    f"(split version {split_version(self.config.env, split)} vs {version}: another task generator?)"
                )

    def _split_versions(self) -> dict[str, str]:
        return {split: split_version(self.config.env, split) for split in ("train", "holdout")}

    def _base_fingerprint(self) -> str:
        if self._fingerprint is None:
            self._fingerprint = self.worker.base_fingerprint()
        return self._fingerprint

    def newest_restorable(self) -> str | None:
        """The checkpoint a restart or a guard's rollback goes back to: this run's newest valid
        one, else the one it resumed from (another run's: none of its own yet), else None."""
        source = self.checkpoints.newest_valid()
        if source is None and self.resumed_from and verify(self.resumed_from) is None:
            source = self.resumed_from
        return source

    # -- recovery ----------------------------------------------------------------------------
    def recover(self, error: Exception) -> None:
        """A worker died: new worker group, back to the newest valid checkpoint (or to the start
        when there is none yet), up to `runtime.max_restarts` times per process."""
        limit = self.config.runtime.max_restarts
        while True:
            if self.session_restarts >= limit:
                raise VlrlError(f"{error}; not restarting again (runtime.max_restarts={limit})") from None
            self.session_restarts += 1
            self.restarts += 1
            source = self.newest_restorable()
            log.warning(
                "%s; restart %d of %d: new workers, continuing from %s",
                error,
                self.session_restarts,
                limit,
                source or "step 0 (no checkpoint yet)",
            )
            self.worker.close()
            try:
                self.worker = self._make_workers()
                if source:
                    self._restore(source, after_restart=True)
                else:
                    self._back_to_start()
                return
            except WorkerDiedError as again:
                error = again

    def _back_to_start(self) -> None:
        """The state `setup` left (the new workers are freshly seeded already)."""
        c = self.config
        self.step_idx = 0
        self.history, self.evals = [], []
        self.sampler = TaskSampler(build_split(c.env, "train"), seed=c.train.seed)
        set_rng_state(self._start_rng)
        if self.guard_state.lr_scale != 1.0:
            self.worker.set_lr_scale(self.guard_state.lr_scale)
        self._rewrite_metrics()
        self._event("restart", checkpoint=None, step=0, changed={})
