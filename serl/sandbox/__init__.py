"""Code sandboxes for the math-with-a-code-interpreter setting: the model writes Python, a
sandbox runs it, the output comes back to the model as a tool turn.

Two backends behind one interface (:class:`Sandbox`: ``run``, ``run_many``, ``stats``,
``close``), made by name with :func:`make_sandbox`:

- ``"local"`` (:class:`LocalSandbox`, the default): one ``python -I -S`` subprocess per program
  with resource limits, a wall-clock timeout, an empty environment and capped output; isolated
  in its own network, pid, user and mount namespaces (read-only file system) where ``unshare``
  works on the machine (:meth:`LocalSandbox.isolation_report` says what holds here).
- ``"sandbox_fusion"`` (:class:`SandboxFusionSandbox`): the HTTP client of a SandboxFusion
  server, as SPEAR's math runs use.

:func:`tool_response_text` turns a result into the text the model sees (SPEAR's verbatim rules,
or serl's fix that keeps stdout next to stderr) and :func:`truncate_tool_output` cuts it.
Threat model, defaults and message rules: ``docs/sandbox.md``.

This package is a leaf: it imports only the standard library, ``httpx`` and :mod:`serl.errors`.
"""

from __future__ import annotations

from typing import Any

from serl.sandbox.base import STATUSES, BaseSandbox, ExecutionResult, Sandbox, SandboxError, Status
from serl.sandbox.fusion import SandboxFusionSandbox
from serl.sandbox.local import LocalSandbox
from serl.sandbox.messages import tool_response_text, truncate_tool_output
from serl.sandbox.preludes import PRELUDES

#: backend name -> class; :func:`make_sandbox` passes its options to the class
SANDBOX_BACKENDS: dict[str, type[BaseSandbox]] = {"local": LocalSandbox, "sandbox_fusion": SandboxFusionSandbox}


def make_sandbox(backend: str = "local", **options: Any) -> BaseSandbox:
    """Build the sandbox ``backend`` (a key of :data:`SANDBOX_BACKENDS`) with ``options``
    (the keyword arguments of :class:`LocalSandbox` or :class:`SandboxFusionSandbox`).

    Raises:
        SandboxError: unknown backend, or the backend rejected its options (unknown or invalid
            option, isolation required but unavailable).
    """
    cls = SANDBOX_BACKENDS.get(backend)
    if cls is None:
        raise SandboxError(f"unknown sandbox backend {backend!r}; expected one of {sorted(SANDBOX_BACKENDS)}")
    try:
        return cls(**options)
    except TypeError as e:  # an unknown keyword: say which backend rejected it
        raise SandboxError(f"bad options for sandbox backend {backend!r}: {e}") from e


__all__ = ["STATUSES", "BaseSandbox", "ExecutionResult", "LocalSandbox", "PRELUDES", "SANDBOX_BACKENDS", "Sandbox",
           "SandboxError", "SandboxFusionSandbox", "Status", "make_sandbox", "tool_response_text",
           "truncate_tool_output"]
