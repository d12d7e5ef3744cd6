"""The GRPO training loop, in one place.

One step, top to bottom (`GRPOTrainer.step`):

    tasks      <- TaskSampler.next(algo.tasks_per_step)               (train split)
    episodes   <- worker.rollout(tasks, G)                            (engine + environments)
    rewards    <- episode returns, shape [tasks, G]
    advantages <- group_advantages(rewards)                           (GRPO / Dr. GRPO)
               (+ per turn: step_advantages over same-state turns, GiGPO, when step_advantage_weight > 0)
               (dynamic sampling: drop all-equal groups, sample more tasks, up to a limit)
    stats      <- worker.update(episodes, advantages)                 (old/ref log-probs, loss, AdamW)
    guards     <- update-phase checks on the stats (training/guards.py); `skip` restores the pre-update state
    worker.sync_adapter(step)                                         (the engine serves the new adapter)
    metrics    -> metrics.jsonl, Prometheus, MLflow (training/telemetry.py) (+ holdout evaluation, checkpoints)
    guards     -> events to run-events.jsonl; `rollback` restores the newest checkpoint, `stop` checkpoints and raises

`worker` is an in-process `Worker` (runtime.backend=local) or a `RayWorkerGroup` of W of them
(runtime.backend=ray, the default): both are a `WorkerGroup` (`vlrl.runtime.worker_api`), so this
loop is the only one.

Checkpoints (`vlrl.training.checkpoint` owns the format) hold everything a step depends on, so a
resumed run continues exactly where the checkpoint was taken: `load_checkpoint("auto" | path)`.
When a Ray worker dies, `train` rebuilds the worker group, reloads the newest valid checkpoint
and carries on (`recover`, at most `runtime.max_restarts` times). Saving, resuming and
recovering live in `vlrl.training.recovery` (`RecoveryMixin`).
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vlrl.algo.grpo import (
    combine_advantages,
    discounted_returns,
    group_advantages,
    informative_groups,
    rare_best_share,
    step_advantages,
)
from vlrl.config import RunConfig, config_to_yaml
from vlrl.envs.base import build_split, env_class
from vlrl.errors import TimeLimitReached, VlrlError, WorkerDiedError
from vlrl.eval.evaluate import EvalResult
from vlrl.rollout.episodes import Episode, RolloutStats
from vlrl.rollout.lora_mode import logprob_gap_check
from vlrl.runtime.update_plan import MISMATCH_KEYS
from vlrl.runtime.worker_api import WorkerGroup
from vlrl.training.checkpoint import CheckpointStore, step_of
from vlrl.training.guards import (
    GuardEvent,
    GuardState,
    GuardStop,
    eval_phase_events,
    most_severe,
    update_phase_events,
    wants_rollback,
    wants_snapshot,
)
from vlrl.training.recovery import RecoveryMixin
from vlrl.training.sampler import TaskSampler
from vlrl.training.seeding import rng_state

if TYPE_CHECKING:
    from vlrl.training.telemetry import RunTelemetry

log = logging.getLogger(__name__)

# Where a guard's rollback keeps the records of the steps it undid (metrics.jsonl follows the history).
ROLLED_BACK_METRICS = "metrics-rolled-back.jsonl"


@dataclass
class StepMetrics:
    step: int
    values: dict[str, float] = field(default_factory=dict)


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Means of the per-episode environment metrics, plus reward spread."""
    if not episodes:
        return {}
    rewards = torch.tensor([e.reward for e in episodes])
    keys = sorted({k for e in episodes for k in e.metrics})
    out = {f"episode/{k}": float(sum(e.metrics.get(k, 0.0) for e in episodes) / len(episodes)) for k in keys}
    out.update({"reward/mean": float(rewards.mean()), "reward/std": float(rewards.std()) if len(episodes) > 1 else 0.0})
    return out


def sampled_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Success and reward over every episode the step sampled, before dynamic sampling dropped any
    group (`episode/success` and `reward/mean` describe the kept groups only)."""
    if not episodes:
        return {}
    n = len(episodes)
    return {
        "rollout/success_all": sum(e.metrics.get("success", 0.0) for e in episodes) / n,
        "rollout/reward_all": sum(e.reward for e in episodes) / n,
        "rollout/episodes_all": float(n),
    }


def _as_list(advantage: float | list[float]) -> list[float]:
    return advantage if isinstance(advantage, list) else [advantage]


class GRPOTrainer(RecoveryMixin):
    """setup -> [load_checkpoint] -> train (step after step) -> save; checkpoints hold everything
    needed to resume exactly (save, resume and restart: `vlrl.training.recovery`)."""

    def __init__(
        self,
        config: RunConfig,
        run_dir: str | Path,
        init_adapter: str | None = None,
        on_step: Callable[[StepMetrics], None] | None = None,
    ):
        self.config = config
        self.run_dir = Path(run_dir)
        self.init_adapter = init_adapter
        self.on_step = on_step
        self.step_idx = 0
        self.history: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self.restarts = 0  # worker-group restarts over the whole run (kept in checkpoints)
        self.session_restarts = 0  # restarts by this process: runtime.max_restarts bounds these
        self.config_changes: list[dict[str, Any]] = []  # allowed config changes at resumes
        self.resumed_from: str | None = None
        self._fingerprint: str | None = None
        self._checkpoint_s = 0.0  # time spent checkpointing since the last step record
        self.guard_state = GuardState()  # LR scale and rollbacks of the stability guards (kept in checkpoints)
        # Started by setup(); close() releases whichever of them exist.
        self.worker: WorkerGroup | None = None
        self.telemetry: RunTelemetry | None = None

    # -- setup -----------------------------------------------------------------------------
    def setup(self) -> None:
        """Start the workers (local or on Ray), build the task splits; a new run also writes its config."""
        c = self.config
        if c.algo.exploring_starts and not env_class(c.env.name).lists_legal_responses():
            raise VlrlError(
                f"algo.exploring_starts needs env '{c.env.name}' to list its legal moves (a legal_responses() "
                "method); set algo.exploring_starts=false"
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoints = CheckpointStore(self.run_dir / "checkpoints", keep=c.train.keep_checkpoints)
        if not self.checkpoints.checkpoints():  # else: written once the resume is accepted (or at a fresh start)
            self._write_config()
        from vlrl.training.telemetry import RunTelemetry

        self.telemetry = RunTelemetry(c, self.run_dir, self.init_adapter)
        self.worker = self._make_workers()
        self.sampler = TaskSampler(build_split(c.env, "train"), seed=c.train.seed)
        self.holdout = list(build_split(c.env, "holdout"))[: c.train.eval_tasks]
        self.metrics_file = self.run_dir / "metrics.jsonl"
        self._start_rng = rng_state()  # where a restart without any checkpoint goes back to

    def _make_workers(self) -> WorkerGroup:
        from vlrl.training.worker import make_worker_group

        c = self.config
        optimizer_steps = (
            c.train.steps
            * c.algo.ppo_epochs
            * max(1, -(-c.algo.tasks_per_step * c.algo.group_size // c.algo.mini_batch_size))
        )
        return make_worker_group(c, optimizer_steps, self.init_adapter)

    def close(self) -> None:
        """Release the workers (Ray actors and their placement group); the trainer is done after this."""
        if self.worker is not None:
            self.worker.close()
        if self.telemetry is not None:
            self.telemetry.close()

    def __enter__(self) -> GRPOTrainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one step --------------------------------------------------------------------------
    def collect(self, stats: RolloutStats) -> tuple[list[Episode], torch.Tensor, int, list[Episode]]:
        """Episodes of `tasks_per_step` tasks, with dynamic sampling when asked; returns the kept
        episodes, their rewards [groups, G], the number of dropped groups, and every episode sampled
        (the dropped groups' too: the honest picture of what the policy did)."""
        a = self.config.algo
        params = self.worker.sampling_params(seed=self.config.train.seed * 1_000_003 + self.step_idx * 101)
        kept: list[list[Episode]] = []
        sampled: list[Episode] = []
        dropped = 0
        for round_ in range(1 + (a.max_resample_rounds if a.dynamic_sampling else 0)):
            need = a.tasks_per_step - len(kept)
            if need <= 0:
                break
            params.seed = None if params.seed is None else params.seed + round_ * 7919
            episodes = self.worker.rollout(self.sampler.next(need), a.group_size, params, stats)
            sampled += episodes
            groups = [episodes[g * a.group_size : (g + 1) * a.group_size] for g in range(need)]
            if a.dynamic_sampling:
                rewards = torch.tensor([[e.reward for e in g] for g in groups])
                keep = informative_groups(rewards)
                dropped += int((~keep).sum())
                groups = [g for g, k in zip(groups, keep.tolist()) if k]
            kept += groups
        if not kept:
            return [], torch.zeros(0), dropped, sampled
        rewards = torch.tensor([[e.reward for e in g] for g in kept])
        return [e for g in kept for e in g], rewards, dropped, sampled

    def shuffled(self, adv: list[float]) -> list[float]:
        """algo.shuffle_advantages (the control arm): the batch's episode advantages permuted across
        its episodes. Seeded by train.seed and the step, so a resumed run shuffles as the
        uninterrupted one did."""
        order = list(range(len(adv)))
        random.Random(f"shuffle/{self.config.train.seed}/{self.step_idx}").shuffle(order)
        return [adv[i] for i in order]

    def step(self) -> StepMetrics:
        c, t0 = self.config, time.perf_counter()
        stats = RolloutStats()
        events: list[GuardEvent] = []
        episodes, rewards, dropped, sampled = self.collect(stats)
        t_rollout = time.perf_counter() - t0
        values: dict[str, float] = {
            "time/rollout_s": t_rollout,
            "time/generate_s": stats.generate_s,
            "time/env_s": stats.env_s,
        }
        values.update(episode_metrics(episodes))
        values.update(sampled_metrics(sampled))
        values["groups/dropped"] = float(dropped)
        if episodes:
            if (share := rare_best_share(rewards)) is not None:
                values["groups/rare_best"] = share
            scale = "std" if c.algo.advantage == "grpo" else "none"
            adv = group_advantages(rewards, scale=scale).flatten().tolist()
            if c.algo.shuffle_advantages:  # episode-level only (the config refuses it with GiGPO)
                adv = self.shuffled(adv)
            if c.algo.step_advantage_weight > 0:
                adv, values["advantage/anchored_turns"] = self.per_turn_advantages(episodes, adv, scale)
            # Episodes that carry any gradient (a nonzero advantage), and the optimizer steps taken on them.
            values["train/effective_episodes"] = float(sum(1 for a in adv if any(x != 0 for x in _as_list(a))))
            values["train/optimizer_steps"] = float(c.algo.ppo_epochs * -(-len(episodes) // c.algo.mini_batch_size))
            snapshot = self._pre_update_state() if wants_snapshot(c.train.guards) else None
            t1 = time.perf_counter()
            update = self.worker.update(episodes, adv, seed=c.train.seed + self.step_idx)
            values["time/update_s"] = time.perf_counter() - t1
            # The sampler/trainer gap describes the rollout, so it is recorded under rollout/.
            values.update({f"rollout/{k}" if k in MISMATCH_KEYS else f"train/{k}": v for k, v in update.items()})
            # A served policy that drifted from the trained one (e.g. a merge's rounding) is flagged, never silent.
            values.update(logprob_gap_check(values, c.rollout.logprob_gap_tolerance, c.rollout.lora_mode))
            values.update({f"time/{k}": v for k, v in update.timings.items()})  # logprob_s, optim_s
            values["throughput/train_tokens_per_s"] = sum(len(e.sequence) for e in episodes) / max(
                1e-9, values["time/update_s"]
            )
            events = update_phase_events(c.train.guards, self.step_idx + 1, values, self.history)
            if snapshot is not None and any(e.action == "skip" for e in events):
                self.worker.load_training_state(*snapshot)  # drop the update before the engine gets it
        self.step_idx += 1
        values["time/sync_s"] = self.worker.sync_adapter(self.step_idx)
        values.update(self.worker.sync_info())  # vLLM: in memory or (after a fallback) through files
        values["throughput/rollout_tokens_per_s"] = stats.generated_tokens / max(1e-9, stats.generate_s)
        values["throughput/episodes_per_s"] = len(episodes) / max(1e-9, t_rollout)
        ends_run = most_severe(events) in ("rollback", "stop")  # no evaluation of a state about to be left
        if (
            c.train.eval_every
            and self.step_idx % c.train.eval_every == 0
            and self.step_idx < c.train.steps
            and not ends_run
        ):
            t2 = time.perf_counter()
            values.update(self.evaluate().as_metrics("eval"))
            values["time/eval_s"] = time.perf_counter() - t2
            events += eval_phase_events(
                c.train.guards, self.step_idx, [*self.history, {"step": self.step_idx, **values}], self.evals
            )
        self._escalate_rollbacks(events)
        values.update({e.record_key: 1.0 for e in events})
        values["time/checkpoint_s"], self._checkpoint_s = self._checkpoint_s, 0.0  # the previous step's
        values["run/restarts"] = float(self.restarts)
        values["time/step_s"] = time.perf_counter() - t0
        record = {"step": self.step_idx, **values}
        self.history.append(record)
        with self.metrics_file.open("a") as f:
            f.write(json.dumps(record) + "\n")
        # Per-step hooks (metric export, tracking, the progress display) see the step once its
        # record is in the history and metrics.jsonl. A replayed step (after a restart or resume
        # from an earlier checkpoint) calls them again.
        self.telemetry.step(record, self.worker.resources if self.telemetry.exporter else None)
        m = StepMetrics(self.step_idx, values)
        if self.on_step:
            self.on_step(m)
        if events:
            self._act_on_guards(events)
        return m

    def per_turn_advantages(
        self, episodes: list[Episode], episode_adv: list[float], scale: str
    ) -> tuple[list[list[float]], float]:
        """GiGPO: the episode advantage plus the weighted step-level advantage, per turn; also the
        share of turns that had a same-state turn to be compared with."""
        a = self.config.algo
        returns = [discounted_returns(e.turn_rewards, a.step_discount) for e in episodes]
        steps, anchored = step_advantages(returns, [e.turn_states for e in episodes], a.group_size, scale=scale)
        return combine_advantages(episode_adv, steps, a.step_advantage_weight), anchored

    def evaluate(self) -> EvalResult:
        result = self.worker.evaluate(self.holdout, greedy=True, label=f"step {self.step_idx}")
        self.evals.append({"step": self.step_idx, **result.summary()})
        self.telemetry.evaluation(self.step_idx, self.evals[-1], result.as_metrics("eval"))
        return result

    def train(self) -> Path:
        """Run until `train.steps`, evaluate at the end, save the adapter; returns its directory.

        Checkpoints every `train.checkpoint_every` steps and at the end. When a Ray worker dies
        the run goes on from the newest checkpoint (`recover`).
        """
        self._started = time.monotonic()
        if self.resumed_from is None and self.step_idx == 0:
            self._start_fresh()
        self.telemetry.start(resumed=self.resumed_from is not None)
        try:
            while True:
                try:
                    adapter = self._run_to_end()
                    break
                except WorkerDiedError as exc:
                    self.recover(exc)
        except TimeLimitReached:
            self.telemetry.finish("KILLED")  # MLflow's word for a run stopped before its end; it resumes
            raise
        except BaseException:
            self.telemetry.finish("KILLED" if isinstance(sys.exc_info()[1], KeyboardInterrupt) else "FAILED")
            raise
        self.telemetry.finish("FINISHED", adapter)
        return adapter

    def _run_to_end(self) -> Path:
        c = self.config.train
        recent: list[float] = []  # the last steps' wall times, to tell whether another one fits the budget
        while self.step_idx < c.steps:
            t0 = time.monotonic()
            m = self.step()
            recent = (recent + [time.monotonic() - t0])[-3:]
            rolled_back = m.step != self.step_idx  # a guard went back to a checkpoint: nothing new to save
            if (
                c.checkpoint_every
                and self.step_idx % c.checkpoint_every == 0
                and self.step_idx < c.steps
                and not rolled_back
            ):
                self.save_checkpoint()
            # Stop BEFORE a step that would end past the budget: a job slot's hard limit would kill
            # it mid-step and lose everything since the last checkpoint (seen on the GPU machine).
            if (
                c.max_minutes is not None
                and self.step_idx < c.steps
                and time.monotonic() - self._started + max(recent) > 60 * c.max_minutes
            ):
                if c.on_time_limit == "finish":
                    log.info(
                        "train.max_minutes (%g) ended the run after step %d of %d",
                        c.max_minutes,
                        self.step_idx,
                        c.steps,
                    )
                    break
                path = self.save_checkpoint()
                raise TimeLimitReached(
                    f"train.max_minutes ({c.max_minutes:g}) reached after step {self.step_idx} of {c.steps}; "
                    f"checkpoint {path}; the same command with --resume auto continues the run"
                )
        if not (self.evals and self.evals[-1]["step"] == self.step_idx):  # else: resumed from the final checkpoint
            self.evaluate()
            self.save_checkpoint()
        (self.run_dir / "evals.json").write_text(json.dumps(self.evals, indent=1))
        return self.worker.save_adapter(self.run_dir / "adapter")

    # -- stability guards (training/guards.py) ---------------------------------------------------
    def _pre_update_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """Adapter, optimizer and scheduler before an update, for a guard's `skip` (LoRA: small)."""
        return self.worker.adapter_state(), self.worker.training_state()

    def _escalate_rollbacks(self, events: list[GuardEvent]) -> None:
        """A rollback that cannot happen stops the run instead: beyond train.guards.max_rollbacks,
        or with no checkpoint to go back to (decided before the record names the action)."""
        rollbacks = [e for e in events if e.action == "rollback"]
        if not rollbacks:
            return
        limit = self.config.train.guards.max_rollbacks
        if self.guard_state.rollbacks >= limit:
            why = f"train.guards.max_rollbacks={limit} reached"
        elif self.newest_restorable() is None:
            why = "no valid checkpoint to go back to"
        else:
            return
        for e in rollbacks:
            e.action = "stop"
            e.message += f" (rollback refused: {why})"

    def _act_on_guards(self, events: list[GuardEvent]) -> None:
        """Record the step's guard events, then roll back or stop when one asks for it (the
        step's record is already in metrics.jsonl; `warn` and `skip` are done by now)."""
        for e in events:
            self._event("guard", **e.as_dict())
            self.telemetry.guard_event(e.as_dict())
            if e.action != "stop":  # a stop says it in its error line
                log.warning("guard %s (%s) at step %d: %s", e.check, e.action, e.step, e.message)
        action = most_severe(events)
        if action == "stop":
            path = self.save_checkpoint()
            first, *others = [e for e in events if e.action == "stop"]
            also = "".join(f"; also {e.check}: {e.message}" for e in others)
            raise GuardStop(
                f"guard {first.check} stopped the run at step {first.step}: {first.message}{also} (checkpoint {path})"
            )
        if action == "rollback":
            self._rollback(next(e for e in events if e.action == "rollback"), self.newest_restorable())

    def _rollback(self, cause: GuardEvent, source: str) -> None:
        """Back to checkpoint `source` with the learning rate x train.guards.rollback_lr_factor.
        The records of the steps undone move to RUN_DIR/metrics-rolled-back.jsonl."""
        g = self.config.train.guards
        self.guard_state.rollbacks += 1
        self.guard_state.lr_scale *= g.rollback_lr_factor
        undone = [r for r in self.history if r["step"] > (step_of(source) or 0)]
        with (self.run_dir / ROLLED_BACK_METRICS).open("a") as f:
            f.writelines(json.dumps({**r, "rolled_back_by": cause.check}) + "\n" for r in undone)
        self._restore(
            source,
            after_restart=True,
            event="rollback",
            check=cause.check,
            lr_scale=self.guard_state.lr_scale,
            rollbacks=self.guard_state.rollbacks,
        )
        log.warning(
            "guard %s: rolled back to %s; learning rate x %g (rollback %d of %d)",
            cause.check,
            source,
            self.guard_state.lr_scale,
            self.guard_state.rollbacks,
            g.max_rollbacks,
        )

    # -- run directory -------------------------------------------------------------------------
    def _start_fresh(self) -> None:
        """A new run in this directory: an earlier run's checkpoints and records are moved aside."""
        names = ("checkpoints", "metrics.jsonl", "evals.json", "run-events.jsonl", ROLLED_BACK_METRICS)
        old = [self.run_dir / name for name in names if (self.run_dir / name).exists()]
        if old:
            aside = self.run_dir / time.strftime("replaced-%Y%m%d-%H%M%S")
            aside.mkdir(exist_ok=True)
            for p in old:
                p.rename(aside / p.name)
            log.warning(
                "%s held an earlier run (not resumed): moved its %s to %s",
                self.run_dir,
                " and ".join(p.name for p in old),
                aside,
            )
        self._write_config()
        if wants_rollback(self.config.train.guards):
            self.save_checkpoint()  # step 0: a guard's rollback always has a checkpoint to go back to

    def _write_config(self) -> None:
        _replace_text(self.run_dir / "config.yaml", config_to_yaml(self.config))

    def _rewrite_metrics(self) -> None:
        """metrics.jsonl as the restored history says (steps after the checkpoint are dropped)."""
        _replace_text(self.metrics_file, "".join(json.dumps(r) + "\n" for r in self.history))

    def _event(self, kind: str, **fields: Any) -> None:
        """One line in RUN_DIR/run-events.jsonl (resumes, restarts, the config changes they brought)."""
        with (self.run_dir / "run-events.jsonl").open("a") as f:
            f.write(json.dumps({"event": kind, "time": time.time(), "restarts": self.restarts, **fields}) + "\n")


def _replace_text(path: Path, text: str) -> None:
    """Write a file whole or not at all (a temporary file renamed over it)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
