"""OpenAI Python client load for the wire-probe tests: what a user's client measures, per request.

Runs requests one after another on one client (its pool keeps the connection when the server does), each with its own `x-request-id`,
streaming chat completions by default; records, per request, TTFT (the request's first byte sent -> first chunk
with content; the client's own set-up before that, building the request or a new connection, is `client_setup_ms`)
and the gaps between later content chunks, as the client sees them (the x-request-id is a fresh UUID). `--cancel I` closes request I's stream
after 3 content chunks (the client goes away mid-stream). `--json-every K` makes every K-th request a
non-streaming one. `--model NAME` names the served model, `--temperature T` the sampling temperature (0: greedy). `--warmup N` first sends N streamed requests that are not recorded: the first call of a
process pays the client's own lazy set-up (imports, request models), which no server ever sees. Writes a JSON
list to `--out`.
"""

import argparse
import json
import time
import uuid

import httpx
import openai


class SendMarks(httpx.HTTPTransport):
    """A transport that notes when each request's first byte went out (httpcore's trace hook): the client's own
    work before that (building the request, JSON, a new connection's handshake) is not the server's."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.sent = None

    def handle_request(self, request):
        request.extensions["trace"] = self._trace
        return super().handle_request(request)

    def _trace(self, name, _info):
        if name == "http11.send_request_headers.started":
            self.sent = time.perf_counter()


def new_client(base_url):
    marks = SendMarks()
    client = openai.OpenAI(base_url=base_url, api_key="none", http_client=httpx.Client(timeout=120, transport=marks))
    return client, marks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--cancel", type=int, default=-1)
    ap.add_argument("--json-every", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--model", default="default")
    # Sampled requests as users send them (0: greedy).
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    client, marks = new_client(a.base_url)
    for _ in range(a.warmup):
        for _chunk in client.chat.completions.create(
            model=a.model,
            messages=[{"role": "user", "content": "Say hi."}],
            max_tokens=4,
            temperature=0,
            stream=True,
            extra_headers={"x-request-id": str(uuid.uuid4())},
        ):
            pass
    rows = []
    prompts = [
        "Write a short poem about the sea.",
        "List three colors and say why you like them.",
        "Explain what a CPU does in two sentences.",
        "Tell me a fact about the moon.",
    ]
    for i in range(a.requests):
        # A UUID: llama_cpp.server (starlette-context's RequestIdPlugin) answers 400 to any other x-request-id.
        xid = str(uuid.uuid4())
        msgs = [{"role": "user", "content": prompts[i % len(prompts)]}]
        stream = not (a.json_every and (i + 1) % a.json_every == 0)
        t0 = time.perf_counter()
        marks.sent = None
        times = []
        cancelled = False
        if stream:
            s = client.chat.completions.create(
                model=a.model,
                messages=msgs,
                max_tokens=a.max_tokens,
                temperature=a.temperature,
                stream=True,
                extra_headers={"x-request-id": xid},
            )
            for chunk in s:
                now = time.perf_counter()
                d = chunk.choices[0].delta if chunk.choices else None
                if d is not None and (d.content or getattr(d, "reasoning_content", None) or d.tool_calls):
                    times.append(now)
                if i == a.cancel and len(times) >= 3:
                    s.close()
                    cancelled = True
                    break
        else:
            client.chat.completions.create(
                model=a.model,
                messages=msgs,
                max_tokens=a.max_tokens,
                temperature=a.temperature,
                extra_headers={"x-request-id": xid},
            )
        t1 = time.perf_counter()
        sent = marks.sent if marks.sent is not None else t0
        rows.append(
            {
                "x_request_id": xid,
                "stream": stream,
                "cancelled": cancelled,
                "ttft_ms": (times[0] - sent) * 1e3 if times else None,
                "client_setup_ms": (sent - t0) * 1e3,
                "itl_ms": [(b - a_) * 1e3 for a_, b in zip(times, times[1:])],
                "chunks": len(times),
                "e2e_ms": (t1 - sent) * 1e3,
            }
        )
        if cancelled:
            # A new client: the cancelled stream's connection is gone.
            client, marks = new_client(a.base_url)
    with open(a.out, "w") as f:
        json.dump(rows, f)


if __name__ == "__main__":
    main()
