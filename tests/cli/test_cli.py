"""The command line: every command is listed and documented with an example."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from vlrl.cli import app

runner = CliRunner()


def _leaf_commands(group, prefix: tuple[str, ...] = ()):
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _leaf_commands(cmd, prefix + (name,))
        else:
            yield prefix + (name,)


def test_help_lists_every_command_and_each_has_an_example():
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0
    for name in ("config", "env", "model", "train", "sft", "eval", "demo"):
        assert name in top.output
    leaves = list(_leaf_commands(typer.main.get_command(app)))
    assert len(leaves) >= 10
    for path in leaves:
        r = runner.invoke(app, [*path, "--help"])
        assert r.exit_code == 0, path
        assert "Example" in r.output or "example" in r.output, f"vlrl {' '.join(path)} --help has no example"
