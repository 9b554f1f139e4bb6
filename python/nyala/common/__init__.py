"""Shared foundations importable from every layer: ids, clock, metadata files, config."""
