"""``ServerSilence``: which peer servers went silent, and a stalled event loop excused."""

from __future__ import annotations

from nyala.consensus.liveness import ServerSilence


def test_a_peer_not_heard_for_the_timeout_goes_silent_once() -> None:
    silence = ServerSilence(1_000)
    silence.watch(["a", "b"], now_ms=0)
    silence.heard("a", 800)
    assert silence.newly_silent(1_000) == []
    assert silence.newly_silent(1_001) == ["b"]
    assert silence.newly_silent(1_500) == []  # reported once
    assert silence.newly_silent(1_801) == ["a"]
    silence.heard("b", 2_000)
    assert silence.newly_silent(3_001) == ["b"]


def test_a_stall_of_the_own_loop_is_not_the_peers_silence() -> None:
    # The loop last checked at 300 and woke at 1,600: the peers' heartbeats of that stretch
    # still wait to be handled, so 1,300 ms of the gap are excused.
    silence = ServerSilence(1_000)
    silence.watch(["a"], now_ms=0)
    silence.heard("a", 200)
    silence.excuse(1_300)
    assert silence.newly_silent(1_600) == []
    assert silence.newly_silent(2_500) == []
    assert silence.newly_silent(2_501) == ["a"]  # silent for 1,000 ms of running loop


def test_no_stall_excuses_nothing() -> None:
    silence = ServerSilence(1_000)
    silence.watch(["a"], now_ms=0)
    silence.excuse(0)
    silence.excuse(-20)  # woken early
    assert silence.newly_silent(1_001) == ["a"]
