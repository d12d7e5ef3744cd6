"""`vlrl serve` for real: the CLI starts vLLM's server (CPU build) on 127.0.0.1 with the tiny model.

One server is shared by the module (started by `vlrl serve` as a subprocess, stopped with SIGTERM
by the last test and, whatever happens, by the fixture's teardown). It serves
  - `maze`: an SFT LoRA adapter (A), given with --adapter;
  - `<registry model>-candidate`: the registry's candidate alias, followed with --watch 1.
Tests marked `vllm` run in the vLLM lane (`scripts/test-vllm.sh`), where a broken vLLM fails them;
elsewhere they skip where vLLM is not usable (tests/vllm_lane.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from vllm_lane import require_vllm

from vlrl.errors import VlrlError

ROOT = Path(__file__).resolve().parents[2]
KEY = "test-key-" + os.urandom(6).hex()
pytestmark = pytest.mark.vllm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(url: str, method: str = "GET", key: str | None = None, body: bytes | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0  # nothing listening


def _descendants(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in map(int, (task / "children").read_text().split()):
            found += [child, *_descendants(child)]
    return found


def _state(served) -> dict:
    from vlrl.serve.swap import ServeClient

    return ServeClient(served.url, KEY).state()


def _sft_adapter(config_overrides: list[str], out: Path) -> Path:
    """A briefly behaviour-cloned adapter: it answers `<action>...</action>` in the tokenizer's own
    encoding, as a trained policy does (a random adapter's gibberish does not survive a chat API)."""
    from vlrl.config import load_config
    from vlrl.training.sft import run_sft

    cfg = load_config(
        ROOT / "configs" / "ci-tiny.yaml",
        config_overrides + ["train.sft.episodes=32", "train.sft.epochs=2", "train.sft.lr=5e-3"],
    )
    return run_sft(cfg, out)


def _random_adapter(base: Path, out: Path, seed: int) -> Path:
    """A LoRA adapter with random nonzero weights (a distinct second version, no training needed)."""
    import torch

    from vlrl.models.fingerprint import model_fingerprint
    from vlrl.models.loading import load_policy_model
    from vlrl.models.lora import apply_lora, save_adapter

    peft = apply_lora(load_policy_model(base), 8, 16, seed=seed)
    noise = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.copy_(0.05 * torch.randn(param.shape, generator=noise))
    return save_adapter(peft, out, model_fingerprint(base))


@pytest.fixture(scope="module")
def served(ci_model_dir, tmp_path_factory):
    """`vlrl serve` running on the tiny model with adapter A as `maze` and the registry's candidate."""
    require_vllm()
    from vlrl.config import load_config
    from vlrl.serve.adapters import adapter_spec
    from vlrl.tracking.lineage import collect_lineage, write_adapter_lineage
    from vlrl.tracking.registry import AdapterRegistry

    tmp = tmp_path_factory.mktemp("serve")
    overrides = [f"model.path={ci_model_dir}", f"storage.root={tmp}", "runtime.backend=local"]
    config = load_config(ROOT / "configs" / "ci-tiny.yaml", overrides)
    adapter_a = _sft_adapter(overrides, tmp / "sft-a" / "adapter")
    adapter_b = _random_adapter(ci_model_dir, tmp / "random-b" / "adapter", seed=1)
    lineage = collect_lineage(config, tmp / "sft-a")
    for adapter in (adapter_a, adapter_b):
        write_adapter_lineage(adapter, lineage)
    uri = f"sqlite:///{tmp / 'registry.db'}"
    registry = AdapterRegistry.from_config(config, uri, create=True)
    model_name = registry.register(adapter_a)["name"]  # v1, alias candidate
    # An adapter trained on other base weights (the recorded fingerprint is all that differs).
    other = shutil.copytree(adapter_a, tmp / "other-base")
    (other / "vlrl_adapter.json").write_text(
        '{"base_fingerprint": "sha256:' + "1" * 64 + '", "rank": 8, "alpha": 16, "format": 1}'
    )

    key_file = tmp / "api-key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)  # a key file readable by every user is refused
    port = _free_port()
    log = tmp / "serve.log"
    argv = [
        sys.executable,
        "-m",
        "vlrl.cli",
        "serve",
        "--base",
        str(ci_model_dir),
        "--adapter",
        f"maze={adapter_a}",
        "--registry",
        f"{model_name}@candidate",
        "--registry-uri",
        uri,
        "--watch",
        "1",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--api-key-file",
        str(key_file),
        "--max-model-len",
        "1024",
        "--kv-cache-mb",
        "64",
        "--max-images",
        "8",
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=tmp)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while _status(url + "/vlrl/ready") != 200:
            assert process.poll() is None, "vlrl serve exited:\n" + log.read_text()[-3000:]
            assert time.monotonic() < deadline, "server not ready in 600 s:\n" + log.read_text()[-3000:]
            time.sleep(1)
        yield SimpleNamespace(
            url=url,
            process=process,
            log=log,
            config=config,
            registry=registry,
            model_name=model_name,
            a=adapter_a,
            b=adapter_b,
            other=other,
            spec_a=adapter_spec("maze", adapter_a),
            spec_b=adapter_spec("maze", adapter_b),
        )
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def test_probes_are_open_and_everything_else_needs_the_key(served):
    import openai

    url = served.url
    assert _status(url + "/health") == 200 and _status(url + "/vlrl/ready") == 200
    # vLLM's own --api-key leaves /invocations (chat), /adapters (load/unload), /tokenize ... open.
    for path, method in [
        ("/v1/models", "GET"),
        ("/v1/chat/completions", "POST"),
        ("/invocations", "POST"),
        ("/adapters", "POST"),
        ("/adapters/maze", "DELETE"),
        ("/tokenize", "POST"),
        ("/v1/vlrl/routes", "GET"),
        ("/v1/load_lora_adapter", "POST"),
        ("/metrics", "GET"),
    ]:
        body = b"{}" if method == "POST" else None
        assert _status(url + path, method, body=body) == 401, path
        assert _status(url + path, method, key="wrong", body=body) == 401, path
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).chat.completions.create(
            model="maze", messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
    assert _status(url + "/v1/models", key=KEY) == 200


def test_models_list_the_base_the_versions_and_the_public_names(served):
    from vlrl.serve.play import openai_client

    models = {m.id: m for m in openai_client(served.url, KEY).models.list().data}
    candidate = f"{served.model_name}-candidate"
    assert {
        "maze",
        served.spec_a.internal_name,
        candidate,
        f"{candidate}:v1",
        Path(served.config.model.path).name,
    } <= set(models)
    assert models["maze"].parent == served.spec_a.internal_name


def test_an_adapter_of_another_base_is_refused_at_runtime(served):
    from vlrl.serve.swap import ServeClient, swap_adapter

    client = ServeClient(served.url, KEY)
    before = client.state()
    with pytest.raises(VlrlError, match="sha256:1111.*served base is sha256:") as refused:
        swap_adapter(served.url, KEY, "maze", served.other)  # checked by the client first
    assert before["base_fingerprint"] in str(refused.value)
    with pytest.raises(VlrlError, match="400.*sha256:1111"):
        client.load("maze:other", served.other)  # and by the server, for anyone calling vLLM's endpoint
    with pytest.raises(VlrlError, match="409.*route it to another version first"):
        client.unload(served.spec_a.internal_name)
    with pytest.raises(VlrlError, match="409.*is a route"):
        client.load("maze", served.b)  # a version named like the route would be unreachable
    with pytest.raises(VlrlError, match="409.*instead of load_inplace"):  # running requests would switch weights
        client._call(
            "POST",
            "/v1/load_lora_adapter",
            {"lora_name": served.spec_a.internal_name, "lora_path": str(served.b), "load_inplace": True},
        )
    after = client.state()
    assert after["routes"] == before["routes"] and after["adapters"] == before["adapters"]


def test_swap_and_rollback_under_concurrent_load_fail_no_request(served):
    import openai

    from vlrl.envs.base import build_split, make_env
    from vlrl.serve.swap import rollback_adapter, swap_adapter

    client = openai.OpenAI(base_url=served.url + "/v1", api_key=KEY, max_retries=0)  # a retry would hide a failure
    env = make_env(served.config.env)
    messages = [
        {"role": "system", "content": env.system_prompt},
        {"role": "user", "content": env.reset(build_split(served.config.env, "train")[0]).to_content("data_url")},
    ]
    records: list[tuple[float, float, str]] = []  # (start, end, served by) or error text
    errors: list[str] = []
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            start = time.perf_counter()
            try:
                reply = client.chat.completions.create(model="maze", messages=messages, max_tokens=8, temperature=0)
                records.append((start, time.perf_counter(), reply.model))
            except Exception as exc:  # noqa: BLE001 - any failure fails the test
                errors.append(f"{type(exc).__name__}: {exc}")

    def wait_for_requests_started_after(moment: float, count: int = 6) -> None:
        # Paced by completed requests, not by the clock: on a busy machine a request takes seconds.
        deadline = time.monotonic() + 180
        while sum(start > moment for start, _, _ in records) < count and not errors:
            assert time.monotonic() < deadline, f"only {len(records)} requests in 180 s"
            time.sleep(0.1)

    threads = [threading.Thread(target=hammer) for _ in range(6)]
    for t in threads:
        t.start()
    try:
        wait_for_requests_started_after(0.0)
        swap_start = time.perf_counter()
        swapped = swap_adapter(served.url, KEY, "maze", served.b)
        swap_end = time.perf_counter()
        wait_for_requests_started_after(swap_end)
        back_start = time.perf_counter()
        rolled = rollback_adapter(served.url, KEY, "maze")
        back_end = time.perf_counter()
        wait_for_requests_started_after(back_end)
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert not errors, errors[:3]
    a, b = served.spec_a.internal_name, served.spec_b.internal_name
    assert (swapped.previous, swapped.target, swapped.loaded) == (a, b, True)
    assert (rolled.previous, rolled.target, rolled.loaded) == (b, a, False)  # A stayed loaded: a route flip
    assert {m for s, e, m in records if e < swap_start} == {a}
    assert {m for s, e, m in records if s > swap_end and e < back_start} == {b}
    assert {m for s, e, m in records if s > back_end} == {a}
    in_flight_at_flip = [m for s, e, m in records if s < swap_end and e > swap_start]
    assert in_flight_at_flip, "no request overlapped the swap; the test did not exercise it"
    assert b in _state(served)["adapters"]  # the previous version stays loaded for the next rollback


def test_registering_a_new_candidate_hot_swaps_the_watched_alias(served):
    name = f"{served.model_name}-candidate"
    assert _state(served)["routes"][name] == f"{name}:v1"
    served.registry.register(served.b)  # v2 takes the candidate alias
    deadline = time.monotonic() + 60
    while _state(served)["routes"][name] != f"{name}:v2":
        assert time.monotonic() < deadline, "the watcher did not swap:\n" + served.log.read_text()[-2000:]
        time.sleep(0.5)
    # The route flips on the server before the watcher prints its line, so wait for the line too.
    while "version 1 -> 2" not in served.log.read_text():
        assert time.monotonic() < deadline, "the watcher swapped but did not say so:\n" + served.log.read_text()[-2000:]
        time.sleep(0.2)


def test_served_prompts_are_the_tokens_the_training_engine_builds(served):
    # The chat template, system prompt, images and feedback text the server renders, turn by turn,
    # compared token for token with ChatFormat (what rollouts and `vlrl eval` feed the model).
    from vlrl.envs.base import build_split, make_env
    from vlrl.models.processor import load_processor
    from vlrl.rollout.sequence import ChatFormat
    from vlrl.serve.play import openai_client

    chat = ChatFormat(load_processor(served.config.model.path))
    client = openai_client(served.url, KEY)
    env = make_env(served.config.env)
    obs = env.reset(build_split(served.config.env, "holdout")[1])
    sequence = chat.prompt(env.system_prompt, obs)
    messages = [
        {"role": "system", "content": [{"type": "text", "text": env.system_prompt}]},
        {"role": "user", "content": obs.to_content("data_url")},
    ]
    for answer in ["<action>up</action>", "nonsense", "<action>right</action>"]:
        reply = client.chat.completions.create(
            model="maze", messages=messages, max_tokens=1, temperature=0, extra_body={"return_token_ids": True}
        )
        assert reply.prompt_token_ids == sequence.token_ids
        ids = chat.tokenizer(answer, add_special_tokens=False)["input_ids"] + [chat.eos_id]
        sequence.append_sampled(ids, [0.0] * len(ids))
        step = env.step(answer)
        sequence.extend(chat.observation_piece(step.observation, response_ended=True))
        messages += [
            {"role": "assistant", "content": [{"type": "text", "text": answer}]},
            {"role": "user", "content": step.observation.to_content("data_url")},
        ]


def test_play_matches_offline_evaluation_with_greedy_decoding(served):
    from vlrl.envs.base import build_split
    from vlrl.eval.protocol import evaluate_models
    from vlrl.serve.play import play_episodes

    config = served.config
    n = 3
    tasks = [build_split(config.env, "holdout")[i] for i in range(n)]
    # The adapter (it answers in the tokenizer's own encoding): whole multi-turn episodes agree.
    (offline,) = evaluate_models(config, [("sft", None, str(served.a))], split="holdout", limit=n)
    online = play_episodes(served.url, KEY, served.spec_a.internal_name, config, tasks, concurrency=n)
    assert online.summary()["tasks_hash"] == offline.summary()["tasks_hash"]
    for mine, theirs in zip(online.traces, offline.traces):
        assert mine["turns"] == theirs["turns"] and mine["success"] == theirs["success"]
        assert set(mine["served_by"]) == {served.spec_a.internal_name}
    assert [e["turns"] for e in online.episodes] == [e["turns"] for e in offline.episodes]
    assert online.success.successes == offline.success.successes
    # The random base model answers gibberish, which is very sensitive to every pixel and token of
    # its prompt; its later turns are re-tokenized from text by any chat API (see serve/play.py),
    # so compare its first turn only.
    one_turn = config.model_copy(update={"env": config.env.model_copy(update={"max_turns": 1})})
    (offline,) = evaluate_models(one_turn, [("base", None, None)], split="holdout", limit=n)
    online = play_episodes(served.url, KEY, Path(config.model.path).name, one_turn, tasks, concurrency=n)
    assert [t["turns"] for t in online.traces] == [t["turns"] for t in offline.traces]
    assert len({t["turns"][0]["response"] for t in online.traces}) > 1  # the answers do depend on the maze


def test_a_second_env_plays_through_the_server_unchanged(served, ci_model_dir):
    """The gui env through `vlrl serve` with no special case: the served base model's first turn on
    gui holdout apps is the one offline evaluation produces (the first turn is sent as the engine
    tokenizes it; later turns of an untrained model's gibberish are re-tokenized, see above)."""
    from vlrl.config import load_config
    from vlrl.envs.base import build_split
    from vlrl.eval.protocol import evaluate_models
    from vlrl.serve.play import play_episodes

    config = load_config(
        ROOT / "configs" / "gui-cpu.yaml",
        [f"model.path={ci_model_dir}", f"storage.root={served.config.storage.root}", "env.max_turns=1"],
    )
    n = 3
    tasks = [build_split(config.env, "holdout")[i] for i in range(n)]
    (offline,) = evaluate_models(config, [("base", None, None)], split="holdout", limit=n)
    online = play_episodes(served.url, KEY, Path(ci_model_dir).name, config, tasks, concurrency=n)
    assert online.summary()["tasks_hash"] == offline.summary()["tasks_hash"]
    assert {t["env"] for t in online.traces} == {"gui"}
    assert [t["turns"] for t in online.traces] == [t["turns"] for t in offline.traces]
    assert online.summary()["group_label"] == "level"


def test_cli_play_prints_the_eval_table(served, ci_model_dir):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "vlrl.cli",
            "play",
            "--url",
            served.url,
            "--model",
            "maze",
            "--split",
            "holdout",
            "-n",
            "1",
            "-c",
            str(ROOT / "configs" / "ci-tiny.yaml"),
            f"model.path={ci_model_dir}",
        ],
        env={**os.environ, "VLRL_API_KEY": KEY},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "success [95% CI]" in r.stdout and "maze (served)" in r.stdout


def test_zz_server_stops_by_itself_on_sigterm(served):
    # Last in the module: stop the shared server the way Kubernetes does.
    server_processes = _descendants(served.process.pid)
    assert server_processes, "vlrl serve has no vLLM child process"
    served.process.send_signal(signal.SIGTERM)
    assert served.process.wait(90) == 0, served.log.read_text()[-2000:]
    time.sleep(1)
    assert [pid for pid in server_processes if Path(f"/proc/{pid}").exists()] == []
    assert _status(served.url + "/health") == 0  # the port is closed
