"""nyala: a replicated, Arrow-native tablet store in the shape of Apache Kudu.

The public API grows issue by issue; see README.md for the tour. This module re-exports the
names users reach for and must not import heavy optional dependencies (pyspark, pandas).
"""

from __future__ import annotations

from nyala import errors
from nyala._native import __version__
from nyala.schema import Column, Schema

__all__ = ["Column", "Schema", "__version__", "errors"]
