"""The sandbox's child-side bootstrap: run as ``python -I [-S] -c <this source> ARGS`` by
:class:`serl.sandbox.local.LocalSandbox`; never imported by serl (standard library only).

ARGS: ``workdir readonly as_bytes cpu_s fsize_bytes nofile nproc prelude``. Steps, in order:

1. ``readonly == "1"`` (only inside the sandbox's own pid namespace, i.e. when this process is
   pid 1 there): bind the work dir onto itself, then remount every other mount point read-only
   (``MS_REMOUNT | MS_BIND | MS_RDONLY``, keeping the flags a user namespace may not clear);
2. resource limits, soft = hard (CPU: hard = soft + 1 s, so ``SIGXCPU`` comes first):
   RLIMIT_AS, RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_NPROC, RLIMIT_CORE = 0;
3. ``PR_SET_NO_NEW_PRIVS``; as (namespace) root, drop every capability (bounding set, then
   effective/permitted/inheritable), so the program can neither undo the read-only mounts nor
   raise its limits;
4. as pid 1 of a pid namespace: fork, and stay as a minimal init that reaps and exits with the
   program's status (``128 + N`` for a signal ``N``, as shells report it): the namespace's init
   ignores signals it has no handler for, which would make the program immune to its limits'
   signals; when it exits the kernel kills every other process of the namespace;
5. run ``prelude`` and then ``main.py`` in a fresh ``__main__`` module, each compiled on its own,
   so tracebacks give line numbers of the program, not shifted by the prelude; an uncaught
   exception prints the usual traceback without this bootstrap's frame and exits with 1.

A set-up failure prints ``serl-sandbox-setup: <reason>`` on stderr and exits with 121.
"""

import os
import sys

SETUP_EXIT = 121
SETUP_MARK = "serl-sandbox-setup: "
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
# statvfs f_flag bit -> the mount flag to keep on remount (a user namespace may not clear them)
KEEP_FLAGS = {2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME, 2048: MS_NODIRATIME, 4096: MS_RELATIME}
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38


def fail(reason):
    sys.stderr.write(SETUP_MARK + reason + "\n")
    sys.stderr.flush()
    os._exit(SETUP_EXIT)


def mount_points():
    points = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            raw = line.split(b" ")[4]
            points.append(raw.decode("unicode_escape").encode("latin-1").decode("utf-8", "replace"))
    return points


def readonly_mounts(libc, workdir):
    import ctypes

    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        fail("cannot make mounts private: errno %d" % ctypes.get_errno())
    wd = os.fsencode(workdir)
    if libc.mount(wd, wd, None, MS_BIND | MS_REC, None) != 0:
        fail("cannot bind the work dir: errno %d" % ctypes.get_errno())
    for point in mount_points():
        if point == workdir or point.startswith(workdir + "/"):
            continue
        try:
            have = os.statvfs(point).f_flag
        except OSError:
            continue  # unreachable (shadowed by a later mount): neither we nor the program can reach it
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY
        for bit, keep in KEEP_FLAGS.items():
            if have & bit:
                flags |= keep
        if libc.mount(None, os.fsencode(point), None, flags, None) != 0:
            err = ctypes.get_errno()
            if os.path.ismount(point):
                fail("cannot remount %s read-only: errno %d" % (point, err))


def set_limits(as_bytes, cpu_s, fsize, nofile, nproc):
    import resource

    limits = [(resource.RLIMIT_AS, as_bytes, as_bytes), (resource.RLIMIT_CPU, cpu_s, cpu_s + 1),
              (resource.RLIMIT_FSIZE, fsize, fsize), (resource.RLIMIT_NOFILE, nofile, nofile),
              (resource.RLIMIT_NPROC, nproc, nproc), (resource.RLIMIT_CORE, 0, 0)]
    for which, soft, hard in limits:
        if soft >= 0:
            try:
                resource.setrlimit(which, (soft, hard))
            except (ValueError, OSError) as e:
                fail("setrlimit(%d, %d): %s" % (which, soft, e))


def prctl(libc, option, arg):
    import ctypes

    zero = ctypes.c_ulong(0)
    return libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), zero, zero, zero)


def drop_privileges(libc):
    import ctypes

    if prctl(libc, PR_SET_NO_NEW_PRIVS, 1) != 0:
        fail("PR_SET_NO_NEW_PRIVS: errno %d" % ctypes.get_errno())
    if os.geteuid() != 0:
        return
    for cap in range(64):
        if prctl(libc, PR_CAPBSET_DROP, cap) != 0:
            if ctypes.get_errno() == 22:  # EINVAL: past the last capability
                break
            fail("PR_CAPBSET_DROP(%d): errno %d" % (cap, ctypes.get_errno()))

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    data = (Data * 2)()
    if libc.capset(ctypes.byref(Header(0x20080522, 0)), data) != 0:
        fail("capset: errno %d" % ctypes.get_errno())


def become_init():
    child = os.fork()
    if child == 0:
        return
    code = 1
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            code = 128 - code if code < 0 else code
            break
    os._exit(code)


def run_program(workdir, prelude):
    import builtins

    module = type(sys)("__main__")
    glb = module.__dict__
    glb.update(__builtins__=builtins, __file__="main.py")
    sys.modules["__main__"] = module
    sys.argv = ["main.py"]
    sys.path.insert(0, workdir)
    with open(os.path.join(workdir, "main.py"), encoding="utf-8", errors="replace") as f:
        source = f.read()
    try:
        if prelude:
            exec(compile(prelude, "<prelude>", "exec"), glb)
        exec(compile(source, "main.py", "exec"), glb)
    except SystemExit:
        raise
    except BaseException as e:  # print it as the interpreter would, minus this frame
        e.__traceback__ = e.__traceback__.tb_next  # the hook prints the exception's own traceback
        sys.excepthook(type(e), e, e.__traceback__)
        sys.exit(1)


def main(argv):
    workdir, readonly, as_bytes, cpu_s, fsize, nofile, nproc, prelude = argv
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    in_namespace = os.getpid() == 1
    if readonly == "1":
        if not in_namespace:
            fail("read-only mounts need the sandbox's own pid and mount namespaces")
        readonly_mounts(libc, workdir)
    set_limits(int(as_bytes), int(cpu_s), int(fsize), int(nofile), int(nproc))
    drop_privileges(libc)
    if in_namespace:
        become_init()
    os.chdir(workdir)
    run_program(workdir, prelude)


if __name__ == "__main__":
    main(sys.argv[1:])
