"""Logging set-up for every Muster process (control plane and agents alike): plain text
for people, or one JSON object per line for machines (`MUSTER_LOG_FORMAT=json`), with
the fields log shippers expect."""

from __future__ import annotations

import json
import logging
import os
import time


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            "process": record.process,
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def setup(level: str = "INFO", component: str = "") -> None:
    fmt = os.environ.get("MUSTER_LOG_FORMAT", "text").lower()
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, os.environ.get("MUSTER_LOG_LEVEL", level).upper(), logging.INFO))
    logging.getLogger("nats").setLevel(logging.WARNING)


def name_this_process(name: str) -> None:
    """Set the process name `ps`, `top` and the benchmark show (Linux `comm`, at most 15
    bytes): the server's helper processes are all `python ... spawn_main` otherwise."""
    try:
        with open("/proc/self/comm", "w") as f:
            f.write(name[:15])
    except OSError:
        pass
