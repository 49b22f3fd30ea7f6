"""The LLM judge against a real OpenAI-compatible HTTP server on 127.0.0.1.

Every test is bounded in time: short timeouts, few retries, and ``judge_batch_timeout``.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from serl.config import SerlConfig
from serl.errors import JudgeError
from serl.hindsight.builder import SerlContextBuilder
from serl.hindsight.judge import JudgeClient, redact_secrets, resolve_api_key
from serl.hindsight.judge_prompt import build_judge_messages
from serl.hindsight.rendering import JUDGE_HEADER
from test_serl_context import ROW, make_groups


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        # a client that gave up on a slow answer closes the socket: expected here, stay quiet
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class FakeJudge:
    """A threaded OpenAI-compatible server. ``behaviour`` decides each answer:
    ``ok`` (a critique naming the task id), ``none`` (placeholder), ``fail500``, ``slow``
    (sleeps ``delay`` s), ``flaky`` (500 for the first request, then ok), ``reasoning_cut``
    (empty content + reasoning + finish_reason=length unless max_tokens is large)."""

    def __init__(self, behaviour: str = "ok", delay: float = 2.0):
        self.behaviour = behaviour
        self.delay = delay
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.lock = threading.Lock()
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # keep pytest output clean
                pass

            def _send(self, code: int, obj) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": "fake-judge-7b", "object": "model"}]})
                else:
                    self._send(404, {"error": "no such path"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with judge.lock:
                    judge.requests.append(body)
                    judge.headers.append(dict(self.headers))
                    n = len(judge.requests)
                b = judge.behaviour
                if b == "echo401":  # a misconfigured proxy that echoes the request headers
                    echoed = "".join(f"{k}: {v}\n" for k, v in sorted(self.headers.items()))
                    return self._send(401, {"request_headers": echoed, "error": "unauthorized",
                                            "hint": "api_key=sk-proj-leakedKEY0123456789 or x-api-key: zzsecretzz"})
                if b == "fail500" or (b == "flaky" and n == 1):
                    return self._send(500, {"error": {"message": "internal error"}})
                if b == "slow":
                    time.sleep(judge.delay)
                if b == "reasoning_cut" and body["max_tokens"] < 8000:
                    return self._send(200, {"choices": [{"message": {"role": "assistant", "content": "",
                                                                     "reasoning_content": "thinking..."},
                                                         "finish_reason": "length"}]})
                user = body["messages"][-1]["content"]
                task = user.split("\n")[1]  # first line of the task section = the first step prompt
                content = "N/A" if b == "none" else f"<think>hidden</think>The rollout failed. Task was {task}."
                self._send(200, {"choices": [{"message": {"role": "assistant", "content": content},
                                              "finish_reason": "stop"}]})

        self.server = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server():
    servers = []

    def start(behaviour="ok", delay=2.0):
        s = FakeJudge(behaviour, delay)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


def jcfg(url: str, mode: str = "judge_current_traj", **kw) -> SerlConfig:
    base = dict(sampling_mode=mode, judge_api_url=url, judge_model="fake-judge-7b", judge_timeout=1.0,
                judge_request_retries=1, judge_batch_timeout=10.0, judge_max_concurrency=4)
    base.update(kw)
    return SerlConfig(**base)


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/v1"


def test_judge_current_traj_against_local_server(server, monkeypatch):
    monkeypatch.setattr(SerlConfig, "_secret_store", {})
    monkeypatch.setenv("SERL_JUDGE_API_KEY", "sk-test-key")
    srv = server("ok")
    groups = make_groups()
    b = SerlContextBuilder(jcfg(srv.url))
    ctxs = b.build(groups)
    assert len(srv.requests) == 7  # one per trajectory (A B C D E F H)
    # every row of A gets A's critique (thinking stripped)
    for r in ("A0", "A1", "A2"):
        assert ctxs[ROW[r]].sections == [(JUDGE_HEADER, "The rollout failed. Task was [A0] obs: You are in the middle of a room..")]
    assert ctxs[ROW["H1"]].sections == [(JUDGE_HEADER, "The rollout failed. Task was [H0] obs: Room three..")]
    assert groups[0].trajectories[0].extra["serl_judge"].startswith("The rollout failed.")
    body = srv.requests[0]
    assert body["model"] == "fake-judge-7b" and body["temperature"] == 0.0 and body["max_tokens"] == 4096
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert all(h.get("Authorization") == "Bearer sk-test-key" for h in srv.headers)
    m = b.metrics()
    assert m["serl/traj_judge_reference_fraction"] == 1.0
    assert m["serl/judge_failure_fraction"] == 0.0 and m["serl/judge_requests"] == 7.0
    assert "sk-test-key" not in repr(b._judge)


def test_judge_prompt_structure():
    groups = make_groups()
    A, B = groups[0].trajectories[:2]
    msgs = build_judge_messages(A, include_feedback=True)
    user = msgs[1]["content"]
    assert user == (
        "## Task\n[A0] obs: You are in the middle of a room.\n\n"
        "## Current rollout\nStep 0\nResponse:\n<action>go to desk 1</action>\n\n"
        "Step 1\nResponse:\n<action>open drawer 1</action>\n\nStep 2\nResponse:\n<action>take key 1</action>\n\n"
        "## Outcome\nFinal success: no\nEpisode reward: 0.0000\nEpisode length: 3 step(s)\n"
        "Final observation after the last action:\nP3-A\nFinal immediate feedback: Nothing happens.\n\n"
        "Write 2-4 plain sentences. The first sentence must say explicitly whether this rollout succeeded or failed."
    )
    assert "succeeded or failed" in msgs[0]["content"]
    from serl.hindsight.success import SuccessRef

    with_ref = build_judge_messages(B, include_feedback=False, reference=SuccessRef(B.steps, "B", "self"))[1]["content"]
    assert "Final success: yes\nEpisode reward: 10.0000" in with_ref
    assert "Final immediate feedback" not in with_ref
    assert "## Reference: a successful rollout (this same rollout)\nStep 0\nResponse:\n<action>go to shelf 1</action>" in with_ref


def test_judge_on_successful_sample_references(server):
    srv = server("ok")
    SerlContextBuilder(jcfg(srv.url, "judge_current_traj_on_successful_sample")).build(make_groups())
    by_task = {r["messages"][1]["content"].split("\n")[1]: r["messages"][1]["content"] for r in srv.requests}
    ref = "## Reference: a successful rollout"
    assert f"{ref} (another rollout of the same task)\nStep 0\nResponse:\n<action>go to shelf 1</action>" in by_task[
        "[A0] obs: You are in the middle of a room."]
    assert f"{ref} (this same rollout)" in by_task["[B0] obs: You are in the middle of a room."]  # lone success: itself
    assert ref not in by_task["[D0] obs: Room two."]  # no success in the group: no reference


def test_no_judge_calls_on_evaluation_unless_asked(server):
    srv = server("ok")
    b = SerlContextBuilder(jcfg(srv.url))
    assert all(c is None for c in b.build(make_groups(), evaluation=True))
    assert srv.requests == []
    b2 = SerlContextBuilder(jcfg(srv.url, judge_on_validation=True))
    assert sum(c is not None for c in b2.build(make_groups(), evaluation=True)) == 14
    assert len(srv.requests) == 7


def test_placeholder_answer_gives_no_context(server):
    srv = server("none")
    b = SerlContextBuilder(jcfg(srv.url))
    assert all(c is None for c in b.build(make_groups()))
    m = b.metrics()
    assert m["serl/judge_empty_fraction"] == 1.0 and m["serl/judge_failure_fraction"] == 0.0
    assert m["serl/traj_judge_reference_fraction"] == 0.0


def test_empty_answer_after_reasoning_cut_retries_with_larger_budget(server):
    srv = server("reasoning_cut")
    res = JudgeClient(srv.url, "fake-judge-7b", timeout=2.0).judge_many([[{"role": "user", "content": "x\ny"}]])
    assert res[0].error is None and res[0].text == "The rollout failed. Task was y."
    assert [r["max_tokens"] for r in srv.requests] == [4096, 8192]


def test_model_discovered_from_models_endpoint(server):
    srv = server("ok")
    client = JudgeClient(srv.url, "", timeout=2.0)
    res = client.judge_many([[{"role": "user", "content": "x\ny"}]])
    assert res[0].error is None and srv.requests[0]["model"] == "fake-judge-7b"


def test_enable_thinking_null_is_not_sent(server):
    srv = server("ok")
    JudgeClient(srv.url, "m", enable_thinking=None).judge_many([[{"role": "user", "content": "x\ny"}]])
    assert "chat_template_kwargs" not in srv.requests[0]


def test_retry_recovers_from_one_500(server):
    srv = server("flaky")
    res = JudgeClient(srv.url, "m", retries=1, backoff=0.05).judge_many([[{"role": "user", "content": "x\ny"}]])
    assert res[0].error is None and len(srv.requests) == 2


def test_http_500_outage_falls_back_and_is_counted(server, caplog, monkeypatch):
    monkeypatch.setenv("SERL_JUDGE_API_KEY", "sk-never-log-me")
    monkeypatch.setattr(SerlConfig, "_secret_store", {})
    srv = server("fail500")
    b = SerlContextBuilder(jcfg(srv.url))
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING):
        ctxs = b.build(make_groups())
    assert time.monotonic() - t0 < 8
    assert all(c is None for c in ctxs)
    assert len(srv.requests) == 14  # 7 trajectories x (1 + 1 retry)
    m = b.metrics()
    assert m["serl/judge_failure_fraction"] == 1.0 and m["serl/reprompt_sample_fraction"] == 0.0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # once per build
    assert "failed for 7/7 trajectories" in warnings[0].getMessage() and "HTTP 500" in warnings[0].getMessage()
    assert "sk-never-log-me" not in caplog.text


def test_stopped_server_falls_back_quickly(server):
    srv = server("ok")
    srv.stop()
    b = SerlContextBuilder(jcfg(srv.url))
    t0 = time.monotonic()
    ctxs = b.build(make_groups())
    assert time.monotonic() - t0 < 8
    assert all(c is None for c in ctxs)
    assert b.metrics()["serl/judge_failure_fraction"] == 1.0


def test_never_listening_port_falls_back():
    b = SerlContextBuilder(jcfg(closed_port_url(), judge_request_retries=0))
    assert all(c is None for c in b.build(make_groups()))
    assert b.metrics()["serl/judge_failure_fraction"] == 1.0


def test_slow_server_times_out_within_bounds(server):
    srv = server("slow", delay=3.0)
    b = SerlContextBuilder(jcfg(srv.url, judge_timeout=0.3, judge_request_retries=1, judge_max_concurrency=8))
    t0 = time.monotonic()
    ctxs = b.build(make_groups())
    elapsed = time.monotonic() - t0
    assert elapsed < 3.0, elapsed  # 2 attempts x 0.3 s + backoff, all 7 in parallel
    assert all(c is None for c in ctxs)
    assert b.metrics()["serl/judge_failure_fraction"] == 1.0


def test_batch_timeout_bounds_total_time(server):
    # per-attempt timeout is long, but the whole batch must end within judge_batch_timeout (+1 s grace)
    srv = server("slow", delay=5.0)
    client = JudgeClient(srv.url, "m", timeout=30.0, retries=3, batch_timeout=0.5, max_concurrency=1)
    t0 = time.monotonic()
    res = client.judge_many([[{"role": "user", "content": "x\ny"}]] * 3)
    assert time.monotonic() - t0 < 2.5
    assert all(r.text is None and r.error for r in res)
    assert "time budget" in res[-1].error


def test_strict_mode_raises_a_clear_error(server):
    srv = server("fail500")
    b = SerlContextBuilder(jcfg(srv.url, judge_request_strict=True, judge_request_retries=0))
    with pytest.raises(JudgeError) as e:
        b.build(make_groups())
    msg = str(e.value)
    assert "LLM judge failed for 7/7 trajectories" in msg and "HTTP 500" in msg
    assert "judge_api_url" in msg and "judge_request_strict=false" in msg


def test_api_key_resolution(monkeypatch):
    monkeypatch.setattr(SerlConfig, "_secret_store", {})
    monkeypatch.delenv("SERL_JUDGE_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert resolve_api_key("") == ""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    assert resolve_api_key("<redacted>") == "sk-openai"
    monkeypatch.setenv("SERL_JUDGE_API_KEY", "sk-serl")
    assert resolve_api_key("") == "sk-serl"
    c = SerlConfig(judge_api_key="sk-config")
    assert c.judge_api_key == "<redacted>" and c.configured_judge_api_key() == "sk-config"
    assert resolve_api_key(c.configured_judge_api_key()) == "sk-config"
    client = JudgeClient.from_config(c)
    try:
        assert client._http.headers["Authorization"] == "Bearer sk-config" and "sk-config" not in repr(client)
    finally:
        client.close()
    assert resolve_api_key("sk-explicit") == "sk-explicit"


def test_error_body_echoing_credentials_is_logged_redacted(server, caplog, monkeypatch):
    """A server that echoes the request headers used to put the API key into the warning."""
    key = "my-very-secret-key-42"
    monkeypatch.setattr(SerlConfig, "_secret_store", {})
    srv = server("echo401")
    b = SerlContextBuilder(jcfg(srv.url, judge_api_key=key, judge_request_retries=0))
    try:
        with caplog.at_level(logging.WARNING):
            assert all(c is None for c in b.build(make_groups()))
    finally:
        b.close()
    assert srv.headers[0]["Authorization"] == f"Bearer {key}"  # the key was sent, and echoed
    text = caplog.text
    assert "HTTP 401" in text and "<redacted>" in text
    for secret in (key, "sk-proj-leakedKEY0123456789", "zzsecretzz", "Bearer my"):
        assert secret not in text, secret


def test_redact_secrets_forms():
    assert redact_secrets("Authorization: Basic dXNlcjpwYXNz\nok") == "Authorization: <redacted>\nok"
    assert redact_secrets('{"authorization": "Bearer abc.def"}') == '{"authorization": "<redacted>"}'
    assert redact_secrets("token bearer abc123 end") == "token bearer <redacted> end"
    assert redact_secrets("?api-key=abc&x=1") == "?api-key=<redacted>&x=1"
    assert redact_secrets('{"apiKey": "abc"}') == '{"apiKey": "<redacted>"}'
    assert redact_secrets("key sk-abcdef0123 here") == "key <redacted> here"
    assert redact_secrets("plain hunter2 text", ("hunter2",)) == "plain <redacted> text"
    assert redact_secrets("nothing secret here") == "nothing secret here"
