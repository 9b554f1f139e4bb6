"""The master: the sys-catalog tablet, the catalog manager (DDL, locations, tablet reports),
the tserver manager, placement, background tasks and master membership (issue 9).

It imports downwards only: tablet and consensus for the sys catalog, rpc for its services and
the RPCs it sends; tserver only for shared pieces (fs layout, consensus service, conversions).
"""

from __future__ import annotations

from nyala.master.server import MasterServer
from nyala.master.settings import MasterSettings

__all__ = ["MasterServer", "MasterSettings"]
