"""`muster job submit`: where the options may go, and what the command is."""

from __future__ import annotations

import pytest

from server.cli.jobs import submit_command
from server.cli.parser import build_parser
from wire.errors import ValidationError


def _submit(*argv: str) -> tuple[dict[str, object], list[str]]:
    args = build_parser().parse_args(["job", "submit", *argv])
    command = submit_command(args)
    return {k: getattr(args, k) for k in ("name", "gpus", "gpu_model", "wait", "output", "cpus")}, command


def test_options_before_the_name() -> None:
    opts, command = _submit("--gpus", "2", "--wait", "train", "--", "python", "t.py", "--lr", "3")
    assert opts == {"name": "train", "gpus": 2, "gpu_model": None, "wait": True, "output": "table", "cpus": 1.0}
    assert command == ["python", "t.py", "--lr", "3"]


def test_options_after_the_name_end_with_a_double_dash() -> None:
    opts, command = _submit("--cpus", "4", "train", "--gpus", "1", "--gpu-model", "H200", "-o", "json", "--",
                            "python", "t.py", "--", "x")
    assert opts == {"name": "train", "gpus": 1, "gpu_model": "H200", "wait": False, "output": "json", "cpus": 4.0}
    assert command == ["python", "t.py", "--", "x"]


def test_options_after_the_name_without_a_double_dash_are_refused_not_run() -> None:
    with pytest.raises(ValidationError, match="--gpus after the job's name"):
        _submit("train", "--gpus", "1", "python", "t.py")


def test_a_command_without_options_or_in_one_string() -> None:
    assert _submit("train", "sleep", "10")[1] == ["sleep", "10"]
    assert _submit("train", "sh -c 'echo hi'")[1] == ["sh", "-c", "echo hi"]
    assert _submit("train", "--", "ls", "--", "-l")[1] == ["ls", "--", "-l"]


def test_an_unknown_option_after_the_name_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        _submit("train", "--gpu", "1", "--", "true")


def test_a_user_error_names_its_field_only_when_it_has_one() -> None:
    from server.cli.errors import user_errors

    err = user_errors([{"field": "", "message": "this token may not submit to queue 'default'", "code": "FORBIDDEN"},
                       {"field": "gpus", "message": "must be at least 0", "code": "INVALID"}])
    assert str(err) == "this token may not submit to queue 'default'\ngpus: must be at least 0"
