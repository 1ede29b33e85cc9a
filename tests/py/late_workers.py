"""Launcher for the wire-probe test of late children (`tests/tests/wire_workers.rs`): starts the engine
(`llmserve`, its command after `--`) at once, then waits for GO_FILE to exist (the test creates it once
`llmprof attach` on this launcher is live) and only then starts gunicorn with 2 forked workers (gthread: keep-alive connections, like a client's
connection pool in front of a real API tier) running
`proxy_app:app` on PORT in front of the engine. So the gateway's master, its workers and their listening socket
all come into being after attach. Usage: late_workers.py GO_FILE PORT UPSTREAM_PORT -- llmserve ARGS...
"""

import os
import subprocess
import sys
import time


def main():
    go, port, upstream = sys.argv[1], sys.argv[2], sys.argv[3]
    engine_cmd = sys.argv[sys.argv.index("--") + 1 :]
    engine = subprocess.Popen(engine_cmd, stdout=subprocess.DEVNULL)
    while not os.path.exists(go):
        if engine.poll() is not None:
            sys.exit(f"the engine exited: {engine.returncode}")
        time.sleep(0.05)
    env = dict(os.environ, UPSTREAM_PORT=upstream)
    gateway = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "--workers",
            "2",
            "--worker-class",
            "gthread",
            "--threads",
            "2",
            "--bind",
            f"127.0.0.1:{port}",
            "--chdir",
            os.path.dirname(os.path.abspath(__file__)),
            "--log-level",
            "warning",
            "proxy_app:app",
        ],
        env=env,
    )
    try:
        sys.exit(gateway.wait())
    finally:
        engine.kill()


if __name__ == "__main__":
    main()
