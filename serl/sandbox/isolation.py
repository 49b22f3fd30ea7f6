"""Detect, once, which isolation the local sandbox gets on this machine.

Isolation is ``unshare`` (util-linux >= 2.32) with :data:`UNSHARE_FLAGS`: new user (the caller
mapped to root inside, no capability outside), network (no interface but a loopback that is
down: every connect fails with ``ENETUNREACH``), pid (the program sees only its own processes;
when the namespace's init exits the kernel kills them all) and mount namespaces (a fresh
``/proc``; the bootstrap then remounts everything but the work dir read-only). It needs a
kernel with unprivileged user namespaces (or root), and no seccomp/AppArmor rule against
``unshare`` (Docker's default profile blocks it: there, the probe fails and the sandbox runs
unisolated, or refuses with ``require_isolation=True``).

:func:`probe_isolation` runs a small program through the sandbox itself, first with namespaces
and a read-only file system, then with namespaces only, and checks from inside what it got.
"""

from __future__ import annotations

import errno
import json
import shutil
from dataclasses import dataclass
from typing import Callable

from serl.sandbox.base import ExecutionResult

#: the exact flags; see the module docstring
UNSHARE_FLAGS = ("--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc")

#: run inside the sandbox: prints what it can see (pid, interfaces, connect errno, a write outside)
PROBE_CODE = r"""
import json, os, socket
facts = {"pid": os.getpid(), "ppid": os.getppid()}
with open("/proc/net/dev") as f:
    facts["ifaces"] = sorted(line.split(":")[0].strip() for line in f.read().splitlines()[2:])
s = socket.socket()
s.settimeout(1)
try:
    s.connect(("127.0.0.1", 9))
    facts["connect"] = 0
except OSError as e:
    facts["connect"] = e.errno
finally:
    s.close()
outside = os.path.join(os.path.dirname(os.getcwd()), ".serl-sandbox-probe-" + os.urandom(6).hex())
try:
    open(outside, "x").close()
    os.remove(outside)
    facts["write_outside"] = 0
except OSError as e:
    facts["write_outside"] = e.errno
print(json.dumps(facts))
"""


def find_unshare() -> str | None:
    """Path of util-linux's ``unshare`` on ``PATH`` or in ``/usr/bin``, ``/bin``; ``None`` if absent."""
    return shutil.which("unshare") or shutil.which("unshare", path="/usr/bin:/bin")


@dataclass(frozen=True)
class Isolation:
    """What the probe found.

    Attributes:
        namespaces: the program runs in its own user, network, pid and mount namespaces.
        readonly_fs: everything but the per-call work dir is mounted read-only for it.
        unshare: path of the ``unshare`` binary used (``None``: not found or not used).
        reason: why something requested is missing; ``""`` when everything requested works.
    """

    namespaces: bool
    readonly_fs: bool
    unshare: str | None
    reason: str = ""


def _check(result: ExecutionResult, readonly: bool) -> str:
    """``""`` when ``result`` (of :data:`PROBE_CODE`) shows the isolation asked for, else why not."""
    if result.status != "ok":
        detail = (result.stderr.strip().splitlines() or [result.message or result.status])[-1]
        return f"the probe failed ({result.status}): {detail}"
    try:
        facts = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return f"the probe printed no facts: {result.stdout[:200]!r}"
    if facts.get("ifaces") != ["lo"] or facts.get("connect") != errno.ENETUNREACH:
        return f"the network is reachable (interfaces {facts.get('ifaces')}, connect errno {facts.get('connect')})"
    if facts.get("ppid") != 1:
        return f"no pid namespace (the program's parent is pid {facts.get('ppid')})"
    if readonly and facts.get("write_outside") != errno.EROFS:
        return f"a write outside the work dir gave errno {facts.get('write_outside')}, not EROFS"
    return ""


def probe_isolation(run: Callable[[str, bool, bool], ExecutionResult], *, unshare: str | None,
                    want_namespaces: bool, want_readonly: bool) -> Isolation:
    """Find the strongest isolation that works, by running :data:`PROBE_CODE`.

    Args:
        run: ``run(code, namespaces, readonly)`` executes ``code`` in the sandbox with that
            isolation and returns its result (it must not raise).
        unshare: path of the ``unshare`` binary (:func:`find_unshare`), ``None`` if there is none.
        want_namespaces: try namespaces at all (``False``: no probe, no isolation).
        want_readonly: also try the read-only file system.
    """
    if not want_namespaces:
        return Isolation(False, False, None, "isolation was turned off (isolate=False)")
    if unshare is None:
        return Isolation(False, False, None, "no `unshare` binary on PATH (util-linux)")
    reasons = []
    for readonly in ([True, False] if want_readonly else [False]):
        why = _check(run(PROBE_CODE, True, readonly), readonly)
        if not why:
            return Isolation(True, readonly, unshare, "; ".join(reasons))
        reasons.append(f"{'namespaces + read-only fs' if readonly else 'namespaces'}: {why}")
    return Isolation(False, False, None, "; ".join(reasons))
