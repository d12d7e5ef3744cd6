"""docs/runbooks/: every page has symptom, confirm and fix, and every vlrl command in it exists.

Each `vlrl ...` line of the pages' shell blocks (and inline code) is parsed by the real CLI
(`deploy_helpers.parse_cli`: unknown subcommands and options, missing arguments fail), and the
`--help` of every subcommand they use is run. kubectl, promtool and shell lines are not checked.
"""

from __future__ import annotations

import re

import pytest
from deploy_helpers import ROOT, fenced_blocks, inline_vlrl_commands, parse_cli, vlrl_commands_in_shell
from typer.testing import CliRunner

RUNBOOKS = ROOT / "docs" / "runbooks"
TOPICS = {  # the situations issue 20 asks a runbook for
    "run-diverged.md",
    "worker-died.md",
    "out-of-gpu-memory.md",
    "wrong-adapter-served.md",
    "rollback-promotion.md",
    "resume-other-gpu-count.md",
}


def pages() -> list:
    return sorted(p for p in RUNBOOKS.glob("*.md") if p.name != "README.md")


def commands() -> list[tuple[str, list[str], bool]]:
    found = []
    for page in pages():
        text = page.read_text()
        for block in fenced_blocks(text):
            found += [(page.name, argv, True) for argv in vlrl_commands_in_shell(block)]
        found += [(page.name, argv, False) for argv in inline_vlrl_commands(text)]
    return found


def command_path(argv: list[str]) -> tuple[str, ...]:
    """The subcommand words of an argv: `vlrl jobs logs X` -> ("jobs", "logs")."""
    import typer

    from vlrl.cli import app

    command, path = typer.main.get_command(app), []
    for word in argv[1:]:
        if not hasattr(command, "commands") or word not in command.commands:
            break
        command, path = command.commands[word], path + [word]
    return tuple(path)


def test_every_topic_has_a_page_and_the_index_lists_them():
    assert {p.name for p in pages()} == TOPICS
    index = (RUNBOOKS / "README.md").read_text()
    for page in pages():
        assert f"]({page.name})" in index, f"README.md does not link {page.name}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.name)
def test_page_gives_symptom_confirm_and_fix_with_commands(page):
    text = page.read_text()
    positions = [text.find(f"**{part}.**") for part in ("Symptom", "Confirm", "Fix")]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), (
        f"{page.name}: Symptom, Confirm, Fix in order"
    )
    confirm, fix = text[positions[1] : positions[2]], text[positions[2] :]
    for part, body in (("Confirm", confirm), ("Fix", fix)):
        assert fenced_blocks(body), f"{page.name}: {part} has no command block"
    assert any(page.name == where for where, _, _ in commands()), f"{page.name}: no vlrl command"


@pytest.mark.parametrize("where,argv,whole", commands(), ids=[f"{w}: {' '.join(a)}" for w, a, _ in commands()])
def test_runbook_command_parses(where, argv, whole):
    problems, _ = parse_cli(argv)
    if not whole:
        problems = [p for p in problems if not re.search(r"Missing argument|Missing option|needs a subcommand", p)]
    assert not problems, problems


@pytest.mark.parametrize("path", sorted({command_path(a) for _, a, _ in commands()}), ids=" ".join)
def test_help_of_every_runbook_subcommand_runs(path):
    from vlrl.cli import app

    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=120)
    assert result.exit_code == 0 and "Usage" in result.output, (path, result.output, result.exception)


def config_commands() -> list[tuple[str, list[str]]]:
    """Whole command lines that run one of the repository's configs (with overrides)."""
    found = []
    for where, argv, whole in commands():
        config = parse_cli(argv)[1].get("config") if whole else None
        if config is not None and (ROOT / config).is_file():
            found.append((where, argv))
    return found


@pytest.mark.parametrize("where,argv", config_commands(), ids=[f"{w}: {' '.join(a)}" for w, a in config_commands()])
def test_runbook_config_overrides_are_valid(where, argv):
    """`vlrl submit CONFIG k=v ...`: the config keys and values a fix changes exist and validate."""
    from vlrl.config import load_config

    params = parse_cli(argv)[1]
    load_config(ROOT / params["config"], list(params.get("overrides") or []))
