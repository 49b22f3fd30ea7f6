"""Run one child process with a wall-clock deadline and capped output capture, then make sure
nothing of it is left: the low-level half of :class:`serl.sandbox.local.LocalSandbox`.

The child is started in a new session (``setsid``: its own process group). Both pipes are read
incrementally with :mod:`selectors`; bytes beyond the cap are read and discarded, so a 100 MB
``print`` costs no memory and the child never blocks on a full pipe. The child's exit is watched
through a pidfd (Linux >= 5.3; else a ``waitid(WNOWAIT)`` poll), which does not reap it, so its
process group id cannot be reused before the final ``killpg``. Whatever happens, the process
group is killed with ``SIGKILL`` and the child is reaped before :func:`run_capped` returns;
without a pid namespace the descendants found in ``/proc`` at that moment are killed too (those
that left the session, e.g. a fork bomb calling ``setsid``).
"""

from __future__ import annotations

import os
import select
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

#: after the child exited, how long to keep reading pipes still held open by its descendants
EXIT_GRACE_S = 0.2
#: how long a SIGKILLed child may take to be reaped before :func:`run_capped` gives up
REAP_TIMEOUT_S = 10.0


@dataclass
class RawRun:
    """What :func:`run_capped` saw: the exit code (``subprocess`` convention, ``-N`` for signal
    ``N``), the captured bytes, whether each stream was cut, whether the deadline hit, seconds."""

    return_code: int | None
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    wall_s: float


def run_capped(argv: list[str], *, cwd: str, env: dict[str, str], timeout_s: float, max_bytes: int,
               own_pid_namespace: bool) -> RawRun:
    """Run ``argv`` to its end or to ``timeout_s`` wall seconds, capturing at most ``max_bytes``
    of stdout and of stderr each.

    ``own_pid_namespace``: the child creates a pid namespace whose death kills all its processes
    (then the process-group kill is enough and ``/proc`` is not scanned).

    Raises:
        OSError: the child could not be started (e.g. ``argv[0]`` missing).
        subprocess.TimeoutExpired: a SIGKILLed child was not reaped within ``REAP_TIMEOUT_S``.
    """
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
    try:
        out, err, timed_out = _collect(proc, start + timeout_s, max_bytes)
    finally:
        _kill_all(proc, scan_descendants=not own_pid_namespace)
        proc.stdout.close()
        proc.stderr.close()
    return RawRun(None if timed_out else proc.returncode, bytes(out[0]), bytes(err[0]), out[1], err[1],
                  timed_out, time.monotonic() - start)


def _collect(proc: subprocess.Popen, deadline: float, max_bytes: int):
    """Read both pipes until they close and the child exited (or ``EXIT_GRACE_S`` after its
    exit), or the deadline. Returns ``([stdout, cut], [stderr, cut], timed_out)``."""
    bufs = {"out": [bytearray(), False], "err": [bytearray(), False]}
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout.fileno(), selectors.EVENT_READ, "out")
    sel.register(proc.stderr.fileno(), selectors.EVENT_READ, "err")
    pidfd = _pidfd(proc.pid)
    if pidfd is not None:
        sel.register(pidfd, selectors.EVENT_READ, "exit")
    open_pipes, exited_at = 2, None
    try:
        while open_pipes and (exited_at is None or time.monotonic() < exited_at + EXIT_GRACE_S):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bufs["out"], bufs["err"], True
            wait = remaining if pidfd is not None else min(remaining, 0.01)
            if exited_at is not None:
                wait = min(wait, max(0.0, exited_at + EXIT_GRACE_S - time.monotonic()))
            for key, _ in sel.select(wait):
                if key.data == "exit":
                    exited_at = time.monotonic()
                    sel.unregister(key.fd)
                    continue
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                    open_pipes -= 1
                    continue
                buf = bufs[key.data]
                room = max_bytes - len(buf[0])
                buf[0] += chunk[:room]
                buf[1] = buf[1] or len(chunk) > room
            if pidfd is None and exited_at is None and _has_exited(proc.pid):
                exited_at = time.monotonic()
        timed_out = exited_at is None and not _wait_exit(proc.pid, pidfd, deadline)
        return bufs["out"], bufs["err"], timed_out
    finally:
        sel.close()
        if pidfd is not None:
            os.close(pidfd)


def _pidfd(pid: int) -> int | None:
    """A pidfd for ``pid`` (readable once it exits), or ``None`` where the kernel or Python has
    none (then the caller polls)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _has_exited(pid: int) -> bool:
    """``pid`` (our child) has exited; it is not reaped (``WNOWAIT``)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _wait_exit(pid: int, pidfd: int | None, deadline: float) -> bool:
    """Wait, without reaping, until ``pid`` exits or the deadline; True if it exited."""
    while True:
        if _has_exited(pid):
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if pidfd is not None:
            select.select([pidfd], [], [], remaining)
        else:
            time.sleep(min(remaining, 0.01))


def descendants(root: int) -> list[int]:
    """Pids of the live descendants of ``root``, from the parent links in ``/proc/*/stat``
    (empty where ``/proc`` cannot be read). A snapshot: a process forking meanwhile may be missed."""
    children: dict[int, list[int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile, or unreadable: nothing to kill there
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for kid in children.get(todo.pop(), []):
            out.append(kid)
            todo.append(kid)
    return out


def _kill_all(proc: subprocess.Popen, scan_descendants: bool) -> None:
    """SIGKILL the child's process group (and, if asked, its descendants that left it), then
    reap the child. The child is not reaped before the group kill, so the group id is still its."""
    stray = descendants(proc.pid) if scan_descendants else []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the group is already empty
    for pid in stray:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone
    proc.wait(timeout=REAP_TIMEOUT_S)
