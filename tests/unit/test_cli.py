"""The ``nyala`` command line: command groups, settings as flags, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from nyala.cli import COMMAND_MODULES, main
from nyala.common.config import from_mapping, parse_value, read_flagfile, tunable_fields
from nyala.errors import InvalidArgumentError
from nyala.tserver.settings import TabletServerSettings


def test_help_lists_every_command_group() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for noun in COMMAND_MODULES:
        assert noun in result.output


def test_unknown_command_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["no-such-noun"])
    assert result.exit_code == 2


def test_every_tunable_setting_is_a_flag() -> None:
    result = CliRunner().invoke(main, ["tserver", "run", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for field in tunable_fields(TabletServerSettings):
        if field.name in ("rpc_bind", "http_bind", "uuid"):
            continue
        assert "--" + field.name.replace("_", "-") in result.output, field.name


def test_a_bad_setting_is_one_line_on_stderr_and_exit_1(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["tserver", "run", "--fs-root", str(tmp_path / "r"), "--heartbeat-interval-ms", "0"],
    )
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "heartbeat_interval_ms must be positive" in lines[0]
    assert not (tmp_path / "r").exists()  # refused before touching the disk


def test_a_malformed_uuid_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["tserver", "run", "--fs-root", str(tmp_path), "--uuid", "not-a-uuid"]
    )
    assert result.exit_code == 1
    assert "InvalidArgumentError" in result.stderr
    assert "not-a-uuid" in result.stderr


def test_a_bad_address_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main, ["tserver", "run", "--fs-root", str(tmp_path), "--rpc-bind", "nohostport"]
    )
    assert result.exit_code == 1
    assert "nohostport" in result.stderr


def test_settings_parse_from_text() -> None:
    settings = from_mapping(
        TabletServerSettings,
        {"fs_root": Path("/x"), "heartbeat_interval_ms": "250", "wal_sync": "off"},
    )
    assert settings.heartbeat_interval_ms == 250
    assert settings.wal_sync is False
    assert settings.election_timeout_ms == 750
    assert settings.rpc_settings().message_bytes_max == 50 * 1024 * 1024


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"heartbeat_interval_ms": "fast"}, "not a valid int"),
        ({"wal_sync": "maybe"}, "not a boolean"),
        ({"no_such_setting": "1"}, "unknown setting"),
        ({"tablet_copy_chunk_bytes": str(40 * 1024 * 1024)}, "room in rpc_message_bytes_max"),
        ({"rpc_client_timeout_ms": "0"}, "timeouts must be positive"),
    ],
)
def test_bad_settings_are_typed_errors(values: dict[str, str], match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        from_mapping(TabletServerSettings, {"fs_root": Path("/x"), **values})


def test_parse_value_accepts_underscores_in_numbers() -> None:
    assert parse_value(int, "8_388_608", name="x") == 8 * 1024 * 1024


def test_flagfile_values_are_settings_and_bad_lines_name_the_line(tmp_path: Path) -> None:
    flagfile = tmp_path / "tserver.flags"
    flagfile.write_text("# tuned for tests\n--heartbeat-interval-ms = 50\nwal_sync=false\n")
    values = read_flagfile(flagfile)
    settings = from_mapping(TabletServerSettings, {"fs_root": tmp_path, **values})
    assert settings.heartbeat_interval_ms == 50
    assert settings.wal_sync is False
    flagfile.write_text("heartbeat_interval_ms = 50\nthis line is wrong\n")
    with pytest.raises(InvalidArgumentError, match=r"tserver.flags:2"):
        read_flagfile(flagfile)


def test_a_bad_flagfile_value_stops_the_server_before_it_touches_the_disk(tmp_path: Path) -> None:
    flagfile = tmp_path / "f"
    flagfile.write_text("scanner_ttl_ms = soon\n")
    root = tmp_path / "root"
    result = CliRunner().invoke(
        main, ["tserver", "run", "--fs-root", str(root), "--flagfile", str(flagfile)]
    )
    assert result.exit_code == 1
    assert "scanner_ttl_ms" in result.stderr
    assert not root.exists()
