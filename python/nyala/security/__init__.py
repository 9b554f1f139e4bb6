"""Cluster security: the cluster CA and the certificates it signs (``pki``), where each
process keeps them (``files``), and who a peer is (``identity``).

Importing this package loads nothing heavy: ``cryptography`` is imported by ``pki`` only, which
masters, enrolling tablet servers and the ``nyala cert`` commands use; the RPC layer reads PEM
files (``files``) and peer names (``identity``) without it.
"""

from __future__ import annotations
