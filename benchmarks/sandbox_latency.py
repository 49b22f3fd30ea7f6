"""Milliseconds per sandbox call (p50 / p99 / mean over N sequential calls) for serl's code sandbox.

Cases, each on two programs (a trivial ``print`` and a small arithmetic script):

* ``local isolated``: :class:`serl.sandbox.LocalSandbox` with namespaces and the read-only file
  system (skipped, and said so, where the machine cannot make namespaces);
* ``local unisolated``: the same with ``isolate=False`` (plain ``python -I -S`` subprocess);
* ``local isolated, prelude=spear``: SPEAR's imports (no numpy) before each program;
* ``sandbox_fusion client``: :class:`serl.sandbox.SandboxFusionSandbox` against a fake server on
  127.0.0.1 that answers at once: the client's own overhead (HTTP + JSON), not a real server.

Calls are sequential (one at a time), so the figures are latencies, not throughput. The CPU
model, Python version and the isolation report are printed first.

    PYTHONPATH=$PWD python benchmarks/sandbox_latency.py --n 200
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from serl.sandbox import LocalSandbox, SandboxFusionSandbox
from serl.utils import cpu_model

PROGRAMS = {
    "print": "print('hello')",
    "arithmetic": "total = 0\nfor i in range(1, 1001):\n    total += i * i % 7\n"
                  "print(total, sqrt(total), factorial(12))",
}
#: the server gets no prelude: the same script without the names of ``from math import *``
FUSION_PROGRAMS = {"print": PROGRAMS["print"],
                   "arithmetic": PROGRAMS["arithmetic"].replace("sqrt(total)", "total ** 0.5")
                   .replace("factorial(12)", "479001600")}


def measure(box, code: str, n: int, warmup: int = 3) -> dict[str, float]:
    """ms per call over ``n`` sequential calls (after ``warmup``); every call must succeed."""
    for _ in range(warmup):
        box.run(code)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        result = box.run(code)
        times.append(1000 * (time.perf_counter() - start))
        if result.status != "ok":
            raise RuntimeError(f"benchmark program failed: {result}")
    times.sort()
    return {"p50_ms": times[len(times) // 2], "p99_ms": times[min(len(times) - 1, int(0.99 * len(times)))],
            "mean_ms": statistics.fmean(times), "n": n}


def fake_fusion_server() -> ThreadingHTTPServer:
    """A server on 127.0.0.1 that answers every POST with a finished run printing ``ok``."""
    reply = json.dumps({"status": "Success", "message": "", "run_result": {
        "status": "Finished", "execution_time": 0.0, "return_code": 0, "stdout": "ok\n", "stderr": ""}}).encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real server behind a pool
        disable_nagle_algorithm = True  # else headers and body wait on a delayed ACK (~40 ms)

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200, help="measured calls per case and program")
    args = ap.parse_args(argv)
    print(f"cpu: {cpu_model()}\npython: {sys.version.split()[0]} ({sys.executable})\n")
    rows = []
    isolated = LocalSandbox()
    print(isolated.isolation_report())
    cases = [("local isolated", isolated if isolated.isolated else None, PROGRAMS),
             ("local unisolated", LocalSandbox(isolate=False), PROGRAMS),
             ("local isolated, prelude=spear", LocalSandbox(prelude="spear") if isolated.isolated else None, PROGRAMS)]
    httpd = fake_fusion_server()
    cases.append(("sandbox_fusion client (fake local server)",
                  SandboxFusionSandbox(f"http://127.0.0.1:{httpd.server_address[1]}/run_code"), FUSION_PROGRAMS))
    print(f"{'case':45s} {'program':11s} {'p50 ms':>8s} {'p99 ms':>8s} {'mean ms':>8s}")
    for name, box, programs in cases:
        if box is None:
            print(f"{name:45s} skipped: no namespaces here ({isolated.isolation.reason})")
            continue
        for prog, code in programs.items():
            row = {"case": name, "program": prog, **measure(box, code, args.n)}
            rows.append(row)
            print(f"{name:45s} {prog:11s} {row['p50_ms']:8.1f} {row['p99_ms']:8.1f} {row['mean_ms']:8.1f}")
        box.close()
    httpd.shutdown()
    return rows


if __name__ == "__main__":
    main()
