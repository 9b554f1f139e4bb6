"""The client's write pipe over a real in-process gRPC server: concurrent writes coalesce into
one call, each write gets its own answer or error, and a failed call fails only its writes."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nyala import _native, errors
from nyala._proto import common_pb2, tserver_pb2, tserver_pb2_grpc
from nyala.client.rpc import ChannelPool
from nyala.client.write_pipe import WritePipe, _Pending, _request_parts
from nyala.testing.garbage import collector_off

UUID = "0123456789abcdef0123456789abcdef"
LEADER = "f" * 32


class _Server(tserver_pb2_grpc.TabletServiceServicer):  # type: ignore[misc]
    """Answers each write by its tablet id: ``ok*`` and ``held*`` succeed (op index = seq
    no), ``follower*`` are NOT_THE_LEADER, and a call holding ``crash*`` fails as a whole.
    Calls wait while ``gate`` is closed, and a call holding ``held*`` while ``hold`` is."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.hold = threading.Event()
        self.hold.set()
        self.calls: list[list[str]] = []  # tablet ids of each call, in arrival order
        self.entered = threading.Semaphore(0)
        self.rows: list[tuple[str, bytes]] = []  # (tablet id, ops) of every write received

    def _answer(self, request: Any) -> Any:
        if request.tablet_id.startswith("follower"):
            return tserver_pb2.WriteResponsePB(
                error=common_pb2.ErrorPB(
                    code=common_pb2.NOT_THE_LEADER, message="follower", leader_uuid=LEADER
                )
            )
        response = tserver_pb2.WriteResponsePB()
        response.op_id.index = request.request_id.seq_no
        return response

    def _serve(self, requests: list[Any], context: Any) -> None:
        self.calls.append([r.tablet_id for r in requests])
        self.rows += [(r.tablet_id, r.ops) for r in requests]
        self.entered.release()
        self.gate.wait()
        if any(r.tablet_id.startswith("held") for r in requests):
            self.hold.wait()
        if any(r.tablet_id.startswith("crash") for r in requests):
            context.abort(grpc.StatusCode.UNAVAILABLE, "crashed")

    def Write(self, request: Any, context: Any) -> Any:
        self._serve([request], context)
        return self._answer(request)

    def WriteMulti(self, request: Any, context: Any) -> Any:
        self._serve(list(request.requests), context)
        return tserver_pb2.WriteMultiResponsePB(
            responses=[self._answer(r) for r in request.requests]
        )


@pytest.fixture
def server() -> Iterator[tuple[_Server, str]]:
    servicer = _Server()
    grpc_server = grpc.server(ThreadPoolExecutor(8))
    tserver_pb2_grpc.add_TabletServiceServicer_to_server(servicer, grpc_server)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        servicer.gate.set()
        servicer.hold.set()
        grpc_server.stop(0)


@pytest.fixture
def pool() -> Iterator[ChannelPool]:
    channels = ChannelPool()
    try:
        yield channels
    finally:
        channels.close()


def _rows_of(tablet: str, seq_no: int) -> tuple[str, bytes]:
    """(tablet id, rows) as the server receives ``_request(tablet, seq_no)``."""
    return tablet, _request(tablet, seq_no)[1]


def _request(tablet: str, seq_no: int) -> tuple[Any, bytes]:
    """A write's request (without rows) and its 100 bytes of rows."""
    request = tserver_pb2.WriteRequestPB(
        dest_uuid=UUID,
        tablet_id=tablet,
        request_id=common_pb2.RequestIdPB(client_id="c", seq_no=seq_no),
    )
    return request, tablet.encode() * (100 // len(tablet)) + b"x" * (100 % len(tablet))


class _Writers:
    """Writes issued each from its own thread; ``join`` returns each answer or exception."""

    def __init__(self, pipe: WritePipe, requests: list[tuple[Any, bytes]]) -> None:
        self.results: list[Any] = [None] * len(requests)
        self.threads = [
            threading.Thread(target=self._one, args=(pipe, i, r)) for i, r in enumerate(requests)
        ]
        for t in self.threads:
            t.start()

    def _one(self, pipe: WritePipe, i: int, request: tuple[Any, bytes]) -> None:
        try:
            self.results[i] = pipe.write(request[0], request[1], 10_000)
        except Exception as exc:
            self.results[i] = exc

    def join(self) -> list[Any]:
        for t in self.threads:
            t.join(timeout=20)
            assert not t.is_alive()
        return self.results


def _hold_first_call(servicer: _Server, pipe: WritePipe, first: tuple[Any, bytes]) -> _Writers:
    """Starts ``first`` with the server's gate closed and waits until its call arrived."""
    servicer.gate.clear()
    started = _Writers(pipe, [first])
    assert servicer.entered.acquire(timeout=10)
    return started


def _wait_queued(pipe: WritePipe, count: int) -> None:
    deadline = time.monotonic() + 10
    while len(pipe._queue) < count:
        assert time.monotonic() < deadline, "writers did not queue"
        time.sleep(0.001)


def test_an_idle_pipe_sends_a_write_at_once_and_alone(
    server: tuple[_Server, str], pool: ChannelPool
) -> None:
    servicer, addr = server
    pipe = WritePipe(pool.get(addr))
    for seq in range(3):
        assert pipe.write(*_request("ok", seq), 5_000).op_id.index == seq
    assert servicer.calls == [["ok"], ["ok"], ["ok"]]
    assert (pipe.calls_sent, pipe.writes_sent) == (3, 3)


def test_rows_reach_the_server_intact_alone_and_in_a_shared_call(
    server: tuple[_Server, str], pool: ChannelPool
) -> None:
    servicer, addr = server
    pipe = WritePipe(pool.get(addr), inflight_calls_max=1)
    big = bytes(range(256)) * 1200  # 307200 bytes: a three-byte length
    big_request = _request("ok-big", 7)[0]
    assert pipe.write(big_request, big, 5_000).op_id.index == 7
    first = _hold_first_call(servicer, pipe, _request("ok-first", 100))
    empty_request = _request("ok-empty", 2)[0]
    later = _Writers(pipe, [(big_request, big), _request("ok-small", 1), (empty_request, b"")])
    _wait_queued(pipe, 3)
    servicer.gate.set()
    first.join()
    assert [a.op_id.index for a in later.join()] == [7, 1, 2]
    assert [len(c) for c in servicer.calls] == [1, 1, 3]  # alone, alone, then shared
    assert servicer.rows[:2] == [("ok-big", big), _rows_of("ok-first", 100)]
    assert sorted(servicer.rows[2:]) == sorted(
        [("ok-big", big), _rows_of("ok-small", 1), ("ok-empty", b"")]
    )


def test_a_request_that_carries_its_rows_itself_is_refused(
    server: tuple[_Server, str], pool: ChannelPool
) -> None:
    _, addr = server
    request, rows = _request("ok", 1)
    request.ops = rows
    with pytest.raises(errors.InvalidArgumentError, match="ops"):
        WritePipe(pool.get(addr)).write(request, rows, 5_000)


def test_writes_issued_while_a_call_is_in_flight_share_the_next_call(
    server: tuple[_Server, str], pool: ChannelPool
) -> None:
    servicer, addr = server
    pipe = WritePipe(pool.get(addr), inflight_calls_max=1)
    first = _hold_first_call(servicer, pipe, _request("ok-first", 100))
    later = _Writers(pipe, [_request(f"ok-{i}", i) for i in range(20)])
    _wait_queued(pipe, 20)
    servicer.gate.set()
    assert first.join()[0].op_id.index == 100
    answers = later.join()
    # Every writer got its own answer (op index = its own seq no).
    assert [a.op_id.index for a in answers] == list(range(20))
    assert len(servicer.calls) == 2
    assert sorted(servicer.calls[1]) == sorted(f"ok-{i}" for i in range(20))
    assert (pipe.calls_sent, pipe.writes_sent) == (2, 21)


def test_a_call_carries_at_most_its_request_and_byte_limits(
    server: tuple[_Server, str], pool: ChannelPool
) -> None:
    servicer, addr = server
    pipe = WritePipe(pool.get(addr), inflight_calls_max=1, call_requests_max=8)
    first = _hold_first_call(servicer, pipe, _request("ok-first", 100))
    later = _Writers(pipe, [_request(f"ok-{i}", i) for i in range(20)])
    _wait_queued(pipe, 20)
    servicer.gate.set()
    first.join()
    assert [a.op_id.index for a in later.join()] == list(range(20))
    assert [len(c) for c in servicer.calls] == [1, 8, 8, 4]

    servicer.calls.clear()
    small = WritePipe(pool.get(addr), inflight_calls_max=1, call_bytes_max=250)
    first = _hold_first_call(servicer, small, _request("ok-first", 100))
    later = _Writers(small, [_request(f"ok-{i}", i) for i in range(5)])
    _wait_queued(small, 5)
    servicer.gate.set()
    first.join()
    later.join()
    assert [len(c) for c in servicer.calls] == [1, 2, 2, 1]  # 100-byte writes, 250 per call


def test_a_sub_request_error_reaches_only_its_own_writer(
    server: tuple[_Server, str], pool: ChannelPool
) -> None:
    servicer, addr = server
    pipe = WritePipe(pool.get(addr), inflight_calls_max=1)
    first = _hold_first_call(servicer, pipe, _request("ok-first", 100))
    tablets = ["ok-a", "follower-b", "ok-c", "follower-d"]
    later = _Writers(pipe, [_request(t, i) for i, t in enumerate(tablets)])
    _wait_queued(pipe, 4)
    servicer.gate.set()
    first.join()
    answers = later.join()
    assert [len(c) for c in servicer.calls] == [1, 4]  # the four shared one call
    assert (answers[0].op_id.index, answers[2].op_id.index) == (0, 2)
    for failed in (answers[1], answers[3]):
        assert isinstance(failed, errors.NotLeaderError)
        assert failed.leader_uuid == LEADER


def test_a_failed_call_fails_only_the_writes_it_carried(
    server: tuple[_Server, str], pool: ChannelPool
) -> None:
    servicer, addr = server
    pipe = WritePipe(pool.get(addr), inflight_calls_max=1, call_requests_max=2)
    first = _hold_first_call(servicer, pipe, _request("ok-first", 100))
    # Queued in this order, cut into calls of two: [crash, ok-1], [ok-2, ok-3].
    writers = []
    for i, tablet in enumerate(["crash-0", "ok-1", "ok-2", "ok-3"]):
        writers.append(_Writers(pipe, [_request(tablet, i)]))
        _wait_queued(pipe, i + 1)
    servicer.gate.set()
    first.join()
    crashed, ok_1, ok_2, ok_3 = (w.join()[0] for w in writers)
    assert [sorted(c) for c in servicer.calls[1:]] == [["crash-0", "ok-1"], ["ok-2", "ok-3"]]
    assert isinstance(crashed, errors.NetworkError)
    assert isinstance(ok_1, errors.NetworkError)  # it shared the failed call
    assert (ok_2.op_id.index, ok_3.op_id.index) == (2, 3)
    # The failed writes can simply be sent again (same request ids) and now go through.
    assert pipe.write(*_request("ok-1", 1), 5_000).op_id.index == 1


def test_a_failed_write_leaves_no_cycle_that_holds_its_rows(
    server: tuple[_Server, str], pool: ChannelPool
) -> None:
    """A write's error is raised from the writer's frame, so that frame must not lead back to
    the error: the cycle would keep the write's rows alive until the cyclic collector runs (a
    client retrying bulk writes refused over a server's memory limit held each one so)."""
    _, addr = server
    pipe = WritePipe(pool.get(addr))
    with collector_off() as left:
        for tablet in ("follower-a", "crash-b"):  # answered with an error; the call failed
            try:
                pipe.write(*_request(tablet, 1), 5_000)
            except errors.NyalaError:
                pass
            else:
                pytest.fail(f"a write to {tablet} succeeded")
        kept = left((_Pending, errors.NyalaError))
        assert kept == [], kept[:5]


def test_a_write_not_answered_in_time_times_out_and_a_queued_one_is_never_sent(
    server: tuple[_Server, str], pool: ChannelPool
) -> None:
    servicer, addr = server
    pipe = WritePipe(pool.get(addr), inflight_calls_max=1)
    servicer.gate.clear()
    with pytest.raises(errors.TimedOutError):
        pipe.write(*_request("ok-slow", 1), 200)  # sent; the server holds it past its deadline
    assert servicer.entered.acquire(timeout=10)
    held = _hold_first_call(servicer, pipe, _request("ok-held", 2))
    with pytest.raises(errors.TimedOutError, match="outcome is unknown"):
        pipe.write(*_request("ok-queued", 3), 200)  # queued behind the held call
    servicer.gate.set()
    assert held.join()[0].op_id.index == 2
    assert pipe.write(*_request("ok-after", 4), 5_000).op_id.index == 4
    assert all("ok-queued" not in c for c in servicer.calls)


def test_a_shared_call_is_made_by_its_latest_deadline_and_no_writer_waits_past_its_own(
    server: tuple[_Server, str], pool: ChannelPool
) -> None:
    servicer, addr = server
    pipe = WritePipe(pool.get(addr), inflight_calls_max=1)
    first = _hold_first_call(servicer, pipe, _request("ok-first", 100))
    servicer.hold.clear()
    outcomes: dict[str, tuple[Any, float]] = {}

    def write(tablet: str, seq_no: int, timeout_ms: int) -> None:
        start = time.monotonic()
        try:
            answer: Any = pipe.write(*_request(tablet, seq_no), timeout_ms)
        except Exception as exc:
            answer = exc
        outcomes[tablet] = (answer, time.monotonic() - start)

    # Queued first, with the earlier deadline: it used to make the shared call, and wait for
    # it until the other write's deadline.
    short = threading.Thread(target=write, args=("held-short", 1, 1_500))
    short.start()
    _wait_queued(pipe, 1)
    long = threading.Thread(target=write, args=("held-long", 2, 20_000))
    long.start()
    _wait_queued(pipe, 2)
    servicer.gate.set()  # the first call is answered; the shared one is held
    first.join()
    short.join(timeout=10)
    assert not short.is_alive(), "the earlier deadline waited for the held call"
    answer, took_s = outcomes["held-short"]
    assert isinstance(answer, errors.TimedOutError)
    assert took_s < 5
    servicer.hold.set()
    long.join(timeout=20)
    assert outcomes["held-long"][0].op_id.index == 2
    assert sorted(servicer.calls[1]) == ["held-long", "held-short"]  # it had been sent


def test_a_writers_wake_up_behaves_as_an_event() -> None:
    wake = _native.Wake()
    began = time.monotonic()
    assert not wake.wait(0.05)  # not set: waits out its timeout
    assert time.monotonic() - began >= 0.04
    wake.set()
    wake.set()  # twice is harmless
    assert wake.wait(0)
    assert wake.wait(0)  # stays set until cleared
    wake.clear()
    wake.clear()
    assert not wake.wait(0.01)
    woken: list[bool] = []
    waiter = threading.Thread(target=lambda: woken.append(wake.wait(10)))
    waiter.start()
    time.sleep(0.05)
    wake.set()  # from another thread, while it waits
    waiter.join(10)
    assert woken == [True]


def test_a_wait_wakes_its_relay_first_and_checks_its_timeout() -> None:
    wake, relay = _native.Wake(), _native.Wake()
    assert not wake.wait(0.01, relay)  # nobody sets it: the timeout
    assert relay.is_set()  # set before this thread slept
    assert relay.wait(0)
    wake.set()
    other = _native.Wake()
    assert wake.wait(0, other)  # set already: still wakes the relay
    assert other.is_set()
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="a wait of"):
            wake.wait(bad)
    wake.clear()
    threading.Timer(0.2, wake.set).start()
    assert wake.wait(1e300)  # too far to represent: as good as never, until set


class _Interrupted(Exception):
    pass


def test_a_wait_is_interrupted_by_a_signal() -> None:
    """A writer waiting in the pipe can be stopped with Ctrl-C: the wait checks signals."""

    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        began = time.monotonic()
        with pytest.raises(_Interrupted):
            _native.Wake().wait(30)
        assert time.monotonic() - began < 5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_writers_that_each_write_once_are_all_answered_at_once(
    server: tuple[_Server, str], pool: ChannelPool
) -> None:
    """Answered writers are woken one at a time, each by the one before it (module doc).
    Writers that return for good must still wake the rest: none waits out its deadline
    (10 s)."""
    servicer, addr = server
    pipe = WritePipe(pool.get(addr), inflight_calls_max=1)
    first = _hold_first_call(servicer, pipe, _request("ok-first", 1))
    later = _Writers(pipe, [_request(f"ok-{i}", 10 + i) for i in range(20)])
    _wait_queued(pipe, 20)
    began = time.monotonic()
    servicer.gate.set()
    assert first.join()[0].op_id.index == 1
    assert [a.op_id.index for a in later.join()] == [10 + i for i in range(20)]
    assert time.monotonic() - began < 5
    assert [len(c) for c in servicer.calls] == [1, 20]
    assert not pipe._asleep


def test_writers_in_a_loop_that_stop_are_all_answered(
    server: tuple[_Server, str], pool: ChannelPool
) -> None:
    """Writers writing back to back (each expected back, so it leaves the relay to its next
    wait) that then stop: the last ones' answers still reach them well before their
    deadline (10 s)."""
    _, addr = server
    pipe = WritePipe(pool.get(addr), inflight_calls_max=1)
    took: list[float] = []
    lock = threading.Lock()

    def loop(base: int) -> None:
        for k in range(30):
            began = time.monotonic()
            assert pipe.write(*_request(f"ok-{base}", base + k), 10_000).op_id.index == base + k
            with lock:
                took.append(time.monotonic() - began)

    threads = [threading.Thread(target=loop, args=(1000 * t,)) for t in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(took) == 12 * 30
    assert max(took) < 5
    assert pipe.writes_sent == 12 * 30
    assert pipe.calls_sent < 12 * 30  # they shared calls
    assert not pipe._asleep


@settings(max_examples=100, deadline=None)
@given(
    names=st.tuples(st.text(max_size=40), st.text(max_size=40), st.text(max_size=40)),
    seq=st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1)),
    small=st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
    authz_token=st.binary(max_size=300),
    timestamp=st.integers(0, 2**64 - 1),
    ops=st.binary(max_size=200),
)
def test_a_native_write_request_head_is_the_message_protobuf_builds(
    names: tuple[str, str, str],
    seq: tuple[int, int],
    small: tuple[int, int],
    authz_token: bytes,
    timestamp: int,
    ops: bytes,
) -> None:
    """``_native.write_request_head`` (what the client sends, its rows appended as ``ops``)
    is, for any field values, the ``WriteRequestPB`` protobuf serializes from the same
    fields."""
    dest_uuid, tablet_id, client_id = names
    seq_no, first_incomplete = seq
    attempt_no, schema_version = small
    expected = tserver_pb2.WriteRequestPB(
        dest_uuid=dest_uuid,
        tablet_id=tablet_id,
        request_id=common_pb2.RequestIdPB(
            client_id=client_id,
            seq_no=seq_no,
            first_incomplete_seq_no=first_incomplete,
            attempt_no=attempt_no,
        ),
        schema_version=schema_version,
        authz_token=authz_token,
        propagated_timestamp=timestamp,
    )
    head = _native.write_request_head(
        dest_uuid,
        tablet_id,
        client_id,
        seq_no,
        first_incomplete,
        attempt_no,
        schema_version,
        authz_token,
        timestamp,
    )
    assert head == expected.SerializeToString()
    sent = b"".join(_request_parts(_Pending(dest_uuid, head, ops, 0.0)))
    expected.ops = ops
    assert tserver_pb2.WriteRequestPB.FromString(sent) == expected
