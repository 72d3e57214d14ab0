"""One CLI grammar (issue 31): every `rally` command that prints takes ``-o json|table`` and ``--json``;
a bad value or a flag the command lacks is refused with THAT command's usage and the flag's name; and
`rally ... | head` ends quietly, with no BrokenPipeError traceback.

The commands are enumerated from the parser, so a new command is covered the day it is added: it takes
the output flags, or it joins ``NOT_PRINTING`` with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rallypoint.cli.main import build_parser, main

#: Commands without the output flags, and why: none of them prints a report a script would parse.
NOT_PRINTING = {
    "serve": "a service in the foreground; it logs JSON lines already",
    "up": "a local cluster in the foreground: a banner, then it supervises until Ctrl-C",
    "demo": "the same, with a guided batch of jobs narrated as it runs",
    "sim": "writes its reports to files; its --json names the summary's file",
    "run": "a terminal session: the rank's own output, byte for byte",
    "attach": "a terminal session, as run",
    "port-forward": "relays connections until Ctrl-C; it prints one line of what it does",
}


def _commands(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(command words, parser) of every command that runs a handler, `rally nodes` as `rally nodes drain`."""
    if callable(parser.get_default("func")) and words:
        yield words, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, (*words, name))


COMMANDS = dict(_commands(build_parser()))
PRINTING = sorted(words for words in COMMANDS if words[0] not in NOT_PRINTING)


def _required_args(parser: argparse.ArgumentParser) -> list[str]:
    """Stand-in values for what the command requires, so parsing reaches the output flags."""
    argv: list[str] = []
    optional = ("?", "*", argparse.REMAINDER, argparse.PARSER)  # PARSER: a further subcommand
    for action in parser._actions:
        if action.option_strings and action.required:
            argv += [action.option_strings[0], str(next(iter(action.choices))) if action.choices else "1"]
        elif not action.option_strings and action.nargs not in optional:
            argv.append(str(next(iter(action.choices))) if action.choices else "x")
    for group in parser._mutually_exclusive_groups:
        if group.required:
            first = group._group_actions[0]
            argv += [first.option_strings[0]] + ([] if first.nargs == 0 else ["x"])
    return argv


def _parse(words: tuple[str, ...], *flags: str) -> argparse.Namespace:
    parser = COMMANDS[words]
    return build_parser().parse_args([*words, *_required_args(parser), *flags])


def test_every_command_is_printing_or_says_why_not() -> None:
    assert {words[0] for words in COMMANDS} >= set(NOT_PRINTING)
    # the ones the issue names are among the printing ones
    for words in [("jobs",), ("show",), ("nodes",), ("submit",), ("checkpoints",), ("tokens", "list")]:
        assert words in PRINTING


@pytest.mark.parametrize("words", PRINTING, ids=" ".join)
def test_o_json_and_json_mean_the_same(words: tuple[str, ...]) -> None:
    assert _parse(words).output == "table"
    assert _parse(words, "-o", "json").output == "json"
    assert _parse(words, "--output", "table").output == "table"
    assert _parse(words, "--json").output == "json"


@pytest.mark.parametrize("words", PRINTING, ids=" ".join)
def test_a_bad_value_or_an_unknown_flag_names_the_command_and_the_flag(
    words: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    prog = "rally " + " ".join(words)
    required = _required_args(COMMANDS[words])
    for flags, named in ((["-o", "yaml"], "-o/--output"), (["--no-such-flag"], "--no-such-flag")):
        with pytest.raises(SystemExit) as exit_:
            main([*words, *required, *flags])
        err = capsys.readouterr().err
        assert exit_.value.code == 2
        assert f"usage: {prog} " in err and f"{prog}: error:" in err and named in err, err


def test_a_command_without_json_names_itself_not_the_top_level(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["sim", "--workload", "w", "--cluster", "c", "--policy", "fifo", "--no-such-flag"])
    assert "rally sim: error: unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_token_commands_print_json_a_script_can_parse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = str(tmp_path / "tokens.json")
    assert main(["tokens", "create", "--team", "nlp", "--tokens-file", file, "-o", "json"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["team"] == "nlp" and created["token"].startswith("rly_") and "hash" not in created
    assert main(["tokens", "revoke", created["id"], "--tokens-file", file, "--json"]) == 0
    revoked = json.loads(capsys.readouterr().out)
    assert revoked["id"] == created["id"] and revoked["revoked_at"] is not None
    assert main(["tokens", "list", "--tokens-file", file, "-o", "json"]) == 0
    assert [row["id"] for row in json.loads(capsys.readouterr().out)] == [created["id"]]


def test_schemas_and_trace_print_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schemas", "--out", str(tmp_path / "schemas"), "-o", "json"]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written and all(Path(path).exists() for path in written)
    out = tmp_path / "converted"
    assert main([*convert_sample(out), "--json"]) == 0
    assert set(json.loads(capsys.readouterr().out)["wrote"]) >= {"workload", "cluster"}


#: The repository's own Philly sample (tests/sim/data): the tests run without ../shared beside the clone.
SAMPLES = Path(__file__).resolve().parents[1] / "sim" / "data"


def convert_sample(out: Path) -> list[str]:
    """`rally trace convert philly` of the repository's sample, half a day of it, into ``out``."""
    jobs, vcs = SAMPLES / "philly_sample.csv", SAMPLES / "philly_vc.csv"
    return ["trace", "convert", "philly", "--out", str(out), "--jobs", str(jobs), "--vc-sizes", str(vcs),
            "--start", "2017-10-02", "--days", "0.5"]  # fmt: skip


def run_into_closed_pipe(argv: list[str], *, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `rally ARGV | head -0`: stdout is a pipe whose reader is gone before the first byte is written.

    The reader closes first on purpose: with a real `head` the race between its exit and our writes makes
    the failure come and go."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "rallypoint.cli.main", *argv],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            timeout=120,
        )
    finally:
        os.close(write)


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    for fmt in ("table", "json"):
        done = run_into_closed_pipe(["schemas", "--out", str(tmp_path / "schemas"), "-o", fmt])
        assert done.stderr == "" and done.returncode == 141, done.stderr
