"""The vLLM lane's rule: where the lane is requested, a test that needs vLLM runs or fails.

`scripts/test-vllm.sh` sets VLRL_VLLM_LANE=1. There, `require_vllm` imports vLLM as the engine
does, so an absent or broken vLLM (an import error such as a torchvision without its C++ ops, or a
version vlrl does not support) fails the test; and any skip of a test marked `vllm` is turned
into a failure (`pytest_runtest_makereport`, which tests/conftest.py installs). Elsewhere (the
main lane, a laptop without vLLM) those tests skip.

It also holds the two helpers the vLLM engine tests share: random LoRA B weights in a policy, and
first-turn prompts of the train split.
"""

from __future__ import annotations

import importlib.util
import os
import types

import pytest

LANE_ENV = "VLRL_VLLM_LANE"


def in_vllm_lane() -> bool:
    return os.environ.get(LANE_ENV) == "1"


def require_vllm() -> types.ModuleType:
    """vLLM, imported through `vlrl.rollout.vllm_engine.import_vllm` (version check included)."""
    try:
        if importlib.util.find_spec("vllm") is None:
            raise ModuleNotFoundError("vLLM is not installed")
        from vlrl.rollout.vllm_engine import import_vllm

        return import_vllm()
    except Exception as exc:
        if in_vllm_lane():
            raise  # absent or broken, it fails the test
        first = (str(exc).strip().splitlines() or [""])[0]
        pytest.skip(
            f"vLLM is not usable here ({type(exc).__name__}: {first}); the vLLM lane runs this test",
            allow_module_level=True,
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if (
        in_vllm_lane()
        and report.skipped
        and not hasattr(report, "wasxfail")
        and item.get_closest_marker("vllm") is not None
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"a vllm test was skipped in the vLLM lane ({LANE_ENV}=1), where it must run: {reason}"


def set_lora_b(worker, seed: int, scale: float) -> None:
    """Random non-zero LoRA B everywhere in `worker`'s policy (language model and vision tower), so
    the adapter changes outputs."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in worker.model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * scale)


def first_prompts(worker, count: int, start: int = 0) -> list:
    """The first-turn prompts of train tasks start .. start + count - 1, in `worker`'s chat format."""
    from vlrl.envs.base import build_split, make_env

    split = build_split(worker.config.env, "train")
    out = []
    for i in range(start, start + count):
        env = make_env(worker.config.env)
        out.append(worker.chat.prompt(env.system_prompt, env.reset(split[i])))
    return out
