"""Muster's one error hierarchy.

    MusterError
    ├── ConfigError          bad settings or command-line options
    ├── ValidationError      a user's input was rejected (carries field and code)
    ├── NotFound             a job, host or token that does not exist
    ├── AuthError            missing, wrong or revoked credentials
    ├── StoreError           the NATS store failed (foreign exceptions translated here)
    │   ├── ConflictError    a revision-checked write lost a race (retry from a fresh view)
    │   └── FencedError      the write carried a stale leadership term (step down)
    └── DecodeError          an untrusted message could not be decoded
"""

from __future__ import annotations


class MusterError(Exception):
    """Base of every error Muster raises on purpose."""


class ConfigError(MusterError):
    pass


class ValidationError(MusterError):
    def __init__(self, field: str, message: str, code: str = "INVALID") -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.code = code


class NotFound(MusterError):
    pass


class AuthError(MusterError):
    pass


class StoreError(MusterError):
    pass


class ConflictError(StoreError):
    pass


class FencedError(StoreError):
    pass


class DecodeError(MusterError):
    pass
