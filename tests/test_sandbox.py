"""The local sandbox against real programs and attacks: each returns a bounded result, leaves no
process and no file, and the sandbox keeps working after it.

Every sandbox here makes its work dirs under one folder, ``ROOT``; after each test an autouse
fixture kills any process whose command line names that folder (so a broken implementation
cannot leave a fork bomb running) and then fails the test if there was one, or if a work dir is
left. Isolated-only checks branch on ``LocalSandbox.isolated``: where the machine cannot make
namespaces they check the documented fallback instead.
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import serl.sandbox.local as local_mod
from serl.sandbox import LocalSandbox, SandboxError, make_sandbox, tool_response_text

ROOT = tempfile.mkdtemp(prefix="serl-sandbox-tests-")
atexit.register(shutil.rmtree, ROOT, ignore_errors=True)  # the fixture below checks it is empty
SECRET = "serl-test-secret-4f1d9c"
TIMEOUT = 2.0  # wall seconds for the attack programs: bounds this file's run time


def _marked_pids(marker: str = ROOT) -> list[int]:
    pids = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        pids.append(int(name))
            except OSError:
                continue  # gone meanwhile
    return pids


@pytest.fixture(autouse=True)
def nothing_left_behind():
    os.environ["SERL_TEST_SECRET"] = SECRET
    yield
    left = _marked_pids()
    for pid in left:  # the safety net: whatever the implementation did, nothing keeps running
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"sandbox processes left running: {left}"
    assert os.listdir(ROOT) == [], f"work dirs left: {os.listdir(ROOT)}"


@pytest.fixture(scope="module")
def sb():
    with LocalSandbox(timeout_s=TIMEOUT, tmp_root=ROOT) as box:
        yield box


@pytest.fixture(scope="module")
def plain():
    """The unisolated fallback, available on every machine."""
    with LocalSandbox(timeout_s=TIMEOUT, tmp_root=ROOT, isolate=False) as box:
        yield box


def run(box, code: str, bound_s: float = TIMEOUT + 3):
    start = time.monotonic()
    result = box.run(textwrap.dedent(code))
    assert time.monotonic() - start < bound_s, result
    return result


def still_works(box):
    assert run(box, "print(6 * 7)").stdout == "42\n"


def test_print_and_prelude(sb):
    result = run(sb, "print(sqrt(16), 'é')")
    assert (result.status, result.stdout, result.stderr, result.return_code) == ("ok", "4.0 é\n", "", 0)
    assert tool_response_text(result) == "4.0 é"


def test_exception_traceback_has_the_programs_line_numbers(sb):
    result = run(sb, "x = 1\ny = 0\nprint(x / y)\n")
    assert (result.status, result.return_code) == ("error", 1)
    assert 'File "main.py", line 3, in <module>' in result.stderr
    assert "<string>" not in result.stderr  # the bootstrap's frame is hidden
    assert tool_response_text(result).endswith("ZeroDivisionError: division by zero\nErrors occurred! Check your code.")


def test_spear_prelude_keeps_line_numbers(tmp_path):
    with LocalSandbox(prelude="spear", tmp_root=ROOT, timeout_s=TIMEOUT) as box:
        assert run(box, "print(Counter('aab')['a'], gcd(12, 18), pow(2, 3, 5))").stdout == "2 6 3\n"
        assert 'File "main.py", line 1, in <module>' in run(box, "1 / 0").stderr


def test_bad_utf8_output_and_exit_codes(sb):
    assert run(sb, "import sys; sys.stdout.buffer.write(b'a\\xffb')").stdout == "a\ufffdb"
    result = run(sb, "import sys; sys.exit(3)")
    assert (result.status, result.return_code) == ("error", 3)


def test_infinite_loop_times_out(sb):
    start = time.monotonic()
    result = run(sb, "while True:\n    pass\n")
    assert result.status == "timeout" and result.return_code is None
    assert TIMEOUT <= time.monotonic() - start < TIMEOUT + 1.5
    still_works(sb)


def test_memory_bomb_is_killed(sb):
    result = run(sb, "x = bytearray(2 * 1024 ** 3)\nprint(len(x))")
    assert result.status == "killed" and result.stderr.rstrip().endswith("MemoryError")
    still_works(sb)


def test_limits_cannot_be_raised_and_capabilities_are_dropped(sb, plain):
    code = """
        import resource
        print(open("/proc/self/status").read().split("CapEff:")[1].split()[0])
        resource.setrlimit(resource.RLIMIT_AS, (-1, -1))
    """
    for box in (sb, plain):
        result = run(box, code)
        assert result.stdout == "0000000000000000\n" and "not allowed to raise maximum limit" in result.stderr


@pytest.mark.parametrize("isolated", [True, False], ids=["isolated", "unisolated"])
def test_fork_bomb_is_contained_and_cleaned_up(sb, plain, isolated):
    box = sb if isolated else plain
    # 2**6 = 64 processes, each leaving the session (setsid) so that a process-group kill alone
    # would miss them; they sleep far past the timeout
    code = """
        import os, time
        for _ in range(6):
            if os.fork() == 0:
                os.setsid()
        time.sleep(60)
    """
    result = run(box, code)
    assert result.status == "timeout"
    still_works(box)


@pytest.mark.parametrize("isolated", [True, False], ids=["isolated", "unisolated"])
def test_background_process_dies_with_the_program(sb, plain, isolated):
    """A child left running (holding stdout open) does not keep the call waiting or survive it."""
    code = "import subprocess\nsubprocess.Popen(['sleep', '60'])\nprint('done')"
    result = run(sb if isolated else plain, code, bound_s=1.5)
    assert (result.status, result.stdout) == ("ok", "done\n")


def test_big_file_write_stops_at_the_size_limit(sb):
    code = """
        with open("big", "wb") as f:
            for _ in range(1024):
                f.write(b"x" * (1 << 20))
    """
    result = run(sb, code)
    assert result.status == "error" and "[Errno 27] File too large" in result.stderr


def test_huge_print_is_capped(sb):
    result = run(sb, "print('x' * (100 * 1024 * 1024))")
    assert result.status == "ok" and result.stdout_truncated and not result.stderr_truncated
    assert result.stdout == "x" * sb.max_output_bytes


def test_no_environment_variable_leaks(sb, plain):
    code = "print(repr(open('/proc/self/environ', 'rb').read()))\nimport os\nprint(sorted(os.environ))"
    for box in (sb, plain):
        result = run(box, code)
        assert result.status == "ok" and SECRET not in result.stdout and "SERL_TEST_SECRET" not in result.stdout
        # LC_CTYPE: set by Python itself (PEP 538 locale coercion), not inherited
        assert result.stdout.splitlines()[1] in ("['PATH']", "['LC_CTYPE', 'PATH']")


def test_other_processes_environments_are_out_of_reach_when_isolated(sb):
    """A process started with the secret in its environment: isolated code cannot see it in /proc."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                              env={**os.environ, "SERL_TEST_SECRET": SECRET})
    try:
        code = f"""
            import os
            hits = 0
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    hits += {SECRET!r}.encode() in open(f"/proc/{{pid}}/environ", "rb").read()
                except OSError:
                    pass
            print(hits, os.path.exists("/proc/{holder.pid}"))
        """
        result = run(sb, code)
        assert result.status == "ok"
        if sb.isolated:
            assert result.stdout == "0 False\n"
        else:  # documented: without a pid namespace, other processes of the user are readable
            assert int(result.stdout.split()[0]) >= 1
    finally:
        holder.kill()
        holder.wait()


def test_network_is_unreachable_when_isolated(sb, plain):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    code = f"""
        import socket
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=1).close()
            print("connected")
        except OSError as e:
            print("errno", e.errno)
    """
    try:
        assert run(plain, code).stdout == "connected\n"  # documented: no isolation, no network barrier
        if sb.isolated:
            assert run(sb, code).stdout == f"errno {errno.ENETUNREACH}\n"
        else:
            assert "network" in sb.isolation_report() and "NOT isolated" in sb.isolation_report()
            with pytest.raises(SandboxError, match="cannot isolate"):
                LocalSandbox(tmp_root=ROOT, require_isolation=True)
    finally:
        server.close()


def test_files_outside_the_work_dir(sb):
    code = f"""
        import os
        print(os.getcwd().startswith({ROOT!r}), sorted(os.listdir(".")))
        open("mine.txt", "w").write("ok")
        try:
            open(os.path.join({ROOT!r}, "escaped.txt"), "w").write("x")
            print("written")
        except OSError as e:
            print("errno", e.errno)
    """
    result = run(sb, code)
    assert result.stdout.splitlines()[0] == "True ['main.py']"  # a fresh dir, removed after (fixture)
    if sb.isolation.readonly_fs:
        assert result.stdout.splitlines()[1] == f"errno {errno.EROFS}"
        undo = """
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            print(libc.mount(None, b"/", None, 32 | 4096, None), ctypes.get_errno())  # remount rw
        """
        assert run(sb, undo).stdout == f"-1 {errno.EPERM}\n"
    else:  # documented: without a mount namespace, the user's files are writable
        assert result.stdout.splitlines()[1] == "written"
        os.remove(os.path.join(ROOT, "escaped.txt"))


def test_killing_the_parent_spares_the_caller(sb):
    if not sb.isolated:
        pytest.skip("unisolated: the program can signal its caller (see the next test)")
    result = run(sb, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('still here')")
    assert result.stdout == "still here\n"  # the namespace's init ignores it
    # kill(-1): every process it may signal; in its namespace that is only its own child
    code = ("import os, signal, subprocess\np = subprocess.Popen(['sleep', '30'])\n"
            "os.kill(-1, signal.SIGKILL)\nprint(p.wait())")
    assert run(sb, code).stdout == f"{-signal.SIGKILL}\n"
    still_works(sb)


def test_unisolated_program_can_kill_its_caller_as_documented(tmp_path):
    caller = textwrap.dedent(f"""
        from serl.sandbox import LocalSandbox
        box = LocalSandbox(isolate=False, tmp_root={str(tmp_path)!r})
        box.run("import os, signal; os.kill(os.getppid(), signal.SIGKILL)")
        print("caller survived")
    """)
    done = subprocess.run([sys.executable, "-c", caller], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL and "caller survived" not in done.stdout


def test_concurrency_is_bounded():
    code = "import time\nstart = time.time()\ntime.sleep(0.4)\nprint(start, time.time())"
    with LocalSandbox(max_concurrency=2, tmp_root=ROOT, timeout_s=TIMEOUT) as box:
        results = box.run_many([code] * 6)
        spans = [tuple(map(float, res.stdout.split())) for res in results]
        stats = box.stats()
    assert all(res.status == "ok" for res in results)
    peak = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    assert peak <= 2
    assert stats["calls"] == 6 and stats["status/ok"] == 6 and stats["p50_ms"] >= 400


@pytest.mark.parametrize("unshare, reason", [(None, "no `unshare`"), ("/bin/false", "the probe failed")],
                         ids=["missing", "failing"])
def test_isolation_is_detected_and_can_be_required(monkeypatch, caplog, unshare, reason):
    """Where ``unshare`` is missing or refused (Docker's seccomp profile), the sandbox runs
    unisolated, warns once, and refuses when isolation is required."""
    monkeypatch.setattr(local_mod, "find_unshare", lambda: unshare)
    monkeypatch.setattr(local_mod, "_warned_unisolated", local_mod.threading.Event())
    with caplog.at_level(logging.WARNING, logger="serl.sandbox.local"):
        first = LocalSandbox(tmp_root=ROOT)
        LocalSandbox(tmp_root=ROOT)
    assert not first.isolated and reason in first.isolation.reason
    assert sum("WITHOUT isolation" in rec.message for rec in caplog.records) == 1  # warned once
    assert "isolation: NONE" in first.isolation_report()
    still_works(first)
    with pytest.raises(SandboxError, match="cannot isolate"):
        LocalSandbox(tmp_root=ROOT, require_isolation=True)


def test_required_isolation_holds_here_or_is_refused(sb):
    if sb.isolated and sb.isolation.readonly_fs:
        assert LocalSandbox(tmp_root=ROOT, require_isolation=True).isolated
        report = sb.isolation_report()
        assert "unshare --user --map-root-user --net --pid --fork --kill-child --mount --mount-proc" in report
        assert "network: none" in report and "read-only everywhere but the per-call work dir" in report
    else:
        with pytest.raises(SandboxError):
            LocalSandbox(tmp_root=ROOT, require_isolation=True)


def test_backend_failure_is_a_result_not_a_raise(sb, monkeypatch):
    def broken(*args, **kwargs):
        raise OSError("no such interpreter")

    monkeypatch.setattr(local_mod, "run_capped", broken)
    before = sb.stats()["status/api_error"]
    result = sb.run("print(1)")
    assert result.status == "api_error" and "no such interpreter" in result.message
    assert tool_response_text(result) == "Tool API failed! Please try again."
    assert sb.stats()["status/api_error"] == before + 1


def test_missing_interpreter_is_reported_not_raised(caplog):
    with caplog.at_level(logging.ERROR, logger="serl.sandbox.base"):
        box = LocalSandbox(python="/nonexistent/python3", tmp_root=ROOT, timeout_s=TIMEOUT)
        result = box.run("print(1)")
    assert not box.isolated and "the probe failed (api_error)" in box.isolation.reason, box.isolation.reason
    assert result.status == "api_error" and "nonexistent" in result.message


def test_fractional_limits():
    with LocalSandbox(cpu_s=1.5, memory_mb=256.5, file_size_mb=0.5, isolate=False, tmp_root=ROOT) as box:
        code = "import resource\nprint(resource.getrlimit(resource.RLIMIT_CPU), resource.getrlimit(resource.RLIMIT_FSIZE))"
        assert run(box, code).stdout == "(2, 3) (524288, 524288)\n"


def test_options_and_registry():
    with pytest.raises(SandboxError, match="unknown sandbox backend"):
        make_sandbox("docker")
    with pytest.raises(SandboxError, match="bad options"):
        make_sandbox("local", memory=1)
    with pytest.raises(SandboxError, match="unknown prelude"):
        LocalSandbox(prelude="numpy", isolate=False, tmp_root=ROOT)
    with pytest.raises(SandboxError, match="timeout_s must be > 0"):
        LocalSandbox(timeout_s=0, isolate=False, tmp_root=ROOT)
    box = make_sandbox("local", isolate=False, tmp_root=ROOT)
    box.close()
    with pytest.raises(SandboxError, match="closed"):
        box.run("print(1)")
    with pytest.raises(TypeError):
        LocalSandbox(isolate=False, tmp_root=ROOT).run(b"print(1)")
