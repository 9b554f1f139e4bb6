"""``nyala tserver run`` and ``nyala master run``: one command shape for both servers.

Both take the fs root, the two bind addresses, the masters, an expected UUID, a log level, a
flagfile and one flag per tunable setting; the settings class says the default ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import io
import logging
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import click

from nyala.cli.options import given, one_line_errors, settings_options
from nyala.common.config import from_mapping, read_flagfile
from nyala.common.process import (
    die_with_parent_if_asked,
    raise_open_files_limit,
    tune_allocator,
    tune_gc,
)
from nyala.server.settings import ServerSettings

_SERVER_FIELDS = ("fs_root", "rpc_bind", "http_bind", "masters", "uuid")
_MASTERS_HELP = "Comma-separated master addresses (default: $NYALA_MASTERS)."


def run_command(
    settings_cls: type[ServerSettings],
    serve: Callable[[Any], Coroutine[Any, Any, None]],
    help_text: str,
) -> click.Command:
    """The ``run`` command of a server whose settings are ``settings_cls``; ``serve(settings)``
    is the coroutine that runs it until SIGTERM or SIGINT."""
    defaults = settings_cls(fs_root=Path("."))

    @click.command(name="run", help=help_text)
    @click.option("--fs-root", type=click.Path(path_type=Path), required=True, help="Data root.")
    @click.option("--rpc-bind", default=defaults.rpc_bind, show_default=True, help="HOST:PORT.")
    @click.option("--http-bind", default=defaults.http_bind, show_default=True, help="HOST:PORT.")
    @click.option("-m", "--masters", envvar="NYALA_MASTERS", default="", help=_MASTERS_HELP)
    @click.option("--uuid", default="", help="Refuse to start unless the fs root has this UUID.")
    @click.option("--log-level", default="INFO", show_default=True, help="Python logging level.")
    @click.option(
        "--flagfile",
        type=click.Path(path_type=Path, dir_okay=False),
        default=None,
        help="File of 'name = value' settings; flags given on the command line win.",
    )
    @settings_options(settings_cls, exclude=_SERVER_FIELDS)
    @one_line_errors
    def run(
        fs_root: Path,
        rpc_bind: str,
        http_bind: str,
        masters: str,
        uuid: str,
        log_level: str,
        flagfile: Path | None,
        **tunables: Any,
    ) -> None:
        tune_allocator()  # first: before any thread of ours has a heap
        die_with_parent_if_asked()
        raise_open_files_limit()
        logging.basicConfig(
            level=log_level.upper(),
            stream=sys.stderr,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        settings = from_mapping(
            settings_cls,
            {
                "fs_root": fs_root,
                "rpc_bind": rpc_bind,
                "http_bind": http_bind,
                "masters": tuple(m.strip() for m in masters.split(",") if m.strip()),
                "uuid": uuid,
                **(read_flagfile(flagfile) if flagfile is not None else {}),
                **given(tunables),
            },
        )
        with contextlib.suppress(io.UnsupportedOperation, ValueError):
            # SIGUSR1 prints every thread's stack to the log: how to see where a stuck server
            # waits (not possible when stderr is no file, e.g. under click's test runner).
            faulthandler.register(signal.SIGUSR1, all_threads=True)
            # A fatal signal (a crash in native code, an abort) leaves every thread's Python
            # stack in the log instead of a log that just stops.
            faulthandler.enable(all_threads=True)
        tune_gc()  # last: what exists now is frozen out of collection
        asyncio.run(serve(settings))

    return run
