"""The GRPO training loop, in one place.

One step, top to bottom (`GRPOTrainer.step`):

    tasks      <- TaskSampler.next(algo.tasks_per_step)               (train split)
    episodes   <- worker.rollout(tasks, G)                            (engine + environments)
    rewards    <- episode returns, shape [tasks, G]
    advantages <- group_advantages(rewards)                           (GRPO / Dr. GRPO)
               (dynamic sampling: drop all-equal groups, sample more tasks, up to a limit)
    stats      <- worker.update(episodes, advantages)                 (old/ref log-probs, loss, AdamW)
    worker.sync_adapter(step)                                         (the engine serves the new adapter)
    metrics    -> metrics.jsonl (+ periodic holdout evaluation, checkpoints)

`worker` is an in-process `Worker` (runtime.backend=local) or a `RayWorkerGroup` of W of them
(runtime.backend=ray, the default): the same methods, so this loop is the only one.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from vlrl.algo.grpo import group_advantages, informative_groups
from vlrl.config import RunConfig, config_to_yaml
from vlrl.envs.base import build_split
from vlrl.errors import VlrlError
from vlrl.eval.evaluate import EvalResult
from vlrl.rollout.episodes import Episode, RolloutStats
from vlrl.training.sampler import TaskSampler
from vlrl.training.seeding import rng_state, set_rng_state


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


class GRPOTrainer:
    """setup -> train (step after step) -> save; checkpoints hold everything needed to resume."""

    def __init__(self, config: RunConfig, run_dir: str | Path, init_adapter: str | None = None,
                 on_step: Callable[[StepMetrics], None] | None = None):
        self.config = config
        self.run_dir = Path(run_dir)
        self.init_adapter = init_adapter
        self.on_step = on_step
        self.step_idx = 0
        self.history: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []

    # -- setup -----------------------------------------------------------------------------
    def setup(self) -> None:
        """Write the resolved config, start the workers (local or on Ray), build the task splits."""
        from vlrl.runtime.worker_group import make_worker_group

        c = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "config.yaml").write_text(config_to_yaml(c))
        optimizer_steps = c.train.steps * c.algo.ppo_epochs * max(
            1, -(-c.algo.tasks_per_step * c.algo.group_size // c.algo.mini_batch_size)
        )
        self.worker = make_worker_group(c, optimizer_steps, self.init_adapter)
        self.sampler = TaskSampler(build_split(c.env, "train"), seed=c.train.seed)
        self.holdout = list(build_split(c.env, "holdout"))[: c.train.eval_tasks]
        self.metrics_file = self.run_dir / "metrics.jsonl"

    def close(self) -> None:
        """Release the workers (Ray actors and their placement group); the trainer is done after this."""
        worker = getattr(self, "worker", None)
        if worker is not None:
            worker.close()

    def __enter__(self) -> "GRPOTrainer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- one step --------------------------------------------------------------------------
    def collect(self, stats: RolloutStats) -> tuple[list[Episode], torch.Tensor, int]:
        """Episodes of `tasks_per_step` tasks, with dynamic sampling when asked; returns dropped groups."""
        a = self.config.algo
        params = self.worker.sampling_params(seed=self.config.train.seed * 1_000_003 + self.step_idx * 101)
        kept: list[list[Episode]] = []
        dropped = 0
        for round_ in range(1 + (a.max_resample_rounds if a.dynamic_sampling else 0)):
            need = a.tasks_per_step - len(kept)
            if need <= 0:
                break
            params.seed = None if params.seed is None else params.seed + round_ * 7919
            episodes = self.worker.rollout(self.sampler.next(need), a.group_size, params, stats)
            groups = [episodes[g * a.group_size : (g + 1) * a.group_size] for g in range(need)]
            if a.dynamic_sampling:
                rewards = torch.tensor([[e.reward for e in g] for g in groups])
                keep = informative_groups(rewards)
                dropped += int((~keep).sum())
                groups = [g for g, k in zip(groups, keep.tolist()) if k]
            kept += groups
        if not kept:
            return [], torch.zeros(0), dropped
        rewards = torch.tensor([[e.reward for e in g] for g in kept])
        return [e for g in kept for e in g], rewards, dropped

    def step(self) -> StepMetrics:
        c, t0 = self.config, time.perf_counter()
        stats = RolloutStats()
        episodes, rewards, dropped = self.collect(stats)
        t_rollout = time.perf_counter() - t0
        values: dict[str, float] = {"time/rollout_s": t_rollout, "time/generate_s": stats.generate_s, "time/env_s": stats.env_s}
        values.update(episode_metrics(episodes))
        values["groups/dropped"] = float(dropped)
        if episodes:
            adv = group_advantages(rewards, scale="std" if c.algo.advantage == "grpo" else "none").flatten().tolist()
            t1 = time.perf_counter()
            update = self.worker.update(episodes, adv, seed=c.train.seed + self.step_idx)
            values["time/update_s"] = time.perf_counter() - t1
            values.update({f"train/{k}": v for k, v in update.items()})
            values["throughput/train_tokens_per_s"] = sum(len(e.sequence) for e in episodes) / max(1e-9, values["time/update_s"])
        self.step_idx += 1
        values["time/sync_s"] = self.worker.sync_adapter(self.step_idx)
        values["throughput/rollout_tokens_per_s"] = stats.generated_tokens / max(1e-9, stats.generate_s)
        values["throughput/episodes_per_s"] = len(episodes) / max(1e-9, t_rollout)
        if c.train.eval_every and self.step_idx % c.train.eval_every == 0 and self.step_idx < c.train.steps:
            values.update(self.evaluate().as_metrics("eval"))
        values["time/step_s"] = time.perf_counter() - t0
        record = {"step": self.step_idx, **values}
        self.history.append(record)
        with self.metrics_file.open("a") as f:
            f.write(json.dumps(record) + "\n")
        m = StepMetrics(self.step_idx, values)
        if self.on_step:
            self.on_step(m)
        return m

    def evaluate(self) -> EvalResult:
        result = self.worker.evaluate(self.holdout, greedy=True, label=f"step {self.step_idx}")
        self.evals.append({"step": self.step_idx, **result.summary()})
        return result

    def train(self) -> Path:
        """Run until `train.steps`, evaluate at the end, save the adapter; returns its directory."""
        if self.config.train.checkpoint_every:
            every = self.config.train.checkpoint_every
        else:
            every = 0
        while self.step_idx < self.config.train.steps:
            self.step()
            if every and self.step_idx % every == 0:
                self.save_checkpoint()
        self.evaluate()
        (self.run_dir / "evals.json").write_text(json.dumps(self.evals, indent=1))
        self.save_checkpoint()
        return self.worker.save_adapter(self.run_dir / "adapter")

    # -- checkpoints -----------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        """Adapter, optimizer and scheduler, random states, sampler position, step and history."""
        path = self.run_dir / "checkpoints" / f"step-{self.step_idx:06d}"
        tmp = path.with_name(path.name + ".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        torch.save(
            {
                "step": self.step_idx,
                "adapter": self.worker.adapter_state(),
                "training": self.worker.training_state(),
                "rng": rng_state(),
                "sampler": self.sampler.state_dict(),
                "history": self.history,
                "evals": self.evals,
                "config": self.config.model_dump(mode="json"),
            },
            tmp / "state.pt",
        )
        if path.exists():
            import shutil

            shutil.rmtree(path)
        tmp.rename(path)
        (path.parent / "latest").write_text(path.name)
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        path = Path(path)
        if path.name == "latest" or (path / "latest").exists():
            root = path if path.is_dir() else path.parent
            path = root / (root / "latest").read_text().strip()
        try:
            state = torch.load(path / "state.pt", weights_only=False)
        except (OSError, RuntimeError, EOFError) as exc:
            raise VlrlError(f"checkpoint {path} cannot be read ({exc.__class__.__name__}: {exc})") from None
        self.worker.load_training_state(state["adapter"], state["training"])
        self.step_idx = state["step"]
        self.sampler.load_state_dict(state["sampler"])
        self.history, self.evals = state["history"], state["evals"]
        set_rng_state(state["rng"])
        self.worker.sync_adapter(self.step_idx)
