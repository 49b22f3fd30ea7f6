"""The SandboxFusion client against a fake server (``http.server`` on 127.0.0.1 in a thread):
request body, reply mapping, the 504-only retry policy, and failures as ``api_error`` results."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from serl.sandbox import SandboxFusionSandbox, SandboxError, make_sandbox, tool_response_text


def run_result(status="Finished", rc=0, stdout="", stderr=""):
    return {"status": "Success" if status == "Finished" and rc == 0 else "Failed", "message": "",
            "compile_result": None, "run_result": {"status": status, "execution_time": 0.01, "return_code": rc,
                                                   "stdout": stdout, "stderr": stderr},
            "executor_pod_name": "fake", "files": {}}


#: path -> the replies in order (the last one repeats): (HTTP status, body: dict -> JSON, str -> raw)
SCRIPTS = {
    "/ok": [(200, run_result(stdout="4\n"))],
    "/exception": [(200, run_result(rc=1, stderr='Traceback (most recent call last):\n  File "x.py", line 1\n'
                                           'ZeroDivisionError: division by zero\n'))],
    "/tle": [(200, run_result("TimeLimitExceeded", rc=-1))],
    "/runner_error": [(200, run_result("Error", rc=-1))],
    "/sandbox_error": [(200, {"status": "SandboxError", "message": "no runner", "run_result": None})],
    "/504_then_ok": [(504, "gateway timeout"), (200, run_result(stdout="ok\n"))],
    "/504": [(504, "gateway timeout")],
    "/500": [(500, "internal error")],
    "/not_json": [(200, "<html>hello</html>")],
    "/big": [(200, run_result(stdout="y" * 100))],
}


class FakeServer:
    def __init__(self):
        self.requests: dict[str, list[dict]] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                seen = outer.requests.setdefault(self.path, [])
                seen.append(body)
                script = SCRIPTS[self.path]
                code, reply = script[min(len(seen), len(script)) - 1]
                raw = (json.dumps(reply) if isinstance(reply, dict) else reply).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def server():
    s = FakeServer()
    yield s
    s.close()


def client(server, path, **kw):
    sleeps: list[float] = []
    box = SandboxFusionSandbox(server.url + path, sleep=sleeps.append, **kw)
    return box, sleeps


def timed_run(box, code="print(2 + 2)"):
    start = time.monotonic()
    result = box.run(code)
    assert time.monotonic() - start < 2.0
    return result


def test_success_and_the_request_body(server):
    box, sleeps = client(server, "/ok", run_timeout_s=5, compile_timeout_s=7, memory_limit_mb=256)
    result = timed_run(box)
    assert (result.status, result.stdout, result.return_code, result.attempts) == ("ok", "4\n", 0, 1)
    assert tool_response_text(result) == "4" and sleeps == []
    assert server.requests["/ok"][-1] == {"compile_timeout": 7.0, "run_timeout": 5.0, "code": "print(2 + 2)",
                                          "stdin": None, "memory_limit_MB": 256, "language": "python",
                                          "files": {}, "fetch_files": []}
    assert box._client.timeout.read == 5 + 7 + 10  # compile + run + 10 s


def test_exception_maps_to_error_with_the_stderr_text(server):
    result = timed_run(client(server, "/exception")[0])
    assert (result.status, result.return_code) == ("error", 1)
    assert tool_response_text(result) == ('File "x.py", line 1\nZeroDivisionError: division by zero\n'
                                          "Errors occurred! Check your code.")


@pytest.mark.parametrize("path, status", [("/tle", "timeout"), ("/runner_error", "api_error"),
                                          ("/sandbox_error", "api_error")])
def test_unfinished_runs(server, path, status):
    result = timed_run(client(server, path)[0])
    assert result.status == status and result.attempts == 1
    assert tool_response_text(result) == "Tool API failed! Please try again."


def test_504_is_retried_then_succeeds(server):
    box, sleeps = client(server, "/504_then_ok")
    result = timed_run(box)
    assert (result.status, result.stdout, result.attempts, sleeps) == ("ok", "ok\n", 2, [1.0])
    assert box.stats()["retries"] == 1


def test_504_three_times_is_an_api_error(server):
    box, sleeps = client(server, "/504")
    result = timed_run(box)
    assert (result.status, result.attempts, sleeps) == ("api_error", 3, [1.0, 2.0])
    assert "HTTP 504" in result.message and len(server.requests["/504"]) == 3


@pytest.mark.parametrize("path, note", [("/500", "HTTP 500"), ("/not_json", "not JSON")])
def test_other_failures_are_not_retried(server, path, note):
    box, sleeps = client(server, path)
    result = timed_run(box)
    assert (result.status, result.attempts, sleeps) == ("api_error", 1, [])
    assert note in result.message and len(server.requests[path]) == 1
    assert box.stats()["status/api_error"] == 1


def test_server_down_is_an_api_error():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    box = SandboxFusionSandbox(f"http://127.0.0.1:{port}/run_code", sleep=lambda s: None)
    result = timed_run(box)
    assert (result.status, result.attempts) == ("api_error", 1) and "ConnectError" in result.message
    box.close()


def test_output_is_capped_and_run_many_keeps_order(server):
    box, _ = client(server, "/big", max_output_chars=10, max_concurrency=3)
    results = box.run_many([f"print({i})" for i in range(5)])
    assert [r.stdout for r in results] == ["y" * 10] * 5 and all(r.stdout_truncated for r in results)
    assert [b["code"] for b in server.requests["/big"]] and box.stats()["calls"] == 5


def test_options():
    with pytest.raises(SandboxError, match="needs a url"):
        make_sandbox("sandbox_fusion", url="")
    with pytest.raises(SandboxError, match="timeouts"):
        SandboxFusionSandbox("http://127.0.0.1:1/run_code", run_timeout_s=0)
