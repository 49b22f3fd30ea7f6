"""LLM judge for the SERL judge modes: an OpenAI-compatible ``/chat/completions`` client (serl.md §3.5).

The judge reads one trajectory (task, the rendered rollout, an outcome summary and optionally a
successful reference rollout) and writes a short critique, the "Trajectory Judge", that becomes
the privileged context of every step row of that trajectory
(:class:`serl.algos.serl_context.SerlContextBuilder`).

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
* the API key comes from the config (moved out of the config object when it is built, see
  :class:`serl.config.SerlConfig`), else ``SERL_JUDGE_API_KEY``, else ``OPENAI_API_KEY``. It is
  sent only as the ``Authorization`` header and never appears in a log line, an error message,
  or the client's ``repr``.
"""

from __future__ import annotations

from serl.errors import JudgeError  # noqa: F401  (re-exported)

import concurrent.futures as cf
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

import httpx

from serl.algos.serl_context import SuccessRef, render_steps, strip_thinking
from serl.trajectory import Trajectory

log = logging.getLogger(__name__)

REDACTED = "<redacted>"
PLACEHOLDER_ANSWERS = {"", "none", "n/a", "na", "null", "nothing", "no comment"}

SYSTEM_PROMPT = (
    "You review one rollout of an agent acting in a text environment and write a short, concrete "
    "critique called the Trajectory Judge; it will be shown to the agent as privileged guidance. "
    "Your first sentence must state plainly whether the rollout succeeded or failed. Then explain "
    "what went right or wrong with respect to the task goal, and end with the single most important "
    "lesson. Never answer with a placeholder such as 'none' or 'n/a'."
)
FINAL_INSTRUCTION = (
    "Write 2-4 plain sentences. The first sentence must say explicitly whether this rollout "
    "succeeded or failed."
)




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
    """The judge API key: ``configured`` (if a real value), else the key moved out of the config
    by :class:`serl.config.SerlConfig`, else ``$SERL_JUDGE_API_KEY``, else ``$OPENAI_API_KEY``,
    else ``""`` (no ``Authorization`` header is sent)."""
    if configured and configured != REDACTED:
        return configured
    from serl.config import SerlConfig

    stored = getattr(SerlConfig, "_secret_store", {}).get("judge_api_key")
    if stored:
        return stored
    return os.environ.get("SERL_JUDGE_API_KEY") or os.environ.get("OPENAI_API_KEY") or ""


def build_judge_messages(
    traj: Trajectory,
    *,
    trajectory_format: str = "response",
    remove_thinking: bool = True,
    max_steps: int = 0,
    include_feedback: bool = True,
    reference: Optional[SuccessRef] = None,
) -> list[dict[str, str]]:
    """Chat messages asking the judge to critique ``traj`` (serl.md §3.5).

    User message sections: the task (the first step's prompt), the current rollout rendered per
    ``trajectory_format`` (capped at ``max_steps``, 0 = all), an outcome summary (final success
    yes/no, episode reward with 4 decimals, episode length, the observation after the last action
    = the last step's ``next_prompt``, and with ``include_feedback`` the last immediate feedback),
    the optional reference rollout, and the closing instruction.

    Only the trajectory's recorded (active) steps are used; there are no post-termination rows.

    Raises:
        ValueError: ``traj`` has no steps, or an unknown format.
    """
    if not traj.steps:
        raise ValueError(f"trajectory {traj.traj_uid!r} has no steps to judge")
    last = traj.steps[-1]
    rollout = render_steps(traj.steps, trajectory_format, remove_thinking=remove_thinking, max_steps=max_steps)
    outcome = [
        f"Final success: {'yes' if traj.won else 'no'}",
        f"Episode reward: {traj.episode_reward:.4f}",
        f"Episode length: {traj.length} step(s)",
        f"Final observation after the last action:\n{last.next_prompt.strip() or '(none)'}",
    ]
    if include_feedback:
        outcome.append(f"Final immediate feedback: {last.feedback.strip() or '(none)'}")
    parts = [
        f"## Task\n{traj.steps[0].prompt}",
        f"## Current rollout\n{rollout}",
        "## Outcome\n" + "\n".join(outcome),
    ]
    if reference is not None:
        ref_text = render_steps(reference.steps, trajectory_format, remove_thinking=remove_thinking, max_steps=max_steps)
        label = "this same rollout" if reference.source == "self" else "another rollout of the same task"
        parts.append(f"## Reference: a successful rollout ({label})\n{ref_text}")
    parts.append(FINAL_INSTRUCTION)
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]


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
    def from_config(cls, cfg) -> "JudgeClient":
        """A client from the ``algorithm.serl`` section (``judge_*`` keys)."""
        return cls(
            cfg.judge_api_url,
            cfg.judge_model,
            cfg.judge_api_key,
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

    def _http_error(self, resp: httpx.Response) -> _Failure:
        body = resp.text[:200].replace("\n", " ")
        return _Failure(f"HTTP {resp.status_code} from {resp.request.url}: {body}", retry=resp.status_code in (408, 429) or resp.status_code >= 500)

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
            raise _Failure(f"malformed chat-completions answer from {url}: {resp.text[:200]!r}", retry=False) from None

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
                    return JudgeResult(None, f"{f}{suffix}")
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
