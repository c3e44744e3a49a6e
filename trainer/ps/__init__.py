"""The parameter server: server (driver side) and client (worker side), numpy and the standard library only.

    ParameterServer                     -- trainer.ps.server (asynchronous commits: .commits, rounds: .rounds)
    Center                              -- trainer.ps.center (in-place updates, tensor locks, consistent reads)
    ShardedParameterServer              -- trainer.ps.shards (S endpoints; the cut: trainer.ps.layout)
    UpdateRecord, UpdateLog             -- trainer.ps.records (bounded update history, exact totals)
    check_commit, check_center          -- trainer.ps.hygiene (what a COMMIT must be)
    completed_epochs, uniform_progress  -- trainer.ps.epochs
    PSClient                            -- trainer.ps.ps_client
    ShardedPSClient, connect_ps         -- trainer.ps.shard_client
    PSError, RemoteError, PSNotStartedError -- trainer.ps.ps_errors

Frames, the handshake, the frame MACs and the socket errors (TransportError,
ConnectionClosed, TransportTimeout, ProtocolError, AuthenticationError,
IntegrityError, new_secret) come from ``trainer.transport``. No Keras, no Spark.
"""

from trainer.ps.ps_client import PSClient
from trainer.ps.ps_errors import PSError, PSNotStartedError, RemoteError
from trainer.ps.records import UpdateRecord
from trainer.ps.server import ParameterServer
from trainer.ps.shard_client import ShardedPSClient, connect_ps
from trainer.ps.shards import ShardedParameterServer

__all__ = ["PSClient", "PSError", "PSNotStartedError", "ParameterServer", "RemoteError", "ShardedPSClient",
           "ShardedParameterServer", "UpdateRecord", "connect_ps"]
