"""Run model-written Python in a separate, fenced-in process.

HumanEval's pass@k executes code a model wrote; nothing here trusts it. ``run_program``
writes the program into a fresh temporary directory and runs it in a child Python with
these fences, layered so that a missing one still leaves the others:

- **a separate process**, started in its own session, killed as a whole process group
  when the **wall-clock timeout** runs out;
- **resource limits** (``setrlimit`` in the child before it starts Python): CPU seconds,
  address space, largest file it may write, number of processes, no core dumps;
- **a fresh temp dir as its working directory**, removed afterwards, and a **clean
  environment** (``PATH``, ``HOME`` = that dir, ``LANG``; Python runs isolated, ``-I``,
  so ``PYTHON*`` variables and the user's site-packages are ignored; ``-B``: no bytecode
  written anywhere);
- **no network, at two levels**: where ``unshare --net`` works (Linux with user
  namespaces, probed once), the child runs in an empty network namespace (loopback only,
  down); always, an audit hook installed before the program's first line refuses every
  socket operation (``socket.*`` events). Which of the two ran is in the result's
  ``network`` field (``"namespace+hook"`` or ``"hook"``);
- the same audit hook **refuses writes outside the temp dir** (``open`` for writing,
  ``os.remove``/``rename``/``mkdir``/... on a path outside it), **starting processes**
  (``subprocess``, ``os.system``, ``exec``, ``fork``...) and **loading C code through
  ctypes**.

Audit hooks guard against a model's mistakes (``shutil.rmtree("/")``, a stray
``requests.get``), not against code written to escape them; the kernel-level fences
(namespace, rlimits, the timeout) are what bound a determined program. Every refusal is
printed on the child's stderr with ``REFUSED_MARK``, so a program that catches the
exception still counts as refused (``SandboxResult.refused``).
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REFUSED_MARK = "[sandbox] refused:"
_OUTPUT_LIMIT = 20_000  # characters of stdout/stderr kept per run


@dataclass(frozen=True)
class Limits:
    """What one sandboxed run may use."""

    timeout_s: float = 10.0  # wall clock
    cpu_s: int = 10
    memory_bytes: int = 2 * 1024**3  # address space (Python alone maps ~30 MB)
    file_bytes: int = 1024**2  # largest file it may write
    processes: int = 1  # RLIMIT_NPROC (not enforced for root; the audit hook still is)


@dataclass
class SandboxResult:
    """How one program ended."""

    returncode: int | None  # None: killed at the wall-clock timeout
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool
    network: str  # "namespace+hook" or "hook"
    refused: list[str] = field(default_factory=list)  # audit events it was refused

    @property
    def passed(self) -> bool:
        """Exited 0 in time and was never refused anything (even if it caught the error)."""
        return self.returncode == 0 and not self.timed_out and not self.refused


# The child's first code: install the audit hook, then run the program. It runs under
# ``python -I -B -c``; its only argument is the program's file name (in the cwd).
_BOOTSTRAP = r'''
import os, sys
MARK = "@MARK@"
ROOT = os.path.realpath(os.getcwd())
source = open(sys.argv[1], encoding="utf-8").read()
code = compile(source, sys.argv[1], "exec")
PROCESS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
           "os.fork", "os.forkpty", "pty.spawn", "os.startfile", "os.kill", "os.killpg")
PATHS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
         "os.symlink", "os.link", "os.truncate", "os.utime", "shutil.rmtree",
         "shutil.copyfile", "shutil.move", "os.listxattr", "os.setxattr", "os.removexattr")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

def inside(path):
    if isinstance(path, int):  # an open file descriptor: what it names was checked
        return True
    path = os.fsdecode(path)
    full = os.path.realpath(os.path.join(ROOT, path))
    return full == ROOT or full.startswith(ROOT + os.sep)

def refuse(event):
    os.write(2, f"{MARK} {event}\n".encode())
    raise PermissionError(f"{MARK} {event}")

def hook(event, args):
    if event.startswith("socket.") or event.startswith("ctypes.") or event in PROCESS:
        refuse(event)
    if event == "open" and args and args[0] is not None:
        mode, flags = args[1] if len(args) > 1 else None, args[2] if len(args) > 2 else 0
        writes = any(c in (mode or "") for c in "wax+") or bool((flags or 0) & WRITE_FLAGS)
        if writes and not inside(args[0]):
            refuse(f"open {os.fsdecode(args[0]) if not isinstance(args[0], int) else args[0]}")
    elif event in PATHS:
        for arg in args[:2]:
            if isinstance(arg, (str, bytes, os.PathLike)) and not inside(arg):
                refuse(f"{event} {os.fsdecode(arg)}")

sys.addaudithook(hook)
del hook
sys.argv = [sys.argv[1]]
exec(code, {"__name__": "__main__", "__file__": sys.argv[0], "__builtins__": __builtins__})
'''.replace("@MARK@", REFUSED_MARK)


@functools.cache
def _unshare_prefix() -> tuple[str, ...]:
    """The command prefix that starts the child in an empty network namespace: plain
    ``unshare --net`` (root), else inside a user namespace; () where neither works here."""
    if not shutil.which("unshare"):
        return ()
    for flags in (("--net",), ("--map-root-user", "--net")):
        try:
            done = subprocess.run(["unshare", *flags, "true"], capture_output=True,
                                  timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return ("unshare", *flags)
    return ()


def network_namespace_works() -> bool:
    """Whether the child gets its own empty network namespace on this machine."""
    return bool(_unshare_prefix())


def _set_limits(limits: Limits):
    """The ``preexec_fn`` that applies ``limits`` in the child before it runs anything."""
    def apply() -> None:
        cpu = max(1, int(limits.cpu_s))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def run_program(source: str, limits: Limits | None = None) -> SandboxResult:
    """Run ``source`` (a whole Python program) in the sandbox; see the module doc."""
    limits = limits or Limits()
    prefix = _unshare_prefix()
    with tempfile.TemporaryDirectory(prefix="ac-sandbox-") as tmp:
        Path(tmp, "program.py").write_text(source, encoding="utf-8")
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "LANG": "C.UTF-8", "TMPDIR": tmp}
        command = [*prefix, sys.executable, "-I", "-B", "-c", _BOOTSTRAP, "program.py"]
        started = time.perf_counter()
        child = subprocess.Popen(command, cwd=tmp, env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 preexec_fn=_set_limits(limits), start_new_session=True)
        timed_out = False
        try:
            out, err = child.communicate(timeout=limits.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(child.pid)
            out, err = child.communicate()
        seconds = time.perf_counter() - started
    stderr = err.decode("utf-8", "replace")
    refused = [line.split(REFUSED_MARK, 1)[1].strip() for line in stderr.splitlines()
               if line.startswith(REFUSED_MARK)]
    return SandboxResult(returncode=None if timed_out else child.returncode,
                         stdout=out.decode("utf-8", "replace")[:_OUTPUT_LIMIT],
                         stderr=stderr[:_OUTPUT_LIMIT], seconds=seconds, timed_out=timed_out,
                         network="namespace+hook" if prefix else "hook", refused=refused)


def _kill_group(pid: int) -> None:
    """Kill the child and anything it started (its own session: one process group)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ------------------------------------------------------------------ pass@k


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` samples of which ``correct`` passed (Chen
    et al. 2021): ``1 - C(n - c, k) / C(n, k)``, as a product so large ``n`` cannot
    overflow."""
    if not 0 <= correct <= n or not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 0 <= correct <= n and 1 <= k <= n "
                         f"(got n={n}, correct={correct})")
    if n - correct < k:
        return 1.0
    missing = 1.0
    for i in range(n - correct + 1, n + 1):
        missing *= 1.0 - k / i
    return 1.0 - missing
