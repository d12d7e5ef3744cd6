#!/usr/bin/env python
"""The GRPO step benchmark: the reference workload through vlrl, and through TRL side by side.

The reference workload (issue 10): a random-initialised model of a given shape (default the
`qwen3vl-8b-shape` preset, built in memory by our own code: nothing is downloaded), bf16, LoRA
r=32 on the language model's projections, the single-turn 5x5 maze plan task (`maze_plan`) at
225 px (224 px after the processor, 49 image tokens), 8 prompts x 8 samples = 64 completions of
exactly 128 new tokens (end-of-turn never sampled, so runs compare), one optimizer step per batch.

vlrl's step is the product's own: `GRPOTrainer.step` with one in-process `Worker`
(`runtime.backend=local`) built from a `RunConfig`, timed by the trainer's own `time/*` record
(rollout, generate, env, old log-probs, optimizer passes, sync), so a change to the trainer,
worker, engine or policy changes what is measured. Warm-up steps (CUDA graph capture, allocator
growth) are run first and reported apart. Probes after the steps go through the worker's public
methods: the sampler/trainer log-prob gap, the update's peak memory, what the engine's sleep
frees, a separate engine copy's adapter sync, and a rollout-only decode sweep (`--decode-sweep`).
The update's MFU is (6 x epochs + 2 x scoring passes) x N x T / (update seconds x
`--peak-tflops`), N the language model's matmul parameters, T the update's tokens (the formula
is stored in the result as `mfu_formula`). `--compare trl` / `--compare trl-vllm` (or
`--trl-only [--trl-vllm]` in a separate process) run TRL 1.16's `GRPOTrainer` on the same saved
model, prompts, images, batch and LoRA, with transformers generation or its colocated vLLM; the
result holds each with its ratio to vlrl's step, and `--merge` joins files of separate runs.

    python bench/grpo_bench.py --model qwen3vl-8b-shape --steps 3 --compare trl --out bench.json
    vlrl bench --model ci --device cpu --dtype float32 --prompts 2 --samples 2 --new-tokens 8   # smoke

`--model` is a preset of `vlrl.models.tiny.TINY_SPECS` or a local model directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import gc
import json
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT / "src"))


@dataclass
class BenchSettings:
    """One benchmark run; the defaults are the reference workload on one GPU."""

    model: str = "qwen3vl-8b-shape"  # tiny preset (built in memory) or a model directory
    device: str = "auto"  # auto: cuda when available
    dtype: str = "bfloat16"
    attn: str = "sdpa"
    lora_rank: int = 32
    lora_alpha: float = 64.0
    maze_size: int = 5
    cell_px: int = 45  # 5 x 45 = 225 px
    prompts: int = 8
    samples: int = 8
    new_tokens: int = 128
    micro_batch: int = 16
    lr: float = 1e-5
    warmup: int = 1
    steps: int = 3
    engine: str = "transformers"  # vlrl's rollout engine: transformers | vllm
    model_dir: str = ""  # vllm: where a preset is saved for vLLM to load (default /tmp/vlrl-bench-<preset>)
    gpu_memory_utilization: str = "0.35"  # vllm engine (and TRL's colocated vLLM): share of the GPU, or auto
    fast_decode: str = "auto"  # transformers engine path: auto | on | off
    compile_decode: bool = False
    lora_mode: str = "auto"  # vllm engine: rollout.lora_mode (auto: merged on GPU)
    sleep_level: str = "auto"  # vllm engine on GPU: rollout.sleep_level (auto: 2 with merged weights)
    sleep_unmap: str = "all"  # ... and at level 2 rollout.sleep_unmap (all: LLM.sleep; large: the engine's own)
    lora_compute_dtype: str = "base"  # model.lora.compute_dtype: base (autocast in bf16) | float32 (PEFT's upcast)
    probe_recompute: bool = True  # one more update with activation recomputation on: its time and peak memory
    probe_lora_upcast: bool = True  # one more update with the other model.lora.compute_dtype: its time and peak
    compile_blocks: str = "auto"  # train.compile_blocks for the measured steps: auto | true | false
    probe_compile: bool = True  # two more updates with the other train.compile_blocks (compile, then timed)
    profile_update: bool = True  # one more update under torch.profiler: the ops that hold it, by device time
    decode_sweep: list[int] = field(default_factory=list)  # extra rollout-only batch sizes to time
    compare: list[str] = field(default_factory=list)  # "trl" (transformers generation) and/or "trl-vllm"
    trl_only: bool = False  # run TRL's side alone (e.g. on another GPU at the same time; see --merge)
    trl_vllm: bool = False  # TRL generates with vLLM (use_vllm=True, vllm_mode="colocate") instead of transformers
    seed: int = 0
    peak_tflops: float = 790.0  # the device's dense bf16 peak the update's MFU divides by (H200: ~790 measured)

    def resolved_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)


# ------------------------------------------------------------------------------------------
# model and workload


def build_model(settings: BenchSettings, device: torch.device):
    """The base model (no LoRA) on `device` and its processor.

    A preset is built in memory, directly on the device (random init in float32, then cast, as
    `build_tiny_model` does), with the preset's tokenizer and image processor.
    """
    from transformers import GenerationConfig, Qwen3VLForConditionalGeneration

    from vlrl.models.loading import DTYPES, load_policy_model
    from vlrl.models.processor import load_processor
    from vlrl.models.tiny import TINY_SPECS, _save_processor_files, build_tokenizer, tiny_config

    if Path(settings.model).is_dir():
        model = load_policy_model(settings.model, settings.dtype, device, settings.attn)
        return model, load_processor(settings.model)
    if settings.model not in TINY_SPECS:
        from vlrl.errors import VlrlError

        raise VlrlError(f"--model {settings.model!r} is neither a directory nor a preset ({', '.join(TINY_SPECS)})")
    spec = TINY_SPECS[settings.model]
    tokenizer = build_tokenizer(spec.tokenizer_vocab)
    config = tiny_config(spec, tokenizer)
    config._attn_implementation = settings.attn
    with tempfile.TemporaryDirectory() as tmp:
        _save_processor_files(Path(tmp), spec, tokenizer)
        processor = load_processor(tmp)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.device(device):
        torch.manual_seed(settings.seed)
        model = Qwen3VLForConditionalGeneration(config)
    model = model.to(DTYPES[settings.dtype])
    pad = tokenizer.pad_token_id
    model.generation_config = GenerationConfig(
        bos_token_id=pad, eos_token_id=[tokenizer.eos_token_id, pad], pad_token_id=pad
    )
    return model.eval(), processor


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable, bucket: dict[str, float], key: str, device: torch.device) -> Callable:
    """`fn` that adds its (device-synchronised) wall time to bucket[key]."""

    def wrapper(*args, **kwargs):
        _sync(device)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            _sync(device)
            bucket[key] = bucket.get(key, 0.0) + time.perf_counter() - t0

    return wrapper


def _mean(rows: list[dict[str, float]], key: str) -> float:
    values = [r[key] for r in rows if key in r]
    return sum(values) / len(values) if values else 0.0


def _memory(device: torch.device) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    return {
        "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30,
    }


# The largest torch allocator peaks seen by `_release` before it resets them (a run's peak, across resets).
_PEAKS: dict[str, float] = {}


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        for key, value in _memory(device).items():
            _PEAKS[key] = max(_PEAKS.get(key, 0.0), value)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _run_peaks(device: torch.device) -> dict[str, float]:
    """The allocator's peaks over the whole run so far (not only since the last reset); then
    forgotten, so the next call reports what ran after this one."""
    out = {k: max(v, _PEAKS.get(k, 0.0)) for k, v in _memory(device).items()}
    _PEAKS.clear()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    return out


class DevicePeak:
    """Polls the GPU's used memory (every allocation on it, vLLM's pool and other processes
    included, which torch's allocator peaks do not all see) in a thread; `peak_gib` afterwards."""

    def __init__(self, device: torch.device, interval_s: float = 0.25):
        import threading

        self.device, self.interval_s, self.peak = device, interval_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True) if device.type == "cuda" else None

    def _read(self) -> None:
        free, total = torch.cuda.mem_get_info(self.device)
        self.peak = max(self.peak, total - free)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._read()
            except Exception:  # noqa: BLE001 - a reading that fails is a reading missed
                pass

    def __enter__(self) -> DevicePeak:
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._read()

    def figures(self) -> dict[str, float]:
        return {"device_peak_used_gib": self.peak / 2**30} if self._thread is not None else {}


# ------------------------------------------------------------------------------------------
# vlrl: the product's own step


def bench_config(settings: BenchSettings, model_dir: Path, run_root: Path):
    """The RunConfig of the workload: what `vlrl train` would be given for it (one local worker)."""
    from vlrl.config import load_config

    completions = settings.prompts * settings.samples
    device = settings.resolved_device()
    return load_config(
        None,
        [
            f"model.path={model_dir}",
            f"model.dtype={settings.dtype}",
            f"model.attn_implementation={settings.attn}",
            f"model.lora.rank={settings.lora_rank}",
            f"model.lora.alpha={settings.lora_alpha}",
            "model.lora.dropout=0.0",
            f"model.lora.compute_dtype={settings.lora_compute_dtype}",
            "env.name=maze_plan",
            f"env.sizes=[{settings.maze_size}]",
            f"env.cell_px={settings.cell_px}",
            "env.holdout.count=8",  # the trainer lists its holdout split at setup; nothing is evaluated
            f"rollout.engine={settings.engine}",
            "rollout.temperature=1.0",
            f"rollout.max_new_tokens={settings.new_tokens}",
            # One generate call per step, and room for the decode sweep's batches (vLLM's max_num_seqs).
            f"rollout.batch_size={max([completions, *settings.decode_sweep])}",
            "rollout.max_model_len=4096",
            f"rollout.gpu_memory_utilization={settings.gpu_memory_utilization}",
            f"rollout.fast_decode={ {'on': 'true', 'off': 'false'}.get(settings.fast_decode, 'auto') }",
            f"rollout.compile_decode={str(settings.compile_decode).lower()}",
            f"rollout.lora_mode={settings.lora_mode}",
            f"rollout.sleep_level={settings.sleep_level}",
            f"rollout.sleep_unmap={settings.sleep_unmap}",
            f"algo.group_size={settings.samples}",
            f"algo.tasks_per_step={settings.prompts}",
            f"algo.mini_batch_size={completions}",
            f"algo.micro_batch_size={min(settings.micro_batch, completions)}",
            "algo.ppo_epochs=1",
            "algo.kl_coef=0.0",
            f"train.lr={settings.lr}",
            f"train.compile_blocks={settings.compile_blocks}",
            f"train.seed={settings.seed}",
            f"train.steps={settings.warmup + settings.steps}",
            "train.eval_every=0",
            "train.checkpoint_every=0",
            "train.eval_tasks=1",
            "runtime.backend=local",
            f"runtime.use_gpu={str(device.type == 'cuda').lower()}",
            f"storage.root={run_root}",
            "storage.run_name=bench",
        ],
    )


# The trainer's step record -> the bench's row (time/* are GRPOTrainer.step's own phase timers).
TRAINER_KEYS = {
    "time/step_s": "step_s",
    "time/rollout_s": "rollout_s",
    "time/generate_s": "generate_s",
    "time/env_s": "env_s",
    "time/update_s": "update_s",
    "time/logprob_s": "old_logprobs_s",  # old (and reference) log-probs; 0 on-policy without KL
    "time/optim_s": "train_s",  # micro-batched forward + backward + AdamW
    "time/sync_s": "sync_s",
    "time/sync_wake_s": "sync_wake_s",  # vLLM merged mode: mapping the slept weights back
    "time/sync_wake_kv_s": "sync_wake_kv_s",  # ... of which the KV cache, mapped while the merge runs
    "time/sync_merge_s": "sync_merge_s",  # ... and the merge written into them
    "time/sync_merge_host_s": "sync_merge_host_s",  # ... of which the host's time to queue it
    "reward/mean": "reward_mean",
    "train/loss": "loss",
}


def step_row(values: dict[str, float], engine_timings: dict[str, float]) -> dict[str, float]:
    """One measured step from `GRPOTrainer.step`'s record (plus the engine's last generate phases)."""
    row = {ours: float(values[theirs]) for theirs, ours in TRAINER_KEYS.items() if theirs in values}
    row.setdefault("old_logprobs_s", 0.0)
    # The record holds throughputs; the token counts behind them are the same quotients undone.
    row["generated_tokens"] = float(
        round(values.get("throughput/rollout_tokens_per_s", 0.0) * max(1e-9, values.get("time/generate_s", 0.0)))
    )
    row["train_tokens"] = float(
        round(values.get("throughput/train_tokens_per_s", 0.0) * max(1e-9, values.get("time/update_s", 0.0)))
    )
    row.update({k: float(v) for k, v in engine_timings.items()})  # prefill_s / capture_s / decode_s
    return row


def update_flop_count(
    forward_params: int, train_tokens: float, ppo_epochs: int, scoring_passes: int
) -> tuple[float, str]:
    """Model FLOPs of one update and the formula, as the result states it.

    A LoRA update still runs the frozen base's backward through the activations, so each trained
    token costs the standard 2N (forward) + 4N (backward) = 6N per epoch; each no-grad scoring pass
    (old log-probs when the batch takes several optimizer steps, reference log-probs with KL) costs
    2N. N: the language model's matmul parameters (every decoder layer + lm_head, LoRA included;
    input embeddings and the vision tower left out), T: the update's tokens (prompt with its image
    tokens + completion, every sequence). Attention's T^2 term and activation recomputation
    (gradient checkpointing) are not counted: model FLOPs, not hardware FLOPs.
    """
    flops = (6 * ppo_epochs + 2 * scoring_passes) * forward_params * train_tokens
    formula = (
        f"MFU = (6 x ppo_epochs + 2 x scoring_passes) x N x T / (update_s x peak) with ppo_epochs={ppo_epochs}, "
        f"scoring_passes={scoring_passes}, N={forward_params:,} (LM layers + lm_head, no embeddings/vision), "
        "T = update tokens"
    )
    return flops, formula


def forward_parameters(model: torch.nn.Module) -> int:
    """N of `update_flop_count`: the language model's matmul parameters (no embeddings, no vision tower)."""
    return sum(
        p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name and ".visual." not in name
    )


def scoring_passes(config) -> int:
    """No-grad passes over the batch inside `Policy.update`: old log-probs (when the batch takes
    more than one optimizer step) and reference log-probs (KL)."""
    a = config.algo
    optimizer_steps = a.ppo_epochs * max(1, -(-a.tasks_per_step * a.group_size // a.mini_batch_size))
    return int(optimizer_steps > 1) + int(a.kl_coef > 0)


def run_vlrl(settings: BenchSettings) -> dict[str, Any]:
    """Warm-up plus measured steps of `GRPOTrainer.step` with one in-process `Worker`.

    What is timed is the product's step: the trainer's own `time/*` record (rollout through
    `Worker.rollout`, `Worker.update`, `Worker.sync_adapter`), so a change to the trainer, worker,
    engine or policy changes what is measured. The only thing set from outside is the engine's
    public `ignore_eos` (every completion runs to `new_tokens`, so runs compare). Probes after the
    steps use the worker's public methods too: the sampler/trainer log-prob gap, the update's
    peak memory, what sleep frees, a separate engine copy's adapter sync and the decode sweep.
    """
    from vlrl.algo.grpo import group_advantages
    from vlrl.rollout.episodes import RolloutStats
    from vlrl.training.trainer import GRPOTrainer

    device = settings.resolved_device()
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)  # the worker takes the current device
    t0 = time.perf_counter()
    model_dir = saved_model_dir(settings)  # the real worker loads from files: a preset is saved once
    save_s = time.perf_counter() - t0
    memory_log: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="vlrl-bench-") as run_root:
        config = bench_config(settings, model_dir, Path(run_root))
        _release(device)
        _PEAKS.clear()  # the preset's build is not the run's
        t0 = time.perf_counter()
        trainer = GRPOTrainer(config, Path(run_root) / "bench")
        trainer.setup()  # the worker: policy + LoRA + optimizer, and its rollout engine
        build_s = time.perf_counter() - t0
        worker = trainer.worker
        engine = worker.engine
        engine.ignore_eos = True  # forced length (a public switch of both engines, meant for benchmarks)
        if device.type == "cuda":
            memory_log["free_after_worker_start_gib"] = _free_bytes(device) / 2**30
        rows: list[dict[str, float]] = []
        records: list[dict[str, float]] = []
        poll = DevicePeak(device).__enter__()
        try:
            for step in range(settings.warmup + settings.steps):
                _release(device)
                m = trainer.step()
                row = step_row(m.values, dict(getattr(engine, "timings", {}) or {}))
                row.update({f"step_{k}": v for k, v in _memory(device).items()})  # this step's peaks
                rows.append(row)
                records.append({"step": m.step, **m.values})
                print(
                    f"[vlrl] step {step} ({'warm-up' if step < settings.warmup else 'measured'}): "
                    f"{row['step_s']:.2f} s (rollout {row['rollout_s']:.2f}, update {row.get('update_s', 0):.2f}, "
                    f"sync {row['sync_s']:.3f})",
                    flush=True,
                )
            # The run's peaks are the steps' (what `vlrl train` needs); the probes after them run
            # other variants of the update and report their own peaks.
            poll.__exit__()
            memory = {**_run_peaks(device), **poll.figures()}
            probes = run_probes(settings, trainer, memory_log, group_advantages, RolloutStats)
            n_forward = forward_parameters(worker.model)
            result = {
                "engine_path": engine_path(engine, device),
                "model_dir": str(model_dir),
                "save_s": save_s,
                "build_s": build_s,
                "steps": rows,
                "records": records,  # the trainer's full step records (time/*, throughput/*, train/*)
                "parameters": sum(p.numel() for p in worker.model.parameters()),
                "trainable_parameters": sum(p.numel() for p in worker.model.parameters() if p.requires_grad),
                "forward_parameters": n_forward,
                "scoring_passes": scoring_passes(config),
                "lora_mode": getattr(engine, "lora_mode", ""),
                "sleep_level": getattr(engine, "sleep_level", None),
                "sleep_unmap": getattr(engine, "sleep_unmap", None),
                "compiled_blocks": worker.policy.compiled_blocks.enabled,  # train.compile_blocks, resolved
                "ppo_epochs": config.algo.ppo_epochs,
            }
            memory.update(_host_memory())
            memory.update({f"probes_{k}": v for k, v in _run_peaks(device).items()})  # the probes alone
        finally:
            poll.__exit__()
            trainer.close()
    measured = rows[settings.warmup :] or rows
    summary = _summary(measured, settings)
    summary.update(probes.pop("summary"))
    summary.update(memory_log)
    flops, formula = update_flop_count(
        result["forward_parameters"], summary["train_tokens"], result["ppo_epochs"], result["scoring_passes"]
    )
    peak = settings.peak_tflops * 1e12
    summary.update(
        update_flops=flops,
        update_tflops_per_s=flops / max(1e-9, summary["update_s"]) / 1e12,
        update_mfu=flops / max(1e-9, summary["update_s"]) / peak,
        # The optimizer passes alone (6N per token per epoch over train_s, no scoring passes).
        optim_mfu=6
        * result["ppo_epochs"]
        * result["forward_parameters"]
        * summary["train_tokens"]
        / max(1e-9, summary.get("train_s", 0.0))
        / peak
        if summary.get("train_s")
        else 0.0,
    )
    result.update(
        summary=summary,
        mfu_formula=f"{formula}; peak {settings.peak_tflops:g} TFLOP/s (--peak-tflops)",
        memory=memory,
        **probes,
    )
    _release(device)
    return result


def run_probes(settings, trainer, memory_log, group_advantages, RolloutStats) -> dict[str, Any]:  # noqa: N803
    """After the timed steps, through the worker's public methods: the sampler check, the
    update's peak memory, what sleep frees, a separate copy's adapter sync, the decode sweep."""
    device = settings.resolved_device()
    worker = trainer.worker
    engine = worker.engine
    n, g = settings.prompts, settings.samples
    # Sanity of the sampler: the engine's log-probs of its own samples against the policy's
    # re-scoring of the same tokens (a wrong position, mask or cache would show as O(1) errors).
    # End-of-turn may be sampled here, so both score the same distribution.
    engine.ignore_eos = False
    tasks = trainer.sampler.next(n)
    check = worker.rollout(tasks, g, worker.sampling_params(seed=12345))
    engine.ignore_eos = True
    diffs = []
    for episode, rescored in zip(check, worker.policy.score_no_grad([e.sequence for e in check])):
        sampled = torch.tensor(episode.sequence.loss_mask[1:], dtype=torch.bool)
        diffs.append((rescored[sampled] - torch.tensor(episode.sequence.logprobs[1:])[sampled]).abs())
    diff = torch.cat(diffs) if diffs else torch.zeros(1)
    # The update's own peak (the engine asleep, as Worker.update puts it): one more update of these episodes.
    rewards = torch.tensor([[e.reward for e in check[i * g : (i + 1) * g]] for i in range(n)])
    advantages = group_advantages(rewards).flatten().tolist()
    _release(device)
    worker.update(check, advantages, seed=10_000)
    if device.type == "cuda":
        memory_log["update_peak_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        memory_log["update_peak_reserved_gib"] = torch.cuda.max_memory_reserved(device) / 2**30
        engine.wake_up()
        _release(device)
        awake = _free_bytes(device)
        engine.sleep()
        memory_log["sleep_freed_gib"] = (_free_bytes(device) - awake) / 2**30
        # A merging engine's own level-2 sleep (vllm_compat.release_for_rewrite): what stayed mapped.
        memory_log.update({f"sleep_{k}": v for k, v in getattr(engine, "sleep_stats", {}).items()})
    update_probes = {}
    if settings.probe_recompute:
        update_probes["recompute"] = _update_with_recompute(worker, check, advantages, device)
    if settings.probe_lora_upcast:
        other = "float32" if settings.lora_compute_dtype == "base" else "base"
        update_probes[f"lora_compute_{other}"] = _update_with_lora_compute(worker, check, advantages, device, other)
    if settings.probe_compile:
        compiled = worker.policy.compiled_blocks.enabled  # the steps' own, `auto` resolved
        key = "eager_blocks" if compiled else "compiled_blocks"
        update_probes[key] = _update_with_compile(worker, check, advantages, device, not compiled)
    if settings.profile_update:
        update_probes["profile"] = _profiled_update(worker, check, advantages, device)
    worker.sync_adapter(10_000)  # the engine serves the policy again
    del check
    # What a separate engine copy (W > 1 workers) pays to receive the adapter: gather to CPU and
    # load (the all-gather across workers comes on top). With the vLLM engine the step's own
    # sync_s is already that (gather + load into vLLM).
    _sync(device)
    t0 = time.perf_counter()
    state = worker.adapter_state()
    worker.load_adapter_state(state)
    _sync(device)
    copy_sync_s = time.perf_counter() - t0
    adapter_mib = sum(t.numel() * t.element_size() for t in state.values()) / 2**20

    sweep = {}
    for rows_wanted in settings.decode_sweep:
        prompts_needed = max(1, rows_wanted // g)
        tasks = trainer.sampler.next(prompts_needed)
        figures = []
        for _ in range(2):  # the first call may capture a graph for the new shape
            stats = RolloutStats()
            _sync(device)
            t0 = time.perf_counter()
            worker.rollout(tasks, g, worker.sampling_params(seed=1), stats)
            _sync(device)
            figures.append((time.perf_counter() - t0, stats))
        (first_s, _), (wall_s, stats) = figures
        batch = prompts_needed * g
        sweep[str(batch)] = {
            "first_s": first_s,
            "s": stats.generate_s,
            "rollout_s": wall_s,
            "tokens": stats.generated_tokens,
            "tokens_per_s": stats.generated_tokens / max(1e-9, stats.generate_s),
            **dict(getattr(engine, "timings", {}) or {}),
        }
        print(f"[vlrl] rollout only, batch {batch}: {sweep[str(batch)]['tokens_per_s']:,.0f} tok/s", flush=True)
    if settings.decode_sweep:  # what per-request seeds cost (vLLM draws seeded rows one by one)
        stats = RolloutStats()
        tasks = trainer.sampler.next(max(1, settings.decode_sweep[0] // g))
        worker.rollout(tasks, g, worker.sampling_params(seed=None), stats)
        key = f"{len(tasks) * g} unseeded"
        sweep[key] = {"s": stats.generate_s, "tokens_per_s": stats.generated_tokens / max(1e-9, stats.generate_s)}
        print(f"[vlrl] rollout only, batch {key}: {sweep[key]['tokens_per_s']:,.0f} tok/s", flush=True)
    return {
        "decode_sweep": sweep,
        "update_probes": update_probes,
        "summary": {
            "adapter_sync_copy_s": copy_sync_s,
            "adapter_mib": adapter_mib,
            "logprob_diff_mean": float(diff.mean()),
            "logprob_diff_max": float(diff.max()),
            **merge_rounding(worker),
        },
    }


def merge_rounding(worker) -> dict[str, float]:
    """A merging engine's W0 + s * B @ A (its factor dtype: one GEMM with W0 in the epilogue on a
    16-bit GPU base) against the same merge from fp32 A and B, on the adapter's largest LoRA
    weight: the share of entries that round to another value, and the largest difference."""
    from vlrl.models import vision_merge
    from vlrl.runtime import distributed

    engine = worker.engine
    if getattr(engine, "lora_mode", "") != "merged":
        return {}
    pairs = vision_merge.lora_pairs(distributed.gather_adapter_state(worker.model, to_cpu=False))
    name = max(pairs, key=lambda n: pairs[n][1].shape[0] * pairs[n][0].shape[1])
    ((_, base),) = worker._policy_base_weights([name])  # the engine's own W0 source
    a, b = pairs[name]
    scale = vision_merge.lora_scale(engine.lora_config)
    dtype = engine.served_dtype or base.dtype
    served = vision_merge.merge_lora(base, a, b, scale, name, dtype, engine.factor_dtype).float()
    exact = vision_merge.merge_lora(base, a, b, scale, name, dtype, torch.float32).float()
    delta = (served - base.float()).abs()
    return {
        "merge_factor_dtype": str(engine.factor_dtype).removeprefix("torch."),
        "merge_differ_fraction": float((served != exact).float().mean()),
        "merge_max_abs_diff": float((served - exact).abs().max()),
        "merge_delta_abs_mean": float(delta.mean()),
    }


def _timed_update(worker, episodes, advantages, device: torch.device, seed: int) -> float:
    """Seconds of one `worker.update` of `episodes`, from a released allocator (so the probe's
    peak is its own) to the last kernel."""
    _release(device)
    _sync(device)
    t0 = time.perf_counter()
    worker.update(episodes, advantages, seed=seed)
    _sync(device)
    return time.perf_counter() - t0


def _update_with_recompute(worker, episodes, advantages, device: torch.device) -> dict[str, float]:
    """One update of `episodes` with activation recomputation on (`train.gradient_checkpointing`'s
    switch, turned off again after): its time and peak memory, beside the step's update without it,
    so the choice is made from measured memory."""
    from vlrl.models.loading import enable_activation_checkpointing

    base = worker.model.get_base_model() if hasattr(worker.model, "get_base_model") else worker.model
    enable_activation_checkpointing(worker.model)
    try:
        out = {"update_s": _timed_update(worker, episodes, advantages, device, seed=10_001)}
    finally:
        base.gradient_checkpointing_disable()
    if device.type == "cuda":
        out["peak_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    print(f"[vlrl] update with activation recomputation: {out}", flush=True)
    return out


def _update_with_lora_compute(worker, episodes, advantages, device: torch.device, compute_dtype: str):
    """One update of `episodes` with the other `model.lora.compute_dtype` (switched back after): its
    time and peak memory, beside the step's update, on the same episodes in the same process."""
    policy = worker.policy
    policy.use_lora_compute_dtype(compute_dtype)
    try:
        out = {"update_s": _timed_update(worker, episodes, advantages, device, seed=10_003)}
    finally:
        policy.use_lora_compute_dtype(worker.config.model.lora.compute_dtype)
    if device.type == "cuda":
        out["peak_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    print(f"[vlrl] update with model.lora.compute_dtype={compute_dtype}: {out}", flush=True)
    return out


def _update_with_compile(worker, episodes, advantages, device: torch.device, enabled: bool) -> dict[str, float]:
    """Two updates of `episodes` with the other `train.compile_blocks` (the policy's own blocks
    put back after): the first pays the compile (and a recompile for a second shape), the second
    is the one to compare with the step's update. A compile that fails is reported, not raised."""
    from vlrl.models.regional_compile import CompiledBlocks

    policy = worker.policy
    kept = policy.compiled_blocks
    out: dict[str, float | str] = {}
    try:
        policy.compiled_blocks = CompiledBlocks(worker.model, enabled)
        for key, seed in (("first_s", 10_004), ("update_s", 10_005)):
            out[key] = _timed_update(worker, episodes, advantages, device, seed=seed)
    except Exception as exc:  # noqa: BLE001 - a probe that fails must not cost the run its figures
        out["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    finally:
        policy.compiled_blocks = kept
    if device.type == "cuda":
        out["peak_allocated_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    print(f"[vlrl] update with train.compile_blocks={str(enabled).lower()}: {out}", flush=True)
    return out


def _profiled_update(worker, episodes, advantages, device: torch.device, rows: int = 30) -> dict[str, Any]:
    """One update under torch.profiler: the `rows` ops with the most device (else CPU) time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _release(device)
    with profile(activities=activities) as prof:
        worker.update(episodes, advantages, seed=10_002)
        _sync(device)
    key = "device_time_total" if device.type == "cuda" else "cpu_time_total"
    events = prof.key_averages()
    total = sum(getattr(e, "self_" + key, 0.0) for e in events) or 1.0
    top = sorted(events, key=lambda e: getattr(e, "self_" + key, 0.0), reverse=True)[:rows]
    table = [
        {
            "op": e.key,
            "calls": e.count,
            f"self_{key}_ms": getattr(e, "self_" + key, 0.0) / 1e3,
            "share": getattr(e, "self_" + key, 0.0) / total,
        }
        for e in top
    ]
    for row in table[:12]:
        print(f"[vlrl] update profile: {row}", flush=True)
    return {"sort_key": f"self_{key}", f"self_{key}_total_ms": total / 1e3, "top": table}


def engine_path(engine, device: torch.device) -> str:
    """Which rollout path the worker's engine took, in words."""
    if type(engine).__name__ == "VLLMEngine":
        import vllm

        return (
            f"vLLM {vllm.__version__} (adapters by {getattr(engine, 'adapter_transport', '?')}, "
            f"start-up {getattr(engine, 'startup_s', 0.0):.0f} s)"
        )
    if "decode_s" in (getattr(engine, "timings", None) or {}):
        return "static-cache decoder, CUDA graphs" if device.type == "cuda" else "static-cache decoder, eager"
    return "transformers generate"


def _free_bytes(device: torch.device) -> int:
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0


def _host_memory() -> dict[str, float]:
    """This process's peak resident memory (the whole run so far)."""
    import resource

    return {"host_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def saved_model_dir(settings: BenchSettings) -> Path:
    """A directory holding the model (the worker and TRL's vLLM load from files): the model
    itself, or the preset saved once."""
    if Path(settings.model).is_dir():
        return Path(settings.model)
    path = Path(settings.model_dir or f"/tmp/vlrl-bench-{settings.model}")
    save_preset(path, settings)
    return path


def save_preset(path: Path, settings: BenchSettings) -> float:
    """Build the preset `settings.model` (on the bench's device: fast for the 8B shape) and save
    it (weights, tokenizer, processor) at `path` unless it is there; returns the seconds it took.
    Written aside, then renamed."""
    if (path / "config.json").is_file():
        return 0.0
    from vlrl.models.tiny import TINY_SPECS, _save_processor_files, build_tokenizer

    t0 = time.perf_counter()
    device = settings.resolved_device()
    model, _ = build_model(settings, device)
    tmp = path.with_name(f".{path.name}.tmp")
    model.save_pretrained(str(tmp))
    spec = TINY_SPECS[settings.model]
    _save_processor_files(tmp, spec, build_tokenizer(spec.tokenizer_vocab))
    tmp.rename(path)
    del model
    _release(device)
    return time.perf_counter() - t0


def _summary(rows: list[dict[str, float]], settings: BenchSettings) -> dict[str, float]:
    step_s = _mean(rows, "step_s")
    completions = settings.prompts * settings.samples
    out = {key: _mean(rows, key) for key in sorted({k for r in rows for k in r})}
    out.update(
        completions_per_s=completions / step_s if step_s else 0.0,
        rollout_tokens_per_s=_mean(rows, "generated_tokens") / max(1e-9, _mean(rows, "generate_s")),
        train_tokens_per_s=_mean(rows, "train_tokens") / max(1e-9, _mean(rows, "update_s")),
        prompt_tokens=_mean(rows, "train_tokens") / completions - settings.new_tokens,
    )
    return out


# ------------------------------------------------------------------------------------------
# TRL


def trl_variants(settings: BenchSettings) -> list[str]:
    """The TRL runs asked for: "trl" (transformers generation) and/or "trl-vllm" (colocated vLLM)."""
    variants = [v for v in settings.compare if v in ("trl", "trl-vllm")]
    if settings.trl_only and not variants:
        variants = ["trl"]
    if settings.trl_vllm:  # the older spelling: --trl-vllm turns the TRL run into the vLLM one
        variants = ["trl-vllm" if v == "trl" else v for v in variants]
    return list(dict.fromkeys(variants))


def run_trl(settings: BenchSettings, use_vllm: bool = False) -> dict[str, Any]:
    """The same workload through TRL's GRPOTrainer: transformers generation, or (`use_vllm`) its
    colocated vLLM engine. Loaded from the same directory as vlrl's worker (the same weights)."""
    try:
        import trl
        from peft import LoraConfig
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        from vlrl.errors import VlrlError

        raise VlrlError(f"--compare trl needs TRL and datasets (pip install -e '.[bench]'): {exc}") from None
    from vlrl.envs.base import Task, build_split, make_env
    from vlrl.envs.maze.env import PLAN_INSTRUCTION, PLAN_SYSTEM_PROMPT
    from vlrl.models.lora import lora_target_regex

    device = settings.resolved_device()
    settings = dataclasses.replace(settings, trl_vllm=use_vllm)
    t0 = time.perf_counter()
    # TRL's vLLM loads the model from its directory (model.name_or_path); both runs load the saved preset.
    model_dir = saved_model_dir(settings)
    config = bench_config(settings, model_dir, Path(tempfile.gettempdir()))
    settings = dataclasses.replace(settings, model=str(model_dir))
    model, processor = build_model(settings, device)
    build_s = time.perf_counter() - t0
    _release(device)
    _PEAKS.clear()  # the peaks of the steps, the weights included, not of building them
    total_steps = settings.warmup + settings.steps
    split = build_split(config.env, "train")
    tasks = [split[i] for i in range(total_steps * settings.prompts)]
    rows = []
    for task in tasks:
        env = make_env(config.env)
        obs = env.reset(task)
        rows.append(
            {
                "prompt": [
                    {"role": "system", "content": PLAN_SYSTEM_PROMPT},
                    {"role": "user", "content": PLAN_INSTRUCTION},
                ],
                "image": obs.images[0],
                "task": json.dumps(task.to_json()),
            }
        )
    assert rows[0]["prompt"][1]["content"] == obs.text and env.system_prompt == PLAN_SYSTEM_PROMPT
    dataset = _dataset(rows)

    def maze_reward(completions, task, **_):
        """The maze_plan environment's reward for each completion (conversational: one assistant message)."""
        out = []
        for completion, task_json in zip(completions, task):
            env = make_env(config.env)
            env.reset(Task.from_json(json.loads(task_json)))
            text = completion[0]["content"] if isinstance(completion, list) else completion
            out.append(float(env.step(text).reward))
        return out

    completions = settings.prompts * settings.samples
    micro = min(settings.micro_batch, completions)
    cuda = device.type == "cuda"
    with tempfile.TemporaryDirectory() as out_dir:
        args = GRPOConfig(
            output_dir=out_dir,
            report_to=[],
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=completions // micro,
            num_generations=settings.samples,
            max_completion_length=settings.new_tokens,
            # Force the length (as vlrl's run) and never sample vision placeholders (a random model would).
            generation_kwargs=trl_generation_kwargs(settings, processor),
            **trl_vllm_args(settings),
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=0.0,
            num_iterations=1,
            learning_rate=settings.lr,
            max_steps=total_steps,
            seed=settings.seed,
            shuffle_dataset=False,
            # Memory is plentiful: no activation recomputation (TRL's default is on), as vlrl runs.
            gradient_checkpointing=False,
            bf16=cuda and settings.dtype == "bfloat16",
            use_cpu=not cuda,
            dataloader_num_workers=0,
        )
        lora = LoraConfig(
            r=settings.lora_rank,
            lora_alpha=settings.lora_alpha,
            lora_dropout=0.0,
            target_modules=lora_target_regex(config.model.lora.target_modules),
            bias="none",
        )
        marks: list[float] = []
        gen_times: list[float] = []

        class StepClock(TrainerCallback):
            def on_train_begin(self, *_, **__):
                _sync(device)
                marks.append(time.perf_counter())

            def on_step_end(self, *_, **__):
                _sync(device)
                marks.append(time.perf_counter())

        trainer = GRPOTrainer(
            model=model,
            reward_funcs=maze_reward,
            args=args,
            train_dataset=dataset,
            processing_class=processor,
            peft_config=lora,
            callbacks=[StepClock()],
        )
        generate = trainer._generate_single_turn
        gen_bucket: dict[str, float] = {}

        def timed_generate(*a, **k):
            gen_bucket.clear()
            result = _timed(generate, gen_bucket, "s", device)(*a, **k)
            gen_times.append(gen_bucket["s"])
            return result

        trainer._generate_single_turn = timed_generate
        # The device's used memory over the steps, as vlrl's side polls it (its vLLM engine included).
        with DevicePeak(device) as poll:
            trainer.train()
        logs = [h for h in trainer.state.log_history if "loss" in h]
    step_times = [b - a for a, b in zip(marks, marks[1:])]
    rows = [{"step_s": s, "generate_s": g, "rest_s": s - g} for s, g in zip(step_times, gen_times)]
    measured = rows[settings.warmup :] or rows
    step_s = _mean(measured, "step_s")
    result = {
        "version": trl.__version__ + (" + vLLM colocate" if settings.trl_vllm else ""),
        "use_vllm": settings.trl_vllm,
        "build_s": build_s,
        "steps": rows,
        "summary": {
            "step_s": step_s,
            "generate_s": _mean(measured, "generate_s"),
            "rest_s": _mean(measured, "rest_s"),
            "completions_per_s": completions / step_s if step_s else 0.0,
            "rollout_tokens_per_s": completions * settings.new_tokens / max(1e-9, _mean(measured, "generate_s")),
        },
        "memory": {**_run_peaks(device), **poll.figures(), **_host_memory()},
        "logged_steps": len(logs),
    }
    del trainer, model
    _release(device)
    return result


def trl_generation_kwargs(settings: BenchSettings, processor) -> dict[str, Any]:
    """Force the length (as vlrl's run) and never sample vision placeholders (a random model would).

    transformers' generate takes `min_new_tokens` / `suppress_tokens`; vLLM's SamplingParams
    `min_tokens` / `allowed_token_ids` (every id of the tokenizer but the vision special tokens).
    """
    from vlrl.models.loading import vision_special_token_ids

    banned = set(vision_special_token_ids(processor))
    if settings.trl_vllm:
        allowed = [i for i in range(len(processor.tokenizer)) if i not in banned]
        return {"min_tokens": settings.new_tokens, "allowed_token_ids": allowed}
    return {"min_new_tokens": settings.new_tokens, "suppress_tokens": sorted(banned)}


def trl_vllm_args(settings: BenchSettings) -> dict[str, Any]:
    """GRPOConfig fields for TRL's colocated vLLM (what TRL users run), or none."""
    if not settings.trl_vllm:
        return {}
    share = 0.3 if settings.gpu_memory_utilization == "auto" else float(settings.gpu_memory_utilization)
    return {
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": share,
        "vllm_max_model_length": 1024,
        "vllm_enable_sleep_mode": False,
    }


def _dataset(rows: list[dict[str, Any]]):
    """A `datasets.Dataset` of the rows, with a fixed fingerprint: hashing an Arrow table with
    images goes through dill, which fails on some pyarrow versions (seen with pyarrow 26)."""
    from datasets import Dataset, DatasetInfo, Features, Image, Value
    from datasets.table import InMemoryTable

    features = Features(
        {
            "prompt": [{"role": Value("string"), "content": Value("string")}],
            "image": Image(),
            "task": Value("string"),
        }
    )
    table = InMemoryTable.from_pylist([features.encode_example(r) for r in rows], schema=features.arrow_schema)
    return Dataset(table, info=DatasetInfo(features=features), fingerprint=f"vlrl-bench-{len(rows)}")


# ------------------------------------------------------------------------------------------
# driver


def environment_info(device: torch.device) -> dict[str, Any]:
    import peft
    import transformers

    info = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "device": str(device),
        "host": platform.node(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["gpu_count"] = torch.cuda.device_count()
    else:
        info["cpu_threads"] = torch.get_num_threads()
    return info


def run(settings: BenchSettings) -> dict[str, Any]:
    """vlrl's run (unless `trl_only`), then each TRL run compared, and the ratios of their step times."""
    device = settings.resolved_device()
    result: dict[str, Any] = {"settings": dataclasses.asdict(settings), "environment": environment_info(device)}
    if not settings.trl_only:
        result["vlrl"] = run_vlrl(settings)
    for variant in trl_variants(settings):
        result[TRL_KEYS[variant]] = run_trl(settings, use_vllm=variant == "trl-vllm")
    return with_ratio(result)


# Where each TRL run sits in a result: without vLLM (transformers generation) and with its colocated vLLM.
TRL_KEYS = {"trl": "trl", "trl-vllm": "trl_vllm"}


def with_ratio(result: dict[str, Any]) -> dict[str, Any]:
    """Add each TRL run's step time over vlrl's when both are in `result`."""
    if "vlrl" not in result:
        return result
    ours = result["vlrl"]["summary"]["step_s"]
    for key in TRL_KEYS.values():
        if key in result:
            result[f"{key}_over_vlrl_step_time"] = result[key]["summary"]["step_s"] / ours
    return result


def _trl_parts(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The TRL runs of a result by key; a "trl" run that used vLLM (files of before the split) is trl_vllm."""
    parts = {key: result[key] for key in TRL_KEYS.values() if key in result}
    trl = parts.get("trl")
    if trl is not None and (trl.get("use_vllm") or "vLLM" in str(trl.get("version", ""))):
        parts["trl_vllm"] = parts.pop("trl")
    return parts


def merge(vlrl_result: dict[str, Any], *trl_results: dict[str, Any]) -> dict[str, Any]:
    """One result from a vlrl-only run and TRL-only runs (with and without vLLM) of the same
    workload, run one after the other or on several GPUs at once."""
    keys = ("model", "dtype", "lora_rank", "prompts", "samples", "new_tokens", "micro_batch", "maze_size", "cell_px")
    a = _resolved_model(vlrl_result["settings"])
    merged = {k: v for k, v in vlrl_result.items() if k not in TRL_KEYS.values()}
    for other in trl_results:
        b = _resolved_model(other["settings"])
        different = [k for k in keys if a[k] != b[k]]
        if different:
            raise ValueError(f"the two runs differ in {different}: not the same workload")
        for key, part in _trl_parts(other).items():
            merged[key] = part
            merged[f"{key}_environment"] = other["environment"]
    return with_ratio(merged)


def _resolved_model(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings with `model` naming the directory actually loaded (a preset is saved to model_dir)."""
    model = str(settings["model"])
    if not Path(model).is_absolute():
        return {**settings, "model": settings.get("model_dir") or f"/tmp/vlrl-bench-{model}"}
    return settings


def headline(result: dict[str, Any]) -> dict[str, float | None]:
    """The figures the GPU run is judged by (None where this run did not measure one)."""
    ours = result.get("vlrl", {})
    summary = ours.get("summary", {})
    sweep = ours.get("decode_sweep", {})
    batch64 = sweep.get("64", {}).get("tokens_per_s")
    s = result["settings"]
    if batch64 is None and s["prompts"] * s["samples"] == 64 and "rollout_tokens_per_s" in summary:
        batch64 = summary["rollout_tokens_per_s"]  # the step's own rollout is 64 completions
    memory = ours.get("memory", {})
    return {
        "step_s": summary.get("step_s"),
        "generate_batch64_tokens_per_s": batch64,
        "sync_s": summary.get("sync_s"),
        "update_tokens_per_s": summary.get("train_tokens_per_s"),
        "update_mfu": summary.get("update_mfu"),
        "peak_allocated_gib": memory.get("peak_allocated_gib"),
        "device_peak_used_gib": memory.get("device_peak_used_gib"),
        "update_peak_allocated_gib": summary.get("update_peak_allocated_gib"),
        # The peer's peaks, measured the same two ways (the memory target compares like with like).
        "trl_vllm_peak_allocated_gib": result.get("trl_vllm", {}).get("memory", {}).get("peak_allocated_gib"),
        "trl_vllm_device_peak_used_gib": result.get("trl_vllm", {}).get("memory", {}).get("device_peak_used_gib"),
        "trl_vllm_over_vlrl_step_time": result.get("trl_vllm_over_vlrl_step_time"),
        "trl_over_vlrl_step_time": result.get("trl_over_vlrl_step_time"),
    }


def format_table(result: dict[str, Any]) -> str:
    """A plain-text table of the summary: a column for vlrl and one for each TRL run, whichever ran."""
    s, env = result["settings"], result["environment"]
    columns: list[tuple[str, dict[str, Any]]] = []
    if "vlrl" in result:
        columns.append(("vlrl", result["vlrl"]))
    for key in TRL_KEYS.values():
        if key in result:
            columns.append((f"TRL {result[key]['version']}", result[key]))
    lines = [
        f"GRPO step benchmark - {s['model']}, {s['dtype']}, LoRA r={s['lora_rank']}, {s['prompts']} prompts x "
        f"{s['samples']} samples x {s['new_tokens']} new tokens, maze_plan {s['maze_size']}x{s['maze_size']}, "
        f"micro-batch {s['micro_batch']}",
        f"{env.get('gpu', env['device'])} | torch {env['torch']} | transformers {env['transformers']} | {env['date']}",
    ]
    if "vlrl" in result:
        lines.append(
            f"vlrl: GRPOTrainer.step, one local Worker; engine {result['vlrl']['engine_path']} "
            f"(fast_decode={s['fast_decode']}, compile={s['compile_decode']})"
        )
    width = max([16] + [len(name) + 2 for name, _ in columns])
    lines += ["", f"{'metric':<36}" + "".join(f"{name:>{width}}" for name, _ in columns)]

    def row(label: str, key: str, fmt: str = "{:,.2f}", where: str = "summary") -> None:
        cells = []
        for _, part in columns:
            value = part.get(where, {}).get(key)
            cells.append(fmt.format(value) if value is not None else "-")
        if any(c != "-" for c in cells):
            lines.append(f"{label:<36}" + "".join(f"{c:>{width}}" for c in cells))

    row("s / step", "step_s", "{:.2f}")
    row("completions / s", "completions_per_s")
    row("rollout tokens / s", "rollout_tokens_per_s", "{:,.0f}")
    row("training (update) tokens / s", "train_tokens_per_s", "{:,.0f}")
    row("update MFU", "update_mfu", "{:.1%}")
    row("  fwd + bwd + AdamW MFU", "optim_mfu", "{:.1%}")
    row("adapter sync s (this engine)", "sync_s", "{:.4f}")
    row("adapter sync s (separate copy)", "adapter_sync_copy_s", "{:.3f}")
    row("engine-policy log-prob |diff| mean", "logprob_diff_mean", "{:.2e}")
    row("merge: entries rounded otherwise than from fp32 A, B", "merge_differ_fraction", "{:.2e}")
    lines.append("phases (s)")
    row("  rollout (generate + env)", "rollout_s", "{:.3f}")
    row("    generate", "generate_s", "{:.3f}")
    row("      prefill", "prefill_s", "{:.3f}")
    row("      graph capture", "capture_s", "{:.3f}")
    row("      decode", "decode_s", "{:.3f}")
    row("    env + prompts", "env_s", "{:.3f}")
    row("  update", "update_s", "{:.3f}")
    row("  TRL: step - generate", "rest_s", "{:.3f}")
    row("    old/ref log-probs", "old_logprobs_s", "{:.3f}")
    row("    fwd + bwd + AdamW", "train_s", "{:.3f}")
    row("  sync", "sync_s", "{:.4f}")
    row("    wake (map weights back)", "sync_wake_s", "{:.4f}")
    row("      of which the KV cache", "sync_wake_kv_s", "{:.4f}")
    row("    merge + write", "sync_merge_s", "{:.4f}")
    row("      host time to queue it", "sync_merge_host_s", "{:.4f}")
    row("peak GPU memory GiB (allocated)", "peak_allocated_gib", "{:.1f}", where="memory")
    row("peak GPU memory GiB (reserved)", "peak_reserved_gib", "{:.1f}", where="memory")
    row("  probes after the steps (allocated)", "probes_peak_allocated_gib", "{:.1f}", where="memory")
    row("peak GPU memory GiB (device, polled)", "device_peak_used_gib", "{:.1f}", where="memory")
    row("peak host memory GiB (RSS)", "host_peak_rss_gib", "{:.1f}", where="memory")
    row("GPU free after worker start GiB", "free_after_worker_start_gib", "{:.1f}")
    row("GPU memory freed by sleep GiB", "sleep_freed_gib", "{:.1f}")
    row("  weights left mapped while asleep GiB", "sleep_weights_kept_gib", "{:.1f}")
    row("  weight allocations unmapped", "sleep_weight_allocations_released", "{:.0f}")
    row("  weight allocations in all", "sleep_weight_allocations", "{:.0f}")
    row("update peak allocated GiB", "update_peak_allocated_gib", "{:.1f}")
    if "vlrl" in result:
        for batch, figures in result["vlrl"]["decode_sweep"].items():
            lines.append(f"{f'rollout only, batch {batch}: tok/s':<36}{figures['tokens_per_s']:>16,.0f}")
        ours = result["vlrl"]
        lines.append(f"LoRA served: {ours.get('lora_mode') or '-'}, vLLM sleep level {ours.get('sleep_level') or '-'}")
        probes = ours.get("update_probes", {})
        if "recompute" in probes:
            r = probes["recompute"]
            peak = f", peak {r['peak_allocated_gib']:.1f} GiB" if "peak_allocated_gib" in r else ""
            lines.append(f"update with activation recomputation: {r['update_s']:.2f} s{peak}")
        for key in ("lora_compute_float32", "lora_compute_base"):
            if key in probes:
                r = probes[key]
                peak = f", peak {r['peak_allocated_gib']:.1f} GiB" if "peak_allocated_gib" in r else ""
                lines.append(
                    f"update with model.lora.compute_dtype={key.rsplit('_', 1)[1]}: {r['update_s']:.2f} s{peak}"
                )
        for key in ("compiled_blocks", "eager_blocks"):
            if key in probes:
                r = probes[key]
                what = "compiled blocks" if key == "compiled_blocks" else "eager blocks"
                if "update_s" in r:
                    lines.append(f"update with {what}: {r['update_s']:.2f} s (first, compiling: {r['first_s']:.1f} s)")
                else:
                    lines.append(f"update with {what}: failed ({r.get('error', '?')})")
        for op in probes.get("profile", {}).get("top", [])[:8]:
            lines.append(f"  update op {op['op'][:48]:<48} {op['share']:>6.1%}")
    if "trl_over_vlrl_step_time" in result:
        lines.append(f"TRL step time / vlrl step time: {result['trl_over_vlrl_step_time']:.2f}x")
    if "trl_vllm_over_vlrl_step_time" in result:
        lines.append(f"TRL+vLLM step time / vlrl step time: {result['trl_vllm_over_vlrl_step_time']:.2f}x")
    if "vlrl" in result:
        ours = result["vlrl"]["summary"]
        lines.append(
            f"training tokens per step {ours['train_tokens']:.0f} (prompt {ours['prompt_tokens']:.0f} + "
            f"{s['new_tokens']} new per completion); warm-up steps ({s['warmup']}) not counted"
        )
        lines.append(result["vlrl"]["mfu_formula"])
    figures = headline(result)
    lines += ["", "headline (- : not measured in this run)"]
    labels = {
        "step_s": ("s / step", "{:.2f}"),
        "generate_batch64_tokens_per_s": ("generate at batch 64, tok/s", "{:,.0f}"),
        "sync_s": ("adapter sync s", "{:.4f}"),
        "update_tokens_per_s": ("update tok/s", "{:,.0f}"),
        "update_mfu": ("update MFU", "{:.1%}"),
        "peak_allocated_gib": ("peak GPU memory GiB (torch)", "{:.1f}"),
        "device_peak_used_gib": ("peak GPU memory GiB (device)", "{:.1f}"),
        "update_peak_allocated_gib": ("update peak GiB", "{:.1f}"),
        "trl_vllm_peak_allocated_gib": ("TRL+vLLM peak GiB (torch)", "{:.1f}"),
        "trl_vllm_device_peak_used_gib": ("TRL+vLLM peak GiB (device)", "{:.1f}"),
        "trl_vllm_over_vlrl_step_time": ("TRL+vLLM / vlrl step time", "{:.2f}x"),
        "trl_over_vlrl_step_time": ("TRL (no vLLM) / vlrl step time", "{:.2f}x"),
    }
    for key, (label, fmt) in labels.items():
        value = figures[key]
        lines.append(f"  {label:<34}{fmt.format(value) if value is not None else '-':>16}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> tuple[BenchSettings | list[str], str | None]:
    defaults = BenchSettings()
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for f in dataclasses.fields(BenchSettings):
        flag = "--" + f.name.replace("_", "-")
        value = getattr(defaults, f.name)
        if f.name == "compile_blocks":  # `--compile-blocks` alone means true, as the flag it was
            p.add_argument(flag, nargs="?", const="true", default=value, choices=["auto", "true", "false"])
        elif isinstance(value, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        elif isinstance(value, list):
            p.add_argument(flag, default=",".join(map(str, value)), help="comma-separated")
        else:
            p.add_argument(flag, type=type(value), default=value)
    p.add_argument("--out", default=None, help="write the full result as JSON here")
    p.add_argument(
        "--merge",
        nargs="+",
        metavar="JSON",
        default=None,
        help="combine a vlrl-only result and TRL-only results (with and without vLLM) into one table (nothing is run)",
    )
    ns = vars(p.parse_args(argv))
    out = ns.pop("out")
    merge_files = ns.pop("merge")
    if merge_files:
        return merge_files, out
    ns["decode_sweep"] = [int(x) for x in str(ns["decode_sweep"]).split(",") if x]
    ns["compare"] = [x for x in str(ns["compare"]).split(",") if x]
    return BenchSettings(**ns), out


def main(argv: list[str] | None = None) -> int:
    settings, out = parse_args(argv)
    if isinstance(settings, list):  # --merge
        result = merge(*(json.loads(Path(f).read_text()) for f in settings))
    else:
        result = run(settings)
    print(format_table(result))
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
