"""The serving process: ``translate-serve``'s flags, the stop sequence on a real SIGTERM, and
connection limits under an open-file limit.

Each test runs the server as a child process, the way an operator or an orchestrator does. The
stop-sequence and connection tests use ``FakeEngine`` (tests/test_scheduler.py), whose decoding
takes a known time, so that a request is surely running when the signal arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import uvloop
from prometheus_client.parser import text_string_to_metric_families

from service.connections import EVICT_IDLE_S, close_listeners
from service.settings import settings_from_args
from tests.test_api import fake_models, free_port

ROOT = Path(__file__).resolve().parent.parent

# The real entry point with FakeEngine bundles: argv[1] is the seconds one decoder step takes.
FAKE_SERVE = (
    "import sys; from service.main import serve; from service.settings import settings_from_args;"
    " from tests.test_api import fake_factory;"
    " serve(settings_from_args(sys.argv[2:]), fake_factory(step_s=float(sys.argv[1])))"
)


class ServerProcess:
    """A server child process on a free port, its stderr collected."""

    def __init__(self, command: Sequence[str], env: dict[str, str] | None = None,
                 open_files: int | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"

        def limit_open_files() -> None:
            if open_files is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

        self.process = subprocess.Popen(
            [*command, "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=ROOT,
            env={**os.environ, "LOG_LEVEL": "warning", **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=limit_open_files,
        )
        self.log: list[str] = []
        self.reader = threading.Thread(target=self._read_log, daemon=True)
        self.reader.start()

    def _read_log(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.log.append(line)

    def wait_for(self, path: str, timeout: float = 60) -> None:
        stop = time.monotonic() + timeout
        while time.monotonic() < stop:
            assert self.process.poll() is None, "".join(self.log)
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.url + path, timeout=2).status_code == 200:
                    return
            time.sleep(0.05)
        raise AssertionError(f"{path} never answered 200:\n{''.join(self.log)}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        finally:
            self.reader.join(5)


@contextlib.contextmanager
def tiny_server(tiny_bundle: Path, env: dict[str, str] | None = None,
                ) -> Iterator[ServerProcess]:
    """``translate-serve`` on the real tiny bundle, one worker of one thread, ready."""
    server = ServerProcess([sys.executable, "-m", "service.main", "--model-dir",
                            str(tiny_bundle), "--threads", "1", "--workers", "1"], env=env)
    try:
        server.wait_for("/ready")
        yield server
    finally:
        assert server.stop() in (0, -signal.SIGTERM), "".join(server.log)


@contextlib.contextmanager
def fake_server(tmp_path: Path, *flags: str, step_s: float = 0.01,
                open_files: int | None = None, pairs: Sequence[str] = ("en-de",),
                env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    models = fake_models(tmp_path / "models", *pairs)
    command = [sys.executable, "-c", FAKE_SERVE, str(step_s), "--model-dir", str(models), *flags]
    server = ServerProcess(command, env=env, open_files=open_files)
    try:
        server.wait_for("/ready")
        yield server
    finally:
        server.process.kill()
        server.process.wait(10)


def served_samples(server: ServerProcess, name: str) -> dict[str, float]:
    """The samples of one metric the server's /metrics serves, by their one label's value."""
    text = httpx.get(server.url + "/metrics").text
    return {
        next(iter(sample.labels.values()), ""): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


# -- translate-serve's flags ----------------------------------------------------------------------


# The entry point with FakeEngine bundles whose every step fails once the file argv[1] exists.
BREAKING_SERVE = (
    "import sys; from pathlib import Path; from service.main import serve;"
    " from service.settings import settings_from_args; from tests.test_api import fake_factory;"
    " from tests.faults import Faults, FaultyEngine; faults = Faults();"
    " faults.broken_when = Path(sys.argv[1]); fake = fake_factory(step_s=0.002);"
    " serve(settings_from_args(sys.argv[2:]), lambda d, s: FaultyEngine(fake(d, s), faults))"
)


def test_workers_failing_beyond_repair_make_the_process_exit(tmp_path: Path) -> None:
    """Under compose only an exit lets the restart policy act: a service whose engine fails
    every step for ENGINE_FAILURE_S (retried with back-off meanwhile, then given up) exits
    with status 3 instead of living on answering 503."""
    models = fake_models(tmp_path / "models", "en-de")
    trigger = tmp_path / "broken"
    server = ServerProcess([sys.executable, "-c", BREAKING_SERVE, str(trigger), "--model-dir",
                            str(models), "--workers", "1", "--engine-failure-s", "1"])
    try:
        server.wait_for("/ready")
        assert httpx.post(server.url + "/translate", json={"text": "fine"}).status_code == 200
        trigger.touch()
        stop = time.monotonic() + 60
        for i in itertools.count():  # each waits out the fault, then is refused
            if server.process.poll() is not None or time.monotonic() > stop:
                break
            with contextlib.suppress(httpx.TransportError):
                response = httpx.post(server.url + "/translate", json={"text": f"q{i}"},
                                      timeout=5)
                assert response.status_code in (500, 503), response.text
            time.sleep(0.05)
        assert server.process.wait(30) == 3, "".join(server.log)
        assert "exiting so the service restarts" in "".join(server.log)
    finally:
        server.process.kill()
        server.process.wait(10)


def test_a_model_that_fails_to_load_makes_the_process_exit(tmp_path: Path) -> None:
    """A bundle that cannot be loaded: the process says why and exits with status 3, so that
    compose's restart policy (or Kubernetes') acts rather than a process living on
    answering 503."""
    broken = tmp_path / "models" / "en-de"
    broken.mkdir(parents=True)
    (broken / "manifest.json").write_text("{not json")
    server = ServerProcess([sys.executable, "-m", "service.main", "--model-dir",
                            str(broken.parent)])
    try:
        assert server.process.wait(60) == 3, "".join(server.log)
        server.reader.join(5)
        log = "".join(server.log)
        assert "loading the models failed; exiting so the service restarts" in log
        assert "manifest.json" in log  # the cause, named
    finally:
        server.process.kill()
        server.process.wait(10)


def test_help_prints_the_flags_and_starts_no_server() -> None:
    done = subprocess.run([sys.executable, "-m", "service.main", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: translate-serve")
    for flag in ("--host", "--port", "--model-dir", "--workers", "--max-queue",
                 "--shutdown-delay-s", "--max-connections", "--no-batching"):
        assert flag in done.stdout
    assert "[env: PORT]" in done.stdout  # the variable each flag overrides
    assert "--api-keys" not in done.stdout  # secrets stay off command lines
    assert "Uvicorn running" not in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prot", "9000"], "unrecognized arguments: --prot 9000"),
        (["9000"], "unrecognized arguments: 9000"),
        (["--api-keys", "secret"], "unrecognized arguments: --api-keys secret"),
        (["--port", "nine"], "--port / PORT: Input should be a valid integer"),
        (["--port", "70000"], "--port / PORT: Input should be less than or equal to 65535"),
        (["--device", "tpu"], "--device / DEVICE: Input should be 'auto', 'cpu' or 'cuda'"),
        (["--port", "9000", "--probe-port", "9000"], "PROBE_PORT must differ from PORT"),
    ],
)
def test_bad_arguments_are_refused(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        settings_from_args(args)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_flags_override_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PORT", "7000")
    monkeypatch.setenv("MAX_QUEUE", "7")
    monkeypatch.setenv("BATCHING", "true")
    settings = settings_from_args(["--port", "9000", "--no-batching", "--cors-origins", "a,b"])
    assert (settings.port, settings.batching, settings.cors_origins) == (9000, False, ["a", "b"])
    assert settings.max_queue == 7  # no flag: the environment's value
    assert settings_from_args([]).port == 7000


def test_the_port_flag_is_where_the_server_answers(tiny_bundle: Path) -> None:
    decoy = free_port()  # the environment names another port; the flag wins
    server = ServerProcess([sys.executable, "-m", "service.main", "--model-dir", str(tiny_bundle),
                            "--threads", "1"], env={"PORT": str(decoy)})
    try:
        server.wait_for("/health")
        assert httpx.get(server.url + "/health").json() == {"status": "ok"}
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{decoy}/health")
    finally:
        assert server.stop() in (0, -signal.SIGTERM), "".join(server.log)


# -- the stop sequence, on a real SIGTERM --------------------------------------------------------


def test_sigterm_turns_ready_503_serves_through_the_delay_then_drains(tmp_path: Path) -> None:
    delay = 3
    with fake_server(tmp_path, "--shutdown-delay-s", str(delay), "--shutdown-grace-s", "10",
                     step_s=0.08) as server, ThreadPoolExecutor(2) as pool:
        long_text = words(100)  # two pieces of 63 and 37 words side by side: 5 s, past the delay

        def post_and_time() -> tuple[httpx.Response, float]:
            response = httpx.post(server.url + "/translate", json={"text": long_text}, timeout=30)
            return response, time.monotonic()

        running = pool.submit(post_and_time)
        time.sleep(0.3)  # the request is decoding
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)

        ready = httpx.get(server.url + "/ready")
        while ready.status_code == 200 and time.monotonic() - signalled < 1:
            ready = httpx.get(server.url + "/ready")
        assert time.monotonic() - signalled < 1  # at once, well before the delay ends
        assert ready.status_code == 503
        assert ready.json()["error"]["code"] == "shutting_down"

        # Load balancers have not noticed yet: what they still send is served.
        late = httpx.post(server.url + "/translate", json={"text": "still here"})
        assert late.status_code == 200 and late.json()["translations"][0]["text"] == "STILL HERE"

        while True:  # the listener closes once the delay is over
            try:
                httpx.get(server.url + "/health", timeout=1)
            except httpx.ConnectError:
                break
            time.sleep(0.05)
        closed = time.monotonic()
        assert closed - signalled >= delay

        response, answered = running.result()
        assert answered > closed  # accepted work finishes after the listener has closed
        assert response.status_code == 200
        assert response.json()["translations"][0]["text"] == long_text.upper()
        assert server.stop() in (0, -signal.SIGTERM)
        assert "Traceback" not in "".join(server.log)


def test_requests_running_when_the_grace_period_ends_get_503_json(tmp_path: Path) -> None:
    with fake_server(tmp_path, "--shutdown-delay-s", "0.2", "--shutdown-grace-s", "1",
                     step_s=0.08) as server, ThreadPoolExecutor(1) as pool:
        running = pool.submit(httpx.post, server.url + "/translate",
                              json={"text": words(100)}, timeout=30)  # 5 s of decoding
        time.sleep(0.3)
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        response = running.result()
        answered = time.monotonic() - signalled
        assert response.status_code == 503, response.text
        assert response.headers["content-type"] == "application/json"
        assert response.json()["error"]["code"] == "shutting_down"
        assert response.headers["retry-after"]
        assert 1.1 < answered < 3  # delay + grace, not the 5 s the request needed
        assert server.stop() in (0, -signal.SIGTERM)
        assert server.process.returncode is not None


def test_a_request_still_reading_its_body_at_the_end_gets_503_json(tmp_path: Path) -> None:
    with fake_server(tmp_path, "--shutdown-delay-s", "0.2", "--shutdown-grace-s", "1",
                     "--body-timeout-s", "60") as server, connect(server) as sock:
        sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        time.sleep(0.3)
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        answer = read_until_closed(sock)
        assert 3 < time.monotonic() - signalled < 6  # delay + grace + uvicorn's 2 s backstop
        assert answer.startswith(b"HTTP/1.1 503 ")
        assert b"content-type: application/json" in answer
        assert b'"code":"shutting_down"' in answer
        assert server.stop() in (0, -signal.SIGTERM)


def listener_closed(server: ServerProcess, timeout: float = 10) -> bool:
    """Wait until the server refuses new connections."""
    stop = time.monotonic() + timeout
    while time.monotonic() < stop:
        try:
            socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
        except ConnectionRefusedError:
            return True
        time.sleep(0.02)
    return False


def wait_until_not_ready(server: ServerProcess) -> None:
    stop = time.monotonic() + 5
    while httpx.get(server.url + "/ready").status_code == 200:
        assert time.monotonic() < stop
        time.sleep(0.02)


TRANSLATE = (b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
             b"Content-Length: 15\r\n\r\n{\"text\":\"late\"}")


def test_from_the_stop_signal_responses_close_their_connections(tmp_path: Path) -> None:
    """A client that keeps its connection would send its next request on it just as the server
    closes it at the end of the delay, and get a reset instead of an answer."""
    with fake_server(tmp_path, "--shutdown-delay-s", "5") as server, connect(server) as sock:
        sock.sendall(TRANSLATE)
        before = read_response(sock)
        assert before.startswith(b"HTTP/1.1 200 ") and b"connection: close" not in before
        server.process.send_signal(signal.SIGTERM)
        wait_until_not_ready(server)
        signalled = time.monotonic()
        sock.sendall(TRANSLATE)  # the kept-alive connection, still served during the delay
        answer = read_until_closed(sock)  # the server closes it after the answer
        assert time.monotonic() - signalled < 2  # at once, not when the delay ends
        assert answer.startswith(b"HTTP/1.1 200 "), answer
        assert b"connection: close" in answer.lower()
        assert b'"text":"LATE"' in answer


@pytest.mark.parametrize("kept_alive", [False, True], ids=["new connection", "kept alive"])
def test_a_request_arriving_as_the_listener_closes_is_answered(
    tmp_path: Path, kept_alive: bool
) -> None:
    """A connection opened before the listener closed, or a request whose first bytes came on a
    kept-alive one before then, gets its request answered with the documented 503 rather than
    the connection closed under it."""
    with fake_server(tmp_path, "--shutdown-delay-s", "0.5") as server, connect(server) as sock:
        begun = 0
        if kept_alive:
            sock.sendall(TRANSLATE)
            assert read_response(sock).startswith(b"HTTP/1.1 200 ")
            begun = 30
            sock.sendall(TRANSLATE[:begun])  # the next request begins
        server.process.send_signal(signal.SIGTERM)
        assert listener_closed(server)
        sock.sendall(TRANSLATE[begun:])
        answer = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert b"connection: close" in answer.lower()
        assert b'"code":"shutting_down"' in answer
        assert server.stop() in (0, -signal.SIGTERM)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])  # uvicorn runs on uvloop when installed
def test_connections_the_kernel_completed_are_served_as_the_listener_closes(loop: str) -> None:
    """The kernel completes a connection before the event loop accepts it; closing the listener
    then would reset it under the request its client has sent."""

    class Echo(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.transport.write(b"answer to " + data)  # type: ignore[attr-defined]
            self.transport.close()

    async def main() -> tuple[list[bytes], bool]:
        server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        # Connected by the kernel, their requests sent, while the loop has had no turn yet.
        clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
        for number, client in enumerate(clients):
            client.sendall(b"request %d" % number)
        await close_listeners([server], Echo)
        await asyncio.sleep(0.1)  # served by the loop
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            refused = False
        except ConnectionRefusedError:
            refused = True
        answers = []
        for client in clients:
            with client:
                answers.append(read_until_closed(client))
        return answers, refused

    answers, refused = asyncio.run(main()) if loop == "asyncio" else uvloop.run(main())
    assert answers == [b"answer to request %d" % number for number in range(3)]
    assert refused  # the listener is closed


# -- connections ---------------------------------------------------------------------------------

OPEN_FILES = 256  # the server's RLIMIT_NOFILE: more connections than this are opened below


@pytest.fixture(scope="module")
def guarded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with fake_server(tmp_path_factory.mktemp("guarded"), "--header-timeout-s", "2",
                     "--body-timeout-s", "2", "--keep-alive-s", "1",
                     open_files=OPEN_FILES) as server:
        yield server


def connect(server: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def read_until_closed(sock: socket.socket) -> bytes:
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def read_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length, leaving the connection open."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_the_cap_is_fitted_to_the_open_file_limit(guarded_server: ServerProcess) -> None:
    log = "".join(guarded_server.log)
    assert f"MAX_CONNECTIONS 4096 lowered to {OPEN_FILES - 64}" in log


def test_slow_headers_get_408_and_are_closed(guarded_server: ServerProcess) -> None:
    with connect(guarded_server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # never finished
        started = time.monotonic()
        answer = read_until_closed(sock)
    assert 1.9 < time.monotonic() - started < 4
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b'"code":"header_timeout"' in answer


def test_a_slow_body_gets_408_and_is_closed(guarded_server: ServerProcess) -> None:
    with connect(guarded_server) as sock:
        sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"text\": ")
        started = time.monotonic()
        answer = read_until_closed(sock)
    assert 1.9 < time.monotonic() - started < 4
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert b'"code":"body_timeout"' in answer


def test_an_idle_kept_alive_connection_is_closed(guarded_server: ServerProcess) -> None:
    with connect(guarded_server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = read_response(sock)
        assert answer.startswith(b"HTTP/1.1 200 ")
        assert b"connection: close" not in answer.lower()  # kept alive...
        started = time.monotonic()
        assert read_until_closed(sock) == b""  # ...until idle for KEEP_ALIVE_S
    assert 0.9 < time.monotonic() - started < 3


def test_at_the_cap_with_every_connection_busy_a_newcomer_gets_503(tmp_path: Path) -> None:
    with fake_server(tmp_path, "--max-connections", "2") as server:
        busy = [connect(server) for _ in range(2)]
        for sock in busy:  # headers sent, the body still to come: a running request
            sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\n")
        time.sleep(0.2)
        with connect(server) as sock:
            answer = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 503 ")
        assert b"retry-after: 1" in answer.lower()
        assert b'"code":"too_many_connections"' in answer
        for sock in busy:  # the running requests are unharmed
            sock.sendall(b'{"text": "a b c"}   ')
            answer = read_response(sock)
            assert answer.startswith(b"HTTP/1.1 200 ") and b'"text":"A B C"' in answer
            sock.close()
        time.sleep(0.2)
        assert httpx.get(server.url + "/health").status_code == 200  # room again
        closed = served_samples(server, "translate_http_connections_closed_total")
        assert closed == {"refused": 1, "evicted": 0, "header_timeout": 0}


def test_the_probe_port_answers_while_the_api_port_is_full_and_while_stopping(
        tmp_path: Path) -> None:
    """PROBE_PORT serves /health, /ready and /metrics (and nothing else) beside PORT, which
    serves them too; with every connection PORT allows busy it still answers, and it answers
    through the stop sequence after PORT's listener has closed."""
    probe_port = free_port()
    with fake_server(tmp_path, "--max-connections", "2", "--probe-port", str(probe_port),
                     "--shutdown-delay-s", "0.5", "--shutdown-grace-s", "10",
                     step_s=0.08) as server:
        probes = f"http://127.0.0.1:{probe_port}"
        for path, answer in (("/health", {"status": "ok"}), ("/ready", {"status": "ready"})):
            assert httpx.get(probes + path).json() == answer
            assert httpx.get(server.url + path).json() == answer
        assert "translate_http_requests_total" in httpx.get(probes + "/metrics").text
        other = httpx.post(probes + "/translate", json={"text": "a"})
        assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"

        body = json.dumps({"text": words(100)}).encode()  # 5 s of decoding
        busy = [connect(server) for _ in range(2)]
        for sock in busy:
            sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.3)
        with connect(server) as sock:  # PORT is full...
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_until_closed(sock).startswith(b"HTTP/1.1 503 ")
        assert httpx.get(probes + "/health").status_code == 200  # ...the probe port is not

        server.process.send_signal(signal.SIGTERM)
        assert listener_closed(server)
        ready = httpx.get(probes + "/ready")
        assert ready.status_code == 503 and ready.json()["error"]["code"] == "shutting_down"
        assert httpx.get(probes + "/health").status_code == 200  # draining: alive
        for sock in busy:  # the accepted requests finish
            assert read_response(sock).startswith(b"HTTP/1.1 200 ")
            sock.close()
        assert server.stop() in (0, -signal.SIGTERM)
        assert "Traceback" not in "".join(server.log)
        with pytest.raises(httpx.ConnectError):
            httpx.get(probes + "/health")


def test_at_the_cap_a_connection_between_requests_is_not_evicted(tmp_path: Path) -> None:
    """A client that has just had its answer sends its next request at once; under load the
    server may not have read it yet. Such a connection is never closed for a newcomer (which
    gets 503, and reads it even though it sent its request straight away); only one idle for
    a second with nothing unread is."""
    with fake_server(tmp_path, "--max-connections", "2") as server:
        clients = [connect(server) for _ in range(2)]
        request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
        for sock in clients:
            sock.sendall(request)
            assert read_response(sock).startswith(b"HTTP/1.1 200 ")
        with connect(server) as newcomer:
            newcomer.sendall(request)  # sent before any answer: it must not be reset
            answer = read_until_closed(newcomer)
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert b'"code":"too_many_connections"' in answer
        for sock in clients:  # both kept their connection and are served on it
            sock.sendall(request)
            assert read_response(sock).startswith(b"HTTP/1.1 200 ")
        time.sleep(1.5)  # now idle for longer than EVICT_IDLE_S
        with connect(server) as newcomer:
            newcomer.sendall(request)
            assert read_response(newcomer).startswith(b"HTTP/1.1 200 ")
        for sock in clients:
            sock.close()
        closed = served_samples(server, "translate_http_connections_closed_total")
        assert closed == {"refused": 1, "evicted": 1, "header_timeout": 0}


def test_more_idle_and_slow_connections_than_files_do_not_lock_out_a_client(
    guarded_server: ServerProcess,
) -> None:
    idle = [connect(guarded_server) for _ in range(OPEN_FILES + 50)]
    slow = [connect(guarded_server) for _ in range(50)]
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    # A connection is closed for a newcomer only once it has been idle for EVICT_IDLE_S: one
    # opened just now may still be about to send its request.
    time.sleep(EVICT_IDLE_S + 0.1)
    stop = threading.Event()

    def dribble() -> None:  # one byte at a time to each slow connection
        for index in range(len(request)):
            for sock in slow:
                with contextlib.suppress(OSError):
                    sock.send(request[index : index + 1])
            if stop.wait(0.1):
                return

    dribbler = threading.Thread(target=dribble)
    dribbler.start()
    try:
        started = time.monotonic()
        response = httpx.post(guarded_server.url + "/translate", json={"text": "hello there"},
                              timeout=10)
        waited = time.monotonic() - started
        assert response.status_code == 200
        assert response.json()["translations"][0]["text"] == "HELLO THERE"
        assert waited < 0.5  # room was made at once, not at the header deadline
    finally:
        stop.set()
        dribbler.join()
    # Every idle and slow connection was closed: evicted to make room, or past its deadline.
    for sock in [*idle, *slow]:
        sock.settimeout(5)
        read_until_closed(sock)
        sock.close()
    assert guarded_server.process.poll() is None
    assert "Too many open files" not in "".join(guarded_server.log)
    closed = served_samples(guarded_server, "translate_http_connections_closed_total")
    assert closed["evicted"] > 0 and closed["header_timeout"] > 0
    assert served_samples(guarded_server, "translate_http_connections") == {"": 1}  # this one
