"""Errors of the parameter server; socket and framing errors come from ``trainer.transport.wire``."""

from __future__ import annotations

from trainer.transport.wire import TransportError


class PSError(TransportError):
    """Base class of the parameter server's own errors."""


class RemoteError(PSError):
    """The server answered a request with an ERROR frame."""


class PSNotStartedError(PSError):
    """The parameter server was used before start() (or restarted after stop())."""
