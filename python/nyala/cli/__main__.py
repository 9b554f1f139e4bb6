"""``python -m nyala.cli``: the same program as the ``nyala`` entry point."""

from __future__ import annotations

from nyala.cli import main

if __name__ == "__main__":
    main(prog_name="nyala")
