"""A WSGI gateway in front of an OpenAI-compatible engine, run by gunicorn with forked gthread workers in the
wire-probe test of late children (`tests/tests/wire_workers.rs`): the shape of a Python API tier in front of an
engine process. Each request is forwarded to `UPSTREAM_PORT` on 127.0.0.1 with its `x-request-id` and
`traceparent`; a streamed (SSE) answer is passed on event by event as it arrives (gunicorn sends it with chunked
transfer encoding), anything else whole. Stdlib only.
"""

import http.client
import os

UPSTREAM = ("127.0.0.1", int(os.environ.get("UPSTREAM_PORT", "8000")))
FORWARDED = ("x-request-id", "traceparent", "content-type", "authorization")


def app(environ, start_response):
    n = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(n) if n else None
    headers = {}
    for name in FORWARDED:
        v = environ.get("HTTP_" + name.upper().replace("-", "_")) or (
            environ.get("CONTENT_TYPE") if name == "content-type" else None
        )
        if v:
            headers[name] = v
    path = environ.get("PATH_INFO", "/")
    if environ.get("QUERY_STRING"):
        path += "?" + environ["QUERY_STRING"]
    conn = http.client.HTTPConnection(*UPSTREAM, timeout=120)
    conn.request(environ["REQUEST_METHOD"], path, body, headers)
    r = conn.getresponse()
    keep = ("content-type", "x-request-id")
    start_response(f"{r.status} {r.reason}", [(k, v) for k, v in r.getheaders() if k.lower() in keep])
    sse = (r.getheader("content-type") or "").startswith("text/event-stream")

    def events():
        try:
            if not sse:
                yield r.read()
                return
            event = b""
            while True:
                line = r.readline()
                if not line:
                    break
                event += line
                if line in (b"\n", b"\r\n"):
                    yield event
                    event = b""
            if event:
                yield event
        finally:
            conn.close()

    return events()
