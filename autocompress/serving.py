"""A local serving stack as process groups: Prefect server, MLflow server, workers.

``autocompress serve`` and the served integration test start the same pieces
through this module, so what the test checks is what a user runs. Each piece is
a subprocess in its own session (process group): stopping it signals the whole
group, so the server's uvicorn workers and a worker's flow-run processes go with
it and nothing is orphaned. Every wait has a deadline.

No Prefect import here (the library stays Prefect-free): the Prefect and MLflow
command lines are started as programs and probed over HTTP.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from autocompress.errors import AutoCompressError

# Flow-run processes import torch, transformers and mlflow; on a loaded 2-core
# machine a server's first start (database migrations) takes tens of seconds.
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0


def own_nice() -> int:
    """This process's nice value, counting its session's autogroup (sched(7)): where
    autogroups are on, the kernel shares the CPU between sessions first."""
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    try:  # "/autogroup-25 nice 19"
        nice = max(nice, int(Path("/proc/self/autogroup").read_text().split()[-1]))
    except (OSError, ValueError, IndexError):
        pass
    return nice


def keep_priority(pid: int) -> None:
    """Give a child started in a session of its own this process's priority. Its new
    session's autogroup starts at nice 0, so a server started from a run that lowered
    its priority (the test suite's, ``nice make ...``) would take a core from the work
    it was lowered for. Popen has returned, so the child's setsid is done."""
    nice = own_nice()
    if nice <= 0:
        return
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except OSError:
        pass  # no autogroups here: the nice value the child inherited is all it takes


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def venv_program(name: str) -> str:
    """A console script of this Python's environment (``prefect``, ``mlflow``)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


@dataclass
class Service:
    """One started process group and the log it writes."""

    name: str
    proc: subprocess.Popen
    log: Path
    url: str | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL the whole group (the leader may be gone while children linger)."""
        _signal_group(self.pid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Stack:
    """The services started so far, stopped in reverse order."""

    services: list[Service] = field(default_factory=list)

    def start(self, name: str, argv: list[str], env: dict[str, str], log: Path,
              cwd: Path | None = None, url: str | None = None) -> Service:
        log.parent.mkdir(parents=True, exist_ok=True)
        if cwd is not None:
            cwd.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    cwd=cwd, start_new_session=True,
                                    stdin=subprocess.DEVNULL)
        keep_priority(proc.pid)
        service = Service(name, proc, log, url)
        self.services.append(service)
        return service

    def get(self, name: str) -> Service:
        for service in self.services:
            if service.name == name:
                return service
        raise KeyError(name)

    def stop(self, name: str | None = None, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop one service by name, or all of them at once.

        All groups get SIGTERM together and share one deadline; what is left
        then gets SIGKILL (a worker waits for its flow runs, a server drains).
        """
        chosen = [s for s in self.services if name is None or s.name == name]
        for service in chosen:
            _signal_group(service.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for service in chosen:
            try:
                service.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for service in chosen:
            service.kill()
            self.services.remove(service)

    def check(self) -> None:
        """Raise if a service died (its log tail says why)."""
        for service in self.services:
            if not service.alive():
                raise AutoCompressError(
                    f"{service.name} exited with code {service.proc.returncode}: "
                    f"{service.log_tail(600).strip()}",
                    f"see the full log at {service.log}")


def wait_http(service: Service, path: str, timeout: float = START_TIMEOUT_S) -> None:
    """Wait until ``service.url + path`` answers 200, the process dies, or the deadline."""
    deadline = time.monotonic() + timeout
    url = f"{service.url}{path}"
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if not service.alive():
            raise AutoCompressError(f"{service.name} exited while starting: "
                                    f"{service.log_tail(800).strip()}",
                                    f"see the full log at {service.log}")
        if time.monotonic() > deadline:
            raise AutoCompressError(f"{service.name} did not answer {url} in {timeout:.0f} s",
                                    f"see its log at {service.log}")
        time.sleep(0.5)


def prefect_server_argv(port: int) -> list[str]:
    """Prefect's server behind the Host/Origin guard of ``tasks.prefect_server``."""
    return [sys.executable, "-m", "tasks.prefect_server", "--port", str(port)]


def local_origins(port: int) -> list[str]:
    """The origins the Prefect UI is served from: the only ones allowed to call its API."""
    return [f"http://127.0.0.1:{port}", f"http://localhost:{port}"]


def new_auth_string() -> str:
    """A fresh ``user:password`` for the Prefect API's basic auth (one per serve)."""
    return f"autocompress:{secrets.token_urlsafe(24)}"


def secured_server_env(port: int, auth_string: str) -> dict[str, str]:
    """Prefect server settings that shut out other users and web pages.

    Basic auth on every API call (the UI asks for the string once), CSRF tokens on
    every state change, and CORS answered only for the UI's own origin. The Host and
    Origin guard in ``tasks.prefect_server`` comes on top of these.
    """
    return {
        "PREFECT_SERVER_API_AUTH_STRING": auth_string,
        "PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED": "true",
        "PREFECT_SERVER_CORS_ALLOWED_ORIGINS": ",".join(local_origins(port)),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }


# A served worker's name, set in its environment (``worker_env``) for its flow runs,
# which record it in the lineage (``flows.placement.worker_name``).
WORKER_NAME_ENV = "AUTOCOMPRESS_WORKER_NAME"

# Retries of a call the server could not serve for a moment (see ``PrefectAPI.call``).
RETRY_CODES = (429, 502, 503)
RETRIES = 4
RETRY_WAIT_S = 0.5


@dataclass
class PrefectAPI:
    """JSON calls to a secured Prefect API with the standard library (auth and CSRF)."""

    url: str  # ends in /api
    auth_string: str | None = None
    csrf: dict[str, str] | None = None  # fetched on the first state change

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if self.auth_string:
            token = base64.b64encode(self.auth_string.encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        return headers

    def _csrf_headers(self) -> dict[str, str]:
        if self.csrf is None:
            client = f"autocompress-{secrets.token_hex(8)}"
            request = urllib.request.Request(f"{self.url}/csrf-token?client={client}",
                                             headers=self.headers())
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    token = json.loads(response.read())["token"]
            except urllib.error.HTTPError as err:
                if err.code != 422:  # 422: the server has CSRF protection off
                    raise
                token = None
            self.csrf = {"Prefect-Csrf-Token": token, "Prefect-Csrf-Client": client} \
                if token else {}
        return self.csrf

    def call(self, path: str, body: dict | None = None, method: str | None = None):
        """GET ``path`` (POST with ``body`` as JSON, or ``method``: PATCH, DELETE) and
        return the decoded answer (None when the server sends no content)."""
        headers = self.headers()
        data = None
        if body is not None or method not in (None, "GET"):
            data = json.dumps(body).encode() if body is not None else None
            headers.update(self._csrf_headers())
        request = urllib.request.Request(f"{self.url}{path}", data=data, headers=headers,
                                         method=method)
        for attempt in range(RETRIES + 1):
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    answer = response.read()
                return json.loads(answer) if answer else None
            except urllib.error.HTTPError as err:
                # A busy server's sqlite answers 503 (and a proxy 502/429) for a moment;
                # Prefect's own client retries these the same way.
                if err.code not in RETRY_CODES or attempt == RETRIES:
                    raise
                time.sleep(RETRY_WAIT_S * 2**attempt)
        return None  # not reached: the last attempt returns or raises


def start_mlflow_server(stack: Stack, port: int, backend_uri: str, artifacts: str,
                        env: dict[str, str], log: Path) -> Service:
    """``mlflow server`` on 127.0.0.1:``port`` (one web worker, artifacts proxied)."""
    argv = [venv_program("mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
            "--workers", "1", "--backend-store-uri", backend_uri,
            "--artifacts-destination", artifacts]
    # Its job runner (8 more processes) serves GenAI features AutoCompress does not
    # use: off unless the environment turns it on.
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true",
           **env}
    return stack.start("mlflow server", argv, env, log, url=f"http://127.0.0.1:{port}")


def worker_argv(pool: str, name: str) -> list[str]:
    return [venv_program("prefect"), "worker", "start", "--pool", pool, "--type", "process",
            "--name", name]


def worker_env(base: dict[str, str], home: Path, name: str | None = None) -> dict[str, str]:
    """A worker's environment: its own AutoCompress and Prefect homes under ``home``.

    Nothing else is local to it: the artifact store, Prefect's results and MLflow
    are named by ``base`` (S3 and servers, or shared directories on one machine).
    ``name`` (the worker's) reaches its flow runs, which record it in the lineage.
    """
    env = {**base, "AUTOCOMPRESS_HOME": str(home), "PREFECT_HOME": str(home / "prefect")}
    return {**env, WORKER_NAME_ENV: name} if name else env


def worker_name_for(pool: str) -> str:
    """The name a worker of ``pool`` started on this machine gets (``host-pool``)."""
    return f"{socket.gethostname()}-{pool}"
