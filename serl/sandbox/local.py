"""The local sandbox: one short-lived Python subprocess per program, isolated with Linux
namespaces where the machine allows it. See ``docs/sandbox.md`` for the threat model.

Each call: a fresh work dir (``tempfile.mkdtemp``, removed afterwards whatever happens) holding
``main.py``; the child ``python -I -S -c <bootstrap>`` (:mod:`serl.sandbox._child`) with an
empty environment but ``PATH``, stdin from ``/dev/null``, its own session, resource limits and,
when isolated, ``unshare`` with :data:`~serl.sandbox.isolation.UNSHARE_FLAGS`; a wall-clock
deadline after which the whole process group is SIGKILLed; stdout and stderr captured up to a cap
each (:mod:`serl.sandbox.process`). Defaults follow a CPU-scale reading of SandboxFusion's
runner (``bytedance/SandboxFusion@469de0845cb7d665bc68044d541aa3aa28c5b30a:sandbox/runners/base.py``,
which applies RLIMIT_AS inside a network namespace and a cgroup).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path

from serl.sandbox import _child
from serl.sandbox.base import BaseSandbox, ExecutionResult, SandboxError
from serl.sandbox.isolation import UNSHARE_FLAGS, Isolation, find_unshare, probe_isolation
from serl.sandbox.preludes import NEEDS_SITE, PRELUDES
from serl.sandbox.process import run_capped

log = logging.getLogger(__name__)

#: the bootstrap's source, passed with ``-c`` (no file of serl is read by the child)
CHILD_SOURCE = Path(_child.__file__).read_text(encoding="utf-8")
#: the child's whole environment (plus OpenBLAS/OpenMP thread caps with the numpy prelude)
CHILD_PATH = "/usr/local/bin:/usr/bin:/bin"
MIB = 1 << 20
_PROBE_TIMEOUT_S = 10.0
_warned_unisolated = threading.Event()
_SIGNAL_NOTES = {signal.SIGXCPU: "CPU time limit", signal.SIGKILL: "SIGKILL (CPU hard limit, memory, or a kill)",
                 signal.SIGSEGV: "segmentation fault (often the memory limit)"}


class LocalSandbox(BaseSandbox):
    """Run Python programs in local subprocesses.

    Args:
        timeout_s: wall-clock seconds per program (start-up included); then the process group
            is SIGKILLed and the result is ``"timeout"``.
        memory_mb: RLIMIT_AS in MiB (fractions allowed, as for ``file_size_mb``) (address space, not RSS: a big ``bytearray`` raises
            ``MemoryError``, reported as ``"killed"``).
        cpu_s: RLIMIT_CPU in seconds, rounded up (SIGXCPU, then SIGKILL one second later).
        file_size_mb: RLIMIT_FSIZE in MiB (a bigger write fails with ``OSError: [Errno 27]``).
        max_open_files: RLIMIT_NOFILE.
        max_processes: RLIMIT_NPROC; counts every process of the user and is not enforced for
            root, so fork bombs are bounded by the timeout and the group kill (docs/sandbox.md).
        max_output_bytes: bytes of stdout and of stderr kept each; the rest is read and dropped.
        max_concurrency: programs at once (default: CPU cores).
        prelude: a key of :data:`~serl.sandbox.preludes.PRELUDES` (``"math"``, ``"spear"``,
            ``"spear_numpy"``, ``"none"``).
        isolate: try namespaces (network, pid, user, mount); ``False`` runs unisolated.
        readonly_fs: with namespaces, also make everything but the work dir read-only.
        warn_unisolated: log one warning per process when programs will run unisolated (an env
            worker whose parent already said so at start-up passes False).
        require_isolation: raise :class:`SandboxError` at construction unless every isolation
            asked for (namespaces, and the read-only fs if ``readonly_fs``) works here.
        python: the interpreter of the child (default: this one).
        tmp_root: where the per-call work dirs are made (default: the system temp dir).

    Raises:
        SandboxError: a bad option, or isolation required but unavailable.
    """

    backend = "local"

    def __init__(self, *, timeout_s: float = 5.0, memory_mb: int = 512, cpu_s: int = 5, file_size_mb: int = 1,
                 max_open_files: int = 64, max_processes: int = 64, max_output_bytes: int = 64 * 1024,
                 max_concurrency: int | None = None, prelude: str = "math", isolate: bool = True,
                 readonly_fs: bool = True, require_isolation: bool = False, warn_unisolated: bool = True,
                 python: str | None = None,
                 tmp_root: str | None = None):
        super().__init__(max_concurrency)
        if prelude not in PRELUDES:
            raise SandboxError(f"unknown prelude {prelude!r}; expected one of {sorted(PRELUDES)}")
        for name, value in dict(timeout_s=timeout_s, memory_mb=memory_mb, cpu_s=cpu_s, file_size_mb=file_size_mb,
                                max_open_files=max_open_files, max_processes=max_processes,
                                max_output_bytes=max_output_bytes).items():
            if value <= 0:
                raise SandboxError(f"{name} must be > 0, got {value}")
        self.timeout_s, self.memory_mb, self.cpu_s, self.file_size_mb = float(timeout_s), memory_mb, cpu_s, file_size_mb
        self.max_open_files, self.max_processes, self.max_output_bytes = max_open_files, max_processes, max_output_bytes
        self.prelude = prelude
        self.python = python or sys.executable
        self.tmp_root = tmp_root or tempfile.gettempdir()
        self._unshare = find_unshare()
        self.isolation: Isolation = probe_isolation(self._probe_run, unshare=self._unshare,
                                                    want_namespaces=isolate, want_readonly=readonly_fs)
        missing = not self.isolation.namespaces or (readonly_fs and not self.isolation.readonly_fs)
        if require_isolation and missing:
            raise SandboxError("the local sandbox cannot isolate programs on this machine "
                               f"({self.isolation.reason}); use a machine where `unshare {' '.join(UNSHARE_FLAGS)}"
                               " -- true` works, the sandbox_fusion backend, or require_isolation=False")
        if warn_unisolated and isolate and not self.isolation.namespaces and not _warned_unisolated.is_set():
            _warned_unisolated.set()
            log.warning("local sandbox: programs run WITHOUT isolation (network, files and processes of "
                        "this user are reachable): %s", self.isolation.reason)

    @property
    def isolated(self) -> bool:
        """Programs run in their own user, network, pid and mount namespaces."""
        return self.isolation.namespaces

    def _command(self, namespaces: bool, readonly: bool, workdir: str) -> list[str]:
        flags = ["-I"] if self.prelude in NEEDS_SITE else ["-I", "-S"]
        limits = [int(self.memory_mb * MIB), math.ceil(self.cpu_s), int(self.file_size_mb * MIB),
                  int(self.max_open_files), int(self.max_processes)]
        cmd = [self.python, *flags, "-c", CHILD_SOURCE, workdir, "1" if readonly else "0",
               *map(str, limits), PRELUDES[self.prelude]]
        return [self._unshare, *UNSHARE_FLAGS, "--", *cmd] if namespaces else cmd

    def _env(self) -> dict[str, str]:
        env = {"PATH": CHILD_PATH}
        if self.prelude in NEEDS_SITE:
            env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        return env

    def _execute(self, code: str) -> ExecutionResult:
        return self._run_with(code, self.isolation.namespaces, self.isolation.readonly_fs, self.timeout_s)

    def _probe_run(self, code: str, namespaces: bool, readonly: bool) -> ExecutionResult:
        """One isolation probe: as :meth:`_run_with` with a longer timeout; a failure to start
        (e.g. ``python`` missing) becomes an ``api_error`` result, i.e. "no isolation"."""
        try:
            return self._run_with(code, namespaces, readonly, max(self.timeout_s, _PROBE_TIMEOUT_S))
        except OSError as e:
            return ExecutionResult("api_error", message=f"{type(e).__name__}: {e}")

    def _run_with(self, code: str, namespaces: bool, readonly: bool, timeout_s: float) -> ExecutionResult:
        """Run ``code`` once with the given isolation and timeout. Raises ``OSError`` if the
        child cannot start (turned into ``api_error`` by :meth:`run`)."""
        workdir = tempfile.mkdtemp(prefix="serl-sandbox-", dir=self.tmp_root)
        try:
            with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8", errors="replace") as f:
                f.write(code)
            raw = run_capped(self._command(namespaces, readonly, workdir), cwd=workdir, env=self._env(),
                             timeout_s=timeout_s, max_bytes=self.max_output_bytes, own_pid_namespace=namespaces)
        finally:
            _remove_tree(workdir)
        out = raw.stdout.decode("utf-8", "replace")
        err = raw.stderr.decode("utf-8", "replace")
        status, rc, message = self._classify(raw.return_code, raw.timed_out, out, err, namespaces)
        return ExecutionResult(status, out, err, rc, raw.wall_s, raw.stdout_truncated, raw.stderr_truncated, message)

    def _classify(self, rc: int | None, timed_out: bool, stdout: str, stderr: str, namespaces: bool):
        """``(status, return_code, message)`` from the child's exit. In a pid namespace the
        bootstrap reports a signal ``N`` as exit code ``128 + N`` (mapped back to ``-N`` here)."""
        if timed_out:
            return "timeout", None, f"wall-clock timeout after {self.timeout_s:g} s"
        if rc == _child.SETUP_EXIT and stderr.startswith(_child.SETUP_MARK):
            return "api_error", None, stderr.splitlines()[0]
        if namespaces and rc and not stdout and stderr.startswith("unshare: "):  # unshare itself failed
            return "api_error", None, stderr.splitlines()[0]
        if namespaces and rc is not None and 128 < rc <= 128 + 64:
            rc = 128 - rc
        if rc is not None and rc < 0:
            note = _SIGNAL_NOTES.get(-rc, "")
            return "killed", rc, f"killed by signal {_signal_name(-rc)}" + (f": {note}" if note else "")
        if rc == 0:
            return "ok", 0, ""
        lines = [line for line in stderr.splitlines() if line.strip()]
        if lines and lines[-1].startswith("MemoryError"):
            return "killed", rc, f"memory limit ({self.memory_mb} MiB address space): MemoryError"
        return "error", rc, f"exit code {rc}"

    def isolation_report(self) -> str:
        """A plain-text description of what this sandbox guarantees on this machine, for the run
        folder (one fact per line)."""
        iso, uid = self.isolation, os.geteuid()
        how = f"{iso.unshare} {' '.join(UNSHARE_FLAGS)}" if iso.namespaces else "none"
        lines = [
            f"backend: local ({self.python} {'-I' if self.prelude in NEEDS_SITE else '-I -S'}, one process per call)",
            f"isolation: {'namespaces (user, network, pid, mount)' if iso.namespaces else 'NONE'} via: {how}",
            "network: " + ("none (own network namespace, loopback down)" if iso.namespaces
                           else "the host's (NOT isolated)"),
            "processes: " + ("own pid namespace: the program sees and signals only its own processes"
                             if iso.namespaces else f"can see and signal every process of uid {uid} (NOT isolated)"),
            "files: " + ("read-only everywhere but the per-call work dir; readable wherever uid "
                         f"{uid} can read" if iso.readonly_fs
                         else f"readable and writable wherever uid {uid} can (NOT isolated)"),
            f"environment: only PATH={CHILD_PATH}" + (" and BLAS thread caps" if self.prelude in NEEDS_SITE else ""),
            f"limits: address space {self.memory_mb} MiB, CPU {self.cpu_s} s, file size {self.file_size_mb} MiB, "
            f"open files {self.max_open_files}, processes {self.max_processes}"
            + (" (not enforced: running as root)" if uid == 0 else "") + ", core dumps 0",
            f"wall timeout: {self.timeout_s:g} s (process group SIGKILLed); output cap: "
            f"{self.max_output_bytes} bytes per stream; concurrency: {self.max_concurrency}",
            f"prelude: {self.prelude}",
        ]
        if iso.reason:
            lines.append(f"notes: {iso.reason}")
        return "\n".join(lines) + "\n"


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return str(n)


def _remove_tree(path: str) -> None:
    """Remove a work dir, also when the program made parts of it unwritable (chmod).

    Raises:
        OSError: it could not be removed (then :meth:`BaseSandbox.run` reports api_error).
    """
    def make_writable_and_retry(func, p, _exc):
        os.chmod(os.path.dirname(p) or p, 0o700)
        if os.path.isdir(p) and not os.path.islink(p):
            os.chmod(p, 0o700)
        func(p)

    shutil.rmtree(path, onerror=make_writable_and_retry)
