"""TLS settings for NATS clients (stdlib `ssl` only; certificates are made elsewhere)."""

from __future__ import annotations

import ssl
from pathlib import Path

from wire.errors import ConfigError


def client_context(ca: str | Path | None = None, cert: str | Path | None = None,
                   key: str | Path | None = None) -> ssl.SSLContext | None:
    """An SSL context trusting `ca` (or the system store), presenting `cert`/`key` when
    both are given. None when nothing TLS-related is configured."""
    if not ca and not cert and not key:
        return None
    if bool(cert) != bool(key):
        raise ConfigError("a NATS client certificate needs both a cert and a key file")
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca) if ca else None)
        if cert and key:
            ctx.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS files: {exc}") from exc
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx
