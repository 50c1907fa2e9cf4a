"""The CLI's own logic: where `job submit`'s options may go and what the command is; how
errors, hosts and a job's wants are printed."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from server.cli.errors import EXIT_NOT_FOUND, EXIT_UNAUTHORISED, exit_code, user_errors
from server.cli.hosts import host_row
from server.cli.jobs import gpus_cell, new_output, submit_command, submit_input, task_of, wants
from server.cli.parser import parse_args
from server.cli.queues import time_limits
from server.cli.times import ago, ahead, when_text
from server.timefmt import parse_time
from wire.errors import ConfigError, ValidationError


def _submit(*argv: str) -> tuple[dict[str, object], list[str]]:
    args = parse_args(["job", "submit", *argv])
    command = submit_command(args)
    return {k: getattr(args, k) for k in ("name", "gpus", "gpu_model", "wait", "output", "cpus")}, command


def test_options_before_the_name() -> None:
    opts, command = _submit("--gpus", "2", "--wait", "train", "--", "python", "t.py", "--lr", "3")
    assert opts == {"name": "train", "gpus": 2, "gpu_model": None, "wait": True, "output": "table", "cpus": 1.0}
    assert command == ["python", "t.py", "--lr", "3"]


def test_options_after_the_name_end_with_a_double_dash() -> None:
    opts, command = _submit("--cpus", "4", "train", "--gpus", "1", "--gpu-model", "H200", "-o", "json", "--",
                            "python", "t.py", "--", "x")
    assert opts == {"name": "train", "gpus": 1, "gpu_model": ["H200"], "wait": False, "output": "json", "cpus": 4.0}
    assert command == ["python", "t.py", "--", "x"]


def test_gpu_models_given_several_times_add_up() -> None:
    """Found by exploring: a repeated --gpu-model kept only the last (as --exclude and
    --host-label do not)."""
    args = parse_args(["job", "submit", "--gpu-model", "H100,A100", "--gpu-model", "L4", "--gpu-model", "H100",
                       "--", "x"])
    assert submit_input(args, ["x"])["gpuModels"] == ["H100", "A100", "L4"]
    args = parse_args(["job", "submit", "--gpu-model", "H100", "--", "x"])
    inp = submit_input(args, ["x"])
    assert inp["gpuModel"] == "H100" and "gpuModels" not in inp


def test_options_after_the_name_without_a_double_dash_are_refused_not_run() -> None:
    with pytest.raises(ValidationError, match="--gpus after the job's name"):
        _submit("train", "--gpus", "1", "python", "t.py")


def test_a_command_without_options_or_in_one_string() -> None:
    assert _submit("train", "sleep", "10")[1] == ["sleep", "10"]
    assert _submit("train", "sh -c 'echo hi'")[1] == ["sh", "-c", "echo hi"]
    assert _submit("train", "--", "ls", "--", "-l")[1] == ["ls", "--", "-l"]


def test_everything_after_the_first_double_dash_is_the_command_word_for_word() -> None:
    assert _submit("train", "--", "--odd", "x")[1] == ["--odd", "x"]
    assert _submit("train", "--", "-", "--")[1] == ["-", "--"]
    assert _submit("--gpus", "1", "train", "--", "--", "y")[1] == ["--", "y"]
    opts, command = _submit("train", "--gpus", "1", "--", "--odd")
    assert opts["gpus"] == 1 and command == ["--odd"]


def test_an_unknown_option_after_the_name_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        _submit("train", "--gpu", "1", "--", "true")


def test_a_user_error_names_its_field_only_when_it_has_one() -> None:
    err = user_errors([{"field": "", "message": "this token may not submit to queue 'default'", "code": "FORBIDDEN"},
                       {"field": "gpus", "message": "must be at least 0", "code": "INVALID"}])
    assert str(err) == "this token may not submit to queue 'default'\ngpus: must be at least 0"
    # A refusal of the token exits as unauthorised (4), a missing thing as not found (3).
    assert exit_code(err) == EXIT_UNAUTHORISED
    assert exit_code(user_errors([{"field": "id", "message": "no job j1", "code": "NOT_FOUND"}])) == EXIT_NOT_FOUND
    assert exit_code(user_errors([{"field": "gpus", "message": "must be at least 0", "code": "INVALID"}])) == 1


def test_host_list_says_draining_and_job_show_says_a_gangs_size() -> None:
    node = {"id": "h1", "health": "HEALTHY", "cordoned": True, "draining": True, "simulated": False, "gpus": 8,
            "gpusAllocated": 0, "gpuModel": "H100", "gpuUtilPct": 0.0, "cpus": 96, "labels": []}
    assert host_row(node)[1] == "HEALTHY DRAINING"
    assert host_row({**node, "draining": False})[1] == "HEALTHY CORDONED"
    assert host_row({**node, "draining": False, "cordoned": False})[1] == "HEALTHY"
    assert host_row(node)[3] == "0.0%" and host_row({**node, "health": "LOST"})[3] == "-"  # a lost host's is stale
    assert host_row({**node, "draining": False, "cordoned": False, "leaving": True})[1] == "HEALTHY LEAVING"
    ahead = {**node, "draining": False, "cordoned": False, "drainAt": "2026-12-24T06:00:00+00:00"}
    assert host_row(ahead)[1] == "HEALTHY DRAIN AT 2026-12-24 06:00 UTC"


def test_a_drain_ahead_is_given_as_a_time_or_a_time_from_now() -> None:
    assert ahead("2026-12-24T06:00") == "2026-12-24T06:00:00+00:00"  # UTC unless it names an offset
    assert ahead("2026-12-24T07:00+01:00") == "2026-12-24T07:00:00+01:00"
    assert when_text("2026-12-24T07:00:00+01:00") == "2026-12-24 06:00 UTC"
    before = dt.datetime.now(dt.UTC)
    got = ahead("2h")
    assert got is not None
    assert dt.timedelta(hours=2) <= dt.datetime.fromisoformat(got) - before < dt.timedelta(hours=3)
    assert ahead(None) is None and when_text(None) == "-"
    with pytest.raises(ConfigError, match="neither an ISO date/time nor a time from now"):
        ahead("tuesday")
    got = ago("1d")
    after = dt.datetime.now(dt.UTC)
    assert got is not None and dt.timedelta(days=1) <= after - dt.datetime.fromisoformat(got) < dt.timedelta(days=2)
    args = parse_args(["job", "submit", "--begin", "2026-12-24T06:00", "later", "--", "run"])
    assert submit_input(args, submit_command(args))["beginAt"] == "2026-12-24T06:00:00+00:00"
    job = {"replicas": 2, "gpus": 8, "gpuModels": ["H100"], "cpus": 4.0, "memoryMb": 1024}
    assert wants(job) == "a gang of 2 tasks, each 8 GPU H100, 4.0 CPU, 1024 MB"
    assert wants({**job, "replicas": 1}) == "8 GPU H100, 4.0 CPU, 1024 MB"


def test_the_submission_carries_env_cwd_rack_and_disconnect_options_and_only_what_was_given() -> None:
    args = parse_args(["job", "submit", "--env", "A=1", "--env", "B=x=y", "--env", "EMPTY=", "--host-label", "zone=a",
                       "--host-label", "net=ib",
                                      "--cwd", "/data", "--replicas", "2", "--same-rack", "--keep-running",
                                      "--replace-after", "120", "--queue", "q", "train", "--", "run"])
    inp = submit_input(args, submit_command(args))
    assert inp == {"name": "train", "command": ["run"], "gpus": 0, "cpus": 1.0, "memoryMb": 512, "priority": 0,
                   "replicas": 2, "sameRack": True, "cwd": "/data", "queue": "q", "replaceAfter": 120.0,
                   "onDisconnect": "KEEP_RUNNING", "env": {"A": "1", "B": "x=y", "EMPTY": ""},
                   "hostLabels": {"zone": "a", "net": "ib"}}
    plain = parse_args(["job", "submit", "train", "--", "run"])
    assert set(submit_input(plain, ["run"])) == {"name", "command", "gpus", "cpus", "memoryMb", "priority"}
    bad = parse_args(["job", "submit", "--env", "NOEQUALS", "train", "--", "run"])
    with pytest.raises(ValidationError, match="expected KEY=VALUE"):
        submit_input(bad, ["run"])


def test_a_queues_time_limits_in_words() -> None:
    assert time_limits(0, 0) == "none by default, no maximum"
    assert time_limits(3600, 86400) == "3600 s by default, at most 1d"
    assert time_limits(0, 600) == "none by default, at most 600 s"
    # Found by exploring: `2.592e+06 s`. From a day up, in days or hours when whole.
    assert time_limits(129600, 30 * 86400) == "36h by default, at most 30d"
    assert time_limits(100000, 1_000_001) == "100000 s by default, at most 1000001 s"


def test_a_gangs_attempts_say_their_task_from_task_0() -> None:
    gang, single = {"replicas": 2}, {"replicas": 1}
    assert [task_of(gang, {"task": t}) for t in (0, 1)] == [" task 0", " task 1"]
    assert task_of(single, {"task": 0}) == ""


def test_following_output_prints_only_what_is_new() -> None:
    assert new_output("", "a\nb\n") == "a\nb\n"
    assert new_output("a\nb\n", "a\nb\n") == ""
    assert new_output("a\nb\n", "a\nb\nc\n") == "c\n"
    # The tail slid: its start is gone, the end of what was shown is still in it.
    before = "".join(f"line {i}\n" for i in range(400))
    now = "".join(f"line {i}\n" for i in range(200, 450))
    assert new_output(before[-4096:], now[-4096:]) == "".join(f"line {i}\n" for i in range(400, 450))
    assert new_output(before, before[-500:] + "more\n") == "more\n"  # less than a kilobyte of it left
    # More than a tail was written between the two: say so, and show the new tail.
    assert new_output("old\n", "new\n") == "[... output skipped: more than a tail was written meanwhile ...]\nnew\n"


def test_following_output_that_repeats_itself_prints_what_the_byte_counts_say_is_new() -> None:
    """A process that prints the same line over and over: the tail looks the same at two
    looks, yet lines were written between them. The anchor cannot tell; the bytes the
    agent counted can."""
    tick = "waiting for the dataset\n"
    before = (tick * 400)[-4096:]
    assert new_output(before, before) == ""  # without counts: taken as nothing new
    assert new_output(before, before, 9600.0, 9600.0 + 3 * len(tick)) == tick * 3
    assert new_output(before, before, 9600.0, 9600.0) == ""
    # Several kilobytes between the looks: more than the tail holds.
    assert new_output(before, before, 9600.0, 9600.0 + 5000).startswith("[... output skipped")
    # Counts of multi-byte text are bytes, not characters.
    assert new_output("é\n", "é\nü\n", 3.0, 6.0) == "ü\n"
    # An older agent's answer, or the final tail of an ended attempt: no counts, the anchor.
    assert new_output("a\nb\n", "a\nb\nc\n", 4.0, None) == "c\n"


def test_following_a_job_prints_each_line_once_through_an_unanswered_poll(monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """An agent that does not answer one poll (liveOutput null) changes nothing shown; the
    end comes from the final report's tail."""
    from server.cli import jobs

    def job(state: str, live: str | None, tail: str = "", code: int | None = None) -> dict[str, object]:
        return {"id": "j1", "state": state, "replicas": 1, "attempts": [
            {"number": 1, "task": 0, "state": state, "host": {"id": "h1"}, "exitCode": code,
             "outputTail": tail, "liveOutput": live}]}

    polls = iter([job("RUNNING", None), job("RUNNING", "a\nb\n"),
                  job("SUCCEEDED", None, "a\nb\nc\n", 0)])
    monkeypatch.setattr(jobs, "_logs", lambda job_id: next(polls))
    monkeypatch.setattr(jobs.time, "sleep", lambda s: None)
    last = jobs.print_output(job("RUNNING", "a\n"), follow=True)
    assert last["state"] == "SUCCEEDED"
    assert capsys.readouterr().out.splitlines() == [
        "==> attempt 1 on h1: RUNNING <==", "a", "b", "c", "==> attempt 1: SUCCEEDED (exit 0) <=="]


def test_a_failed_job_says_why() -> None:
    from server.cli.jobs import ended

    def attempt(task: int, state: str, code: int | None, reason: str) -> dict[str, object]:
        return {"number": 1, "task": task, "state": state, "host": {"id": f"h{task}"}, "exitCode": code,
                "reason": reason}

    job = {"id": "j1", "state": "FAILED", "replicas": 2, "endReason": "", "attempts": [
        attempt(0, "FAILED", 127, "spawn failed: cannot start 'x'"),
        attempt(1, "KILLED", None, "gang task 0 ended FAILED")]}
    assert ended(job) == ("job j1 FAILED\n  attempt 1 task 0 on h0: exit 127 (spawn failed: cannot start 'x')"
                          "\n  attempt 1 task 1 on h1: KILLED (gang task 0 ended FAILED)")
    assert ended({**job, "state": "TIMEOUT", "endReason": "time limit of 60 s reached"}) == \
        "job j1 TIMEOUT: time limit of 60 s reached"


def test_an_array_is_n_jobs_each_told_its_index() -> None:
    from server.cli.jobs import array_indices, array_inputs

    args = parse_args(["job", "submit", "--gpus", "1", "--env", "LR=0.1", "--array", "3", "sweep", "--", "run"])
    indices, limit = array_indices(args.array)
    jobs = array_inputs(submit_input(args, submit_command(args)), indices, limit)
    assert [j["name"] for j in jobs] == ["sweep-0", "sweep-1", "sweep-2"]
    assert [j["env"] for j in jobs] == [{"LR": "0.1", "MUSTER_ARRAY_INDEX": str(i), "MUSTER_ARRAY_SIZE": "3"}
                                        for i in range(3)]
    assert all(j["gpus"] == 1 and j["command"] == ["run"] for j in jobs)
    # One group of its own (named for the array), with no limit unless N%K gives one.
    assert len({j["group"] for j in jobs}) == 1 and jobs[0]["group"].startswith("sweep#")
    assert all("groupLimit" not in j for j in jobs)
    assert array_indices("100%8") == (list(range(100)), 8) and array_indices("4") == ([0, 1, 2, 3], 0)
    throttled = array_inputs({"name": "x"}, [0, 1, 2, 3], 2)
    assert [j["groupLimit"] for j in throttled] == [2] * 4
    assert throttled[0]["group"] != array_inputs({"name": "x"}, [0, 1, 2, 3], 2)[0]["group"]  # each array its own
    for bad in ("many", "10%", "10%0", "%3", "", "3-", "-3", "1,,2", "0-9:", "4:2", "0-9:x", "1-2-3"):
        with pytest.raises(ValidationError, match="array"):
            array_indices(bad)
    with pytest.raises(ValidationError, match="from 1 to 1000"):
        array_inputs({"name": "x"}, list(range(1001)))
    with pytest.raises(ValidationError, match="at most 125 characters with --array indices up to 99"):
        array_inputs({"name": "x" * 126}, list(range(100)))


def test_an_array_takes_indices_as_slurm_writes_them() -> None:
    """Ranges, steps and lists, as sbatch's --array; each index once, ascending; the
    size is the number of jobs, whatever the indices."""
    from server.cli.jobs import array_indices, array_inputs

    assert array_indices("0-3") == ([0, 1, 2, 3], 0)
    assert array_indices("5-5") == ([5], 0)  # one index (a lone 5 is five jobs)
    assert array_indices("1,3,5-7%2") == ([1, 3, 5, 6, 7], 2)
    assert array_indices("0-20:10") == ([0, 10, 20], 0)
    assert array_indices("7,2-3,3") == ([2, 3, 7], 0)
    jobs = array_inputs({"name": "scan", "env": {"A": "1"}}, *array_indices("100-102"))
    assert [(j["name"], j["env"]) for j in jobs] == [
        (f"scan-{i}", {"A": "1", "MUSTER_ARRAY_INDEX": str(i), "MUSTER_ARRAY_SIZE": "3"}) for i in (100, 101, 102)]
    with pytest.raises(ValidationError, match="runs up"):
        array_indices("9-3")
    with pytest.raises(ValidationError, match="runs up"):
        array_indices("0-9:0")
    with pytest.raises(ValidationError, match="from 1 to 1000"):
        array_indices("0-1000")  # 1,001 jobs, refused before they are made
    with pytest.raises(ValidationError, match="from 1 to 1000"):
        array_inputs({"name": "x"}, *array_indices("0-999,2000-2999:2"))
    # The name's room is set by the widest index.
    with pytest.raises(ValidationError, match="at most 121 characters with --array indices up to 100000"):
        array_inputs({"name": "x" * 122}, *array_indices("0,100000"))


def test_a_singleton_and_a_group_are_given_as_groups_of_the_users_jobs() -> None:
    args = parse_args(["job", "submit", "--singleton", "nightly", "--", "run"])
    inp = submit_input(args, submit_command(args))
    assert (inp["group"], inp["groupLimit"]) == ("nightly", 1)
    args = parse_args(["job", "submit", "--group", "etl", "--group-limit", "3", "load", "--", "run"])
    inp = submit_input(args, submit_command(args))
    assert (inp["group"], inp["groupLimit"]) == ("etl", 3)
    for argv in (["--singleton", "--group", "g"], ["--group-limit", "2"], ["--singleton", "--array", "3"]):
        args = parse_args(["job", "submit", *argv, "x", "--", "run"])
        with pytest.raises(ValidationError):
            submit_input(args, submit_command(args))


def test_a_cli_newer_than_its_server_says_so() -> None:
    from server.cli.client import explain_errors

    old = explain_errors(["Cannot query field 'hostLabels' on type 'Job'."], "http://x/graphql")
    assert old.splitlines() == ["Cannot query field 'hostLabels' on type 'Job'.",
                                "  the server at http://x/graphql has an older API than this muster CLI: use the "
                                "CLI of the server's version, or upgrade the server"]
    assert explain_errors(["a", "b"], "u") == "a; b"


def test_a_live_attempt_on_a_lost_host_says_so() -> None:
    from server.cli.jobs import lost_note

    on = {"state": "RUNNING", "host": {"id": "h1", "health": "LOST"}}
    assert lost_note(on) == " (its host is LOST: replaced once another host has room)"
    assert lost_note({**on, "state": "LOST"}) == ""
    assert lost_note({**on, "host": {"id": "h1", "health": "HEALTHY"}}) == ""


def test_a_lists_gpus_cell_says_shares_mig_and_gangs() -> None:
    """Found by hand: `job list` said 0 GPUs for a share job and 2 for a gang of 2 x 2."""
    base = {"gpus": 0, "gpuShare": 0, "migProfile": None, "replicas": 1}
    assert gpus_cell({**base, "gpus": 4}) == "4"
    assert gpus_cell(base) == "0"
    assert gpus_cell({**base, "gpuShare": 300}) == "300/1000"
    assert gpus_cell({**base, "migProfile": "1g.10gb"}) == "MIG 1g.10gb"
    assert gpus_cell({**base, "gpus": 2, "replicas": 4}) == "2 x4"


def test_an_unknown_option_is_refused_with_its_subcommands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    """Found by hand: `muster job submit --name x -- true` printed the usage of `muster`
    itself, with every command, and not that of `job submit`."""
    with pytest.raises(SystemExit) as exit_:
        parse_args(["job", "submit", "--name", "x", "--", "true"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.startswith("usage: muster job submit") and "unrecognized arguments: --name" in err
    with pytest.raises(SystemExit):
        parse_args(["queue", "list", "--bogus"])
    assert capsys.readouterr().err.startswith("usage: muster queue list")


def test_a_job_without_a_name_is_named_after_its_command() -> None:
    """As sbatch names a job after its script: options, `--`, the command."""
    opts, command = _submit("--gpus", "1", "--", "python3", "t.py")
    assert opts["name"] == "python3" and opts["gpus"] == 1 and command == ["python3", "t.py"]
    assert _submit("--", "/opt/run/train.sh", "--lr", "3")[0]["name"] == "train.sh"
    assert _submit("--", "./run+v2@a100")[0]["name"] == "run-v2-a100"
    # After `--`, one string is one word, its command's program (a path with a space).
    opts, command = _submit("--", "/tmp/sp ace/run.sh")
    assert opts["name"] == "run.sh" and command == ["/tmp/sp ace/run.sh"]
    assert _submit("--", "_")[0]["name"] == "job"


def test_without_a_name_the_command_must_follow_a_double_dash() -> None:
    with pytest.raises(ValidationError, match="a job name, or options ended with --"):
        _submit("--gpus", "1")


def test_excluded_hosts_are_given_comma_separated_or_repeated() -> None:
    args = parse_args(["job", "submit", "--exclude", "gpu-1,gpu-2", "--exclude", " gpu-9 ", "t", "--", "run"])
    assert submit_input(args, submit_command(args))["excludeHosts"] == ["gpu-1", "gpu-2", "gpu-9"]
    args = parse_args(["job", "submit", "t", "--", "run"])
    assert "excludeHosts" not in submit_input(args, submit_command(args))


def test_job_idle_lists_the_jobs_holding_idle_gpus(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`muster job idle`: a row per running try whose GPUs stay idle (the query itself is
    run against the schema in tests/integration/test_console.py)."""
    from server.cli import jobs as cli_jobs

    rows = [{"host": "gpu-7", "since": "2026-12-06T10:00:00+00:00",
             "job": {"id": "j1", "name": "train", "queue": "vision", "user": "ann"},
             "attempt": {"gpuIndices": [0, 1], "gpuShare": 0}},
            {"host": "gpu-8", "since": "2026-12-06T11:30:00+00:00",
             "job": {"id": "j2", "name": "infer", "queue": "serve", "user": "bo"},
             "attempt": {"gpuIndices": [3], "gpuShare": 250}}]
    monkeypatch.setattr(cli_jobs, "gql", lambda q, v: {"idleGpus": rows} if "idleGpus" in q else {})
    assert cli_jobs.cmd_idle(parse_args(["job", "idle"])) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["JOB", "NAME", "QUEUE", "USER", "HOST", "GPUS", "IDLE", "SINCE"]
    assert lines[1].split() == ["j1", "train", "vision", "ann", "gpu-7", "0,1", "2026-12-06", "10:00", "UTC"]
    assert lines[2].split() == ["j2", "infer", "serve", "bo", "gpu-8", "250/1000", "of", "3", "2026-12-06", "11:30",
                                "UTC"]


def test_a_jobs_output_reaches_a_terminal_with_its_control_characters_escaped() -> None:
    """Found by exploring: a job's output reached the operator's terminal raw (clear screen,
    window title sequences); piped, it stays as written."""
    from server.cli.jobs import for_terminal

    text = "step 1\r\n\x1b[2J\x1b]0;owned\x07done\t\x9b31m\n"
    assert for_terminal(text, tty=True) == "step 1\r\n\\x1b[2J\\x1b]0;owned\\x07done\t\\x9b31m\n"
    assert for_terminal(text, tty=False) == text


def test_job_show_escapes_control_characters_of_the_command_and_reasons_on_a_terminal(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by exploring: a command with escape sequences (a window title, colours) reached
    the terminal of whoever ran `job show` raw; on a terminal each control character is
    shown escaped, newlines of an argument included."""
    import sys

    from server.cli import jobs as cli_jobs

    job = {"id": "j1", "name": "t", "state": "FAILED", "queue": "default", "priority": 0,
           "command": ["printf", "\x1b]0;PWNED\x07\x1b[31mRED\n"], "gpus": 0, "gpuModels": [], "cpus": 1.0,
           "memoryMb": 512, "replicas": 1, "effectiveTimeLimitSeconds": 0, "timeLimitSeconds": 0,
           "attempts": [{"number": 1, "task": 0, "host": {"id": "h1"}, "migInstances": [], "gpuShare": 0,
                         "gpuIndices": [], "exitCode": 1, "state": "FAILED", "reason": "bad \x1b[2J",
                         "outputTail": ""}]}
    monkeypatch.setattr(cli_jobs, "gql", lambda *a, **kw: {"job": job})
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    cli_jobs.show(parse_args(["job", "show", "j1"]))
    text = capsys.readouterr().out
    assert "\x1b" not in text and "\x07" not in text, text
    assert "\\x1b]0;PWNED\\x07\\x1b[31mRED\\x0a" in text and "bad \\x1b[2J" in text, text


def test_a_drain_of_many_hosts_gives_every_host_one_start_and_so_one_deadline(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by exploring: a rack drained `--at` a few seconds ahead got deadlines that
    differed host to host: once the start had passed (the hosts drained one by one) the
    rest were drained now, each deadline reckoned from when it was. Every host is given
    the start (the server takes one just past as now, its deadline reckoned from it); with
    no --at, the start the server drained the first host at; hosts reached long after the
    start are drained from then, and said so."""
    import server.cli.hosts as hosts_cli

    def iso(t: float) -> str:
        return dt.datetime.fromtimestamp(t, dt.UTC).isoformat()

    clock = [1000.0]

    def server(_q: str, variables: dict[str, dict[str, Any]], **_kw: object) -> dict[str, object]:
        """drainHost, reckoning the deadline as server.operations.hosts does; each host takes a minute."""
        i = variables["input"]
        now = clock[0]
        clock[0] += 60
        at = parse_time(i["at"]).timestamp() if "at" in i else None
        return {"drainHost": {"userErrors": [], "host": {
            "id": i["id"], "health": "HEALTHY", "drainAt": iso(at) if at is not None and at > now else None,
            "drainDeadline": iso((now if at is None else at) + i["deadlineSeconds"])}}}

    shown: list[list[dict[str, Any]]] = []
    monkeypatch.setattr(hosts_cli.time, "time", lambda: clock[0])
    monkeypatch.setattr(hosts_cli.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(hosts_cli, "gql", server)
    monkeypatch.setattr(hosts_cli, "out", lambda _args, hosts, *_a, **_k: shown.append(hosts))

    def drain(*argv: str) -> list[str]:
        assert hosts_cli.cmd_drain(parse_args(["host", "drain", *argv, "--reason", "r", "--deadline", "300"])) == 0
        return [h["drainDeadline"] for h in shown[-1]]

    # From 100 s ahead: the start passes after the second host; the third has its deadline too.
    assert drain("a", "b", "c", "--at", iso(1100)) == [iso(1400)] * 3
    # Now: the first drained at 1,180, the others from then.
    assert drain("a", "b", "c") == [iso(1480)] * 3
    assert capsys.readouterr().err == ""
    # Reached more than DRAIN_START_KEPT_S after the start: drained from then.
    clock[0] = 1000.0
    assert drain("a", "b", "c", "d", "e", "--at", iso(1000)) == [iso(1300)] * 3 + [iso(1480), iso(1540)]
    assert "the start 150 s and more past, their deadline later: d, e" in capsys.readouterr().err


def test_number_options_refuse_what_is_not_a_finite_number(capsys: pytest.CaptureFixture[str]) -> None:
    for option in ("--retry-delay", "--time-limit", "--cpus"):
        for bad in ("nan", "inf"):
            with pytest.raises(SystemExit):
                parse_args(["job", "submit", "--retry-failures", "1", option, bad, "x", "--", "run"])
            assert "is not a finite number" in capsys.readouterr().err
    for argv in (["host", "drain", "h1", "--reason", "r", "--deadline"], ["queue", "create", "q", "--weight"],
                 ["queue", "set", "q", "--grace"]):
        with pytest.raises(SystemExit):
            parse_args([*argv, "nan"])
        assert "is not a finite number" in capsys.readouterr().err
    args = parse_args(["job", "submit", "--retry-failures", "1", "--retry-delay", "30", "x", "--", "run"])
    assert submit_input(args, submit_command(args))["retryDelaySeconds"] == 30.0


def test_followed_output_shows_a_character_split_between_looks_whole_and_a_line_written_in_parts_as_one(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Found by exploring: "x€ y" written in two parts, the euro sign split between them,
    was printed "x??", a new line, then a replacement character; a progress line written
    bit by bit came out one part a line."""
    import server.cli.jobs as jobs_cli
    from agent.runner import Run
    from wire.messages import Task

    run = Run(Task(attempt_id="j.1", job_id="j", number=1, command=["x"]), None)  # type: ignore[arg-type]
    looks = []
    for part in (b"x\xe2\x82", b"\xac y", b" 50%\n"):
        run._tail.extend(part)  # noqa: SLF001 - as the reader adds what the process wrote
        run.written += len(part)
        looks.append(run.live_tail())
    assert looks == [("x", 1), ("x€ y", 6), ("x€ y 50%\n", 11)]

    def job(state: str, look: tuple[str, int] | None) -> dict[str, object]:
        text, written = look or ("", 0)
        return {"id": "j", "state": state, "replicas": 1, "attempts": [{
            "number": 1, "task": 0, "state": state, "host": {"id": "h"}, "exitCode": None if look else 0,
            "liveOutput": text if look else None, "liveOutputBytes": float(written) if look else None,
            "outputTail": "x€ y 50%\n"}]}

    answers = iter([job("RUNNING", looks[1]), job("RUNNING", looks[2]), job("SUCCEEDED", None)])
    monkeypatch.setattr(jobs_cli, "_logs", lambda _id: next(answers))
    monkeypatch.setattr(jobs_cli.time, "sleep", lambda _s: None)
    jobs_cli.print_output(job("RUNNING", looks[0]), follow=True)
    out = capsys.readouterr().out
    assert out == ("==> attempt 1 on h: RUNNING <==\nx€ y 50%\n==> attempt 1: SUCCEEDED (exit 0) <==\n"), out


def test_a_reservation_from_a_start_just_past_lasts_its_duration_from_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server takes a start just past as now: the end a duration gives is counted from
    now, not from the start as typed (found by exploring: 4 minutes ago for 10 minutes
    lasted 6)."""
    import server.cli.reservations as res_cli

    sent: list[dict[str, object]] = []
    monkeypatch.setattr(res_cli, "_send", lambda _a, _m, _t, given: sent.append(given) or 0)
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=4)).strftime("%Y-%m-%dT%H:%M:%S")
    args = parse_args(["reservation", "create", "r", "h1", "--queues", "q", "--start", past, "--duration", "10m"])
    before = dt.datetime.now(dt.UTC)
    assert res_cli.cmd_create(args) == 0
    ends = dt.datetime.fromisoformat(str(sent[0]["endsAt"]))
    assert before + dt.timedelta(minutes=10) - dt.timedelta(seconds=1) <= ends <= dt.datetime.now(dt.UTC) + \
        dt.timedelta(minutes=10)


def test_followed_output_of_a_gangs_tasks_keeps_each_tasks_line_its_own(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A review: task 1's output was appended to task 0's line still open."""
    import server.cli.jobs as jobs_cli

    def job(state: str, outs: tuple[str, str]) -> dict[str, object]:
        return {"id": "j", "state": state, "replicas": 2, "attempts": [{
            "number": 1, "task": i, "state": "RUNNING", "host": {"id": f"h{i}"}, "exitCode": None,
            "liveOutput": out, "liveOutputBytes": float(len(out.encode())), "outputTail": out}
            for i, out in enumerate(outs)]}

    answers = iter([job("RUNNING", ("step 1 ", "hello\n")), job("SUCCEEDED", ("step 1 step 2\n", "hello\nworld\n"))])
    monkeypatch.setattr(jobs_cli, "_logs", lambda _id: next(answers))
    monkeypatch.setattr(jobs_cli.time, "sleep", lambda _s: None)
    jobs_cli.print_output(job("RUNNING", ("", "")), follow=True)
    out = capsys.readouterr().out
    assert "step 1 hello" not in out, out
    # Each task's output under its own header, again whenever the other's came between
    # (found by exploring: a gang's lines were mixed, nothing saying which task wrote which).
    t0, t1 = "==> attempt 1 task 0 on h0: RUNNING <==", "==> attempt 1 task 1 on h1: RUNNING <=="
    assert out.splitlines() == [t0, t1, t0, "step 1 ", t1, "hello", t0, "step 2", t1, "world"], out


def test_alerts_tail_checks_its_options(capsys: pytest.CaptureFixture[str]) -> None:
    """Found by exploring: `-n -1` printed all but one alert, `--kind nope` printed nothing
    and exited 0, `--interval 0` polled in a tight loop."""
    args = parse_args(["alerts", "tail", "-n", "0", "--kind", "host.lost", "--interval", "0.5"])
    assert (args.lines, args.kind, args.interval) == (0, "host.lost", 0.5)
    for bad, said in ((["-n", "-1"], "must be from 0 to 500"), (["-n", "501"], "must be from 0 to 500"),
                      (["--kind", "nope"], "invalid choice: 'nope'"), (["--interval", "0"], "at least 0.2"),
                      (["--interval", "nan"], "not a finite number")):
        with pytest.raises(SystemExit) as exc:
            parse_args(["alerts", "tail", *bad])
        assert exc.value.code == 2 and said in capsys.readouterr().err, bad


def test_an_array_too_large_for_one_request_goes_in_several(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Found by exploring: 600 jobs of a 2,000-character command (within every documented
    limit) were refused whole, "request body too large"; each request stays under the
    API's 1 MiB, in order, and a refusal sends no more."""
    import json

    import server.cli.jobs as jobs_cli
    from server.api.app import MAX_BODY_BYTES

    args = parse_args(["job", "submit", "--array", "600", "big", "--", "echo", "x" * 2000])
    inputs = jobs_cli.array_inputs(jobs_cli.submit_input(args, jobs_cli.submit_command(args)),
                                   *jobs_cli.array_indices(args.array), args.group)
    sent: list[list[dict[str, object]]] = []

    def gql(_q: str, variables: dict[str, list[dict[str, object]]], optional: object = ()) -> dict[str, object]:
        sent.append(variables["input"])
        assert len(json.dumps(variables)) < MAX_BODY_BYTES - 4096
        return {"submitJobs": [{"job": {"id": f"id-{i['name']}", "name": i["name"], "state": "QUEUED"},
                                "userErrors": [], "warnings": []} for i in variables["input"]]}

    monkeypatch.setattr(jobs_cli, "gql", gql)
    assert jobs_cli.submit_array(args, inputs) == 0
    assert len(sent) >= 2 and [i["name"] for part in sent for i in part] == [f"big-{k}" for k in range(600)]
    # A later request that fails (a timeout, the server gone): the jobs the earlier ones
    # stored are listed before the error (a review: they were not, and the command run
    # again would have run them twice).
    from server.cli.errors import ApiError

    first = len(sent[0])
    sent.clear()
    capsys.readouterr()

    def failing(q: str, variables: dict[str, list[dict[str, object]]], optional: object = ()) -> dict[str, object]:
        if sent:
            raise ApiError("cannot reach the server")
        return gql(q, variables, optional)

    monkeypatch.setattr(jobs_cli, "gql", failing)
    with pytest.raises(ApiError):
        jobs_cli.submit_array(args, inputs)
    got = capsys.readouterr()
    assert "big-0" in got.out and f"big-{first - 1}" in got.out and f"big-{first}" not in got.out
    assert f"{first} of the array's 600 jobs were stored (above) before this" in got.err


def test_job_list_says_when_it_shows_fewer_than_match(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Found by exploring: `job list` showed 50 rows of 336 and said nothing of the rest."""
    import server.cli.jobs as jobs_cli

    node = {"id": "j1", "name": "n", "state": "QUEUED", "user": "u", "queue": "default", "gpus": 1, "gpuModel": None,
            "gpuModels": None, "gpuShare": 0, "migProfile": None, "replicas": 1, "priority": 0,
            "submittedAt": "2026-01-01T00:00:00", "hold": None, "waitingFor": [], "reservation": None}
    total = 336
    monkeypatch.setattr(jobs_cli, "gql", lambda *_a, **_k: {"jobs": {"totalCount": total, "edges": [{"node": node}]}})
    assert jobs_cli.cmd_list(parse_args(["job", "list", "--limit", "1"])) == 0
    assert "1 of 336 jobs shown (--limit N for more)" in capsys.readouterr().err
    total = 1
    assert jobs_cli.cmd_list(parse_args(["job", "list", "--limit", "1"])) == 0
    assert "shown" not in capsys.readouterr().err


def test_huge_counts_and_times_are_refused_in_words() -> None:
    """Found by exploring: `--array 99999999999999999999` and `--begin 99999999999d` ended
    in tracebacks (OverflowError), and `--array 100000000000` built its list of indices
    before the check and ran out of memory."""
    import server.cli.jobs as jobs_cli
    from server.cli.reservations import _duration
    from server.cli.times import ahead
    from wire.errors import ConfigError, ValidationError

    for n in ("99999999999999999999", "100000000000", "1001", "0"):
        with pytest.raises(ValidationError, match="must be from 1 to 1000 jobs"):
            jobs_cli.array_indices(n)
    for far in ("99999999999d", "9999999d"):
        with pytest.raises(ConfigError, match="too far from now"):
            ahead(far)
    with pytest.raises(ConfigError, match="at most 3650d"):
        _duration("99999999999999999999d")
    assert jobs_cli.array_indices("3%2") == ([0, 1, 2], 2) and _duration("2d") == 172800


def test_alerts_tail_follows_through_an_outage(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Found by exploring: `alerts tail` exited at the first error (the server restarting,
    its history database down). It says so once and asks again; what came meanwhile is
    printed once it answers."""
    import server.cli.alerts as alerts_cli
    from server.cli.errors import ApiError

    def alert(i: int) -> dict[str, object]:
        return {"node": {"id": str(i), "kind": "host.lost", "ts": "2026-12-07T10:00:00", "hostId": f"h{i}",
                         "jobId": None, "message": f"host h{i} lost"}}

    answers: list[object] = [[alert(1)], ApiError("cannot reach x"), ApiError("cannot reach x"), [alert(2), alert(1)],
                             KeyboardInterrupt()]

    def gql(*_a: object, **_k: object) -> dict[str, object]:
        got = answers.pop(0)
        if isinstance(got, BaseException):
            raise got
        return {"alerts": {"edges": got}}

    monkeypatch.setattr(alerts_cli, "gql", gql)
    monkeypatch.setattr(alerts_cli.time, "sleep", lambda _s: None)
    assert alerts_cli.cmd_tail(parse_args(["alerts", "tail"])) == 0
    out = capsys.readouterr()
    assert [line.split()[-2] for line in out.out.splitlines()] == ["h1", "h2"], out.out
    assert out.err.count("warning: cannot reach x; asking again") == 1 and "alerts answer again" in out.err
