"""HTTP client of a SandboxFusion server (``POST /run_code``), the sandbox of SPEAR's math runs.

The request and the retry policy follow SPEAR's client
(``TencentYoutuResearch/SPEAR@7e8431513165640b4b1f78d09ebaae8807ee4f85:verl/verl/utils/reward_score/sandbox_fusion/utils.py``):
one JSON body per program; an HTTP client timeout of compile + run + 10 s; retries **only** on
HTTP 504 (3 attempts in all, sleeping 1 s then 2 s); any other failure at once. Unlike the
original, a failure never raises: it is a result of status ``"api_error"`` (counted in
:meth:`~serl.sandbox.base.BaseSandbox.stats`). The server side
(``bytedance/SandboxFusion@469de0845cb7d665bc68044d541aa3aa28c5b30a:sandbox/server/sandbox_api.py``)
runs the code in its own namespaces and cgroup and answers
``{"status", "message", "run_result": {"status", "execution_time", "return_code", "stdout", "stderr"}, ...}``.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import httpx

from serl.sandbox.base import BaseSandbox, ExecutionResult, SandboxError

#: sleeps before the 2nd and the 3rd attempt after an HTTP 504, in seconds
RETRY_SLEEPS_S = (1.0, 2.0)


class SandboxFusionSandbox(BaseSandbox):
    """Send programs to a SandboxFusion server.

    Args:
        url: the server's run endpoint, e.g. ``http://127.0.0.1:8080/run_code``.
        run_timeout_s: the server's run time limit (``run_timeout``), seconds (SPEAR: 30).
        compile_timeout_s: ``compile_timeout``, seconds (SPEAR: 30).
        memory_limit_mb: ``memory_limit_MB`` (SPEAR: 1024).
        max_concurrency: requests in flight at once (SPEAR: 128 cluster-wide; default here: 8).
        max_output_chars: stdout and stderr are each cut to this many characters (the server
            does not cap them); the result's ``*_truncated`` flags say so.
        sleep: the function used to sleep between 504 retries (tests pass a recorder).
        transport: an ``httpx`` transport (tests); default: a real connection.

    Raises:
        SandboxError: an empty ``url`` or a non-positive timeout.
    """

    backend = "sandbox_fusion"

    def __init__(self, url: str, *, run_timeout_s: float = 30.0, compile_timeout_s: float = 30.0,
                 memory_limit_mb: int = 1024, max_concurrency: int | None = 8, max_output_chars: int = 64 * 1024,
                 sleep: Callable[[float], None] = time.sleep, transport: httpx.BaseTransport | None = None):
        super().__init__(max_concurrency)
        if not url:
            raise SandboxError("sandbox_fusion needs a url, e.g. http://127.0.0.1:8080/run_code")
        if run_timeout_s <= 0 or compile_timeout_s <= 0:
            raise SandboxError(f"timeouts must be > 0, got run {run_timeout_s}, compile {compile_timeout_s}")
        self.url = url
        self.run_timeout_s, self.compile_timeout_s = float(run_timeout_s), float(compile_timeout_s)
        self.memory_limit_mb, self.max_output_chars = memory_limit_mb, max_output_chars
        self._sleep = sleep
        self._client = httpx.Client(timeout=self.compile_timeout_s + self.run_timeout_s + 10.0, transport=transport)

    def request_body(self, code: str) -> dict[str, Any]:
        """The JSON body of one run request (SPEAR's fields and values)."""
        return {"compile_timeout": self.compile_timeout_s, "run_timeout": self.run_timeout_s, "code": code,
                "stdin": None, "memory_limit_MB": self.memory_limit_mb, "language": "python", "files": {},
                "fetch_files": []}

    def _execute(self, code: str) -> ExecutionResult:
        start = time.monotonic()
        body = self.request_body(code)
        attempts = 0
        for attempt in range(len(RETRY_SLEEPS_S) + 1):
            attempts = attempt + 1
            try:
                reply = self._client.post(self.url, json=body)
            except httpx.HTTPError as e:  # connection refused, client timeout, protocol error
                return self._failed(f"request failed: {type(e).__name__}: {e}", start, attempts)
            if reply.status_code != 504:
                break
            if attempt < len(RETRY_SLEEPS_S):
                self._sleep(RETRY_SLEEPS_S[attempt])
        if reply.status_code != 200:
            return self._failed(f"HTTP {reply.status_code}: {reply.text[:200]}", start, attempts)
        try:
            data = reply.json()
        except ValueError:
            return self._failed(f"reply is not JSON: {reply.text[:200]!r}", start, attempts)
        return self._from_reply(data, time.monotonic() - start, attempts)

    def _failed(self, message: str, start: float, attempts: int) -> ExecutionResult:
        return ExecutionResult("api_error", message=message, wall_s=time.monotonic() - start, attempts=attempts)

    def _from_reply(self, data: Any, wall_s: float, attempts: int) -> ExecutionResult:
        """Map a server reply: ``run_result.status`` ``Finished`` -> ``ok``/``error``/``killed`` by
        the return code; ``TimeLimitExceeded`` -> ``timeout``; ``Error``, a missing ``run_result``
        or anything unknown -> ``api_error`` (the original tool answers all of those "Tool API
        failed!")."""
        run = data.get("run_result") if isinstance(data, dict) else None
        if not isinstance(run, dict):
            note = data.get("message", "") if isinstance(data, dict) else ""
            status = data.get("status") if isinstance(data, dict) else type(data).__name__
            return ExecutionResult("api_error", message=f"no run_result (status {status}): {note}"[:300],
                                   wall_s=wall_s, attempts=attempts)
        stdout, out_cut = _cut(run.get("stdout") or "", self.max_output_chars)
        stderr, err_cut = _cut(run.get("stderr") or "", self.max_output_chars)
        rc = run.get("return_code")
        rc = rc if isinstance(rc, int) else None
        kind = run.get("status")
        if kind == "Finished":
            status = "ok" if rc == 0 else "killed" if rc is not None and rc < 0 else "error"
            message = "" if rc == 0 else f"exit code {rc}"
        elif kind == "TimeLimitExceeded":
            status, rc, message = "timeout", None, f"server time limit ({self.run_timeout_s:g} s)"
        else:
            status, message = "api_error", f"run_result.status {kind!r}: {data.get('message', '')}"[:300]
        return ExecutionResult(status, stdout, stderr, rc, wall_s, out_cut, err_cut, message, attempts)

    def close(self) -> None:
        """Close the HTTP connection pool; idempotent."""
        super().close()
        self._client.close()


def _cut(text: Any, limit: int) -> tuple[str, bool]:
    text = text if isinstance(text, str) else str(text)
    return (text[:limit], True) if len(text) > limit else (text, False)
