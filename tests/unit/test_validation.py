"""validate_job, validate_labels, and decode() of untrusted bytes."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError as PydanticValidationError

from tests.factories import heartbeat, host_alloc, job, job_spec, task
from wire.errors import DecodeError, ValidationError
from wire.messages import (
    JOB_ID_PATTERN,
    MAX_MESSAGE_BYTES,
    MAX_RECORD_BYTES,
    Attempt,
    AttemptState,
    Command,
    Heartbeat,
    HostAlloc,
    Job,
    JobSpec,
    StatusReport,
    Task,
    decode,
    encode,
)
from wire.validation import (
    MAX_CPUS,
    MAX_ENV_BYTES,
    MAX_ENV_VARS,
    MAX_GPUS,
    MAX_LABELS,
    MAX_MEMORY_MB,
    validate_job,
    validate_labels,
)

BASE: dict[str, Any] = {"name": "train-1", "command": ["python", "train.py"]}


def errs(**overrides: Any) -> list[tuple[str, str]]:
    data = {**BASE, **overrides}
    spec, errors = validate_job(data)
    assert (spec is None) == bool(errors)
    for e in errors:
        assert isinstance(e, ValidationError)
        assert e.message and str(e).startswith(f"{e.field}: ")
    return [(e.field, e.code) for e in errors]


def without(key: str) -> dict[str, Any]:
    return {k: v for k, v in BASE.items() if k != key}


# ---------------------------------------------------------------- valid input


def test_minimal_valid_input_returns_spec_with_defaults() -> None:
    spec, errors = validate_job(dict(BASE))
    assert errors == []
    assert isinstance(spec, JobSpec)
    assert spec.name == "train-1"
    assert spec.command == ["python", "train.py"]
    assert (spec.gpus, spec.gpu_model, spec.cpus, spec.memory_mb) == (0, None, 1.0, 512)
    assert (spec.priority, spec.max_attempts, spec.user, spec.env, spec.cwd) == (0, 3, "operator", {}, None)


def test_full_valid_input_returns_spec() -> None:
    data = {
        **BASE,
        "env": {"CUDA_VISIBLE_ORDER": "x", "_A1": ""},
        "cwd": "/data/run",
        "gpus": 8,
        "gpu_model": "H100",
        "cpus": 16,
        "memory_mb": 65536,
        "priority": -1000,
        "max_attempts": 100,
        "user": "u" * 100,
    }
    spec, errors = validate_job(data)
    assert errors == [] and spec is not None
    assert spec.gpus == 8 and spec.gpu_model == "H100"
    assert spec.cpus == 16.0 and isinstance(spec.cpus, float)
    assert spec.memory_mb == 65536 and spec.priority == -1000 and spec.max_attempts == 100
    assert spec.env == {"CUDA_VISIBLE_ORDER": "x", "_A1": ""}
    assert spec.cwd == "/data/run"
    assert spec.user == "u" * 64


def test_limits_are_inclusive() -> None:
    assert errs(gpus=MAX_GPUS, gpu_model="B200", cpus=MAX_CPUS, memory_mb=MAX_MEMORY_MB, priority=1000,
                max_attempts=1, name="a" * 128) == []
    assert errs(cpus=0.001, memory_mb=1) == []


def test_known_models_extend_the_builtin_list() -> None:
    assert errs(gpus=1, gpu_model="MI300X") == [("gpuModel", "UNKNOWN_GPU_MODEL")]
    spec, errors = validate_job({**BASE, "gpus": 1, "gpu_model": "MI300X"}, known_models=["MI300X"])
    assert errors == [] and spec is not None and spec.gpu_model == "MI300X"


def test_empty_gpu_model_means_any() -> None:
    spec, errors = validate_job({**BASE, "gpus": 1, "gpu_model": ""})
    assert errors == [] and spec is not None and spec.gpu_model is None


# ---------------------------------------------------------------- each rule


@pytest.mark.parametrize("name", ["", None, "-lead", ".lead", "has space", "a" * 129, "ünï", "a/b", 5, ["a"]])
def test_bad_names(name: Any) -> None:
    assert errs(name=name) == [("name", "INVALID")]


def test_missing_name() -> None:
    spec, errors = validate_job(without("name"))
    assert spec is None and [(e.field, e.code) for e in errors] == [("name", "INVALID")]


@pytest.mark.parametrize("command", [None, [], "python train.py", [1, 2], ["ok", None], {"a": "b"}])
def test_command_must_be_nonempty_list_of_strings(command: Any) -> None:
    assert errs(command=command) == [("command", "EMPTY_COMMAND")]


@pytest.mark.parametrize("command", [[""], ["   "], ["\t", "arg"]])
def test_empty_program(command: list[str]) -> None:
    assert errs(command=command) == [("command", "EMPTY_COMMAND")]


def test_missing_command() -> None:
    spec, errors = validate_job(without("command"))
    assert spec is None and [(e.field, e.code) for e in errors] == [("command", "EMPTY_COMMAND")]


@pytest.mark.parametrize("command", [["x" * (64 * 1024 + 1)], ["a"] * 257, ["é" * (32 * 1024 + 1)]])
def test_command_too_large(command: list[str]) -> None:
    assert errs(command=command) == [("command", "TOO_LARGE")]


def test_command_with_nul() -> None:
    assert errs(command=["echo", "a\x00b"]) == [("command", "INVALID")]


def test_a_lone_surrogate_anywhere_is_refused_by_field() -> None:
    """JSON's escapes can name a lone surrogate ("\\ud800"), which cannot be written as
    UTF-8: a submission holding one was an internal error when its record was written."""
    for field, value, api in (("command", ["echo", "a\ud800"], "command"), ("env", {"A": "\udfff"}, "env"),
                              ("env", {"\ud800": "x"}, "env"), ("cwd", "/tmp/\ud800", "cwd"),
                              ("user", "u\ud800", "user"), ("host_labels", {"zone": "\ud800"}, "hostLabels")):
        assert errs(**{field: value}) == [(api, "INVALID")]
    assert errs(command=["echo", "é ✓ \U0001f600"]) == []  # a pair written as one character is text


def test_host_labels() -> None:
    assert errs(host_labels={"zone": "eu-1", "net": "ib", "empty": ""}) == []
    assert errs(host_labels=["zone=eu-1"]) == [("hostLabels", "TOO_LARGE")]
    assert errs(host_labels={f"k{i}": "v" for i in range(17)}) == [("hostLabels", "TOO_LARGE")]
    assert errs(host_labels={"Zone": "a"}) == [("hostLabels", "INVALID")]
    assert errs(host_labels={"zone": "a b"}) == [("hostLabels", "INVALID")]
    assert errs(host_labels={"zone": 1}) == [("hostLabels", "INVALID")]


def test_operators_mistakes_are_told_in_words() -> None:
    """Found by trying the CLI: a bad dependency named the whole list, a reservation with
    neither queues nor users blamed `endsAt` with pydantic's prefix, a queue's bad name
    showed the raw pattern."""
    from wire.errors import InvalidInput
    from wire.validation import validate_advance_reservation, validate_queue

    _, errors = validate_job({**BASE, "depends_on": ["bogus"]})
    assert [(e.field, e.message) for e in errors] == [("dependsOn", "'bogus' is not a job id")]
    with pytest.raises(ValidationError) as exc:
        validate_advance_reservation({"name": "r", "hosts": ["h1"], "starts": 1.0, "ends": 2.0})
    assert (exc.value.field, exc.value.code) == ("queues", "REQUIRED")
    with pytest.raises(InvalidInput) as bad:
        validate_advance_reservation({"name": "r", "hosts": ["h1"], "queues": ["q"], "starts": 2.0, "ends": 1.0})
    assert [(e.field, e.message) for e in bad.value.details()] == [("endsAt", "it must end after it starts")]
    with pytest.raises(ValidationError, match="lower-case letters") as exc:
        validate_queue({"name": "A"})
    assert exc.value.field == "name"
    # A begin time too far ahead is said so (found by exploring: the year 3000 was "must be a
    # time").
    _, errors = validate_job({"name": "b", "command": ["x"], "begin_at": 32503680000.0}, set())
    assert [(e.field, e.message) for e in errors] == [("beginAt", "must be before 2242-03-16")]
    # A quota of a GPU model no host reports and none known is refused, as a job's is
    # (found by exploring: `gpu:h100` was taken and the queue's GPU jobs waited for good);
    # one the fleet reports, or one the queue had before, is taken.
    h100 = {"nominal": 4}
    with pytest.raises(ValidationError, match="unknown GPU model 'h100'") as exc:
        validate_queue({"name": "q", "quota": {"gpu:h100": h100}})
    assert (exc.value.field, exc.value.code) == ("quota", "UNKNOWN_GPU_MODEL")
    assert validate_queue({"name": "q", "quota": {"gpu:H100": h100, "cpu": h100}}).quota["gpu:H100"].nominal == 4
    assert validate_queue({"name": "q", "quota": {"gpu:X9": h100}}, known_models={"X9"}).quota
    assert validate_queue({"name": "q", "quota": {"gpu:X9": h100}}, kept={"gpu:X9"}).quota
    with pytest.raises(ValidationError, match="lower-case letters") as exc:
        validate_advance_reservation({"name": "", "hosts": ["h1"], "queues": ["q"], "starts": 1.0, "ends": 2.0})
    assert exc.value.field == "name"


@pytest.mark.parametrize("text", ["a\x00b", "bell\x07", "esc\x1b[31m"])
def test_descriptions_refuse_control_characters(text: str) -> None:
    """A queue's or a reservation's description with a NUL or an escape was taken (PostgreSQL
    refuses a NUL in text; an escape reaches terminals as it is)."""
    from wire.validation import validate_advance_reservation, validate_queue

    assert validate_queue({"name": "q", "description": "two lines\n\tand a tab"}).description
    # Ordinary text that is not "printable" to Python is taken (found by review).
    assert validate_queue({"name": "q", "description": "GPU team\xa0: training \U0001f469\u200d\U0001f52c"})
    with pytest.raises(ValidationError) as exc:
        validate_queue({"name": "q", "description": text})
    assert (exc.value.field, exc.value.code) == ("description", "INVALID")
    with pytest.raises(ValidationError) as exc:
        validate_advance_reservation({"name": "r", "hosts": ["h1"], "queues": ["q"], "starts": 1.0, "ends": 2.0,
                                      "description": text})
    assert exc.value.field == "description"


def test_a_job_cannot_set_the_facts_muster_gives_its_tasks_nor_a_relative_cwd() -> None:
    """Found by exploring: `--env MUSTER_GANG_TASK=7` on a single task was read back by the
    agent as the task's index, and `--cwd out` ran in the agent's own directory."""
    assert errs(env={"MUSTER_GANG_TASK": "7"}) == [("env", "INVALID")]
    assert errs(env={"MUSTER_JOB_ID": "x", "OK": "1"}) == [("env", "INVALID")]
    assert errs(env={"MUSTER_ARRAY_INDEX": "3"}) == []  # the CLI's array jobs set their own
    assert errs(cwd="out") == [("cwd", "INVALID")] and errs(cwd="../x") == [("cwd", "INVALID")]
    assert errs(cwd="/scratch/run") == []


def test_excluded_hosts() -> None:
    assert errs(exclude_hosts=["gpu-7", "gpu-12"]) == []
    assert errs(exclude_hosts="gpu-7") == [("excludeHosts", "INVALID")]
    assert errs(exclude_hosts=["gpu 7"]) == [("excludeHosts", "INVALID")]
    assert errs(exclude_hosts=[f"h{i}" for i in range(129)]) == [("excludeHosts", "INVALID")]
    spec, _ = validate_job({"name": "j", "command": ["x"], "exclude_hosts": ["b", "a", "b"]})
    assert spec is not None and spec.exclude_hosts == ["a", "b"]


def test_env_not_a_map() -> None:
    assert errs(env=["A=1"]) == [("env", "INVALID")]


@pytest.mark.parametrize(
    "env",
    [
        {f"V{i}": "x" for i in range(MAX_ENV_VARS + 1)},
        {"BIG": "x" * MAX_ENV_BYTES},
    ],
)
def test_env_too_big(env: dict[str, str]) -> None:
    assert errs(env=env) == [("env", "TOO_LARGE")]


def test_env_at_the_limit_is_fine() -> None:
    assert errs(env={f"V{i}": "x" for i in range(MAX_ENV_VARS)}) == []
    assert errs(env={"BIG": "x" * (MAX_ENV_BYTES - 3)}) == []


@pytest.mark.parametrize("env", [{"1BAD": "x"}, {"A-B": "x"}, {"": "x"}, {"OK": 5}, {"OK": None}, {"OK": "a\x00"},
                                 {"K" * 129: "x"}])
def test_env_bad_variable(env: dict[str, Any]) -> None:
    assert errs(env=env) == [("env", "INVALID")]


@pytest.mark.parametrize("gpus", [-1, MAX_GPUS + 1, 10**9, 1.5, "2", None, True, False])
def test_bad_gpus(gpus: Any) -> None:
    assert errs(gpus=gpus) == [("gpus", "OUT_OF_RANGE")]


@pytest.mark.parametrize("cpus", [0, 0.0, 1e-300, 0.0009, -1, MAX_CPUS + 0.5, float("nan"), float("inf"), "1", None,
                                  True])
def test_bad_cpus(cpus: Any) -> None:
    assert errs(cpus=cpus) == [("cpus", "OUT_OF_RANGE")]


@pytest.mark.parametrize("memory_mb", [0, -5, MAX_MEMORY_MB + 1, 512.0, "512", None, True])
def test_bad_memory(memory_mb: Any) -> None:
    assert errs(memory_mb=memory_mb) == [("memoryMb", "OUT_OF_RANGE")]


def test_zero_everything() -> None:
    assert errs(gpus=0, cpus=0, memory_mb=0) == [("cpus", "OUT_OF_RANGE"), ("memoryMb", "OUT_OF_RANGE")]


def test_absurd_resources() -> None:
    assert errs(gpus=100_000, cpus=1e12, memory_mb=10**15) == [
        ("gpus", "OUT_OF_RANGE"),
        ("cpus", "OUT_OF_RANGE"),
        ("memoryMb", "OUT_OF_RANGE"),
    ]


@pytest.mark.parametrize("model", ["X9000", "h100", 5, ["H100"]])
def test_unknown_gpu_model(model: Any) -> None:
    assert errs(gpus=1, gpu_model=model) == [("gpuModel", "UNKNOWN_GPU_MODEL")]


def test_model_with_zero_gpus() -> None:
    assert errs(gpu_model="H100") == [("gpuModel", "INVALID")]
    assert errs(gpus=0, gpu_model="H100") == [("gpuModel", "INVALID")]


@pytest.mark.parametrize("priority", [1001, -1001, "1", 1.0, None])
def test_bad_priority(priority: Any) -> None:
    assert errs(priority=priority) == [("priority", "OUT_OF_RANGE")]


@pytest.mark.parametrize("max_attempts", [0, 101, -1, "3", 2.0, None])
def test_bad_max_attempts(max_attempts: Any) -> None:
    assert errs(max_attempts=max_attempts) == [("maxAttempts", "OUT_OF_RANGE")]


@pytest.mark.parametrize("cwd", ["/" + "d" * 4096, 5, "/tmp/\x00"])
def test_bad_cwd(cwd: Any) -> None:
    assert errs(cwd=cwd) == [("cwd", "INVALID")]


def test_bool_priority_rejected() -> None:
    assert errs(priority=True) == [("priority", "OUT_OF_RANGE")]


def test_bool_max_attempts_rejected() -> None:
    assert errs(max_attempts=True) == [("maxAttempts", "OUT_OF_RANGE")]


def test_name_with_trailing_newline_rejected() -> None:
    assert errs(name="train\n") == [("name", "INVALID")]


def test_env_key_with_trailing_newline_rejected() -> None:
    assert errs(env={"FOO\n": "x"}) == [("env", "INVALID")]


def test_one_error_per_bad_field() -> None:
    spec, errors = validate_job({"name": "", "command": [], "env": 3, "gpus": -1, "cpus": 0, "memory_mb": 0,
                                 "gpu_model": "nope", "priority": 5000, "max_attempts": 0, "cwd": 7})
    assert spec is None
    assert [e.field for e in errors] == ["name", "command", "env", "gpus", "cpus", "memoryMb", "gpuModel",
                                         "priority", "maxAttempts", "cwd"]


# ---------------------------------------------------------------- labels


def test_valid_labels() -> None:
    assert validate_labels({}) == []
    assert validate_labels({"rack": "r1", "zone": "z-1.a_B", "empty": "", "a.b-c_d": "X" * 63}) == []
    assert validate_labels({f"k{i}": "v" for i in range(MAX_LABELS)}) == []


def test_too_many_labels() -> None:
    errors = validate_labels({f"k{i}": "v" for i in range(MAX_LABELS + 1)})
    assert [e.field for e in errors] == ["labels"]
    assert "at most" in errors[0].message


@pytest.mark.parametrize("key", ["Rack", "1rack", "", "-x", "rack zone", "k" * 64, "räck"])
def test_bad_label_key(key: str) -> None:
    errors = validate_labels({key: "v"})
    assert len(errors) == 1 and errors[0].field == "labels" and "key" in errors[0].message


@pytest.mark.parametrize("value", ["has space", "v" * 64, "a/b", "a=b", "é"])
def test_bad_label_value(value: str) -> None:
    errors = validate_labels({"rack": value})
    assert len(errors) == 1 and errors[0].field == "labels" and "value" in errors[0].message


def test_every_bad_label_reported() -> None:
    errors = validate_labels({"Bad": "x", "good": "y", "also": "no way"})
    assert len(errors) == 2


def test_label_with_trailing_newline_rejected() -> None:
    assert len(validate_labels({"rack\n": "r1"})) == 1
    assert len(validate_labels({"rack": "r1\n"})) == 1


@pytest.mark.parametrize("labels", [{"Rack": "r1"}, {"rack": "has space"}, {"rack": "a/b"}, {"k" * 64: "v"}])
def test_a_heartbeat_with_labels_the_agent_would_refuse_is_refused_by_the_server(labels: dict[str, str]) -> None:
    """An agent that skipped its own label check (or a forged heartbeat) does not get its
    labels shown or matched: the heartbeat is not decoded, and the cluster view drops it."""
    from server.state.cluster import ClusterState
    from wire.messages import encode

    body = json.loads(encode(heartbeat("h1", boot_id="b", seq=0, ts=1.0, cpus=8, memory_mb=1024)))
    body["labels"] = labels
    raw = json.dumps(body).encode()
    with pytest.raises(DecodeError):
        decode(Heartbeat, raw)
    state = ClusterState()
    state.apply_heartbeat("h1", 1, raw, None, 1.0)
    assert state.dropped["heartbeat"] == 1 and "h1" not in state.hosts


# ---------------------------------------------------------------- decode


def sample_messages() -> list:
    spec = job_spec("j", gpus=1, gpu_model="H100")
    return [
        heartbeat("h1", boot_id="b", seq=0, ts=1.0, cpus=8, memory_mb=1024, labels={"rack": "r1"}, gpus=1,
                  unhealthy=[0], fault="xid 79"),
        StatusReport(host_id="h1", attempt_id="j.1", job_id="j", state=AttemptState.FAILED, exit_code=3, ts=2.0),
        host_alloc("h1", [task("j", gpu_indices=[0], cpus=1.0, memory_mb=512, term=4)], term=4),
        job("j", spec=spec, submitted_at=1.0, updated_at=2.0,
            attempts=[Attempt(id="j.1", number=1, host_id="h1", gpu_indices=[0])]),
        Command(kind="cancel", job_id="j", by="me", ts=3.0),
    ]


CLASSES = [Heartbeat, StatusReport, HostAlloc, Job, Command]


@pytest.mark.parametrize("msg", sample_messages(), ids=lambda m: type(m).__name__)
def test_encode_decode_round_trip(msg: Any) -> None:
    assert decode(type(msg), encode(msg)) == msg


tasks = st.builds(
    Task,
    attempt_id=st.text(min_size=1, max_size=20),
    job_id=st.text(min_size=1, max_size=20),
    number=st.integers(0, 100),
    command=st.lists(st.text(max_size=10), min_size=1, max_size=3),
    env=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    cwd=st.none() | st.text(max_size=10),
    gpu_indices=st.lists(st.integers(0, 63), max_size=4),
    cpus=st.floats(0, 4096),
    memory_mb=st.integers(0, 10**7),
    term=st.integers(0, 10**6),
    stop=st.booleans(),
    keep_running=st.booleans(),
)


@given(host=st.text(min_size=1, max_size=30), term=st.integers(0, 10**6), tasks=st.lists(tasks, max_size=5))
def test_alloc_record_omits_defaults_and_decodes_to_the_same_tasks(host: str, term: int, tasks: list[Task]) -> None:
    alloc = host_alloc(host, tasks, term=term)
    data = encode(alloc)
    assert decode(HostAlloc, data, limit=MAX_RECORD_BYTES) == alloc
    raw = json.loads(data)
    assert raw["v"] == 1 and raw["host_id"] == host and raw["term"] == term
    for t, d in zip(tasks, raw["tasks"], strict=True):
        defaults = Task(attempt_id="a", job_id="j", number=0, command=["x"])
        omitted = {k for k in Task.model_fields if getattr(t, k) == getattr(defaults, k)} - {
            "attempt_id", "job_id", "number", "command"}
        assert omitted.isdisjoint(d), "a field holding its default is written"
        assert {k for k in Task.model_fields if k not in omitted} <= set(d)


def test_task_is_immutable_and_a_changed_copy_is_encoded_anew() -> None:
    t = task("j", gpu_indices=[0])
    before = encode(host_alloc("h1", [t]))  # caches the task's JSON
    with pytest.raises(PydanticValidationError):
        t.stop = True  # type: ignore[misc]
    stopped = t.model_copy(update={"stop": True})
    assert stopped != t and not t.stop
    after = decode(HostAlloc, encode(host_alloc("h1", [t, stopped])), limit=MAX_RECORD_BYTES)
    assert [x.stop for x in after.tasks] == [False, True]
    assert encode(host_alloc("h1", [t])) == before


@pytest.mark.parametrize("msg", sample_messages(), ids=lambda m: type(m).__name__)
def test_decode_rejects_oversized(msg: Any) -> None:
    data = encode(msg)
    padded = data + b" " * (MAX_MESSAGE_BYTES + 1 - len(data))
    assert len(padded) == MAX_MESSAGE_BYTES + 1
    with pytest.raises(DecodeError, match="exceeds"):
        decode(type(msg), padded)
    # Exactly at the limit is still decoded.
    assert decode(type(msg), padded[:-1]) == msg
    with pytest.raises(DecodeError):
        decode(type(msg), data, limit=len(data) - 1)
    assert decode(type(msg), data, limit=len(data)) == msg


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize("data", [b"", b"{", b"not json", b"\xff\xfe\x00", b"[]", b"null", b"1", b'"x"',
                                  b'{"v": 1', b"{}"])
def test_decode_rejects_malformed(cls: type, data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode(cls, data)


@pytest.mark.parametrize("msg", sample_messages(), ids=lambda m: type(m).__name__)
@pytest.mark.parametrize("v", [2, 0, "1", None])
def test_decode_rejects_wrong_version(msg: Any, v: Any) -> None:
    doc = json.loads(encode(msg))
    doc["v"] = v
    with pytest.raises(DecodeError):
        decode(type(msg), json.dumps(doc).encode())


@pytest.mark.parametrize("msg", sample_messages(), ids=lambda m: type(m).__name__)
def test_decode_missing_version_defaults_to_1(msg: Any) -> None:
    doc = json.loads(encode(msg))
    doc.pop("v", None)  # a job record is stored without its defaults, "v" included
    assert decode(type(msg), json.dumps(doc).encode()) == msg


@pytest.mark.parametrize(
    "cls, field, value",
    [
        (Heartbeat, "cpus", "lots"),
        (Heartbeat, "cpus", -1),
        (Heartbeat, "ts", "yesterday"),
        (Heartbeat, "host_id", "bad host"),
        (Heartbeat, "host_id", ""),
        (Heartbeat, "gpus", [{"index": 64, "model": "H100", "memory_mb": 1}]),
        (Heartbeat, "labels", {f"k{i}": "v" for i in range(33)}),
        (StatusReport, "state", "EXPLODED"),
        (StatusReport, "exit_code", "three"),
        (StatusReport, "output_tail", "x" * 16385),
        (HostAlloc, "tasks", [{"attempt_id": "a"}]),
        (HostAlloc, "tasks", "none"),
        (Job, "state", "DONE"),
        (Job, "spec", {"name": "j", "command": []}),
        (Job, "spec", {"name": "j", "command": ["x"], "gpus": 65}),
        (Job, "attempts", [{"id": "a"}]),
        (Command, "kind", "delete"),
        (Command, "job_id", "j" * 129),
    ],
)
def test_decode_rejects_wrong_types(cls: type, field: str, value: Any) -> None:
    msg = next(m for m in sample_messages() if type(m) is cls)
    doc = json.loads(encode(msg))
    doc[field] = value
    with pytest.raises(DecodeError):
        decode(cls, json.dumps(doc).encode())


def test_decode_ignores_unknown_fields() -> None:
    msg = sample_messages()[0]
    doc = json.loads(encode(msg))
    doc["future_field"] = {"x": 1}
    assert decode(Heartbeat, json.dumps(doc).encode()) == msg


# ---------------------------------------------------------------- fuzz

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=25,
)


def decode_or_error(cls: type, data: bytes) -> None:
    try:
        out = decode(cls, data)
    except DecodeError:
        return
    assert isinstance(out, cls)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cls=st.sampled_from(CLASSES), data=st.binary(max_size=300))
def test_fuzz_random_bytes(cls: type, data: bytes) -> None:
    decode_or_error(cls, data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cls=st.sampled_from(CLASSES), value=json_values)
def test_fuzz_random_json(cls: type, value: Any) -> None:
    decode_or_error(cls, json.dumps(value).encode())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(idx=st.integers(0, len(CLASSES) - 1), data=st.data())
def test_fuzz_mutated_valid_documents(idx: int, data: st.DataObject) -> None:
    """Valid documents with one field (top level or nested) replaced by a random JSON value."""
    msg = sample_messages()[idx]
    doc = json.loads(encode(msg))
    target = doc
    # Walk down into a nested object now and then.
    while True:
        nested = [k for k, v in target.items() if isinstance(v, dict) and v] + [
            k for k, v in target.items() if isinstance(v, list) and v and isinstance(v[0], dict)
        ]
        if not nested or not data.draw(st.booleans()):
            break
        k = data.draw(st.sampled_from(nested))
        target = target[k] if isinstance(target[k], dict) else target[k][0]
    key = data.draw(st.sampled_from(sorted(target) + ["extra"]))
    target[key] = data.draw(json_values)
    decode_or_error(type(msg), json.dumps(doc).encode())


@settings(max_examples=100, deadline=None)
@given(depth=st.integers(100, 20_000))
def test_fuzz_deep_nesting(depth: int) -> None:
    data = b"[" * depth + b"]" * depth
    with pytest.raises(DecodeError):
        decode(Job, data)
    with pytest.raises(DecodeError):
        decode(Heartbeat, b'{"labels": ' + b"{\"a\": " * depth + b"1" + b"}" * depth + b"}")


def test_a_job_record_is_stored_without_its_defaults_and_reads_back_whole() -> None:
    """`job.<id>` records leave out what holds its default (a reader fills it in): the
    record is smaller, and a decoded job keeps only the fields it carried as given."""
    from tests.factories import job as make_job
    from tests.factories import job_spec

    j = make_job("j1", spec=job_spec("j1", gpus=2))
    raw = encode(j)
    doc = json.loads(raw)
    assert "v" not in doc and "cancel_reason" not in doc and "preempting" not in doc
    assert "env" not in doc["spec"] and doc["spec"]["gpus"] == 2
    back = decode(Job, raw)
    assert back == j
    assert back.model_fields_set <= set(doc)


def test_ids_made_together_keep_their_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by hand: the jobs of one `--array` share their submission time, and their ids
    were ordered by chance (the list showed arr-0, arr-2, arr-1, and the queue ran them in
    that order). Within a process ids strictly increase, in one millisecond too, and while
    the clock stands behind the last id."""
    from wire import messages

    ids = [messages.new_id("j") for _ in range(5000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    clock = [2_000_000_000.0]
    monkeypatch.setattr(messages.time, "time", lambda: clock[0])
    later = [messages.new_id("j") for _ in range(3)]
    clock[0] -= 5  # the clock steps back
    later += [messages.new_id("j") for _ in range(3)]
    assert later == sorted(later) and len(set(later)) == 6 and later[0] > ids[-1]
    assert all(len(i) == len(ids[0]) and re.fullmatch(JOB_ID_PATTERN, i) for i in later)


def test_a_forked_child_makes_other_ids_than_its_parent() -> None:
    """The random part comes from a generator of the process's own (no system call per
    id): a forked child is seeded again, so it and its parent, in the same millisecond,
    do not make the same ids."""
    import os

    from wire import messages

    messages.new_id("j")  # the generator in use before the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next random parts, to the parent
        os.close(read)
        os.write(write, ",".join(str(messages._id_random.getrandbits(40)) for _ in range(4)).encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 4096).decode().split(",")
    os.close(read)
    os.waitpid(pid, 0)
    mine = [str(messages._id_random.getrandbits(40)) for _ in range(4)]
    assert len(child) == 4 and child != mine


def test_a_dependency_rule_is_one_of_three_and_only_with_jobs_to_run_after() -> None:
    deps = ["jprep00001"]
    assert errs(depends_on=deps, depend_any=True, depend_not_ok=True) == [("dependency", "INVALID")]
    assert errs(depends_on=deps, depend_not_ok="yes") == [("dependency", "INVALID")]
    spec, _ = validate_job({**BASE, "depends_on": deps, "depend_not_ok": True})
    assert spec is not None and spec.depend_not_ok and not spec.depend_any
    spec, _ = validate_job({**BASE, "depend_not_ok": True})  # nothing to run after: no rule kept
    assert spec is not None and not spec.depend_not_ok


def test_checkpoints_is_true_or_false() -> None:
    assert errs(checkpoints="yes") == [("checkpoints", "INVALID")]
    spec, _ = validate_job({**BASE, "checkpoints": True})
    assert spec is not None and spec.checkpoints
    spec, _ = validate_job(dict(BASE))
    assert spec is not None and not spec.checkpoints
