"""The CLI against a server one version older: a field the server's schema lacks is
asked for again without it when the command can do without (server.cli.client.gql's
`optional`), and said in so many words when it cannot. The older server's HTTP answers
are those strawberry gives for a field its schema lacks."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from server.cli import client
from server.cli.errors import ApiError


class OlderServer:
    """Answers as a server without `hold` on Job: GraphQL's validation error when a query
    asks for it, the data otherwise."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    def post(self, url: str, json: dict[str, Any], **_: Any) -> httpx.Response:
        q = json["query"]
        self.queries.append(q)
        missing = [f for f in ("hold", "fancy") if f" {f} " in f" {q} ".replace("}", " ").replace("{", " ")]
        if missing:
            errors = [{"message": f"Cannot query field '{f}' on type 'Job'."} for f in missing]
            return httpx.Response(200, json={"data": None, "errors": errors})
        return httpx.Response(200, json={"data": {"job": {"id": "j1", "state": "QUEUED"}}})


@pytest.fixture
def older(monkeypatch: pytest.MonkeyPatch) -> OlderServer:
    server = OlderServer()
    monkeypatch.setattr(httpx, "post", server.post)
    monkeypatch.setenv("MUSTER_TOKEN", "mst_x")
    return server


def test_an_optional_field_the_server_lacks_is_dropped_and_asked_again(older: OlderServer) -> None:
    data = client.gql("query { job(id: \"j1\") { id state hold } }", optional=("hold",))
    assert data == {"job": {"id": "j1", "state": "QUEUED"}}
    assert len(older.queries) == 2 and "hold" not in older.queries[1] and "state" in older.queries[1]


def test_a_missing_field_that_is_not_optional_says_the_server_is_older(older: OlderServer) -> None:
    with pytest.raises(ApiError, match="older API than this muster CLI"):
        client.gql("query { job(id: \"j1\") { id hold } }")
    with pytest.raises(ApiError, match="Cannot query field 'fancy'"):
        client.gql("query { job(id: \"j1\") { id hold fancy } }", optional=("hold",))
    assert len(older.queries) == 2  # no retry when a field it cannot do without is missing too


def test_an_optional_object_field_is_dropped_with_its_arguments_and_selection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A field with arguments and a selection of its own (`submittedJobsByUser(first: 5) {
    user jobs }`): the query asked again has neither, and its braces still balance."""
    queries: list[str] = []

    def post(url: str, json: dict[str, Any], **_: Any) -> httpx.Response:
        queries.append(json["query"])
        if "submittedJobsByUser" in json["query"]:
            return httpx.Response(200, json={"data": None, "errors": [
                {"message": "Cannot query field 'submittedJobsByUser' on type 'Queue'."}]})
        return httpx.Response(200, json={"data": {"queue": {"name": "a", "weight": 1.0}}})

    monkeypatch.setattr(httpx, "post", post)
    monkeypatch.setenv("MUSTER_TOKEN", "mst_x")
    q = "query { queue(name: \"a\") { name submittedJobsByUser(first: 5) { user jobs } weight } }"
    assert client.gql(q, optional=("submittedJobsByUser",)) == {"queue": {"name": "a", "weight": 1.0}}
    again = queries[1]
    assert "user" not in again and "first" not in again and "jobs" not in again
    assert again.count("{") == again.count("}") == 2 and "name" in again and "weight" in again


def test_job_submit_wait_polls_an_older_server_without_the_newer_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    """`job submit --wait` (cli.jobs.wait_for) asks for a job as `job show` does, so a
    server without one of the newest fields answers it: it used to fail there, after the
    job was submitted."""
    from server.cli import jobs

    asked: list[str] = []

    def post(url: str, json: dict[str, Any], **_: Any) -> httpx.Response:
        q = json["query"]
        asked.append(q)
        if "gpuIdleSince" in q:
            return httpx.Response(200, json={"data": None, "errors": [
                {"message": "Cannot query field 'gpuIdleSince' on type 'Attempt'."}]})
        return httpx.Response(200, json={"data": {"job": {"id": "j1", "state": "SUCCEEDED"}}})

    monkeypatch.setattr(httpx, "post", post)
    monkeypatch.setenv("MUSTER_TOKEN", "mst_x")
    job, timed_out = jobs.wait_for("j1", timeout=5)
    assert job["state"] == "SUCCEEDED" and not timed_out
    assert "gpuIdleSince" in asked[0] and "gpuIdleSince" not in asked[-1]


def test_a_bulk_action_asks_an_older_server_without_the_count_of_other_queues_jobs(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`job cancel --name x` asks cancelJobs for `outsideTokenQueues` and `tokenQueues`
    (newer than some servers): an older server is asked again without them, and the
    command says what it said before."""
    from server.cli.entry import main

    asked: list[str] = []

    def post(url: str, json: dict[str, Any], **_: Any) -> httpx.Response:
        q = json["query"]
        asked.append(q)
        missing = [f for f in ("outsideTokenQueues", "tokenQueues") if f in q]
        if missing:
            return httpx.Response(200, json={"data": None, "errors": [
                {"message": f"Cannot query field '{f}' on type 'CancelJobsPayload'."} for f in missing]})
        return httpx.Response(200, json={"data": {"cancelJobs": {"count": 0, "jobIds": [], "userErrors": []}}})

    monkeypatch.setattr(httpx, "post", post)
    monkeypatch.setenv("MUSTER_TOKEN", "mst_x")
    assert main(["job", "cancel", "--name", "x", "--reason", "r"]) == 0
    assert "no job matches: nothing to cancel" in capsys.readouterr().err
    assert len(asked) == 2 and "outsideTokenQueues" in asked[0] and "tokenQueues" not in asked[1]
