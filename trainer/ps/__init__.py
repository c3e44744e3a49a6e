"""The parameter server: server (driver side) and client (worker side), numpy and the standard library only.

    ParameterServer, UpdateRecord       -- trainer.ps.server
    PSClient                            -- trainer.ps.client
    PSError, RemoteError, PSNotStartedError -- trainer.ps.errors

Frames, the handshake and the socket errors (TransportError, ConnectionClosed,
TransportTimeout, ProtocolError, AuthenticationError, new_secret) come from
``trainer.transport``. No Keras, no Spark.
"""

from trainer.ps.client import PSClient
from trainer.ps.errors import PSError, PSNotStartedError, RemoteError
from trainer.ps.server import ParameterServer, UpdateRecord

__all__ = ["PSClient", "PSError", "PSNotStartedError", "ParameterServer", "RemoteError", "UpdateRecord"]
