"""`vlrl play`'s episode loop (the OpenAI chat API path of serving) on gui tasks.

The chat client is a stand-in that answers as the gui oracle would (it plays a copy of the
episode itself), so what is tested is the env through the serving path: data-URL screenshots in
the messages, one step per reply, the row and the trace `vlrl play` keeps, and the trace's replay.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path
from types import SimpleNamespace

from PIL import Image

from vlrl.config import load_config
from vlrl.envs.base import build_split, make_env, replay_trace
from vlrl.serve.play import PlaySettings, play_episode

ROOT = Path(__file__).resolve().parents[3]


class OracleChat:
    """`client.chat.completions.create(...)`: replies with the oracle's answer for a copy of the episode."""

    def __init__(self, config, task):
        self.env = make_env(config.env)
        self.env.reset(task)
        self.images: list[Image.Image] = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, model, messages, **kwargs):
        for part in messages[-1]["content"]:
            if part["type"] == "image_url":
                data = part["image_url"]["url"].removeprefix("data:image/png;base64,")
                self.images.append(Image.open(io.BytesIO(base64.b64decode(data))))
        text = self.env.oracle_response()
        self.env.step(text)
        return SimpleNamespace(
            choices=[SimpleNamespace(message=SimpleNamespace(content=text))], usage=None, model=model
        )


def test_served_play_loop_on_a_level_3_app():
    config = load_config(
        ROOT / "configs" / "gui-cpu.yaml", ["env.levels=[3]", "env.width=160", "env.height=160", "env.max_turns=8"]
    )
    task = build_split(config.env, "holdout")[0]
    client = OracleChat(config, task)
    row, trace = play_episode(client, "gui", config, task, PlaySettings.from_config(config, True, {}))
    # click the field, type, Save (the episode ends once the goal holds: gui-cpu.yaml needs no stop)
    assert row["success"] == 1.0 and row["turns"] == row["optimal_turns"] == 3.0 and row["group"] == "level 3"
    assert [im.size for im in client.images] == [(160, 160)] * 3  # one screenshot before each turn
    assert trace["served_by"] == ["gui"] * 3 and replay_trace(trace)["matches"]
