"""The one rule for every string a request carries (``rallypoint.jobs.text``), and where it applies.

Issue 30: a NUL in ``gpu_type`` was accepted and then stopped the PostgreSQL projector for good; invalid
UTF-8 inside a JSON string answered 500; ``checkpoint_dir`` ``/etc`` was accepted. Here: the rule itself
character by character, the walk over a decoded document (the path it names), ``validate_spec`` over
every string field of a spec (a property test), the body decoder, the checkpoint folder and the token
file's user and team.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rallypoint.jobs import SpecError, check_checkpoint_dir, check_strings, text_fault, validate_spec
from rallypoint.jobs.text import CLEAN_TEXT_PATTERN, FREE_TEXT_PATTERN
from rallypoint.jobs.validate import BodyError, check_idempotency_key, decode_json_body
from rallypoint.security.tokens import TokenError, create_token

ROOT = "/shared/checkpoints"

#: (character, what the refusal says), refused in every field, free text included
ALWAYS_REFUSED = [
    ("\x00", "NUL"),
    ("\x01", "control character (U+0001)"),
    ("\x1b", "control character (U+001B)"),  # ESC: repaints a terminal showing `rally jobs`
    ("\r", "control character (U+000D)"),
    ("\x0b", "control character (U+000B)"),
    ("\x7f", "control character (U+007F)"),
    ("\x85", "control character (U+0085)"),  # C1
    ("\ud800", "invalid UTF-8"),
    ("\udcff", "invalid UTF-8"),  # what surrogateescape makes of the byte 0xff
    ("\u202e", "bidirectional formatting character (U+202E)"),
    ("\u2066", "bidirectional formatting character (U+2066)"),
]
#: refused where the field is not free text
ONE_LINE_ONLY = [("\t", "tab"), ("\n", "newline")]
CLEAN = ["", "pretrain", "H100-80GB", "é ü ß", "日本語", "emoji 😀 with ZWJ 👩‍💻", "\ufffd", "a b"]


def spec(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": "pretrain", "team": "nlp", "gpus": 8, "command": ["python", "train.py"]}
    body.update(overrides)
    return body


# --- the rule, character by character --------------------------------------------------------------


@pytest.mark.parametrize(("char", "says"), ALWAYS_REFUSED)
@pytest.mark.parametrize("free_text", [False, True])
def test_refused_in_every_field(char: str, says: str, free_text: bool) -> None:
    fault = text_fault(f"ab{char}c", free_text)
    assert fault is not None and says in fault and "at character 2" in fault


@pytest.mark.parametrize(("char", "says"), ONE_LINE_ONLY)
def test_tab_and_newline_only_in_free_text(char: str, says: str) -> None:
    fault = text_fault(f"x{char}", False)
    assert fault is not None and says in fault and "only free text" in fault
    assert text_fault(f"x{char}", True) is None


@pytest.mark.parametrize("value", CLEAN)
def test_clean_text_passes_everywhere(value: str) -> None:
    assert text_fault(value, False) is None
    assert text_fault(value, True) is None


@given(st.text())
def test_the_openapi_patterns_say_what_the_rule_says(value: str) -> None:
    """The document's patterns (the ECMA reading: $ at the very end) accept exactly what the rule does."""
    assert bool(re.fullmatch(CLEAN_TEXT_PATTERN[1:-1], value)) == (text_fault(value, False) is None)
    assert bool(re.fullmatch(FREE_TEXT_PATTERN[1:-1], value)) == (text_fault(value, True) is None)


# --- the walk: every string and key of a document, named by its path ----------------------------------

WALKED: list[tuple[object, str]] = [
    ({"gpu_type": "H1\x0000"}, "gpu_type"),
    ({"gpu_types": ["A100", "H\x00"]}, "gpu_types[1]"),
    ({"command": ["sh", "-c", "ok\n", "\x1b[2J"]}, "command[3]"),
    ({"env": {"A": "fine\n", "B": "\x00"}}, "env.B"),
    ({"env": {"A\n": "x"}}, "env"),  # a key is named by the object that holds it
    ({"na\x00me": 1}, "body"),
    ({"data": {"labels": [{"k": "\x7f"}]}}, "data.labels[0].k"),
    ("top\x00", "body"),
]


@pytest.mark.parametrize(("document", "field"), WALKED)
def test_the_walk_names_the_offending_string(document: object, field: str) -> None:
    with pytest.raises(SpecError) as refused:
        check_strings(document, free_text={"command", "env"})
    assert refused.value.field == field


def test_free_text_fields_hold_tabs_and_newlines_but_not_in_keys() -> None:
    check_strings(
        {"command": ["sh", "-c", "a\n\tb"], "env": {"PEM": "-----\nMII\n"}}, free_text={"command", "env"}
    )
    with pytest.raises(SpecError) as refused:
        check_strings({"command": ["sh"], "name": "a\tb"}, free_text={"command"})
    assert refused.value.field == "name"


# --- validate_spec: every string field of a spec (a property test) ----------------------------------------

#: every string a spec may carry: (field the refusal names, free text?, body with MARK where it goes)
MARK = "\uffff"
SPEC_STRINGS: list[tuple[str, bool, dict[str, Any]]] = [
    ("name", False, spec(name=f"pre{MARK}train")),
    ("team", False, spec(team=f"n{MARK}lp")),
    ("priority", False, spec(priority=f"production{MARK}")),
    ("gpu_type", False, spec(gpu_type=f"H100{MARK}")),
    ("gpu_types[0]", False, spec(gpu_types=[f"{MARK}A100", "H100"])),
    ("gpu_types[1]", False, spec(gpu_types=["A100", f"H{MARK}100"])),
    ("topology_required", False, spec(topology_required=f"rack{MARK}")),
    ("topology_preferred", False, spec(topology_preferred=f"{MARK}node")),
    ("checkpoint_dir", False, spec(checkpoint_dir=f"{ROOT}/nlp/{MARK}run")),
    ("command[0]", True, spec(command=[f"pyth{MARK}on", "train.py"])),
    ("command[1]", True, spec(command=["python", f"train.py{MARK}"])),
    ("env.WANDB_API_KEY", True, spec(env={"WANDB_API_KEY": f"sec{MARK}ret"})),
    ("env", False, spec(env={f"NAME{MARK}": "x"})),
    ("body", False, {**spec(), f"unknown{MARK}": "x"}),
]


def with_mark(value: object, char: str) -> object:
    if isinstance(value, str):
        return value.replace(MARK, char)
    if isinstance(value, dict):
        return {with_mark(k, char): with_mark(v, char) for k, v in value.items()}
    if isinstance(value, list):
        return [with_mark(v, char) for v in value]
    return value


@settings(max_examples=300)
@given(
    case=st.sampled_from(SPEC_STRINGS),
    char=st.sampled_from([c for c, _ in ALWAYS_REFUSED + ONE_LINE_ONLY])
    | st.characters(categories=["Cc", "Cs"]).filter(lambda c: c not in "\t\n"),
)
def test_every_string_field_of_a_spec_refuses_what_the_rule_refuses(
    case: tuple[str, bool, dict[str, Any]], char: str
) -> None:
    field, free_text, template = case
    body = with_mark(template, char)
    if free_text and char in "\t\n":
        validate_spec(body)  # a script or a PEM value: accepted
        return
    with pytest.raises(SpecError) as refused:
        validate_spec(body)
    assert refused.value.field == field
    assert refused.value.detail.startswith(("holds ", "the key "))


@pytest.mark.parametrize("body", [spec(name="job\n"), spec(team="nlp\n"), spec(env={"A\n": "x"})])
def test_a_trailing_newline_does_not_slip_past_a_pattern(body: dict[str, Any]) -> None:
    """Python's $ matches before a final newline: name, team and env names passed with one."""
    with pytest.raises(SpecError):
        validate_spec(body)


def test_an_idempotency_key_ending_in_a_newline_is_refused() -> None:
    with pytest.raises(SpecError) as refused:
        check_idempotency_key("build-17\n")
    assert refused.value.field == "idempotency_key"


# --- the body: invalid UTF-8 is a 400 naming the field, never a 500 ---------------------------------------

UNREADABLE: list[tuple[bytes, str, str]] = [
    (b'{"gpu_type": "H100\xff"}', "gpu_type", "invalid UTF-8"),
    (b'{"command": ["python", "\xed\xa0\x80"]}', "command[1]", "invalid UTF-8"),  # an encoded surrogate
    (b'{"command": ["python", "\\ud800"]}', "command[1]", "invalid UTF-8"),  # half a \\u pair
    (b'{"env": {"A": "\\udc00x"}}', "env.A", "invalid UTF-8"),
    (b'{"name\xc3": "x"}', "body", "the key"),
    (b'\xff{"name": "x"}', "body", "not valid JSON"),
    (b'{"name": "x",}', "body", "not valid JSON"),
    (b'{"a": 1, "a": 2}', "body", "duplicate key"),
    (b"[" * 40 + b"]" * 40, "body", "nested 40 levels"),
]


@pytest.mark.parametrize(("raw", "field", "says"), UNREADABLE)
def test_an_unreadable_body_is_a_body_error_naming_the_field(raw: bytes, field: str, says: str) -> None:
    with pytest.raises(BodyError) as refused:
        decode_json_body(raw)
    assert refused.value.field == field
    assert says in refused.value.detail


def test_a_readable_body_decodes() -> None:
    body = spec(command=["sh", "-c", "echo 😀\n"], env={"A": "é"})
    assert decode_json_body(json.dumps(body).encode()) == body
    assert decode_json_body(json.dumps(body, ensure_ascii=False).encode()) == body
    assert decode_json_body(b"") is None


# --- checkpoint_dir: absolute, normalized, in the team's folder of the root --------------------------------

REFUSED_DIRS: list[tuple[str, str | None, str]] = [
    ("/etc", ROOT, "not under /shared/checkpoints/nlp/"),
    ("../../..", ROOT, "not an absolute path"),
    ("ckpt", ROOT, "not an absolute path"),
    (f"{ROOT}/nlp/../../../etc", ROOT, "not normalized"),
    (f"{ROOT}/nlp/./run", ROOT, "not normalized"),
    (f"{ROOT}/nlp//run", ROOT, "not normalized"),
    (f"{ROOT}/nlp/run/", ROOT, "not normalized"),
    (f"/{ROOT}/nlp/run", ROOT, "not normalized"),
    (f"{ROOT}/nlp", ROOT, "not under"),  # the team's folder itself: its jobs' folders are in it
    (f"{ROOT}/vision/run", ROOT, "not under"),  # another team's
    (f"{ROOT}/j-0123456789ab", ROOT, "not under"),  # another job's default folder
    (f"{ROOT}/nlp-other/run", ROOT, "not under"),  # a team whose name starts with this one's
    (f"{ROOT}-evil/nlp/run", ROOT, "not under"),
    (f"{ROOT}/nlp/run", None, "no checkpoint root"),
]


@pytest.mark.parametrize(("path", "root", "says"), REFUSED_DIRS)
def test_checkpoint_dir_outside_the_teams_folder_is_refused(path: str, root: str | None, says: str) -> None:
    with pytest.raises(SpecError) as refused:
        check_checkpoint_dir(validate_spec(spec(checkpoint_dir=path)), root)
    assert refused.value.field == "checkpoint_dir"
    assert says in refused.value.detail


@pytest.mark.parametrize("path", [f"{ROOT}/nlp/run", f"{ROOT}/nlp/2026/llama-70b", f"{ROOT}/nlp/.hidden"])
def test_checkpoint_dir_in_the_teams_folder_is_accepted(path: str) -> None:
    check_checkpoint_dir(validate_spec(spec(checkpoint_dir=path)), ROOT)
    check_checkpoint_dir(validate_spec(spec()), None)  # none named: nothing to check


# --- the token file: user and team ------------------------------------------------------------------------


@pytest.mark.parametrize(("user", "team"), [("bob\n", "nlp"), ("bob", "nlp\n"), ("b\x00b", "nlp")])
def test_a_token_for_an_unclean_user_or_team_is_refused(tmp_path: Path, user: str, team: str) -> None:
    with pytest.raises(TokenError):
        create_token(tmp_path / "tokens.json", user=user, team=team)
    assert not (tmp_path / "tokens.json").exists()
