"""The master: the sys-catalog tablet, the catalog manager (DDL, locations, tablet reports),
the tserver manager, placement, background tasks and master membership (issue 9).

It imports downwards only: ``nyala.server`` for what every server shares (fs layout, server base,
consensus service, conversions), tablet and consensus for the sys catalog, rpc for its services
and the RPCs it sends; never ``nyala.tserver``.
"""

from __future__ import annotations

from nyala.master.server import MasterServer
from nyala.master.settings import MasterSettings

__all__ = ["MasterServer", "MasterSettings"]
