"""free_loopback_ports: the OS's choice by default, a range of the caller's when one is named."""

from __future__ import annotations

import errno
import socket

import pytest

from nyala.rpc.ports import PORT_RANGE_ENV, free_loopback_ports, port_range_from_env


def free_block(size: int) -> int:
    """The first port of ``size`` consecutive ports free now (searched below 32768)."""
    for lo in range(29000, 32768 - size, size):
        socks = []
        try:
            for port in range(lo, lo + size):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return lo
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    pytest.skip("no block of free ports below 32768")


def test_ports_come_from_the_named_range_and_are_distinct(monkeypatch: pytest.MonkeyPatch) -> None:
    lo = free_block(8)
    monkeypatch.setenv(PORT_RANGE_ENV, f"{lo}-{lo + 8}")
    ports = free_loopback_ports(8)
    assert sorted(ports) == list(range(lo, lo + 8))


def test_a_port_in_use_is_skipped_and_too_few_free_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lo = free_block(3)
    monkeypatch.setenv(PORT_RANGE_ENV, f"{lo}-{lo + 3}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", lo + 1))
        taken.listen()
        assert sorted(free_loopback_ports(2)) == [lo, lo + 2]
        with pytest.raises(OSError, match="fewer than 3 free ports") as raised:
            free_loopback_ports(3)
        assert raised.value.errno == errno.EADDRINUSE


def test_without_a_range_the_os_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PORT_RANGE_ENV, raising=False)
    assert port_range_from_env() is None
    ports = free_loopback_ports(4)
    assert len(set(ports)) == 4


@pytest.mark.parametrize("text", ["20000", "x-y", "30000-20000", "0-10", "1-70000"])
def test_a_malformed_range_is_refused(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, text)
    with pytest.raises(ValueError, match=PORT_RANGE_ENV):
        free_loopback_ports(1)


def test_the_test_processes_ports_are_below_the_ephemeral_range() -> None:
    """tests/conftest.py names a range for every test process (each xdist worker its own)."""
    span = port_range_from_env()
    assert span is not None
    lo, hi = span
    assert 1024 <= lo < hi <= 32768


def test_zero_ports_is_an_empty_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PORT_RANGE_ENV, "30000-30001")
    assert free_loopback_ports(0) == []
    monkeypatch.delenv(PORT_RANGE_ENV)
    assert free_loopback_ports(0) == []


def test_ports_handed_out_earlier_can_be_avoided(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller that chose ports for servers not yet started (the chaos cluster's peer
    channels) keeps later choices off them: without ``avoid`` a free port is offered again."""
    lo = free_block(4)
    monkeypatch.setenv(PORT_RANGE_ENV, f"{lo}-{lo + 4}")
    first = free_loopback_ports(2)
    assert sorted(free_loopback_ports(4)) == list(range(lo, lo + 4))
    assert sorted(free_loopback_ports(2, avoid=first)) == sorted(set(range(lo, lo + 4)) - {*first})
    with pytest.raises(OSError, match="fewer than 3 free ports"):
        free_loopback_ports(3, avoid=first)

    monkeypatch.delenv(PORT_RANGE_ENV)
    first = free_loopback_ports(20)
    again = free_loopback_ports(20, avoid=first)
    assert len(set(again)) == 20
    assert not set(again) & set(first)
