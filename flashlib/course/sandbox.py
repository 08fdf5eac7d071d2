"""Run a learner's code where it cannot reach the grader, the other submissions or the machine.

One call, :func:`run`, runs a command in a folder of its own and returns when the
command ends or its time is up; afterwards no process it started is left. How much
it can hold depends on what the machine offers; :func:`pick_mode` takes the
strongest that works, and :data:`GUARANTEES` says what each one holds:

``bwrap``  Debian's bubblewrap: new user, PID, network, IPC and UTS namespaces (the
           job is user 65534 there, with no capabilities), the whole file system
           read-only except the job's folder, a private ``/tmp``, the graded folder
           hidden; killed with the grader. As root or not.
``user``   the grader runs as root, no bubblewrap: the job runs as an unprivileged
           user id of its own (no account needed), so it can write only its folder
           and world-writable places (``/tmp``), and cannot signal the grader.
``session`` neither: the job runs as the grader's own user. It cannot outlive the
           grader's clean-up, but it could write the user's files or signal the
           grader. Use it for your own tests, not to grade strangers.

In every mode: a new session (process group), resource limits (CPU seconds,
address space, processes, file size, no core dumps), a wall-clock deadline, and a
clean-up that kills every process left: the session, and every orphan the grader
inherits as child subreaper (``user``: every process of the sandbox's user id).
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

MODES = ("bwrap", "user", "session")

GUARANTEES = {
    "bwrap": ("bubblewrap: user 65534 without capabilities in its own user, PID, network and IPC "
              "namespaces; read-only file system except its own folder; private /tmp; the graded folder "
              "hidden; resource limits; nothing survives"),
    "user": ("unprivileged user id (no bubblewrap): writes only its own folder and world-writable "
             "places such as /tmp; cannot signal the grader; resource limits; nothing survives"),
    "session": ("WEAK (no bubblewrap, not root): runs as your user, so it could change your files or "
                "signal the grader; resource limits; nothing survives. Install bubblewrap "
                "(apt install bubblewrap) or grade as root"),
}

#: The user and group id of the ``user`` mode: one no account uses, so that every
#: process with it belongs to the sandbox and can be killed at the end.
SANDBOX_UID = int(os.environ.get("FLASHLIB_SANDBOX_UID", "64642"))


@dataclasses.dataclass(frozen=True)
class Limits:
    """Resource limits of one run (seconds, bytes, processes)."""

    wall_seconds: float = 300.0
    cpu_seconds: int = 900
    memory_bytes: int = 16 * 2**30
    file_bytes: int = 256 * 2**20
    processes: int = 512
    #: The job's folder as a whole (file_bytes bounds one file only): past either, the run is stopped.
    folder_bytes: int = 2 * 2**30
    folder_entries: int = 100_000


#: How often :func:`run` measures the job's folder, in seconds.
FOLDER_POLL_SECONDS = 0.5


@dataclasses.dataclass
class Outcome:
    """How a run ended: its exit code (None if killed at the deadline), the mode, leftovers killed."""

    returncode: int | None
    timed_out: bool
    mode: str
    leftovers_killed: int
    seconds: float
    disk_exceeded: str = ""  # why the run was stopped for what it wrote to its folder ("" if it was not)


# ------------------------------------------------------------------ which mode

@functools.lru_cache(maxsize=None)
def _bwrap_works() -> bool:
    """Whether bubblewrap is installed and can make its namespaces here (asked once per process)."""
    exe = shutil.which("bwrap")
    if not exe:
        return False
    try:
        return subprocess.run([exe, *(_bwrap_base_args()), "true"], capture_output=True,
                              timeout=20).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _world_readable(path: Path) -> bool:
    """Whether an unprivileged user can reach ``path`` (every folder above it searchable)."""
    path = path.resolve()
    for part in [path, *path.parents]:
        try:
            mode = part.stat().st_mode
        except OSError:
            return False
        if part == path and not stat.S_ISDIR(mode):
            if not mode & stat.S_IROTH:
                return False
        elif not mode & stat.S_IXOTH:
            return False
    return True


def user_mode_problem() -> str | None:
    """Why the ``user`` mode cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "the grader is not root"
    import flashlib

    for needed in (Path(sys.executable), Path(flashlib.__file__)):
        if not _world_readable(needed):
            return f"an unprivileged user cannot read {needed}"
    if _processes_of(SANDBOX_UID):
        return f"processes with user id {SANDBOX_UID} exist already (set FLASHLIB_SANDBOX_UID)"
    return None


def pick_mode(requested: str | None = None) -> str:
    """The strongest mode that works here, or ``requested`` (ValueError if it cannot run)."""
    if requested is not None:
        if requested not in MODES:
            raise ValueError(f"sandbox mode: expected one of {MODES}, got {requested!r}")
        if requested == "bwrap" and not _bwrap_works():
            raise ValueError("sandbox mode 'bwrap': bubblewrap is not installed or cannot create "
                             "namespaces here")
        if requested == "user" and user_mode_problem():
            raise ValueError(f"sandbox mode 'user': {user_mode_problem()}")
        return requested
    if _bwrap_works():
        return "bwrap"
    if user_mode_problem() is None:
        return "user"
    return "session"


# ------------------------------------------------------------------ processes

def _processes_of(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", encoding="utf-8") as handle:
                for line in handle:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(entry))
                        break
        except (OSError, ValueError):
            continue
    return pids


def _children_of(pid: int) -> list[int]:
    """Live (not zombie) children of ``pid``."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                children.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return children


_SUBREAPER = False


def _become_subreaper() -> None:
    """Orphans of the job become the grader's children (Linux), so none can hide by double-forking."""
    global _SUBREAPER
    if _SUBREAPER or not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(36, 1, 0, 0, 0) == 0:  # PR_SET_CHILD_SUBREAPER
            _SUBREAPER = True
    except (OSError, AttributeError):
        pass


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _clean_up(process: subprocess.Popen, mode: str, known_children: set[int]) -> int:
    """Kill the job's session and every process it left; return how many leftovers were killed."""
    killed = 0
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.kill()
    process.wait()
    time.sleep(0.05)
    _reap_all()
    for _ in range(50):
        leftovers = [pid for pid in _children_of(os.getpid()) if pid not in known_children]
        if mode == "user":
            leftovers += [pid for pid in _processes_of(SANDBOX_UID) if pid != os.getpid()]
        if not leftovers:
            break
        killed += sum(_kill(pid) for pid in set(leftovers))
        time.sleep(0.02)
        _reap_all()
    return killed


# ------------------------------------------------------------------ running

#: Bytes each private tmpfs (/tmp, /dev/shm) may hold: they live in the machine's memory, and the job's own
#: temporary files go to its folder (TMPDIR), which :func:`folder_over_limits` measures.
TMPFS_BYTES = 256 * 2**20
#: A hidden folder is an empty tmpfs: nothing needs to be written there.
HIDDEN_TMPFS_BYTES = 2**20


@functools.lru_cache(maxsize=None)
def _bwrap_sizes_tmpfs() -> bool:
    """Whether this bubblewrap has ``--size`` (0.5 and later), asked once; without it, tmpfs are unbounded."""
    try:
        return "--size" in subprocess.run([shutil.which("bwrap"), "--help"], capture_output=True, text=True,
                                          timeout=20).stdout
    except (OSError, subprocess.SubprocessError, TypeError):
        return False


def _tmpfs(path: str, size: int) -> list[str]:
    """bwrap's arguments for an empty tmpfs at ``path`` holding at most ``size`` bytes (where bwrap can say so)."""
    return (["--size", str(size)] if _bwrap_sizes_tmpfs() else []) + ["--tmpfs", path]


def _bwrap_base_args() -> list[str]:
    return ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", *_tmpfs("/tmp", TMPFS_BYTES),
            *_tmpfs("/dev/shm", TMPFS_BYTES), "--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534",
            "--die-with-parent", "--new-session"]


def _needed_paths() -> list[str]:
    """What the job must see to run Python and flashlib: the interpreter, its prefix, the package."""
    import flashlib

    return [str(Path(p).resolve()) for p in
            (sys.prefix, sys.base_prefix, Path(sys.executable).parent, Path(flashlib.__file__).parents[1])]


def _bwrap_views(workdir: str, hide) -> list[str]:
    """bwrap arguments after the base ones: what must stay visible, then hidden folders, then the job's folder.

    The base arguments put empty tmpfs over /tmp and /dev/shm; Python or flashlib living
    there (a checkout in /tmp, say) is bound back read-only first, so that a hidden
    folder inside it stays hidden. A folder to hide that holds them is left visible
    (read-only, as everything is).
    """
    needed = _needed_paths()
    views = []
    for path in sorted(set(needed)):
        if any(path == top or path.startswith(top + os.sep) for top in ("/tmp", "/dev/shm")):
            views += ["--ro-bind", path, path]
    for folder in hide:
        folder = str(Path(folder).resolve())
        if not any(path == folder or path.startswith(folder + os.sep) for path in needed + [workdir]):
            views += _tmpfs(folder, HIDDEN_TMPFS_BYTES)
    return views + ["--bind", workdir, workdir]


def _limits_setter(limits: Limits, uid: int | None):
    """What the child runs between fork and exec: nothing that takes a lock (no /proc reading here)."""
    current_processes = len(_processes_of(os.getuid() if uid is None else uid))

    def apply():
        os.setsid()
        for which, value in ((resource.RLIMIT_CPU, limits.cpu_seconds),
                             (resource.RLIMIT_AS, limits.memory_bytes),
                             (resource.RLIMIT_FSIZE, limits.file_bytes),
                             (resource.RLIMIT_CORE, 0),
                             (resource.RLIMIT_NPROC, current_processes + limits.processes)):
            try:
                resource.setrlimit(which, (value, value))
            except (ValueError, OSError):
                pass
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
    return apply


def run(argv: list[str], workdir: str | os.PathLike, env: dict[str, str], limits: Limits = Limits(),
        mode: str | None = None, hide: list[str | os.PathLike] = ()) -> Outcome:
    """Run ``argv`` in ``workdir`` (which it may write) under ``mode``; kill everything left when done.

    ``hide`` lists folders the job must not see (``bwrap``: replaced by an empty
    tmpfs; other modes cannot hide them, but the job cannot write them as ``user``).
    """
    mode = pick_mode(mode)
    workdir = str(Path(workdir).resolve())
    _become_subreaper()
    command = list(argv)
    uid = None
    if mode == "bwrap":
        command = [shutil.which("bwrap"), *(_bwrap_base_args()), *_bwrap_views(workdir, hide),
                   "--chdir", workdir, "--", *argv]
    elif mode == "user":
        uid = SANDBOX_UID
        for root, dirs, files in os.walk(workdir):
            for name in [root] + [os.path.join(root, f) for f in dirs + files]:
                os.chown(name, uid, uid)
    known_children = set(_children_of(os.getpid()))
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=workdir, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               preexec_fn=_limits_setter(limits, uid), close_fds=True)
    returncode, timed_out, disk_exceeded = None, False, ""
    deadline = started + limits.wall_seconds
    while True:
        try:
            returncode = process.wait(timeout=max(0.0, min(FOLDER_POLL_SECONDS, deadline - time.monotonic())))
            break
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                timed_out = True
                break
            disk_exceeded = folder_over_limits(workdir, limits)
            if disk_exceeded:
                break
    leftovers = _clean_up(process, mode, known_children)
    return Outcome(returncode, timed_out, mode, leftovers, time.monotonic() - started, disk_exceeded)


def folder_over_limits(folder: str, limits: Limits) -> str:
    """Why ``folder`` holds more than ``limits`` allow (bytes on disk, or files and folders), or "".

    Measured from outside while the job runs: a per-file size limit alone lets a job fill the disk with many
    files. Links are not followed; sparse files count the blocks they really use; the count stops at the limit.
    """
    used, entries, stack = 0, 0, [folder]
    while stack:
        try:
            with os.scandir(stack.pop()) as listing:
                for entry in listing:
                    entries += 1
                    if entries > limits.folder_entries:
                        return f"its folder holds more than {limits.folder_entries} files and folders"
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        else:
                            used += entry.stat(follow_symlinks=False).st_blocks * 512
                    except OSError:
                        continue
        except OSError:  # removed meanwhile, or unreadable
            continue
        if used > limits.folder_bytes:
            return f"it wrote more than {limits.folder_bytes / 2**20:g} MiB to its folder"
    return ""
