"""Where the error hierarchy (wire.errors) meets HTTP, in one place.

    ValidationError  422 (409 for code ALREADY_FINISHED: cancelling a job that ended)
    NotFound         404
    AuthError        403 (Forbidden too: a role that may only view, a wrong CSRF token)
    ConflictError    409 (a revision-checked write kept losing its race)
    RejectedError    413 (the store refused the record for what it holds: too large)
    StoreError       503 (the cluster store did not answer; on an action, whether it was
                     done is unknown: see `error_response`)

`status_for` is the mapping. A form shows the first three (and ConflictError) next to
its fields with that status (`FORM_ERRORS`); an endpoint that lets one of `MAPPED`
propagate gets `error_response`, an error page (plain text for htmx). Any other
exception is a fault: Starlette logs it and answers 500.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from web.console.render import error_page
from wire.errors import (
    AuthError,
    ConflictError,
    FencedError,
    HistoryUnavailable,
    MusterError,
    NotFound,
    RejectedError,
    StoreError,
    ValidationError,
)

# The errors a form shows next to its fields; the others in MAPPED become an error page.
FORM_ERRORS = (ValidationError, NotFound, AuthError, ConflictError, RejectedError)
MAPPED = (ValidationError, NotFound, AuthError, StoreError)

# Titles of the error pages (NotFound's by what was not found: its `field`).
NOT_FOUND_TITLES = {"host": "No such host", "job": "No such job"}
TITLES = {403: "Forbidden", 404: "Not found", 409: "Conflict", 413: "Too large", 422: "Invalid input",
          503: "Store unavailable"}
UNKNOWN_OUTCOME = "Outcome unknown"


def status_for(exc: MusterError) -> int:
    """The HTTP status of an error of the hierarchy."""
    if isinstance(exc, ValidationError):
        return 409 if exc.code == "ALREADY_FINISHED" else 422
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, AuthError):
        return 403
    if isinstance(exc, ConflictError):
        return 409
    if isinstance(exc, RejectedError):
        return 413
    if isinstance(exc, StoreError):
        return 503
    return 500


def error_response(request: Request, exc: MusterError) -> Response:
    """An error page for an error of the hierarchy, with its status."""
    status = status_for(exc)
    if isinstance(exc, NotFound):
        return error_page(request, status, NOT_FOUND_TITLES.get(exc.field, TITLES[404]), exc.message)
    if isinstance(exc, HistoryUnavailable):  # a read of history, not of the cluster store
        return error_page(request, status, "History unavailable", exc.message)
    if isinstance(exc, StoreError) and not isinstance(exc, (ConflictError, RejectedError, FencedError)):
        if request.method == "POST":
            # A write the store did not answer in time may still have been applied (found
            # by exploring: a cancel and a requeue said "Store unavailable" as a failure,
            # and had been done): say so, rather than invite the operator to do it again.
            return error_page(request, status, UNKNOWN_OUTCOME,
                              f"The cluster store did not answer in time ({exc}), so whether this was done is "
                              "unknown: it may have been applied. Look at the job or host it was for (reload its "
                              "page) before trying again.")
        return error_page(request, status, TITLES[503], f"The cluster store did not answer: {exc}")
    return error_page(request, status, TITLES.get(status, "Error"), exc.message)


def no_such_host(host_id: str) -> NotFound:
    return NotFound(f"No host {host_id!r} has reported to this cluster.", field="host")


def no_such_job(job_id: str) -> NotFound:
    return NotFound(f"There is no job {job_id!r}.", field="job")
