"""bench/__main__.py: `python -m bench serve --scenario X | cost | gpu` reach the suites."""

import importlib

import pytest

from bench.__main__ import COMMANDS, SCENARIOS, main


@pytest.mark.parametrize("module", [*SCENARIOS.values(), *COMMANDS.values()])
def test_every_scenario_and_command_has_a_main(module):
    assert callable(importlib.import_module(module).main)


@pytest.mark.parametrize("argv", [[], ["serve"], ["serve", "--scenario", "nope"], ["nope"]])
def test_an_unknown_name_prints_the_usage_and_fails(argv, capsys):
    assert main(argv) == 2
    assert "python -m bench serve --scenario" in capsys.readouterr().err


def test_the_arguments_after_the_scenario_reach_it(capsys):
    with pytest.raises(SystemExit) as done:
        main(["serve", "--scenario=ws", "--help"])
    assert done.value.code == 0 and "--rate" in capsys.readouterr().out
