"""What masters and tablet servers share (Kudu's ``server/``): the server base (fs root,
replicas, RPC and HTTP on one event loop, graceful shutdown), the settings both take, the fs
manager, the ConsensusService that routes Raft RPCs to hosted replicas, and the protobuf
conversions of tablet-layer types.

Masters and tablet servers stand on this floor and never import each other; they meet only on
the wire.
"""

from __future__ import annotations
