"""What the `muster` CLI makes of what it is given, through its entry point with the API
stood in for: empty selectors and filters, a job's command after `--`, the token's
whitespace, numbers and durations, several hosts or jobs acted on, `--timeout` while
following, what `host list` says of hosts it does not show, the API's errors in the CLI's
words, and jobs a bulk action leaves alone in queues other than the token's."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import server.cli.hosts as hosts_cli
import server.cli.jobs as jobs_cli
import server.cli.queues as queues_cli
from server.cli import client
from server.cli.entry import main
from server.cli.errors import EXIT_NOT_FOUND, EXIT_UNAUTHORISED, ApiError, JobFailed, exit_code
from server.cli.jobs import array_indices, submit_command, submit_input
from server.cli.parser import build_parser, parse_args
from server.cli.queues import parse_quota
from server.cli.times import ago, ahead
from server.timefmt import duration_s
from wire.errors import AuthError, ConfigError, ValidationError


def _no_server(*_a: Any, **_k: Any) -> dict[str, Any]:
    raise AssertionError("the server was asked")


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """`muster argv` refused as a usage error (exit 2) before the server is asked: its stderr."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2, argv
    return capsys.readouterr().err


def test_an_empty_host_selector_is_refused_before_the_server_is_asked(monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Found by exploring: `host cordon --label '' --reason x` cordoned every host (the
    API took an empty label as no filter); `host drain --label ''` and `reservation create
    --label ''` alike."""
    monkeypatch.setattr(hosts_cli, "gql", _no_server)
    for argv in (["host", "cordon", "--label", "", "--reason", "x"],
                 ["host", "uncordon", "--rack", ""],
                 ["host", "drain", "--label", " ", "--reason", "x"],
                 ["host", "drain", "--rack", "", "--reason", "x"],
                 ["reservation", "create", "r", "--label", "", "--queues", "q", "--duration", "1h"],
                 ["reservation", "create", "r", "--rack", "", "--queues", "q", "--duration", "1h"],
                 ["host", "list", "--zone", ""], ["host", "list", "--label", ""]):
        err = _refused(argv, capsys)
        assert "empty" in err and ("--label" in err or "--rack" in err or "--zone" in err), err
    with pytest.raises(ValidationError, match="empty"):
        hosts_cli.selected_hosts(None, "")


def test_an_empty_job_filter_is_refused_not_dropped(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Found by exploring: `job hold --name '' --queue default` held every queued job of
    default, `job release --user '' --name aa` ignored --user, and `job cancel --name "$P"
    --queue q` with P empty cancelled the whole queue."""
    monkeypatch.setattr(jobs_cli, "gql", _no_server)
    for argv in (["job", "hold", "--name", "", "--queue", "default"],
                 ["job", "release", "--user", "", "--name", "aa"],
                 ["job", "cancel", "--name", "", "--queue", "q"],
                 ["job", "cancel", "--state", "", "--queue", "q"],
                 ["job", "cancel", "--group", "", "--queue", "q"],
                 ["job", "list", "--queue", ""]):
        err = _refused(argv, capsys)
        assert "empty" in err, err
    args = parse_args(["job", "cancel", "--queue", "q"])
    args.name = ""
    with pytest.raises(ValidationError, match="empty"):
        jobs_cli.job_filter(args)


def _submit(*argv: str) -> list[str]:
    return submit_command(parse_args(["job", "submit", *argv]))


def test_the_command_after_a_double_dash_is_taken_word_for_word_even_one_word_with_spaces() -> None:
    """Found by exploring: `job submit sp -- "/tmp/x/sp ace/run.sh"` stored the command
    ['/tmp/x/sp', 'ace/run.sh'], and `-- "echo 'unbalanced"` ended in a traceback."""
    assert _submit("sp", "--", "/tmp/x/sp ace/run.sh") == ["/tmp/x/sp ace/run.sh"]
    assert _submit("--", "/tmp/x/sp ace/run.sh") == ["/tmp/x/sp ace/run.sh"]
    assert _submit("x", "--", "echo 'unbalanced") == ["echo 'unbalanced"]
    # Without `--`, one string is still split as a shell would, and a quote left open is
    # said, not a traceback.
    assert _submit("x", "sh -c 'echo hi'") == ["sh", "-c", "echo hi"]
    with pytest.raises(ValidationError, match="closing quotation"):
        _submit("x", "echo 'unbalanced")


def test_the_token_is_taken_without_surrounding_whitespace_and_never_printed(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Found by exploring: MUSTER_TOKEN="$(cat token)" with a newline after it made `job
    list` say `cannot reach ...: Illegal header value b'Bearer mst_...\\n'`, exit 1, the
    whole secret on stderr."""
    monkeypatch.setenv("MUSTER_DATA_DIR", str(tmp_path))
    for given in ("mst_secret\n", " mst_secret ", "\tmst_secret\r\n"):
        monkeypatch.setenv("MUSTER_TOKEN", given)
        assert client.token() == "mst_secret"
    for bad in ("mst_sec\nret", "mst_sec ret", "mst_sécret", "mst_sec\x7fret"):
        monkeypatch.setenv("MUSTER_TOKEN", bad)
        with pytest.raises(AuthError) as e:
            client.token()
        assert "sec" not in str(e.value) and "MUSTER_TOKEN" in str(e.value)
        assert exit_code(e.value) == EXIT_UNAUTHORISED
    monkeypatch.delenv("MUSTER_TOKEN")
    (tmp_path / "token").write_text("mst_sec ret\n")
    with pytest.raises(AuthError, match="the token in .*token holds characters") as e:
        client.token()
    assert "sec" not in str(e.value)
    # An error of the HTTP client that quotes the header does not print the token.
    monkeypatch.setenv("MUSTER_TOKEN", "mst_secret")

    def post(*_a: Any, headers: dict[str, str], **_k: Any) -> httpx.Response:
        raise httpx.LocalProtocolError(f"Illegal header value {headers['Authorization'].encode()!r}")

    monkeypatch.setattr(httpx, "post", post)
    with pytest.raises(ApiError) as api:
        client.gql("{ x }")
    assert "mst_secret" not in str(api.value) and "cannot reach" in str(api.value)


def test_a_quota_that_is_not_a_finite_number_is_refused_in_words() -> None:
    """Found by exploring: `queue set research --quota gpu:H100=nan` (inf, 1e400, 1:nan)
    ended in a traceback."""
    for item in ("gpu:H100=nan", "gpu:H100=inf", "gpu:H100=1e400", "gpu:H100=1:nan", "cpu=1:2:-inf"):
        with pytest.raises(ConfigError, match="not a finite number"):
            parse_quota([item])
    assert parse_quota(["gpu:H100=8:-:2"]) == [{"resource": "gpu:H100", "nominal": 8.0, "borrowingLimit": None,
                                                "lendingLimit": 2.0}]


def test_a_nominal_quota_is_a_number_not_no_limit() -> None:
    """Found by exploring: `--quota gpu:H100=-` set a nominal quota of 0, where the docs
    said '-' is no limit; the API has no unlimited nominal quota ('-' is for BORROW and
    LEND)."""
    for item in ("gpu:H100=-", "gpu:H100=", "gpu:H100=:4", "gpu:H100=-:4:2"):
        with pytest.raises(ConfigError, match="NOMINAL"):
            parse_quota([item])
    assert parse_quota(["gpu:H100=0:-"])[0]["nominal"] == 0.0


def test_durations_and_arrays_take_ascii_digits_only() -> None:
    """Found by exploring: `--begin '²h'`, `usage --since '²d'`, `--array '²'` and
    `--array '1-²'` ended in tracebacks, and `--begin '٣h'` was read as 3h."""
    for text in ("²h", "٣h", "1²h", "１h", "٣.5h"):
        assert duration_s(text) is None, text
        with pytest.raises(ConfigError):
            ahead(text)
        with pytest.raises(ConfigError):
            ago(text)
    assert duration_s("1.5h") == 5400 and duration_s("90m") == 5400 and duration_s(".5m") == 30
    for spec in ("²", "٣", "1-²", "1-٣", "0-9:²", "3%²", "3%٣"):
        with pytest.raises(ValidationError, match="expected N"):
            array_indices(spec)
    with pytest.raises(SystemExit):
        parse_args(["host", "drain", "h1", "--reason", "r", "--deadline", "٣"])


def _host(host_id: str) -> dict[str, Any]:
    return {"id": host_id, "health": "HEALTHY", "cordoned": True, "draining": False, "drainAt": None,
            "drainDeadline": None}


def _by_id(field: str) -> Any:
    def fake(_q: str, variables: dict[str, Any], **_k: Any) -> dict[str, Any]:
        host_id = variables["input"]["id"]
        if host_id.startswith("nosuch"):
            return {field: {"host": None, "userErrors": [{"field": "id", "message": f"no host {host_id}",
                                                          "code": "NOT_FOUND"}]}}
        return {field: {"host": _host(host_id), "userErrors": []}}
    return fake


def test_several_hosts_stopped_at_a_refusal_say_which_were_changed(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Found by exploring: `host cordon ex-2 nosuch --reason t` printed only `error: id: no
    host nosuch` (exit 3), though ex-2 had been cordoned."""
    for cmd, rest, field, verb in ((["host", "cordon"], ["--reason", "t"], "cordonHost", "cordoned"),
                                   (["host", "uncordon"], [], "uncordonHost", "uncordoned"),
                                   (["host", "drain"], ["--reason", "t"], "drainHost", "drained")):
        monkeypatch.setattr(hosts_cli, "gql", _by_id(field))
        assert main([*cmd, "ex-1", "ex-2", "nosuch", "ex-3", *rest]) == EXIT_NOT_FOUND
        err = capsys.readouterr().err
        assert f"{verb} before the refusal: ex-1, ex-2" in err and "no host nosuch" in err, err
        assert "ex-3" not in err
        # The first host refused: nothing was changed, nothing more to say.
        assert main([*cmd, "nosuch", "ex-1", *rest]) == EXIT_NOT_FOUND
        assert "before the refusal" not in capsys.readouterr().err


def test_host_list_says_when_it_shows_fewer_than_match(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Found by exploring: `host list` stopped at --limit (500) silently, while `job list`
    says how many it shows of how many."""
    node = {**_host("h1"), "leaving": False, "pressure": None, "simulated": False, "gpus": 8, "gpuModel": "H100",
            "gpusAllocated": 0, "gpuUtilPct": 0, "cpus": 64, "memoryMb": 1, "labels": []}
    total = 600
    monkeypatch.setattr(hosts_cli, "gql", lambda *_a, **_k: {"hosts": {"totalCount": total,
                                                                       "edges": [{"node": node}]}})
    assert main(["host", "list", "--limit", "1"]) == 0
    assert "1 of 600 hosts shown (--limit N for more)" in capsys.readouterr().err
    total = 1
    assert main(["host", "list", "--limit", "1"]) == 0
    assert "shown" not in capsys.readouterr().err


def _submitted(monkeypatch: pytest.MonkeyPatch, states: list[str]) -> list[dict[str, Any]]:
    """`job submit` against a stand-in API whose job goes through `states` as it is
    followed (the last one for good), with a clock that moves 2 s a sleep; what was sent."""
    sent: list[dict[str, Any]] = []
    clock = [0.0]

    def fake(q: str, variables: dict[str, Any], **_k: Any) -> dict[str, Any]:
        if "submitJob" in q:
            sent.append(variables["input"])
            return {"submitJob": {"job": {"id": "j1", "state": "QUEUED"}, "userErrors": [], "warnings": []}}
        if clock[0] > 60:
            raise AssertionError("still following long past --timeout")
        state = states.pop(0) if len(states) > 1 else states[0]
        attempts = [] if state == "QUEUED" else [
            {"number": 1, "task": 0, "state": state, "host": {"id": "h1"}, "exitCode": None, "reason": "",
             "outputTail": "", "liveOutput": "", "liveOutputBytes": 0}]
        return {"job": {"id": "j1", "state": state, "replicas": 1, "endReason": None, "attempts": attempts}}

    def sleep(s: float) -> None:
        clock[0] += max(s, 0.01)

    monkeypatch.setattr(jobs_cli, "gql", fake)
    monkeypatch.setattr(jobs_cli.time, "sleep", sleep)
    monkeypatch.setattr(jobs_cli.time, "monotonic", lambda: clock[0])
    return sent


def test_timeout_bounds_following_and_is_refused_without_wait_or_follow(monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Found by exploring: `job submit -f --timeout 3 ... -- sleep 8` followed all 8 s and
    exited 0, and `--timeout` without `--wait` was ignored without a word."""
    sent = _submitted(monkeypatch, ["RUNNING"])
    with pytest.raises(ApiError, match="still RUNNING after 3s"):
        jobs_cli.cmd_submit(parse_args(["job", "submit", "-f", "--timeout", "3", "x", "--", "sleep", "8"]))
    assert len(sent) == 1
    sent = _submitted(monkeypatch, ["QUEUED"])
    with pytest.raises(JobFailed, match="not placed within 3s"):
        jobs_cli.cmd_submit(parse_args(["job", "submit", "-f", "--timeout", "3", "x", "--", "sleep", "8"]))
    sent = _submitted(monkeypatch, ["QUEUED", "RUNNING", "SUCCEEDED"])
    assert jobs_cli.cmd_submit(parse_args(["job", "submit", "-f", "--timeout", "30", "x", "--", "true"])) == 0
    # Without --wait or -f it would bound nothing: refused before anything is submitted.
    sent = _submitted(monkeypatch, ["QUEUED"])
    with pytest.raises(ValidationError, match="--timeout goes with --wait or -f"):
        jobs_cli.cmd_submit(parse_args(["job", "submit", "--timeout", "3", "x", "--", "true"]))
    assert sent == []
    capsys.readouterr()


def test_json_of_several_jobs_acted_on_includes_the_refused(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Found by exploring: `job hold A jnosuch -o json` printed only the jobs held; the id
    refused was missing from stdout."""
    def fake(_q: str, variables: dict[str, Any], **_k: Any) -> dict[str, Any]:
        job_id = variables["input"]["id"]
        if job_id == "jnosuch":
            return {"updateJob": {"job": None, "userErrors": [{"field": "id", "message": "no job jnosuch",
                                                               "code": "NOT_FOUND"}]}}
        return {"updateJob": {"job": {"id": job_id, "state": "QUEUED", "priority": 0, "hold": "held"},
                              "userErrors": []}}

    monkeypatch.setattr(jobs_cli, "gql", fake)
    assert main(["job", "hold", "j1", "jnosuch", "j2", "-o", "json"]) == EXIT_NOT_FOUND
    got = json.loads(capsys.readouterr().out)
    assert [g["id"] for g in got] == ["j1", "jnosuch", "j2"]
    assert got[1] == {"id": "jnosuch", "error": "no job jnosuch"} and got[0]["state"] == "QUEUED"


def test_list_options_are_stripped_and_checked_and_after_takes_several(monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Found by exploring: `host list --health 'HEALTHY, LOST'` was refused (the values not
    stripped, as `job list --state` strips them), `job list --state bogus` showed the raw
    GraphQL enum error, and `--after A,B` was one id where `--exclude` splits on commas."""
    asked: list[dict[str, Any]] = []

    def fake(_q: str, variables: dict[str, Any], **_k: Any) -> dict[str, Any]:
        asked.append(variables)
        return {"hosts": {"totalCount": 0, "edges": []}}

    monkeypatch.setattr(hosts_cli, "gql", fake)
    assert main(["host", "list", "--health", "healthy, LOST"]) == 0
    assert asked[0]["filter"]["health"] == ["HEALTHY", "LOST"]
    monkeypatch.setattr(jobs_cli, "gql", _no_server)
    assert main(["job", "list", "--state", "queued,bogus"]) == 1
    err = capsys.readouterr().err
    assert "'bogus' is not a job state" in err and "QUEUED, PLACED, RUNNING, SUCCEEDED" in err, err
    assert main(["job", "cancel", "--state", "done", "--queue", "q"]) == 1
    args = parse_args(["job", "submit", "--after", "j1,j2", "--after", " j3 ", "x", "--", "true"])
    assert submit_input(args, submit_command(args))["dependsOn"] == ["j1", "j2", "j3"]


def _every_option(p: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, argparse.Action]]:
    """Each option of `p` and of every subcommand under it, with the command it is of."""
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _every_option(sub, (*path, name))
        else:
            yield " ".join(path), action


def test_integer_options_take_ascii_digits_only_and_refuse_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    """Found by exploring: `job submit --gpus ٣` (and --replicas, --max-attempts,
    --priority ... every option parsed with int()) was read as 3, as float() read '٣' before
    finite_float; `--gpus ３` alike. Every integer and number option takes ASCII digits only."""
    parser = build_parser()
    loose = [f"{cmd} {'/'.join(a.option_strings)}" for cmd, a in _every_option(parser) if a.type in (int, float)]
    assert loose == [], loose
    for argv in (["job", "submit", "--gpus", "٣", "x", "--", "true"],
                 ["job", "submit", "x", "--replicas", "３", "--", "true"],
                 ["job", "submit", "--max-attempts", "²", "x", "--", "true"],
                 ["job", "set", "j1", "--priority", "٣"],
                 ["job", "list", "--limit", "٣"],
                 ["host", "list", "--limit", "٣"],
                 ["host", "clear-gpu-faults", "h1", "--reason", "r", "--gpu", "٣"],
                 ["queue", "set", "q", "--max-submitted-jobs", "٣"],
                 ["alerts", "tail", "-n", "٣"],
                 ["job", "submit", "--gpus", "1.5", "x", "--", "true"],
                 ["job", "submit", "--gpus", "1_000", "x", "--", "true"],  # int() takes these (a review)
                 ["job", "list", "--limit", " 3 "]):
        err = _refused(argv, capsys)
        assert "is not a whole number" in err and "Traceback" not in err, (argv, err)
    err = _refused(["server", "--heartbeat-interval", "٣"], capsys)
    assert "is not a number" in err, err
    # ASCII digits, with a sign, as before.
    args = parse_args(["job", "submit", "--gpus", "3", "--priority", "-5", "x", "--", "true"])
    assert (args.gpus, args.priority) == (3, -5)
    assert parse_args(["alerts", "tail", "-n", "0"]).lines == 0


def test_api_errors_name_the_cli_options_the_user_gave(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Found by exploring: `job submit --time-limit 7200` was told `timeLimitSeconds: queue
    'runs' allows at most 3600 s`, `--after J` `dependsOn: ... use AFTER_ANY`, and `queue
    create default` to "change it with updateQueue": the API's names, not the options given.
    The server's message is kept, in the CLI's words."""
    answers: list[dict[str, Any]] = []

    def fake(q: str, _v: dict[str, Any], **_k: Any) -> dict[str, Any]:
        field = "submitJob" if "submitJob" in q else "createQueue"
        return {field: {"job": None, "queue": None, "warnings": [], "userErrors": answers}}

    monkeypatch.setattr(jobs_cli, "gql", fake)
    monkeypatch.setattr(queues_cli, "gql", fake)
    answers[:] = [{"field": "timeLimitSeconds", "message": "queue 'runs' allows at most 3600 s", "code": "TIME_LIMIT"},
                  {"field": "dependsOn", "message": "job j-1 ended FAILED: this job could never run (afterok; use "
                                                    "AFTER_ANY to run after it whatever its end)",
                   "code": "DEPENDENCY_FAILED"}]
    assert main(["job", "submit", "--time-limit", "7200", "--after", "j-1", "x", "--", "true"]) == 1
    err = capsys.readouterr().err
    assert "error: --time-limit: queue 'runs' allows at most 3600 s (TIME_LIMIT)" in err, err
    assert ("error: --after: job j-1 ended FAILED: this job could never run (afterok; use --after-any to run after "
            "it whatever its end) (DEPENDENCY_FAILED)") in err, err
    answers[:] = [{"field": "name", "message": "a queue named 'default' exists (change it with updateQueue)",
                   "code": "EXISTS"}]
    assert main(["queue", "create", "default"]) == 1
    err = capsys.readouterr().err
    assert "error: name: a queue named 'default' exists (change it with muster queue set) (EXISTS)" in err, err
    # Only whole names: a word that merely holds one is left as it is.
    answers[:] = [{"field": "queue", "message": "its per-user limit (maxSubmittedJobsPerUser 3); xtimeLimitSeconds",
                   "code": "JOB_LIMIT"}]
    assert main(["job", "submit", "x", "--", "true"]) == 1
    err = capsys.readouterr().err
    assert "queue: its per-user limit (--max-submitted-jobs-per-user 3); xtimeLimitSeconds (JOB_LIMIT)" in err, err


def test_a_bulk_action_says_when_the_jobs_that_match_are_outside_the_tokens_queues(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by exploring: with a token bound to queues a and b, `job cancel --name x`
    (hold, release alike) said "no job matches: nothing to cancel" though jobs named x
    existed, in other queues; the API left them alone without a word."""
    answer: dict[str, Any] = {}

    def fake(q: str, _v: dict[str, Any], **_k: Any) -> dict[str, Any]:
        return {next(m for m in ("cancelJobs", "holdJobs", "releaseJobs") if m in q): dict(answer)}

    monkeypatch.setattr(jobs_cli, "gql", fake)
    answer.update(count=0, jobIds=[], outsideTokenQueues=2, tokenQueues=["a", "b"], userErrors=[])
    for argv in (["job", "cancel", "--name", "x", "--reason", "r"], ["job", "hold", "--name", "x"],
                 ["job", "release", "--name", "x"]):
        assert main(argv) == EXIT_UNAUTHORISED, argv  # a refusal, as `--queue c` is (FORBIDDEN)
        err = capsys.readouterr().err
        assert "no job matches" not in err, err
        assert (f"error: no job of this token's queues (a, b) matches: nothing to {argv[1]}; 2 job(s) that match "
                "are of other queues, and this token acts only on jobs of its queues (a, b)") in err, err
    # Some in its queues, some not: those done, and the others said.
    answer.update(count=1, jobIds=["j1"], outsideTokenQueues=3)
    assert main(["job", "cancel", "--name", "x", "--reason", "r"]) == 0
    captured = capsys.readouterr()
    assert "cancel requested for 1 job(s)" in captured.err and "left alone: 3 job(s) that match" in captured.err
    assert "j1" in captured.out
    # With -o json, the API's answer on stdout either way.
    answer.update(count=0, jobIds=[])
    assert main(["job", "cancel", "--name", "x", "--reason", "r", "-o", "json"]) == EXIT_UNAUTHORISED
    assert json.loads(capsys.readouterr().out)["outsideTokenQueues"] == 3
    # Nothing matches anywhere (or an older server, which says nothing of other queues): as before.
    for older in ({"outsideTokenQueues": 0, "tokenQueues": ["a"]}, {}):
        answer.clear()
        answer.update(count=0, jobIds=[], userErrors=[], **older)
        assert main(["job", "cancel", "--name", "x", "--reason", "r"]) == 0
        assert "no job matches: nothing to cancel" in capsys.readouterr().err


def test_a_bulk_action_by_group_says_the_group_is_the_callers_own(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A group is named within its user (the API acts on the caller's own group unless a
    user is given): when none of the caller's matches, `job cancel --group etl` says so, and
    how to name another user's, not that no job of that group exists."""
    sent: list[dict[str, Any]] = []

    def fake(q: str, v: dict[str, Any], **_k: Any) -> dict[str, Any]:
        sent.append(v["f"])
        return {next(m for m in ("cancelJobs", "holdJobs", "releaseJobs") if m in q):
                {"count": 0, "jobIds": [], "outsideTokenQueues": 0, "tokenQueues": None, "userErrors": []}}

    monkeypatch.setattr(jobs_cli, "gql", fake)
    for verb in ("cancel", "hold", "release"):
        assert main(["job", verb, "--group", "etl"]) == 0
        err = capsys.readouterr().err
        assert (f"no job of yours matches: nothing to {verb} (--group is a group of your jobs: add --user U for "
                "another user's)") in err, err
    assert main(["job", "cancel", "--group", "etl", "--user", "ann"]) == 0
    assert "no job matches: nothing to cancel\n" in capsys.readouterr().err
    assert sent[-1] == {"group": "etl", "user": "ann"}
