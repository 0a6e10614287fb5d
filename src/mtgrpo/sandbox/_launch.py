"""Trusted stage of the code sandbox, run by ``run.py`` for every sandboxed process in a
fresh ``python -I -S -B`` (imported there as ``_launch``, to reuse its compiled bytecode,
and ``main()`` called; the library itself never imports it). It never runs untrusted code.
It builds a sandbox with the kernel's namespaces, starts one harness in it (the program's,
``_harness.py``, or the judge's, ``_judge.py``), and relays the harness's records to the
trainer. A run with tests starts two launchers, one per sandbox, so the program and the
judge share no namespace. Three processes each:

* **launcher** (this script's first process, in the trainer's PID namespace): reads its job
  on stdin, enters new PID, network, IPC and UTS namespaces (as root directly; otherwise
  inside a new user namespace that maps one unprivileged id, 65534, to the caller), forks
  the *reaper*, gives up its own privileges, sends the harness its job on a pipe, and reads
  the harness's records, writing them as report lines to the trainer's report pipe. It dies
  with the thread of the trainer that started it (``PR_SET_PDEATHSIG``), and so does
  everything below it.
* **reaper** (PID 1 of the new PID namespace): enters a new mount namespace, mounts a
  read-only tmpfs root holding only the mount plan of the job (the interpreter, its
  standard library with every non-standard entry hidden, the shared libraries they need,
  the allowed extra paths, four devices and the private working directory
  ``/sandbox/work``, a size-limited tmpfs),
  ``pivot_root``s into it and detaches the old root, forks the harness, drops its own
  privileges and waits. When it exits, the kernel kills whatever is left in the namespace.
* **harness** (PID 2): sets the resource limits, becomes uid/gid 65534 with no capabilities
  at all (bounding, ambient, permitted, effective and inheritable sets emptied and read
  back), ``PR_SET_NO_NEW_PRIVS``, dies with the reaper (``PR_SET_PDEATHSIG``), and execs
  a fresh interpreter on the harness: a new process image, so ``ctypes`` (which this
  module uses) is not loaded in the process that runs the program. The judge's harness
  gets descriptors 5 and 6 to the program's (pipes made by the trainer), and nothing else.

Failures to build the sandbox are reported as ``refused <reason>``: untrusted code is then
not run at all. Report lines (``run.py`` reads them): ``sandbox <mode>``, ``refused
<reason>``, ``program`` and ``syntax <name>`` (the program's harness), ``pass <unit>`` and
``lost`` (the judge's), ``exit <status>``.
"""

from __future__ import annotations

import ctypes
import fcntl
import marshal
import os
import resource
import select
import signal

# the kernel's values from <linux/sched.h> (clone(2)) and <sys/mount.h> (mount(2))
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
# statvfs bits -> mount flags: a bind's remount must keep the ones the kernel locks
ST_FLAGS = {1: MS_RDONLY, 2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: 1024, 2048: 2048,
            4096: 1 << 21}  # fmt: skip
# <linux/prctl.h>, as prctl(2) names them
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_READ, PR_CAPBSET_DROP = 1, 4, 23, 24
PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 38, 47, 4
CAPABILITY_VERSION_3 = 0x20080522  # _LINUX_CAPABILITY_VERSION_3: 64-bit sets (capget(2))
# glibc has no pivot_root wrapper: called by syscall number, per architecture
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "loongarch64": 41, "ppc64le": 203,
              "ppc64": 203, "s390x": 217}  # fmt: skip
SANDBOX_ID = 65534  # uid and gid of the harness ("nobody")
FIRST_FREE_FD = 10  # the harness's descriptors are moved above this before being placed
HARNESS_FDS = 7  # 0 stdin, 1 stdout, 2 stderr, 3 job, 4 records, 5-6 the other harness
RESULT_LINE_LIMIT = 1 << 16  # records other than values are short
LAUNCHER_PATH = os.path.abspath(__file__)


class RefusedError(OSError):
    """The kernel refused a step of building the sandbox: the program must not run."""


def main() -> None:
    job = _read_job()
    report = job["report_fd"]
    _die_with_parent(job["parent_pid"])  # before any namespace: an orphan builds nothing
    try:
        mode = _enter_namespaces(job["user_namespace"])
    except OSError as error:
        _line(report, f"refused {error}")
        return
    pipes = {name: os.pipe() for name in ("job", "results", "setup")}
    # unshare(2): CLONE_NEWPID does not move the caller; its first child is PID 1 there
    reaper = os.fork()
    if reaper == 0:
        _reaper(job, mode, pipes)
    for name, end in (("job", 0), ("results", 1), ("setup", 1)):
        os.close(pipes[name][end])
    for fd in job["peer_fds"]:  # the harness holds them now; EOF must follow its exit
        os.close(fd)
    _drop_launcher_privileges(mode)
    # prctl(2): a change of effective uid or gid clears the parent-death signal
    _die_with_parent(job["parent_pid"])
    _line(report, f"sandbox {mode}")
    token = _send_harness_job(job, pipes["job"][1])
    _serve(token, pipes["results"][0], pipes["setup"][0], report)
    os.waitpid(reaper, 0)
    os._exit(0)  # no interpreter teardown: the trainer waits on this exit


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when the trainer's thread that started it ends, whatever the
    sandboxed program does (the reaper dies with this process, and the PID namespace with
    the reaper); if the trainer has already gone, stop now."""
    # checked after the prctl: a trainer that died before it would never signal (prctl(2):
    # no signal is sent when the parent is already gone)
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def _read_job() -> dict:
    size = int.from_bytes(_read_exactly(8), "little")
    return marshal.loads(_read_exactly(size))


def _read_exactly(size: int) -> bytes:
    chunks, remaining = [], size
    while remaining:
        chunk = os.read(0, min(remaining, 1 << 20))
        if not chunk:
            raise SystemExit("sandbox launcher: job truncated")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _line(fd: int, text: str) -> None:
    # a newline inside an error text would split one record into two lines
    os.write(fd, text.replace("\n", " ").encode("utf-8", "replace") + b"\n")


# ------------------------------------------------------------------------ namespaces


def _libc():
    # the libc already mapped in this process: no library path is searched
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = (ctypes.c_char_p,) * 3 + (ctypes.c_ulong, ctypes.c_char_p)
    libc.umount2.argtypes = (ctypes.c_char_p, ctypes.c_int)
    libc.prctl.argtypes = (ctypes.c_int,) + (ctypes.c_ulong,) * 4
    libc.syscall.restype = ctypes.c_long  # the default int result would truncate a long
    return libc


LIBC = _libc()


def _check(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise RefusedError(number, f"{what}: {os.strerror(number)}")


def _enter_namespaces(user_namespace: bool) -> str:
    """Enter new PID (for children), network, IPC and UTS namespaces; ``"root"`` or ``"user"``.

    As root the namespaces are created directly and the harness later switches to uid
    65534. Otherwise (or when the job asks for it) a user namespace is created first, mapping
    uid and gid 65534 inside to the caller's ids, so the harness is unprivileged both inside
    (a non-zero uid loses every capability on exec) and outside (the caller's own ids).
    """
    # a new network namespace has only a down loopback: test_no_network
    flags = CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    # an unprivileged unshare of these needs a user namespace (user_namespaces(7))
    if os.geteuid() == 0 and not user_namespace:
        _check(LIBC.unshare(flags), "unshare(PID, network, IPC, UTS namespaces)")
        return "root"
    uid, gid = os.geteuid(), os.getegid()
    _check(LIBC.unshare(CLONE_NEWUSER | flags), "unshare(user, PID, network, IPC, UTS)")
    # the kernel refuses an unprivileged gid_map until setgroups is denied (user_namespaces(7))
    for name, text in (("setgroups", "deny"), ("uid_map", f"{SANDBOX_ID} {uid} 1"),
                       ("gid_map", f"{SANDBOX_ID} {gid} 1")):  # fmt: skip
        try:
            with open(f"/proc/self/{name}", "w") as file:
                file.write(text)
        except OSError as error:
            message = f"writing /proc/self/{name}: {error.strerror}"
            raise RefusedError(error.errno, message) from None
    return "user"


# ---------------------------------------------------------------------------- reaper


def _reaper(job: dict, mode: str, pipes: dict) -> None:
    """PID 1 of the sandbox: build the root, start the harness, wait, report its status."""
    setup = pipes["setup"][1]
    for name, end in (("job", 1), ("results", 0), ("setup", 0)):
        os.close(pipes[name][end])
    os.close(job["report_fd"])
    try:
        # prctl(2): fork clears the parent-death signal; the reaper sets its own
        _check(LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")
        cap_last = _cap_last()  # read now: /proc is gone once the new root is pivoted in
        # the mounts below never show in the trainer's namespace
        _check(LIBC.unshare(CLONE_NEWNS), "unshare(mount namespace)")
        _build_root(job["root"], job["mounts"])
        _pivot_root(job["root"])
        os.set_inheritable(setup, False)  # the harness's copy closes on exec
        harness = os.fork()
        if harness == 0:
            _start_harness(job, mode, cap_last, pipes["job"][0], pipes["results"][1], setup)
        _drop_privileges(mode, cap_last)
        # undumpable: the harness (same uid) cannot ptrace PID 1 or read its memory (ptrace(2):
        # the access mode check denies a target whose dumpable attribute is not 1)
        LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        # Dies with the launcher (after the uid switch, which clears the setting); its
        # death ends the PID namespace, so whatever the harness started ends too: when a
        # namespace's init exits, the kernel SIGKILLs every process in it (pid_namespaces(7)).
        _check(LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")
    except BaseException as error:  # nothing untrusted has run: report and stop
        _line(setup, f"refused {error}")
        os._exit(1)
    # PID 1 keeps only the setup pipe: no descriptor of the trainer's stays open
    os.closerange(0, setup)
    os.closerange(setup + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    _line(setup, f"status {_wait_for(harness)}")
    os._exit(0)


def _cap_last() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as file:
            return int(file.read())
    except (OSError, ValueError):
        return 63  # unreadable: try every number a 64-bit capability set can hold


def _wait_for(harness: int) -> int:
    """Reap every process of the namespace; the harness's exit code (negative: a signal)."""
    while True:
        try:
            # PID 1 inherits every orphan of the namespace (pid_namespaces(7)): reaping all
            # keeps zombies out
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return -signal.SIGKILL
        if pid == harness:
            return os.waitstatus_to_exitcode(status)


def _mount(source: str | None, target: str, fstype: str | None, flags: int,
           data: str | None = None) -> None:  # fmt: skip
    def encode(text):
        return (None if text is None else os.fsencode(text))
    result = LIBC.mount(encode(source), encode(target), encode(fstype), flags, encode(data))
    _check(result, f"mount {source or fstype or ''} on {target}")


def _build_root(root: str, mounts: list) -> None:
    """Mount a tmpfs on ``root`` and the plan's entries into it, then make it read-only.

    Entries: ``("bind", source, target, writable, executable)``; ``("only", directory,
    names, prefixes)``: every entry of an already bound directory whose name (up to its
    first dot) is not in ``names`` and starts with none of ``prefixes`` is hidden (an empty
    read-only tmpfs over a directory, an empty file over a file), listed now; and ``("link",
    points_to, path)``: a symbolic link in the tmpfs; ``("tmpfs", target, bytes, inodes)``: the
    writable work directory, owned by uid 65534, no exec. A bind keeps the flags the kernel
    locks on its source (read-only, nosuid, nodev, noexec, atime).
    """
    # private propagation: no mount made here reaches the host's namespace (systemd marks
    # mounts shared, and a copied shared mount stays in its peer group: mount_namespaces(7))
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # the root holds only mount points and links; it is made read-only below
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    empty = os.path.join(root, "sandbox", "empty")  # an empty file to hide files with
    os.makedirs(os.path.dirname(empty))
    open(empty, "w").close()
    for entry in mounts:
        if entry[0] == "link":
            os.symlink(entry[1], root + entry[2])
            continue
        if entry[0] == "tmpfs":
            _, inside, size, inodes = entry
            os.makedirs(root + inside)
            options = f"size={size},nr_inodes={inodes},mode=0700,uid={SANDBOX_ID},gid={SANDBOX_ID}"
            # noexec: test_a_library_the_program_writes_cannot_be_loaded; size and inodes:
            # test_the_work_directory_is_a_kernel_quota
            _mount("tmpfs", root + inside, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, options)
            continue
        if entry[0] == "only":
            _hide_unlisted(root, empty, *entry[1:])
            continue
        _, source, inside, writable, executable = entry
        target = root + inside
        if not os.path.lexists(target):
            if os.path.isdir(source):
                os.makedirs(target)
            else:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                open(target, "w").close()  # a mount point for a file
        _bind(source, target, writable=writable, executable=executable)
    # read-only root: test_no_writes_outside_the_working_directory (MS_REMOUNT changes the
    # flags of the tmpfs already mounted there, mount(2))
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _hide_unlisted(root: str, empty: str, directory: str, names: list, prefixes: list) -> None:
    # a whitelist, not a blacklist: test_ffi_modules_are_unreachable_by_any_path
    keep, starts = frozenset(names), tuple(prefixes)
    for entry in os.listdir(directory):
        target = root + os.path.join(directory, entry)
        if entry.partition(".")[0] in keep or entry.startswith(starts) or os.path.islink(target):
            continue  # a symbolic link resolves inside this root: to what is visible, or nothing
        if os.path.isdir(target):
            _mount("tmpfs", target, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                   "size=4k,nr_inodes=1,mode=0555")  # fmt: skip
        else:
            _bind(empty, target, writable=False, executable=False)


def _bind(source: str, target: str, *, writable: bool, executable: bool) -> None:
    # mount(2): a bind ignores every flag but MS_REC, so read-only and noexec need the
    # MS_REMOUNT | MS_BIND call below
    _mount(source, target, None, MS_BIND | MS_REC)
    # a remount that clears a flag the kernel locked on the source fails with EPERM
    # (mount_namespaces(7): flags propagated into a less privileged namespace are locked)
    locked = os.statvfs(source).f_flag
    # nosuid always: no set-uid binary of a bound path grants privilege
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID
    flags |= sum(flag for bit, flag in ST_FLAGS.items() if locked & bit)
    flags |= 0 if writable else MS_RDONLY
    flags |= 0 if executable else MS_NOEXEC
    # only the four devices open as devices; a device node in any other bind does not
    if not source.startswith("/dev/"):
        flags |= MS_NODEV
    _mount(None, target, None, flags)


def _pivot_root(root: str) -> None:
    """Make ``root`` the root directory and detach the old one (``pivot_root(".", ".")``)."""
    machine = os.uname().machine
    if machine not in PIVOT_ROOT:
        raise RefusedError(0, f"pivot_root: the syscall number for {machine} is not known")
    os.chdir(root)
    # ".", "." stacks the old root under the new one; detached next (pivot_root(2))
    _check(LIBC.syscall(PIVOT_ROOT[machine], b".", b"."), "pivot_root")
    _check(LIBC.umount2(b".", MNT_DETACH), "detaching the old root")
    os.chdir("/")  # no working directory left pointing into the old root


# ---------------------------------------------------------------------------- harness


def _start_harness(job: dict, mode: str, cap_last: int, job_fd: int, result_fd: int,
                   setup: int) -> None:  # fmt: skip
    """In the harness process: descriptors, limits, no privileges, then exec the harness."""
    try:
        setup = _high(setup, cloexec=True)
        # only an io case reads stdin; a program under test reads /dev/null
        stdin = 0 if job["mode"] == "io" else os.open("/dev/null", os.O_RDONLY)
        # descriptors 5 and 6 always exist, /dev/null when there is no other harness
        peers = list(job["peer_fds"]) or [os.open("/dev/null", os.O_RDONLY)] * 2
        _place_descriptors([stdin, 1, 2, job_fd, result_fd, *peers], keep=setup)
        # Limits after the uid switch: switching to a uid already at its RLIMIT_NPROC marks
        # the process, and the kernel then refuses its execve (execve(2), EAGAIN).
        _drop_privileges(mode, cap_last)
        _apply_limits(job["limits"])
        # after the uid switch, which clears it (prctl(2)); kept across this execve
        _check(LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "PR_SET_PDEATHSIG")
        # relative paths of the program resolve inside the work directory
        os.chdir(job["harness_job"]["workdir"])
        interpreter = job["interpreter"]
        # The launcher's path as a last argument (ignored) tells which installation started
        # the process, for whoever lists processes (the tests check that none survives).
        argv = [interpreter, "-I", "-S", "-B", "-X", "utf8", "-c", job["harness"], LAUNCHER_PATH]
        os.execve(interpreter, argv, job["environment"])
    except BaseException as error:
        _line(setup, f"refused {error}")
    os._exit(127)


def _place_descriptors(sources: list[int], keep: int) -> None:
    """Make ``sources[i]`` descriptor ``i``; close every other one except ``keep``."""
    moved = [_high(os.dup(fd), cloexec=False) for fd in sources]
    for number, fd in enumerate(moved):
        os.dup2(fd, number)
    # nothing the trainer had open is inherited by the program
    os.closerange(HARNESS_FDS, keep)
    os.closerange(keep + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def _high(fd: int, *, cloexec: bool) -> int:
    """``fd`` moved to a number of at least :data:`FIRST_FREE_FD` (the original closed)."""
    command = fcntl.F_DUPFD_CLOEXEC if cloexec else fcntl.F_DUPFD
    # above every target, so a dup2 cannot overwrite a source not yet placed
    high = fcntl.fcntl(fd, command, max(FIRST_FREE_FD, fd))
    os.close(fd)
    return high


def _apply_limits(limits: dict) -> None:
    values = {
        # test_memory_bombs: allocations fail with MemoryError (setrlimit(2): brk, mmap and
        # mremap fail with ENOMEM past it)
        resource.RLIMIT_AS: limits["memory_bytes"],
        resource.RLIMIT_CPU: limits["cpu_seconds"],  # test_cpu_limit_kills_a_busy_program
        resource.RLIMIT_FSIZE: limits["file_bytes"],  # test_file_size_and_count_limits
        resource.RLIMIT_NOFILE: limits["max_open_files"],
        # no fork, no thread: test_no_new_processes (a fork bomb too). setrlimit(2): counts
        # threads of the real uid, and is not enforced for uid 0 or CAP_SYS_ADMIN, so it
        # holds only after _drop_privileges
        resource.RLIMIT_NPROC: 0,
        resource.RLIMIT_CORE: 0,  # a crash leaves no core file (a memory image) behind
    }
    for kind, value in values.items():
        # setrlimit(2): SIGXCPU at the soft CPU limit, SIGKILL at the hard one a second later
        hard = value + 1 if kind == resource.RLIMIT_CPU else value
        resource.setrlimit(kind, (value, hard))
    # An ignored signal stays ignored across execve (signal(7)); with SIGXFSZ ignored, a write
    # past RLIMIT_FSIZE fails with EFBIG instead of killing the process (setrlimit(2)).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32))  # fmt: skip


def _drop_privileges(mode: str, cap_last: int) -> None:
    """Become uid/gid 65534 with every capability set empty, and check it."""
    # the bounding set can only be dropped while CAP_SETPCAP is still held: first
    # (capabilities(7), PR_CAPBSET_DROP)
    for capability in range(cap_last + 1):
        LIBC.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0)
    # the ambient set would otherwise carry capabilities across execve (capabilities(7))
    LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if mode == "root":
        os.setgroups([])  # root's supplementary groups would otherwise stay
        # gid first: after the uid switch no right to change it remains
        os.setresgid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID)
        # capabilities(7): when real, effective and saved uids all leave 0, the permitted,
        # effective and ambient sets are cleared
        os.setresuid(SANDBOX_ID, SANDBOX_ID, SANDBOX_ID)
    # version 3 takes two structs, the low and high 32 bits of each set (capget(2)); zeroed
    header, data = _CapHeader(CAPABILITY_VERSION_3, 0), (_CapData * 2)()
    # in a user namespace the uid is already 65534 but the sets are full: empty them
    _check(LIBC.capset(ctypes.byref(header), ctypes.byref(data)), "capset")
    # set-uid files and file capabilities grant nothing across exec (prctl(2): inherited by
    # children and kept across execve, and cannot be unset)
    _check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    # read back, not trusted: test_no_capabilities_anywhere
    _check(LIBC.capget(ctypes.byref(header), ctypes.byref(data)), "capget")
    held = [getattr(part, name) for part in data for name in ("effective", "permitted",
                                                                "inheritable")]  # fmt: skip
    # PR_CAPBSET_READ returns 1 for a capability still in the bounding set (prctl(2))
    bounding = [c for c in range(cap_last + 1) if LIBC.prctl(PR_CAPBSET_READ, c, 0, 0, 0) > 0]
    if any(held) or bounding or os.getuid() != SANDBOX_ID or os.getgid() != SANDBOX_ID:
        raise RefusedError(0, f"privileges remain: capability sets {held}, bounding {bounding}, "
                         f"uid {os.getuid()}, gid {os.getgid()}")  # fmt: skip


def _drop_launcher_privileges(mode: str) -> None:
    """The launcher needs no privilege after the fork: drop them and be undumpable."""
    LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    _drop_privileges(mode, _cap_last())


# -------------------------------------------------------------------------- records


def _send_harness_job(job: dict, fd: int) -> bytes:
    """Write the harness's job (with a fresh token the program's harness writes once its
    top level has run) and close the pipe; the token."""
    harness_job = dict(job["harness_job"])
    # fresh per run: a record with a guessed or stale token is ignored
    token = os.urandom(16).hex().encode()
    harness_job["code_token"] = token
    payload = marshal.dumps(harness_job)
    try:
        with os.fdopen(fd, "wb") as pipe:
            pipe.write(len(payload).to_bytes(8, "little") + payload)
    except BrokenPipeError:  # the harness did not start; the setup pipe says why
        pass
    return token


def _serve(token: bytes, results: int, setup: int, report: int) -> None:
    """Relay the harness's records and the reaper's status until both pipes close."""
    streams = {results: bytearray(), setup: bytearray()}
    # a flooding harness cannot grow the launcher's memory
    budget = {results: RESULT_LINE_LIMIT, setup: RESULT_LINE_LIMIT}
    poller = select.poll()
    for fd in streams:
        poller.register(fd, select.POLLIN | select.POLLHUP)
    while streams:
        for fd, _ in poller.poll():
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                poller.unregister(fd)
                for line in bytes(streams.pop(fd)).split(b"\n"):
                    _dispatch(fd == results, line, token, report)
                continue
            if budget[fd] <= 0:
                continue  # drained past the cap: a flood is read and dropped
            budget[fd] -= len(chunk)
            buffer = streams[fd]
            buffer += chunk
            *complete, rest = bytes(buffer).split(b"\n")
            streams[fd] = bytearray(rest)
            for line in complete:
                _dispatch(fd == results, line, token, report)


def _dispatch(from_harness: bool, line: bytes, token: bytes, report: int) -> None:
    """One record as a report line. The program's harness may write anything on its record
    pipe (the program shares its process), so nothing it writes is a verdict: ``program``
    and ``syntax`` only describe the run. Verdicts come from the judge's launcher."""
    if from_harness:
        if line == b"C" + token:
            _line(report, "program")
        elif line.startswith(b"S "):
            # the name is cut short: the program's process writes on this pipe too
            _line(report, f"syntax {line[2:66].decode('ascii', 'replace')}")
        # only a bounded unit number passes, never free text
        elif line[:1] == b"P" and line[1:].isdigit() and len(line) < 12:
            _line(report, f"pass {int(line[1:])}")
        elif line == b"L":
            _line(report, "lost")
    elif line.startswith((b"status ", b"refused ")):
        head, _, rest = line.partition(b" ")
        text = rest.decode("utf-8", "replace")
        _line(report, f"exit {int(rest)}" if head == b"status" else f"refused {text}")


if __name__ == "__main__":
    main()
