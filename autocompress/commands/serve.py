"""`autocompress serve`: a Prefect server, MLflow, work pools, deployments and workers.

One command brings up on 127.0.0.1 what a cluster runs (infra/k8s): the Prefect
server (UI, API, schedules, event triggers), an MLflow tracking server (unless
MLFLOW_TRACKING_URI already names one), the work pools prefect.yaml uses (process
pools here), every deployment of prefect.yaml, and one worker per pool. Each
worker has its own AUTOCOMPRESS_HOME, PREFECT_HOME and working directory: what
stages share goes through the artifact store (AUTOCOMPRESS_STORE; S3 to share
nothing local), Prefect's result storage and MLflow. Ctrl-C stops everything it
started (each piece is a process group).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import typer
import yaml

from autocompress.errors import AutoCompressError
from autocompress.serving import (
    PrefectAPI,
    Stack,
    free_port,
    new_auth_string,
    prefect_server_argv,
    secured_server_env,
    start_mlflow_server,
    venv_program,
    wait_http,
    worker_argv,
    worker_env,
    worker_name_for,
)

# The checkout (or installed tree) holding flows/ and tasks/: on workers' PYTHONPATH.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEPLOY_TIMEOUT_S = 300.0


def register(app: typer.Typer) -> None:
    """Add ``serve`` to the main app."""
    app.command("serve")(serve)


def serve(
    file: Path = typer.Option(PROJECT_ROOT / "prefect.yaml", "--file",
                              help="The prefect.yaml whose deployments to serve."),
    port: int = typer.Option(4200, help="Prefect server port on 127.0.0.1 (0: any free)."),
    mlflow_port: int = typer.Option(5000, help="MLflow server port on 127.0.0.1 (0: any free); "
                                    "not started when MLFLOW_TRACKING_URI is http(s)."),
    home: Path = typer.Option(None, help="Where the servers and workers keep their state "
                              "(default $AUTOCOMPRESS_HOME/serve)."),
    worker: list[str] = typer.Option(None, "--workers", "--worker",
                                     help="Pools to start a worker for, comma-separated or "
                                     "repeated (--workers cpu,accelerator; default: one per "
                                     "pool in the file)."),
    no_worker: bool = typer.Option(False, "--no-worker", help="Start no worker."),
    allow_job_overrides: bool = typer.Option(
        False, "--allow-job-overrides",
        help="Let a flow run override its worker's command, environment and working "
             "directory (job variables). Off: anyone who can create a flow run could "
             "otherwise run any command as you."),
) -> None:
    """Serve the deployments of prefect.yaml locally until Ctrl-C.

    Starts the Prefect server and an MLflow server on 127.0.0.1, creates the work
    pools, deploys every deployment (schedules and event triggers included),
    starts a worker per pool and prints the UI addresses. For a shared-nothing
    set-up (as in a cluster) set AUTOCOMPRESS_STORE=s3://bucket/prefix first.

    The Prefect API asks for a password made anew by each serve (basic auth; the UI
    asks for it once: it is printed, and kept in the 0600 worker.env), refuses other
    hosts and origins, and wants CSRF tokens; workers ignore job-variable overrides.
    """
    from autocompress.paths import home as ac_home

    spec = _read_spec(file)
    root = (home or ac_home() / "serve").resolve()
    pools = _pools(spec)
    workers = [] if no_worker else (named_pools(worker) or pools)
    unknown = sorted(set(workers) - set(pools))
    if unknown:
        raise AutoCompressError(f"no deployment in {file} uses pool(s) {unknown}",
                                f"pick from {pools}")
    stack = Stack()
    started = time.monotonic()
    # Ctrl-C and SIGTERM both stop everything, also where serve was started as a background
    # job of a script (such a job inherits SIGINT ignored, so Python's own handler is absent).
    signal.signal(signal.SIGINT, _raise_interrupt)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        env = start_servers(stack, root, port or free_port(), mlflow_port or free_port())
        prepare_pools(env, pools, allow_job_overrides)
        env = with_result_storage(env, root)
        write_worker_env(env, root / "worker.env")
        for pool in workers:  # workers need only their pool: start them while deploying
            start_worker(stack, env, root / "workers" / pool, pool)
        deploy(file, env, root)
        print_addresses(env, root, pools, workers)
        typer.echo(f"ready in {time.monotonic() - started:.0f} s (Ctrl-C stops everything)")
        sys.stdout.flush()
        while True:  # until Ctrl-C or a piece dies
            stack.check()
            time.sleep(1.0)
    except KeyboardInterrupt:
        typer.echo("stopping...")
    finally:
        # A second Ctrl-C must not cut the clean-up short and orphan a server.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stack.stop()
    typer.echo("stopped")


def _raise_interrupt(signum, frame):  # SIGTERM stops like Ctrl-C
    raise KeyboardInterrupt


def _read_spec(file: Path) -> dict:
    try:
        spec = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise AutoCompressError(f"cannot read {file}: {err}",
                                "pass --file path/to/prefect.yaml") from None
    if not isinstance(spec, dict) or not spec.get("deployments"):
        raise AutoCompressError(f"{file} defines no deployments", "see prefect.yaml in the repo")
    return spec


def named_pools(values: list[str] | None) -> list[str]:
    """``--workers cpu,accelerator --workers x`` as ``[cpu, accelerator, x]`` (no repeats)."""
    names = (name.strip() for value in values or [] for name in value.split(","))
    return list(dict.fromkeys(name for name in names if name))


def _pools(spec: dict) -> list[str]:
    """Work pools the deployments use, in first-use order."""
    names = [(d.get("work_pool") or {}).get("name") for d in spec["deployments"]]
    return list(dict.fromkeys(n for n in names if n))


def base_env(root: Path, prefect_url: str, mlflow_url: str) -> dict[str, str]:
    """The environment every served process shares (servers, deploy, workers)."""
    store = os.environ.get("AUTOCOMPRESS_STORE") or str(root / "artifacts")
    if "://" not in store:  # workers have other working directories: no relative paths
        store = str(Path(store).expanduser().resolve())
    path = os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p)
    return {
        **os.environ,
        "PREFECT_API_URL": f"{prefect_url}/api",
        "MLFLOW_TRACKING_URI": mlflow_url,
        "AUTOCOMPRESS_STORE": store,
        "PYTHONPATH": path,
        # Workers look for runs every 2 s (Prefect's default is 10).
        "PREFECT_WORKER_QUERY_SECONDS": os.environ.get("PREFECT_WORKER_QUERY_SECONDS", "2"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "1",
    }


def start_servers(stack: Stack, root: Path, port: int, mlflow_port: int) -> dict[str, str]:
    """Start Prefect (and MLflow unless one is configured); return the shared environment."""
    prefect_url = f"http://127.0.0.1:{port}"
    configured = os.environ.get("MLFLOW_TRACKING_URI", "")
    mlflow_url = configured if configured.startswith(("http://", "https://")) \
        else f"http://127.0.0.1:{mlflow_port}"
    auth_string = new_auth_string()
    env = {**base_env(root, prefect_url, mlflow_url), "PREFECT_API_AUTH_STRING": auth_string}
    server_home = root / "prefect-server"
    server_home.mkdir(parents=True, exist_ok=True)
    server_env = {**env, **secured_server_env(port, auth_string), "PREFECT_HOME": str(server_home)}
    prefect = stack.start("prefect server", prefect_server_argv(port), server_env,
                          root / "logs" / "prefect.log", url=prefect_url)
    mlflow = None
    if mlflow_url != configured:
        store = env["AUTOCOMPRESS_STORE"]
        artifacts = f"{store.rstrip('/')}/mlflow" if store.startswith("s3://") \
            else str(root / "mlartifacts")
        mlflow = start_mlflow_server(stack, mlflow_port, f"sqlite:///{root / 'mlflow.db'}",
                                     artifacts, env, root / "logs" / "mlflow.log")
    wait_http(prefect, "/api/health")
    if mlflow is not None:
        wait_http(mlflow, "/health")
    return env


# Job variables a flow run could set that decide what its worker executes.
LOCKED_JOB_VARIABLES = ("command", "env", "working_dir")


def process_job_template(allow_overrides: bool) -> dict:
    """The process pools' job template; without overrides of what runs, unless allowed.

    Removed from both the variables (so the API refuses a flow run that sets them:
    no other property is allowed) and the job configuration (so a worker never reads
    them): the worker then runs its own flow-run command in its own environment.
    """
    from prefect.workers.process import ProcessWorker  # lazy: Prefect loads in seconds

    template = ProcessWorker.get_default_base_job_template()
    if allow_overrides:
        return template
    for key in LOCKED_JOB_VARIABLES:
        template["variables"]["properties"].pop(key)
        template["job_configuration"].pop(key)
    template["variables"]["additionalProperties"] = False
    return template


def prepare_pools(env: dict[str, str], pools: list[str], allow_job_overrides: bool) -> None:
    """Create each pool as a process pool, or set the job template of an existing one."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectAlreadyExists

    template = process_job_template(allow_job_overrides)
    with client_settings(env), get_client(sync_client=True) as client:
        for name in pools:
            try:
                client.create_work_pool(WorkPoolCreate(name=name, type="process",
                                                       base_job_template=template))
            except ObjectAlreadyExists:
                client.update_work_pool(name, WorkPoolUpdate(base_job_template=template))


def client_settings(env: dict[str, str]):
    """Prefect client settings of this process pointed at the served API, with its auth."""
    from prefect.settings import (
        PREFECT_API_AUTH_STRING,
        PREFECT_API_URL,
        temporary_settings,
    )

    return temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"],
                               PREFECT_API_AUTH_STRING: env["PREFECT_API_AUTH_STRING"]})


def with_result_storage(env: dict[str, str], root: Path) -> dict[str, str]:
    """Where Prefect keeps results (the stage cache, placed steps' outputs) for all workers.

    With an S3 store: an S3Bucket block saved on the server (tasks.storage), named
    as the default result storage so flow results go there too. Otherwise a
    directory under ``root`` that every worker on this machine shares.
    """
    store = env["AUTOCOMPRESS_STORE"]
    if not store.startswith("s3://"):
        results = str(root / "prefect-results")
        return {**env, "AUTOCOMPRESS_RESULTS": results,
                "PREFECT_RESULTS_LOCAL_STORAGE_PATH": results}
    from autocompress.artifacts import s3_endpoint_url
    from tasks.storage import saved_s3_block

    uri = store.rstrip("/") + "/prefect-results"
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or s3_endpoint_url()
    with client_settings(env):
        slug = saved_s3_block(uri, endpoint)
    return {**env, "PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK": slug}


# What a worker started elsewhere needs to join this stack: no cloud credentials
# (each worker has its own), but the Prefect API's password, so the file is 0600.
WORKER_ENV_KEYS = (
    "PREFECT_API_URL", "PREFECT_API_AUTH_STRING", "MLFLOW_TRACKING_URI", "AUTOCOMPRESS_STORE",
    "AUTOCOMPRESS_RESULTS", "PREFECT_RESULTS_LOCAL_STORAGE_PATH",
    "PREFECT_RESULTS_DEFAULT_STORAGE_BLOCK", "PREFECT_WORKER_QUERY_SECONDS",
    "AWS_ENDPOINT_URL_S3", "MLFLOW_S3_ENDPOINT_URL", "PYTHONPATH",
)


def write_worker_env(env: dict[str, str], path: Path) -> None:
    """``KEY=value`` lines another worker can load (``set -a; . worker.env``)."""
    lines = [f"{key}={env[key]}" for key in WORKER_ENV_KEYS if env.get(key)]
    path.unlink(missing_ok=True)  # a file left by an older serve may have wider modes
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("\n".join(lines) + "\n")


def read_worker_env(path: Path) -> dict[str, str]:
    """The inverse of ``write_worker_env``."""
    pairs = (line.partition("=") for line in path.read_text().splitlines() if "=" in line)
    return {key: value for key, _, value in pairs}


def deploy(file: Path, env: dict[str, str], root: Path) -> None:
    """``prefect deploy --all`` from the file's directory (its entrypoints are module paths)."""
    log = root / "logs" / "deploy.log"
    argv = [venv_program("prefect"), "--no-prompt", "deploy", "--all",
            "--prefect-file", str(file.resolve())]
    with open(log, "wb") as out:
        try:
            done = subprocess.run(argv, cwd=file.resolve().parent, env=env, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=DEPLOY_TIMEOUT_S,
                                  start_new_session=True)
        except subprocess.TimeoutExpired:
            raise AutoCompressError(f"prefect deploy took over {DEPLOY_TIMEOUT_S:.0f} s",
                                    f"see {log}") from None
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-800:].strip()
        raise AutoCompressError(f"prefect deploy failed: {tail}", f"see {log}")


def start_worker(stack: Stack, env: dict[str, str], home: Path, pool: str):
    """A process worker for ``pool`` with its own homes and working directory ``home``."""
    name = worker_name_for(pool)
    return stack.start(f"worker {pool}", worker_argv(pool, name), worker_env(env, home, name),
                       home / "worker.log", cwd=home)


def print_addresses(env: dict[str, str], root: Path, pools: list[str],
                    workers: list[str]) -> None:
    prefect_url = env["PREFECT_API_URL"].removesuffix("/api")
    typer.echo(f"Prefect UI   {prefect_url} (it asks for this password once: "
               f"{env['PREFECT_API_AUTH_STRING']})")
    typer.echo(f"MLflow UI    {env['MLFLOW_TRACKING_URI']}")
    typer.echo(f"artifacts    {env['AUTOCOMPRESS_STORE']}")
    typer.echo(f"work pools   {', '.join(pools)} (workers: {', '.join(workers) or 'none'})")
    typer.echo(f"worker env   {root / 'worker.env'} (for workers started elsewhere)")
    for line in schedule_lines(PrefectAPI(env["PREFECT_API_URL"], env["PREFECT_API_AUTH_STRING"])):
        typer.echo(f"schedule     {line}")
    typer.echo("use it from a shell:")
    typer.echo(f"  set -a; . {root / 'worker.env'}; set +a")


def schedule_lines(api: PrefectAPI) -> list[str]:
    """Each deployment's schedules as the server has them (read back, not from the file)."""
    deployments = api.call("/deployments/filter", {})
    lines = []
    for dep in deployments:
        for entry in dep.get("schedules") or []:
            schedule = entry.get("schedule") or {}
            if "cron" in schedule:
                lines.append(f"{dep['name']}: cron {schedule['cron']!r} "
                             f"{schedule.get('timezone') or 'UTC'} "
                             f"({'active' if entry.get('active') else 'paused'})")
    return lines
