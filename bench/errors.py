"""The benchmark's error: a run that cannot go on (a process died, the cluster never got
ready, a request failed). Part of Muster's one hierarchy (`wire.errors.MusterError`)."""

from __future__ import annotations

from wire.errors import MusterError


class BenchError(MusterError):
    """A benchmark run failed; the message says why and, where there is one, which log to read."""
