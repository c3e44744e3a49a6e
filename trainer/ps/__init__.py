"""The parameter server: server (driver side) and client (worker side), numpy and the standard library only.

    ParameterServer                     -- trainer.ps.server
    UpdateRecord, UpdateLog             -- trainer.ps.records (bounded update history, exact totals)
    check_commit, check_center          -- trainer.ps.hygiene (what a COMMIT must be)
    completed_epochs, uniform_progress  -- trainer.ps.epochs
    PSClient                            -- trainer.ps.client
    PSError, RemoteError, PSNotStartedError -- trainer.ps.errors

Frames, the handshake, the frame MACs and the socket errors (TransportError,
ConnectionClosed, TransportTimeout, ProtocolError, AuthenticationError,
IntegrityError, new_secret) come from ``trainer.transport``. No Keras, no Spark.
"""

from trainer.ps.client import PSClient
from trainer.ps.errors import PSError, PSNotStartedError, RemoteError
from trainer.ps.records import UpdateRecord
from trainer.ps.server import ParameterServer

__all__ = ["PSClient", "PSError", "PSNotStartedError", "ParameterServer", "RemoteError", "UpdateRecord"]
