"""The tablet server: fs root, settings, RPC services and the server process object."""

from __future__ import annotations

from nyala.tserver.server import TabletServer
from nyala.tserver.settings import TabletServerSettings

__all__ = ["TabletServer", "TabletServerSettings"]
