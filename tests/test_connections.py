"""Shedding at the connection: while the event loop is behind, a request is answered 503 with
Retry-After as soon as its headers are read, before its key, body or route costs anything,
and the probes still get through."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import httpx

from tests.test_server import fake_server


def test_while_the_loop_is_behind_requests_are_shed_at_once_and_probes_answered(
        tmp_path: Path) -> None:
    # Any lateness at all counts as behind: the loop is never exactly on time.
    env = {"MAX_LOOP_LAG_S": "1e-9", "API_KEYS": "right"}
    with fake_server(tmp_path, env=env) as server:
        time.sleep(0.3)  # a few of the loop's samples
        for method, path in (("GET", "/languages"), ("POST", "/translate"),
                             ("POST", "/v2/translate"), ("GET", "/")):
            shed = httpx.request(method, server.url + path, json={"text": "a"})
            assert shed.status_code == 503, (path, shed.text)  # not 401: the key is not read
            assert shed.json()["error"]["code"] == "overloaded"
            assert int(shed.headers["retry-after"]) >= 1
            assert shed.headers["connection"] == "close"
        for probe in ("/health", "/ready", "/metrics"):
            answer = httpx.get(server.url + probe, headers={"Authorization": "Bearer right"})
            assert answer.status_code == 200, probe
        # Its body is never waited for: the answer comes before the client sends it.
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 503 ")
