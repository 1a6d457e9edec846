"""Stand-in for LibreTranslate's tests/test_api/conftest.py (used by scripts/peer-suites.sh).

LibreTranslate's own fixture builds its Flask app (``create_app``) and hands the tests
``app.test_client()``. This one hands them a small HTTP client with the same surface the tests
use -- ``.get(path)`` / ``.post(path, data=..., json=...)`` returning objects with
``.status_code``, ``.data`` (bytes) and ``.json`` -- that sends each request over loopback to a
running instance of this service, at ``PEER_LT_URL`` (e.g. http://127.0.0.1:8123/libretranslate).

As with Flask's test client: a dict ``data`` is sent form-encoded, ``json`` as a JSON body, no
body at all when neither is given, and redirects are not followed. Each request and its answer
are logged (logger ``peer.http``, DEBUG), for scripts/peer/record_http.py to report when a test
fails.
"""

from __future__ import annotations

import json as _json
import logging
import os

import pytest
import requests

BASE_URL = os.environ.get("PEER_LT_URL", "http://127.0.0.1:8000/libretranslate").rstrip("/")
TIMEOUT_S = float(os.environ.get("PEER_HTTP_TIMEOUT_S", "60"))
log = logging.getLogger("peer.http")


class ShimResponse:
    """What the tests read of a Flask test response."""

    def __init__(self, response: requests.Response) -> None:
        self.status_code = response.status_code
        self.data = response.content
        self.headers = response.headers
        self.content_type = response.headers.get("content-type", "")

    @property
    def json(self):
        # Flask's .json is the parsed body of a JSON response; None here when it is not JSON.
        try:
            return _json.loads(self.data)
        except ValueError:
            return None

    def get_json(self):
        return self.json

    def __repr__(self) -> str:
        return f"<ShimResponse {self.status_code} {self.data[:200]!r}>"


class HttpClient:
    """The part of werkzeug's test client that LibreTranslate's API tests call."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.session = requests.Session()

    def open(self, path: str, method: str = "GET", data=None, json=None, headers=None,
             query_string=None, **_ignored) -> ShimResponse:
        log.debug("request %s %s data=%r json=%r query=%r", method, self.base_url + path,
                  data, json, query_string)
        response = self.session.request(
            method, self.base_url + path, data=data, json=json, headers=headers,
            params=query_string, timeout=TIMEOUT_S, allow_redirects=False)
        log.debug("answer %s content-type=%s body=%r", response.status_code,
                  response.headers.get("content-type", ""), response.content[:400])
        return ShimResponse(response)

    def get(self, path: str, **kwargs) -> ShimResponse:
        return self.open(path, "GET", **kwargs)

    def post(self, path: str, **kwargs) -> ShimResponse:
        return self.open(path, "POST", **kwargs)

    def put(self, path: str, **kwargs) -> ShimResponse:
        return self.open(path, "PUT", **kwargs)

    def delete(self, path: str, **kwargs) -> ShimResponse:
        return self.open(path, "DELETE", **kwargs)


@pytest.fixture()
def app():
    # The upstream fixture is the Flask app; nothing here needs it beyond the name.
    return BASE_URL


@pytest.fixture()
def client(app):
    client = HttpClient(app)
    yield client
    client.session.close()
