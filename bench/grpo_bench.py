#!/usr/bin/env python
"""The GRPO step benchmark: the reference workload through vlrl, and through TRL side by side.

The reference workload (issue 10): a random-initialised model of a given shape (default the
`qwen3vl-8b-shape` preset, built in memory by our own code: nothing is downloaded), bf16, LoRA
r=32 on the language model's projections, the single-turn 5x5 maze plan task (`maze_plan`) at
225 px (224 px after the processor, 49 image tokens), 8 prompts x 8 samples = 64 completions of
exactly 128 new tokens (end-of-turn never sampled, so runs compare), one optimizer step per batch.

vlrl's step is the one `GRPOTrainer` runs with one in-process worker: `run_episodes` through a
`TransformersEngine` that shares the policy's module, GRPO advantages, `Policy.update` (old
log-probs, micro-batched forward/backward, AdamW), adapter sync. Warm-up steps (CUDA graph
capture, allocator growth) are run first and reported apart. `--compare trl` then builds the same
model again and runs TRL's `GRPOTrainer` (transformers generation, no vLLM) on the same prompts,
images, batch and LoRA, and prints the ratio of the mean step times.

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
    decode_sweep: list[int] = field(default_factory=list)  # extra rollout-only batch sizes to time
    compare: list[str] = field(default_factory=list)  # "trl"
    trl_only: bool = False  # run TRL's side alone (e.g. on another GPU at the same time; see --merge)
    trl_vllm: bool = False  # TRL generates with vLLM (use_vllm=True, vllm_mode="colocate") instead of transformers
    seed: int = 0

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


def reference_config(settings: BenchSettings):
    """The RunConfig of the workload (what `vlrl train` would be given for it)."""
    from vlrl.config import load_config

    completions = settings.prompts * settings.samples
    return load_config(
        None,
        [
            f"model.dtype={settings.dtype}",
            f"model.attn_implementation={settings.attn}",
            f"model.lora.rank={settings.lora_rank}",
            f"model.lora.alpha={settings.lora_alpha}",
            "env.name=maze_plan",
            f"env.sizes=[{settings.maze_size}]",
            f"env.cell_px={settings.cell_px}",
            "rollout.engine=transformers",
            "rollout.temperature=1.0",
            f"rollout.max_new_tokens={settings.new_tokens}",
            f"rollout.batch_size={completions}",
            "rollout.max_model_len=4096",
            f"algo.group_size={settings.samples}",
            f"algo.tasks_per_step={settings.prompts}",
            f"algo.mini_batch_size={completions}",
            f"algo.micro_batch_size={min(settings.micro_batch, completions)}",
            "algo.ppo_epochs=1",
            "algo.kl_coef=0.0",
            f"train.lr={settings.lr}",
            f"train.seed={settings.seed}",
            "runtime.backend=local",
        ],
    )


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


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


# ------------------------------------------------------------------------------------------
# vlrl


def run_vlrl(settings: BenchSettings) -> dict[str, Any]:
    """Warm-up plus measured GRPO steps through vlrl's own rollout engine and policy update."""
    from vlrl.algo.grpo import group_advantages
    from vlrl.envs.base import build_split
    from vlrl.models.loading import vision_special_token_ids
    from vlrl.models.lora import adapter_state_dict, apply_lora, load_adapter_state_dict
    from vlrl.rollout.engine import SamplingParams
    from vlrl.rollout.episodes import RolloutStats, run_episodes
    from vlrl.rollout.factory import build_engine
    from vlrl.rollout.sequence import ChatFormat
    from vlrl.training.policy import Policy

    device = settings.resolved_device()
    config = reference_config(settings)
    t0 = time.perf_counter()
    if settings.engine == "vllm":  # vLLM loads from a directory: save the preset once, load both from it
        settings = dataclasses.replace(settings, model=str(saved_model_dir(settings)))
    base, processor = build_model(settings, device)
    build_s = time.perf_counter() - t0
    model = apply_lora(
        base, settings.lora_rank, settings.lora_alpha, 0.0, config.model.lora.target_modules, seed=settings.seed
    )
    model.to(device)
    _release(device)
    chat = ChatFormat(processor)
    tokenizer = processor.tokenizer
    suppress = vision_special_token_ids(processor)
    pad_id = tokenizer.pad_token_id
    total_steps = settings.warmup + settings.steps
    policy = Policy(model, config, suppress, pad_id, total_optimizer_steps=total_steps)
    memory_log: dict[str, float] = {}
    if settings.engine == "vllm":
        engine = make_vllm_engine(settings, config, model, chat, memory_log)
    else:
        engine = build_engine(
            config,
            chat,
            model,
            engine="transformers",
            shares_policy=True,
            fast_decode={"on": True, "off": False}.get(settings.fast_decode, "auto"),
            compile_decode=settings.compile_decode,
            ignore_eos=True,
        )
    phases: dict[str, float] = {}
    policy.score_no_grad = _timed(policy.score_no_grad, phases, "old_logprobs_s", device)
    policy._optimizer_step = _timed(policy._optimizer_step, phases, "train_s", device)
    n = settings.prompts
    split = build_split(config.env, "train")  # lazy: only the tasks used are generated
    tasks = [
        split[i] for i in range(max(total_steps * n, max(settings.decode_sweep, default=0) // settings.samples + 1))
    ]

    rows: list[dict[str, float]] = []
    for step in range(total_steps):
        phases.clear()
        batch = tasks[step * n : (step + 1) * n]
        params = SamplingParams(
            n=settings.samples, temperature=1.0, max_new_tokens=settings.new_tokens, seed=settings.seed * 1000 + step
        )
        stats = RolloutStats()
        _sync(device)
        t_start = time.perf_counter()
        episodes = run_episodes(
            engine, chat, config.env, batch, settings.samples, params, config.rollout.max_model_len, stats
        )
        _sync(device)
        t_rollout = time.perf_counter()
        rewards = torch.tensor(
            [[e.reward for e in episodes[g * settings.samples : (g + 1) * settings.samples]] for g in range(n)]
        )
        advantages = group_advantages(rewards).flatten().tolist()
        free_awake = _free_bytes(device)
        engine.sleep()
        free_asleep = _free_bytes(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        update = policy.update(episodes, advantages, seed=step)
        _sync(device)
        t_update = time.perf_counter()
        if device.type == "cuda":
            memory_log["update_peak_allocated_gib"] = max(
                memory_log.get("update_peak_allocated_gib", 0.0), torch.cuda.max_memory_allocated(device) / 2**30
            )
        memory_log["sleep_freed_gib"] = (free_asleep - free_awake) / 2**30
        # A separate engine (vLLM) receives the adapter as CPU tensors; a shared one only a version bump.
        sync_s = engine.update_adapter(
            {} if getattr(engine, "shares_policy", False) else adapter_state_dict(model), step + 1
        )
        if settings.engine == "vllm" and device.type == "cuda":
            memory_log["free_after_wake_gib"] = _free_bytes(device) / 2**30
        t_end = time.perf_counter()
        row = {
            "step_s": t_end - t_start,
            "rollout_s": t_rollout - t_start,
            "generate_s": stats.generate_s,
            "env_s": stats.env_s,
            "update_s": t_update - t_rollout,
            "sync_s": sync_s,
            "generated_tokens": float(stats.generated_tokens),
            "train_tokens": float(sum(len(e.sequence) for e in episodes)),
            "prompt_tokens": float(sum(len(e.sequence) - e.response_tokens for e in episodes) / len(episodes)),
            "reward_mean": float(rewards.mean()),
            "loss": float(update.get("loss", 0.0)),
            # old_logprobs_s is 0 when the update is on-policy (one optimizer step: no separate pass)
            **dict(getattr(engine, "timings", {})),
            "old_logprobs_s": 0.0,
            **phases,
        }
        rows.append(row)
        print(
            f"[vlrl] step {step} ({'warm-up' if step < settings.warmup else 'measured'}): "
            f"{row['step_s']:.2f} s (rollout {row['rollout_s']:.2f}, update {row['update_s']:.2f})",
            flush=True,
        )

    # Sanity of the sampler: the engine's log-probs of its own samples against the policy's
    # re-scoring of the same tokens (a wrong position, mask or cache would show as O(1) errors).
    # End-of-turn may be sampled here, so both score the same distribution.
    engine.ignore_eos = False
    check = run_episodes(
        engine,
        chat,
        config.env,
        tasks[:n],
        settings.samples,
        SamplingParams(n=settings.samples, temperature=1.0, max_new_tokens=settings.new_tokens, seed=12345),
        config.rollout.max_model_len,
    )
    diffs = []
    for episode, rescored in zip(check, policy.score_no_grad([e.sequence for e in check])):
        sampled = torch.tensor(episode.sequence.loss_mask[1:], dtype=torch.bool)
        diffs.append((rescored[sampled] - torch.tensor(episode.sequence.logprobs[1:])[sampled]).abs())
    diff = torch.cat(diffs)
    del check
    engine.ignore_eos = True

    # What a separate engine copy (W > 1 workers) pays to receive the adapter: a GPU->CPU copy of
    # the LoRA tensors and an in-place load (the all-gather across workers comes on top). With the
    # vLLM engine the step's own sync_s is already that (GPU->CPU copy + load into vLLM).
    _sync(device)
    t0 = time.perf_counter()
    state = adapter_state_dict(model)
    load_adapter_state_dict(model, state)
    _sync(device)
    copy_sync_s = time.perf_counter() - t0
    adapter_mib = sum(t.numel() * t.element_size() for t in state.values()) / 2**20

    sweep = {}
    for rows_wanted in settings.decode_sweep:
        prompts_needed = max(1, rows_wanted // settings.samples)
        prompts = [chat.prompt(*_first_observation(config.env, task)) for task in tasks[:prompts_needed]]
        params = SamplingParams(n=settings.samples, temperature=1.0, max_new_tokens=settings.new_tokens, seed=1)
        engine.batch_size = prompts_needed * settings.samples
        times = []
        for _ in range(2):  # the first call may capture a graph for the new shape
            _sync(device)
            t0 = time.perf_counter()
            out = engine.generate(prompts, params)
            _sync(device)
            times.append(time.perf_counter() - t0)
        tokens = sum(len(c.token_ids) for per in out for c in per)
        sweep[str(prompts_needed * settings.samples)] = {
            "first_s": times[0],
            "s": times[1],
            "tokens": tokens,
            "tokens_per_s": tokens / times[1],
            **dict(getattr(engine, "timings", {})),
        }
        print(
            f"[vlrl] rollout only, batch {prompts_needed * settings.samples}: {tokens / times[1]:,.0f} tok/s",
            flush=True,
        )

    measured = rows[settings.warmup :] or rows
    summary = _summary(measured, settings)
    summary.update(
        adapter_sync_copy_s=copy_sync_s,
        adapter_mib=adapter_mib,
        logprob_diff_mean=float(diff.mean()),
        logprob_diff_max=float(diff.max()),
    )
    fast = any("decode_s" in r for r in rows)
    if settings.engine == "vllm":
        import vllm

        path = f"vLLM {vllm.__version__} (adapters by {engine.adapter_transport}, start-up {engine.startup_s:.0f} s)"
    elif fast:
        path = "static-cache decoder, CUDA graphs" if device.type == "cuda" else "static-cache decoder, eager"
    else:
        path = "transformers generate"
    summary.update(memory_log)
    result = {
        "engine_path": path,
        "build_s": build_s,
        "summary": summary,
        "steps": rows,
        "decode_sweep": sweep,
        "memory": _memory(device),
        "parameters": sum(p.numel() for p in model.parameters()),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }
    if settings.engine == "vllm":
        engine.close()
    del engine, policy, model, base
    _release(device)
    return result


def _free_bytes(device: torch.device) -> int:
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 0


def saved_model_dir(settings: BenchSettings) -> Path:
    """A directory holding the model (vLLM loads from files): the model itself, or the preset saved once."""
    if Path(settings.model).is_dir():
        return Path(settings.model)
    path = Path(settings.model_dir or f"/tmp/vlrl-bench-{settings.model}")
    save_preset(path, settings)
    return path


def save_preset(path: Path, settings: BenchSettings) -> float:
    """Build the preset `settings.model` and save it (weights, tokenizer, processor) at `path`
    unless it is there; returns the seconds it took. Written aside, then renamed."""
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


def make_vllm_engine(settings: BenchSettings, config, model, chat, memory_log: dict[str, float]):
    """vlrl's vLLM engine beside the policy on the same device, sized as `vlrl train` sizes it."""
    from vlrl.models.lora import adapter_state_dict
    from vlrl.rollout.factory import build_engine, vllm_memory_share

    device = settings.resolved_device()
    cuda = device.type == "cuda"
    share = 0.5
    if cuda:
        share = vllm_memory_share(settings.gpu_memory_utilization, *torch.cuda.mem_get_info(device))
        memory_log["vllm_share"] = share
    rows = max([settings.prompts * settings.samples, *settings.decode_sweep])
    engine = build_engine(
        config,
        chat,
        model,
        engine="vllm",
        model_dir=settings.model,
        gpu_memory_utilization=share,
        max_model_len=1024,
        max_images=1,
        max_num_seqs=rows,
        kv_cache_memory_mb=256,
        use_gpu=cuda,
        extra_args={
            "compilation_config": {
                "cudagraph_capture_sizes": sorted({1, 8, 16, 32, 64, 128, rows} | set(settings.decode_sweep))
            }
        }
        if cuda
        else None,
    )
    engine.ignore_eos = True  # forced length, as the transformers engine runs the workload
    engine.update_adapter(adapter_state_dict(model), 0)
    if cuda:
        memory_log["free_after_vllm_start_gib"] = torch.cuda.mem_get_info(device)[0] / 2**30
    return engine


def _first_observation(env_config, task):
    from vlrl.envs.base import make_env

    env = make_env(env_config)
    return env.system_prompt, env.reset(task)


def _summary(rows: list[dict[str, float]], settings: BenchSettings) -> dict[str, float]:
    step_s = _mean(rows, "step_s")
    completions = settings.prompts * settings.samples
    out = {key: _mean(rows, key) for key in sorted({k for r in rows for k in r})}
    out.update(
        completions_per_s=completions / step_s if step_s else 0.0,
        rollout_tokens_per_s=_mean(rows, "generated_tokens") / max(1e-9, _mean(rows, "generate_s")),
        train_tokens_per_s=_mean(rows, "train_tokens") / max(1e-9, _mean(rows, "update_s")),
    )
    return out


# ------------------------------------------------------------------------------------------
# TRL


def run_trl(settings: BenchSettings) -> dict[str, Any]:
    """The same workload through TRL's GRPOTrainer: transformers generation, or (`trl_vllm`) its
    colocated vLLM engine."""
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
    config = reference_config(settings)
    t0 = time.perf_counter()
    if settings.trl_vllm:  # TRL's vLLM loads the model from its directory (model.name_or_path)
        settings = dataclasses.replace(settings, model=str(saved_model_dir(settings)))
    model, processor = build_model(settings, device)
    build_s = time.perf_counter() - t0
    _release(device)
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
        trainer.train()
        logs = [h for h in trainer.state.log_history if "loss" in h]
    step_times = [b - a for a, b in zip(marks, marks[1:])]
    rows = [{"step_s": s, "generate_s": g, "rest_s": s - g} for s, g in zip(step_times, gen_times)]
    measured = rows[settings.warmup :] or rows
    step_s = _mean(measured, "step_s")
    result = {
        "version": trl.__version__ + (" + vLLM colocate" if settings.trl_vllm else ""),
        "build_s": build_s,
        "steps": rows,
        "summary": {
            "step_s": step_s,
            "generate_s": _mean(measured, "generate_s"),
            "rest_s": _mean(measured, "rest_s"),
            "completions_per_s": completions / step_s if step_s else 0.0,
            "rollout_tokens_per_s": completions * settings.new_tokens / max(1e-9, _mean(measured, "generate_s")),
        },
        "memory": _memory(device),
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
    """vlrl's run (unless `trl_only`), then TRL's when compared, and the ratio of their step times."""
    device = settings.resolved_device()
    result: dict[str, Any] = {"settings": dataclasses.asdict(settings), "environment": environment_info(device)}
    if not settings.trl_only:
        result["vlrl"] = run_vlrl(settings)
    if settings.trl_only or "trl" in settings.compare:
        result["trl"] = run_trl(settings)
    return with_ratio(result)


def with_ratio(result: dict[str, Any]) -> dict[str, Any]:
    """Add TRL's step time over vlrl's when both are in `result`."""
    if "vlrl" in result and "trl" in result:
        result["trl_over_vlrl_step_time"] = result["trl"]["summary"]["step_s"] / result["vlrl"]["summary"]["step_s"]
    return result


def merge(vlrl_result: dict[str, Any], trl_result: dict[str, Any]) -> dict[str, Any]:
    """One result from a vlrl-only and a TRL-only run of the same workload (e.g. on two GPUs at once)."""
    keys = ("model", "dtype", "lora_rank", "prompts", "samples", "new_tokens", "micro_batch", "maze_size", "cell_px")
    a, b = (_resolved_model(r["settings"]) for r in (vlrl_result, trl_result))
    different = [k for k in keys if a[k] != b[k]]
    if different:
        raise ValueError(f"the two runs differ in {different}: not the same workload")
    merged = {**vlrl_result, "trl": trl_result["trl"], "trl_environment": trl_result["environment"]}
    return with_ratio(merged)


def _resolved_model(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings with `model` naming the directory actually loaded (a preset saved to model_dir for vLLM)."""
    if settings.get("model_dir") and not Path(str(settings["model"])).is_absolute():
        return {**settings, "model": settings["model_dir"]}
    return settings


def format_table(result: dict[str, Any]) -> str:
    """A plain-text table of the summary: a column for vlrl and one for TRL, whichever ran."""
    s, env = result["settings"], result["environment"]
    columns: list[tuple[str, dict[str, Any]]] = []
    if "vlrl" in result:
        columns.append(("vlrl", result["vlrl"]))
    if "trl" in result:
        columns.append((f"TRL {result['trl']['version']}", result["trl"]))
    lines = [
        f"GRPO step benchmark - {s['model']}, {s['dtype']}, LoRA r={s['lora_rank']}, {s['prompts']} prompts x "
        f"{s['samples']} samples x {s['new_tokens']} new tokens, maze_plan {s['maze_size']}x{s['maze_size']}, "
        f"micro-batch {s['micro_batch']}",
        f"{env.get('gpu', env['device'])} | torch {env['torch']} | transformers {env['transformers']} | {env['date']}",
    ]
    if "vlrl" in result:
        lines.append(
            f"vlrl engine: {result['vlrl']['engine_path']} (fast_decode={s['fast_decode']}, "
            f"compile={s['compile_decode']})"
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
    row("training tokens / s", "train_tokens_per_s", "{:,.0f}")
    row("adapter sync s (this engine)", "sync_s", "{:.4f}")
    row("adapter sync s (separate copy)", "adapter_sync_copy_s", "{:.3f}")
    row("engine-policy log-prob |diff| mean", "logprob_diff_mean", "{:.2e}")
    lines.append("phases (s)")
    row("  rollout (generate + env)", "rollout_s", "{:.3f}")
    row("    generate", "generate_s", "{:.3f}")
    row("      prefill", "prefill_s", "{:.3f}")
    row("      graph capture", "capture_s", "{:.3f}")
    row("      decode", "decode_s", "{:.3f}")
    row("    env + prompts", "env_s", "{:.3f}")
    row("  update", "update_s", "{:.3f}")
    row("  TRL: step - generate", "rest_s", "{:.3f}")
    row("    old log-probs", "old_logprobs_s", "{:.3f}")
    row("    fwd + bwd + AdamW", "train_s", "{:.3f}")
    row("peak GPU memory GiB (allocated)", "peak_allocated_gib", "{:.1f}", where="memory")
    row("vLLM share of the GPU", "vllm_share", "{:.3f}")
    row("GPU free after vLLM start GiB", "free_after_vllm_start_gib", "{:.1f}")
    row("GPU memory freed by sleep GiB", "sleep_freed_gib", "{:.1f}")
    row("update peak allocated GiB", "update_peak_allocated_gib", "{:.1f}")
    if "vlrl" in result:
        for batch, figures in result["vlrl"]["decode_sweep"].items():
            lines.append(f"{f'rollout only, batch {batch}: tok/s':<36}{figures['tokens_per_s']:>16,.0f}")
    if "trl_over_vlrl_step_time" in result:
        lines.append(f"TRL step time / vlrl step time: {result['trl_over_vlrl_step_time']:.2f}x")
    if "vlrl" in result:
        ours = result["vlrl"]["summary"]
        lines.append(
            f"training tokens per step {ours['train_tokens']:.0f} (prompt {ours['prompt_tokens']:.0f} + "
            f"{s['new_tokens']} new per completion); warm-up steps ({s['warmup']}) not counted"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> tuple[BenchSettings | list[str], str | None]:
    defaults = BenchSettings()
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for f in dataclasses.fields(BenchSettings):
        flag = "--" + f.name.replace("_", "-")
        value = getattr(defaults, f.name)
        if isinstance(value, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        elif isinstance(value, list):
            p.add_argument(flag, default=",".join(map(str, value)), help="comma-separated")
        else:
            p.add_argument(flag, type=type(value), default=value)
    p.add_argument("--out", default=None, help="write the full result as JSON here")
    p.add_argument(
        "--merge",
        nargs=2,
        metavar=("VLRL_JSON", "TRL_JSON"),
        default=None,
        help="combine a vlrl-only and a TRL-only result into one table (nothing is run)",
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
