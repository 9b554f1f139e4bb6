"""``python -m nyala.chaos run ...``: the same as ``nyala chaos run ...``."""

from __future__ import annotations

from nyala.cli.chaos import group

if __name__ == "__main__":
    group(prog_name="python -m nyala.chaos")
