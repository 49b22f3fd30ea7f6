"""LLM judge for the SERL judge modes: an OpenAI-compatible ``/chat/completions`` client.

It sends the messages of :func:`serl.hindsight.judge_prompt.build_judge_messages`; the critique
becomes the privileged context of every step row of the judged trajectory
(:class:`serl.hindsight.builder.SerlContextBuilder`). Original: SERL (arXiv 2605.19447), whose
judge runs inside ``OliverLeeXZ/SERL@5a2a85b:agent_system/multi_turn_rollout/rollout_loop.py``.

Behaviour:

* requests: ``POST <judge_api_url>/chat/completions`` with ``model``, ``messages``,
  ``temperature`` (0), ``max_tokens`` and, unless ``judge_enable_thinking`` is null,
  ``chat_template_kwargs.enable_thinking``. An empty ``judge_model`` is resolved once from
  ``GET <judge_api_url>/models`` (the first id; vLLM and llama.cpp servers list their model).
* concurrency: at most ``judge_max_concurrency`` requests in flight (a thread pool).
* failures: a timeout, a connection error, HTTP 429 or 5xx is retried ``judge_request_retries``
  times with a short backoff; another HTTP error or a malformed body is not retried. If the
  answer is empty while the model's reasoning hit ``finish_reason=length``, the request is
  repeated once with ``judge_retry_max_tokens``.
* bounded time: every call of :meth:`JudgeClient.judge_many` ends within
  ``judge_batch_timeout`` seconds (plus a small grace); calls still running then count as
  failed. A single attempt is capped by ``judge_timeout`` (httpx per-operation timeouts).
* answers that are empty or a placeholder (``none``, ``n/a``) give no critique (``text=None``,
  not an error).
* the API key comes from the config (handed over by :meth:`JudgeClient.from_config`), else
  ``SERL_JUDGE_API_KEY``, else ``OPENAI_API_KEY``. It is sent only as the ``Authorization``
  header and never appears in a log line, an error message, or the client's ``repr``.
* error messages: an HTTP error names the status code and up to 200 characters of the body,
  after :func:`redact_secrets` has removed anything that looks like a credential (a server that
  echoes the request headers would otherwise print the key).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import httpx

from serl.errors import JudgeError  # noqa: F401  (re-exported)
from serl.hindsight.rendering import strip_thinking

if TYPE_CHECKING:
    from serl.config import SerlConfig

log = logging.getLogger(__name__)

REDACTED = "<redacted>"
PLACEHOLDER_ANSWERS = {"", "none", "n/a", "na", "null", "nothing", "no comment"}
#: characters of a failing server's (redacted) response body kept in an error message
ERROR_BODY_CHARS = 200

# credential-shaped substrings: the value of an Authorization header (any scheme), a Bearer
# token, an api-key field/parameter/header (api_key, api-key, apikey, x-api-key; JSON, query
# string or header syntax) and OpenAI-style ``sk-...`` tokens
_SECRET_PATTERNS = [
    (re.compile(r"(authorization[\"']?\s*[:=]\s*[\"']?)[^\"'\r\n,}]+", re.IGNORECASE), r"\1" + REDACTED),
    (re.compile(r"(bearer\s+)[A-Za-z0-9._~+/=\-]+", re.IGNORECASE), r"\1" + REDACTED),
    (re.compile(r"(api[_-]?key[\"']?\s*[:=]\s*[\"']?)[^\"'\s,&}]+", re.IGNORECASE), r"\1" + REDACTED),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}"), REDACTED),
]

@dataclass
class JudgeResult:
    """Outcome of one judge request.

    Attributes:
        text: the critique, or None (failure, or an empty / placeholder answer).
        error: None on success (even with ``text=None``); else a one-line description
            (never containing the API key).
    """

    text: Optional[str] = None
    error: Optional[str] = None


def resolve_api_key(configured: str = "") -> str:
    """The judge API key: ``configured`` (if a real value, not ``""`` or ``"<redacted>"``), else
    ``$SERL_JUDGE_API_KEY``, else ``$OPENAI_API_KEY``, else ``""`` (no ``Authorization``
    header is sent). A key given in the config reaches here through
    :meth:`serl.config.SerlConfig.configured_judge_api_key` (see :meth:`JudgeClient.from_config`)."""
    if configured and configured != REDACTED:
        return configured
    return os.environ.get("SERL_JUDGE_API_KEY") or os.environ.get("OPENAI_API_KEY") or ""


def redact_secrets(text: str, secrets: tuple[str, ...] = ()) -> str:
    """``text`` with every credential-looking substring replaced by ``"<redacted>"``.

    Removes each of ``secrets`` verbatim (the configured API key), then the value of any
    ``Authorization`` header or field, ``Bearer <token>``, the value of any ``api_key`` /
    ``api-key`` / ``apikey`` field, parameter or header, and ``sk-...`` tokens. Apply it to a
    whole body *before* cutting it, so a cut never leaves part of a key behind.
    """
    for secret in secrets:
        if secret and secret != REDACTED:
            text = text.replace(secret, REDACTED)
    for pat, repl in _SECRET_PATTERNS:
        text = pat.sub(repl, text)
    return text


def _clean_answer(content: Optional[str]) -> Optional[str]:
    """Strip thinking and whitespace; None for an empty or placeholder answer."""
    if content is None:
        return None
    text = strip_thinking(content).strip()
    if text.strip(" .!'\"`").lower() in PLACEHOLDER_ANSWERS:
        return None
    return text


class _Failure(Exception):
    """Internal: one attempt failed; ``retry`` says whether another attempt may help."""

    def __init__(self, msg: str, retry: bool):
        super().__init__(msg)
        self.retry = retry


class JudgeClient:
    """OpenAI-compatible chat client with a concurrency limit, retries and a time bound.

    Args:
        api_url: base URL, e.g. ``http://localhost:8000/v1`` (``/chat/completions`` is appended).
        model: model name; ``""`` = the first id of ``GET <api_url>/models``.
        api_key: key or ``""``/``"<redacted>"`` to use :func:`resolve_api_key`.
        timeout: seconds per attempt (httpx connect/read/write/pool timeouts).
        retries: extra attempts after a retryable failure (timeout, connection error, 429, 5xx).
        batch_timeout: seconds for a whole :meth:`judge_many` call.
        max_tokens, retry_max_tokens: completion budgets (see the module docstring).
        temperature: sampling temperature (0 = greedy).
        enable_thinking: sent as ``chat_template_kwargs.enable_thinking`` unless None.
        max_concurrency: requests in flight at once.
        backoff: seconds before retry ``k`` = ``backoff * k``.
        transport: an httpx transport (tests).
    """

    def __init__(
        self,
        api_url: str,
        model: str = "",
        api_key: str = "",
        *,
        timeout: float = 180.0,
        retries: int = 2,
        batch_timeout: float = 900.0,
        max_tokens: int = 4096,
        retry_max_tokens: int = 8192,
        temperature: float = 0.0,
        enable_thinking: Optional[bool] = False,
        max_concurrency: int = 32,
        backoff: float = 0.5,
        transport: Optional[httpx.BaseTransport] = None,
    ):
        if max_concurrency < 1:
            raise ValueError("JudgeClient: max_concurrency must be >= 1")
        self.api_url = api_url.rstrip("/")
        self.model = model
        self._api_key = resolve_api_key(api_key)
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.batch_timeout = float(batch_timeout)
        self.max_tokens = int(max_tokens)
        self.retry_max_tokens = int(retry_max_tokens)
        self.temperature = float(temperature)
        self.enable_thinking = enable_thinking
        self.max_concurrency = int(max_concurrency)
        self.backoff = float(backoff)
        self._model_lock = threading.Lock()
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        self._http = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(self.timeout),
            limits=httpx.Limits(max_connections=self.max_concurrency, max_keepalive_connections=self.max_concurrency),
            transport=transport,
        )

    @classmethod
    def from_config(cls, cfg: SerlConfig) -> "JudgeClient":
        """A client from the ``algorithm.serl`` section (``judge_*`` keys; the key behind a
        redacted ``judge_api_key`` via :meth:`~serl.config.SerlConfig.configured_judge_api_key`)."""
        return cls(
            cfg.judge_api_url,
            cfg.judge_model,
            cfg.configured_judge_api_key(),
            timeout=cfg.judge_timeout,
            retries=cfg.judge_request_retries,
            batch_timeout=cfg.judge_batch_timeout,
            max_tokens=cfg.judge_max_tokens,
            retry_max_tokens=cfg.judge_retry_max_tokens,
            temperature=cfg.judge_temperature,
            enable_thinking=cfg.judge_enable_thinking,
            max_concurrency=cfg.judge_max_concurrency,
        )

    def __repr__(self) -> str:
        return f"JudgeClient(api_url={self.api_url!r}, model={self.model!r}, key={'set' if self._api_key else 'none'})"

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()

    # -- one request ---------------------------------------------------------------------------

    def _timeout(self, deadline: float) -> httpx.Timeout:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Failure(f"judge time budget of {self.batch_timeout:g}s exhausted", retry=False)
        return httpx.Timeout(min(self.timeout, remaining))

    def _redact(self, text: str) -> str:
        """:func:`redact_secrets` with this client's API key."""
        return redact_secrets(text, (self._api_key,))

    def _body_excerpt(self, resp: httpx.Response) -> str:
        """The response body, redacted, then cut to :data:`ERROR_BODY_CHARS` on one line."""
        return self._redact(resp.text)[:ERROR_BODY_CHARS].replace("\n", " ")

    def _http_error(self, resp: httpx.Response) -> _Failure:
        url = self._redact(str(resp.request.url))
        return _Failure(f"HTTP {resp.status_code} from {url}: {self._body_excerpt(resp)}",
                        retry=resp.status_code in (408, 429) or resp.status_code >= 500)

    def _resolve_model(self, deadline: float) -> str:
        with self._model_lock:
            if self.model:
                return self.model
            url = f"{self.api_url}/models"
            try:
                resp = self._http.get(url, timeout=self._timeout(deadline))
            except httpx.HTTPError as e:
                raise _Failure(f"judge_model is empty and {url} is unreachable ({type(e).__name__}: {e}); "
                               "set algorithm.serl.judge_model", retry=True) from None
            if resp.status_code != 200:
                raise self._http_error(resp)
            try:
                self.model = resp.json()["data"][0]["id"]
            except (ValueError, KeyError, IndexError, TypeError):
                raise _Failure(f"judge_model is empty and {url} lists no model; set algorithm.serl.judge_model",
                               retry=False) from None
            return self.model

    def _attempt(self, messages: list[dict], max_tokens: int, deadline: float) -> dict[str, Any]:
        model = self._resolve_model(deadline)
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": max_tokens,
        }
        if self.enable_thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": bool(self.enable_thinking)}
        url = f"{self.api_url}/chat/completions"
        try:
            resp = self._http.post(url, json=body, timeout=self._timeout(deadline))
        except httpx.TimeoutException as e:
            raise _Failure(f"timeout after {self.timeout:g}s talking to {url} ({type(e).__name__})", retry=True) from None
        except httpx.HTTPError as e:
            raise _Failure(f"cannot reach {url} ({type(e).__name__}: {e})", retry=True) from None
        if resp.status_code != 200:
            raise self._http_error(resp)
        try:
            choice = resp.json()["choices"][0]
            msg = choice.get("message") or {}
            return {
                "content": msg.get("content"),
                "reasoning": msg.get("reasoning_content") or msg.get("reasoning"),
                "finish_reason": choice.get("finish_reason"),
            }
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise _Failure(f"malformed chat-completions answer from {url}: {self._body_excerpt(resp)!r}",
                           retry=False) from None

    def complete(self, messages: list[dict], *, deadline: Optional[float] = None) -> JudgeResult:
        """Send one chat request with retries; never raises for request problems.

        Args:
            messages: OpenAI chat messages.
            deadline: ``time.monotonic()`` value after which no new attempt starts
                (default: now + ``batch_timeout``).
        """
        deadline = time.monotonic() + self.batch_timeout if deadline is None else deadline
        max_tokens, bumped, failures = self.max_tokens, False, 0
        while True:
            try:
                out = self._attempt(messages, max_tokens, deadline)
            except _Failure as f:
                failures += 1
                if not f.retry or failures > self.retries:
                    suffix = f" (after {failures} attempt(s))" if failures > 1 else ""
                    return JudgeResult(None, self._redact(f"{f}{suffix}"))
                pause = min(self.backoff * failures, max(0.0, deadline - time.monotonic()))
                time.sleep(pause)
                continue
            text = _clean_answer(out["content"])
            if text is None and out["reasoning"] and out["finish_reason"] == "length" and not bumped:
                bumped, max_tokens = True, self.retry_max_tokens
                continue
            return JudgeResult(text, None)

    # -- many requests -------------------------------------------------------------------------

    def judge_many(self, requests: list[list[dict]]) -> list[JudgeResult]:
        """Run many chat requests with at most ``max_concurrency`` in flight, all within
        ``batch_timeout`` seconds (+ 1 s grace). Requests not finished by then get a failed
        :class:`JudgeResult`; their threads stop at their next time check."""
        if not requests:
            return []
        deadline = time.monotonic() + self.batch_timeout
        pool = cf.ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(requests)), thread_name_prefix="serl-judge")
        futures = [pool.submit(self.complete, m, deadline=deadline) for m in requests]
        try:
            cf.wait(futures, timeout=self.batch_timeout + 1.0)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        results = []
        for fut in futures:
            if fut.done() and not fut.cancelled():
                results.append(fut.result())
            else:
                results.append(JudgeResult(None, f"judge time budget of {self.batch_timeout:g}s exhausted before an answer"))
        return results
