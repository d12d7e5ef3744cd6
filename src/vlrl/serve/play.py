"""Play episodes of the config's env against a served model with the official `openai` client, scored like `vlrl eval`.

Each episode is a multi-turn chat: the env's system prompt, then per turn the observation (its
images as base64 PNG data URLs, then the text) and the model's answer, exactly the messages
the offline engine renders with the model's chat template (`vlrl.rollout.sequence.ChatFormat`).
The server renders the same template, so with greedy decoding served and offline episodes agree.
What the chat API cannot carry, and how it is matched:

  - vision special tokens: the offline engine never samples them (they would break re-scoring);
    here they get `logit_bias` -100 (their ids are asked from the server's `/tokenize`);
  - the token budget: `max_tokens` = rollout.max_new_tokens;
  - the conversation limit: offline, an episode ends (truncated) when the next prompt plus the
    token budget outgrows rollout.max_model_len; here the same test is made on the prompt length
    the server reports (`usage.prompt_tokens`), and a server-side context-length refusal counts
    as truncated too;
  - earlier answers travel as text and are re-tokenized by the server; offline they stay the
    sampled token ids. The two differ only for a token sequence that is not the tokenizer's own
    encoding of its text, which a trained policy rarely emits.

Results are an `EvalResult`, so `results_table` prints the same table as `vlrl eval`. Each trace
also records which adapter version answered every turn (`served_by`: the response's `model`).
"""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from vlrl.config import RunConfig
from vlrl.envs.base import Task, make_env, split_version
from vlrl.errors import VlrlError
from vlrl.eval.evaluate import EvalResult, episode_row
from vlrl.eval.protocol import tasks_hash

CONTEXT_ERRORS = ("maximum context length", "max_model_len", "too long")


@dataclass
class PlaySettings:
    """Decoding and limits of served episodes (from the run config's rollout section)."""

    greedy: bool
    temperature: float
    top_p: float
    max_new_tokens: int
    max_model_len: int
    seed: int | None
    logit_bias: dict[str, int]

    @classmethod
    def from_config(cls, config: RunConfig, greedy: bool, logit_bias: dict[str, int]) -> PlaySettings:
        r = config.rollout
        return cls(greedy, r.temperature, r.top_p, r.max_new_tokens, r.max_model_len, config.train.seed, logit_bias)


def base_url(url: str) -> str:
    """`http://host:port/v1` from `http://host:port` or `http://host:port/v1`."""
    return url.rstrip("/").removesuffix("/v1") + "/v1"


def openai_client(url: str, api_key: str, timeout: float = 300.0):
    """The official client on a served endpoint (connection errors and 5xx retried twice by it)."""
    from openai import OpenAI

    return OpenAI(base_url=base_url(url), api_key=api_key, timeout=timeout, max_retries=2)


def vision_logit_bias(url: str, api_key: str, model: str) -> dict[str, int]:
    """{token id: -100} for the model's vision special tokens, asked from the server's /tokenize."""
    from vlrl.models.loading import VISION_SPECIAL_TOKENS

    bias: dict[str, int] = {}
    for token in VISION_SPECIAL_TOKENS:
        payload = json.dumps({"model": model, "prompt": token, "add_special_tokens": False}).encode()
        request = urllib.request.Request(
            base_url(url).removesuffix("/v1") + "/tokenize",
            data=payload,
            method="POST",
            headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                ids = json.loads(response.read())["tokens"]
        except OSError as exc:
            raise VlrlError(f"cannot ask {url} for the vision token ids ({exc})") from None
        if len(ids) == 1:  # a single id: the token exists in this vocabulary
            bias[str(ids[0])] = -100
    return bias


def _is_context_error(exc: Exception) -> bool:
    return any(s in str(exc) for s in CONTEXT_ERRORS)


def play_episode(client: Any, model: str, config: RunConfig, task: Task, settings: PlaySettings) -> tuple[dict, dict]:
    """One episode through the chat API; returns (metrics row, trace) as `EvalResult` keeps them."""
    import openai

    env = make_env(config.env)
    obs = env.reset(task)
    messages: list[dict[str, Any]] = []
    if env.system_prompt:
        messages.append({"role": "system", "content": [{"type": "text", "text": env.system_prompt}]})
    messages.append({"role": "user", "content": obs.to_content("data_url")})
    served_by: list[str] = []
    truncated, response_tokens, turn = False, 0, 0
    while True:
        sampling: dict[str, Any] = (
            {"temperature": 0.0}
            if settings.greedy
            else {
                "temperature": settings.temperature,
                "top_p": settings.top_p,
                "seed": None if settings.seed is None else settings.seed + turn,
            }
        )
        try:
            reply = client.chat.completions.create(
                model=model,
                messages=messages,
                max_tokens=settings.max_new_tokens,
                logit_bias=settings.logit_bias or None,
                **sampling,
            )
        except openai.BadRequestError as exc:
            if turn and _is_context_error(exc):
                truncated = True
                break
            raise VlrlError(f"{task.task_id}: the server refused the request: {exc}") from None
        except openai.APIError as exc:
            raise VlrlError(f"{task.task_id}: request to the server failed: {exc}") from None
        if turn and reply.usage and reply.usage.prompt_tokens + settings.max_new_tokens > settings.max_model_len:
            truncated = True  # the offline driver would not have asked for this turn
            break
        text = reply.choices[0].message.content or ""
        response_tokens += reply.usage.completion_tokens if reply.usage else 0
        served_by.append(reply.model)
        result = env.step(text)
        if result.done:
            break
        messages.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
        messages.append({"role": "user", "content": result.observation.to_content("data_url")})
        turn += 1
    metrics = {**env.episode_metrics(), "truncated": float(truncated), "response_tokens": float(response_tokens)}
    row = episode_row(metrics, task)
    trace = {**env.trace(), "served_by": served_by}
    return row, trace


def play_episodes(
    url: str,
    api_key: str,
    model: str,
    config: RunConfig,
    tasks: list[Task],
    *,
    greedy: bool = True,
    concurrency: int = 8,
) -> EvalResult:
    """One episode per task against the served `model`, `concurrency` episodes at a time."""
    import openai

    client = openai_client(url, api_key)
    try:
        served = [m.id for m in client.models.list().data]
    except openai.AuthenticationError:
        raise VlrlError(f"{url} refused the API key (401); pass the key the server was started with") from None
    except openai.APIError as exc:
        raise VlrlError(f"cannot reach the server at {url} ({exc})") from None
    if model not in served:
        raise VlrlError(f"the server at {url} does not serve {model!r}; it serves: {', '.join(served)}")
    settings = PlaySettings.from_config(config, greedy, vision_logit_bias(url, api_key, model))
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        outcomes = list(pool.map(lambda task: play_episode(client, model, config, task, settings), tasks))
    split = tasks[0].split if tasks else "?"
    decoding = "greedy" if greedy else f"sampled T={config.rollout.temperature}"
    # Like `vlrl eval`'s meta (same split version and task hash: comparable), but no "model"
    # identity: a served result is not evidence the registry's gate may take as an offline one.
    served_by = sorted({m for _, trace in outcomes for m in trace["served_by"]})
    meta = {
        "split_version": split_version(config.env, split) if tasks else None,
        "tasks_hash": tasks_hash(tasks),
        "env": config.env.name,
        "evaluated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "served": {"url": base_url(url), "model": model, "versions": served_by},
    }
    return EvalResult(
        f"{model} (served)", split, decoding, [row for row, _ in outcomes], [trace for _, trace in outcomes], meta
    )
