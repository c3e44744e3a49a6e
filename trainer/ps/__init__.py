"""Parameter-server transport: wire format, server (driver side) and client (worker side).

Only numpy and the standard library are used here; no Keras, no Spark.

    ParameterServer, UpdateRecord, PSNotStartedError   -- trainer.ps.server
    PSClient, RemoteError                              -- trainer.ps.client
    Msg, PSError, ProtocolError, ConnectionClosed,
    PSTimeout, AuthenticationError, new_secret         -- trainer.ps.wire
"""

from trainer.ps.client import PSClient, RemoteError
from trainer.ps.server import ParameterServer, PSNotStartedError, UpdateRecord
from trainer.ps.wire import (
    AuthenticationError,
    ConnectionClosed,
    Msg,
    ProtocolError,
    PSError,
    PSTimeout,
    new_secret,
)

__all__ = [
    "AuthenticationError",
    "ConnectionClosed",
    "Msg",
    "PSClient",
    "PSError",
    "PSNotStartedError",
    "PSTimeout",
    "ParameterServer",
    "ProtocolError",
    "RemoteError",
    "UpdateRecord",
    "new_secret",
]
