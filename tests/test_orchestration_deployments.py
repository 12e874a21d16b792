"""prefect.yaml and infra/ are checked with Prefect's own validators (prefect 3.9).

``prefect deploy`` reads prefect.yaml through ``PrefectYamlModel`` (extra keys
ignored), then validates each trigger with ``DeploymentTriggerAdapter``, builds
schedules with ``_schedule_config_to_deployment_schedule`` and loads each
entrypoint. The same calls run here, plus: parameters validate against each
flow's signature, and the Kubernetes work pool's base job template passes the
server's ``WorkPoolCreate`` validation and its variables schema accepts the job
variables the deployments use.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

import pytest  # noqa: E402
import yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PREFECT_YAML = ROOT / "prefect.yaml"
K8S_TEMPLATE = ROOT / "infra" / "k8s" / "base-job-template.json"


@pytest.fixture(scope="module")
def spec() -> dict:
    return yaml.safe_load(PREFECT_YAML.read_text())


@pytest.fixture(scope="module")
def deployments(spec):
    from prefect.cli.deploy._models import PrefectYamlModel

    model = PrefectYamlModel.model_validate(spec)
    assert model.deployments, "prefect.yaml defines no deployments"
    return [d.model_dump(exclude_unset=True, mode="json") for d in model.deployments]


def _is_template(value) -> bool:
    return isinstance(value, str) and "{{" in value


def test_prefect_yaml_keys_are_all_known(spec):
    # PrefectYamlModel ignores unknown keys, so a typo ("schedule:" for "schedules:")
    # would silently drop a setting: check names against the model's fields.
    from prefect.cli.deploy._models import DeploymentConfig, PrefectYamlModel

    top = set(PrefectYamlModel.model_fields) | {"prefect-version", "definitions"}
    assert set(spec) <= top
    for raw in spec["deployments"]:
        assert set(raw) <= set(DeploymentConfig.model_fields), raw["name"]


def test_entrypoints_load_and_parameters_validate(deployments):
    from prefect.flows import load_flow_from_entrypoint

    names = set()
    for dep in deployments:
        # Module paths (no ':'), so workers import the installed package and need
        # no pull step (prefect.yaml has `pull: []`).
        assert ":" not in dep["entrypoint"], dep["entrypoint"]
        flow = load_flow_from_entrypoint(dep["entrypoint"])
        names.add(dep["name"])
        if dep["entrypoint"] == "flows.placement.run_stage":
            continue  # started by other flows, with the placed step as parameters
        params = dep.get("parameters", {})
        flow.validate_parameters(params)  # raises on unknown or ill-typed parameters
        for trigger in dep.get("triggers") or []:
            merged = {**params, **{k: "x" if _is_template(v) else v
                                   for k, v in trigger.get("parameters", {}).items()}}
            flow.validate_parameters(merged)
    assert len(names) == len(deployments), "deployment names must be unique"


def test_placement_names_steps_and_pools_that_exist(deployments):
    from flows.compress import STEP_NAMES
    from flows.smoke import SMOKE_STEPS

    steps = {*STEP_NAMES, *(s.name for s in SMOKE_STEPS)}
    pools = {dep["work_pool"]["name"] for dep in deployments}
    stage_pools = {dep["name"] for dep in deployments
                   if dep["entrypoint"] == "flows.placement.run_stage"}
    assert stage_pools == pools  # every pool can run a placed step
    for dep in deployments:
        placement = dep.get("parameters", {}).get("placement") or {}
        assert set(placement) <= steps, dep["name"]
        assert set(placement.values()) <= pools, dep["name"]


def test_schedules_and_triggers_pass_prefects_validation(deployments):
    from prefect.cli.deploy._schedules import _schedule_config_to_deployment_schedule
    from prefect.cli.deploy._triggers import _initialize_deployment_triggers
    from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger

    kinds = set()
    for dep in deployments:
        for schedule in dep.get("schedules") or []:
            built = _schedule_config_to_deployment_schedule(schedule)
            kinds.add(type(built["schedule"]).__name__)
        triggers = _initialize_deployment_triggers(dep["name"], copy.deepcopy(
            dep.get("triggers") or []))
        kinds.update(type(t).__name__ for t in triggers)
        for trigger in triggers:
            if isinstance(trigger, DeploymentEventTrigger):
                assert "autocompress.teacher.registered" in trigger.expect
    assert {"CronSchedule", "DeploymentEventTrigger"} <= kinds


def test_event_trigger_matches_what_the_teacher_flow_emits(spec):
    from flows.train_teacher import TEACHER_EVENT

    triggered = [d for d in spec["deployments"] if d.get("triggers")]
    assert triggered and all(TEACHER_EVENT in t["expect"]
                             for d in triggered for t in d["triggers"])
    # The template names payload keys the flow puts in the event.
    source = (ROOT / "flows" / "train_teacher.py").read_text()
    for dep in triggered:
        for trigger in dep["triggers"]:
            assert trigger["parameters"]["teacher"] == "{{ event.payload.model_uri }}"
    assert '"model_uri": f"models:/{registered.name}/{registered.version}"' in source


def test_work_pools_and_kubernetes_gpu_template(deployments):
    from prefect.server.schemas.actions import WorkPoolCreate
    from prefect.utilities.schema_tools import validate
    from prefect.workers.process import ProcessWorker

    template = json.loads(K8S_TEMPLATE.read_text())
    WorkPoolCreate(name="accelerator", type="kubernetes", base_job_template=template)
    manifest = template["job_configuration"]["job_manifest"]
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "{{ gpu }}"
    pools = {dep["work_pool"]["name"]: dep["work_pool"] for dep in deployments}
    assert set(pools) == {"cpu", "accelerator"}
    # The same deployments run on process pools (`autocompress serve`) and on
    # Kubernetes pools of the same names: their job variables fit both.
    process_template = ProcessWorker.get_default_base_job_template()
    for pool in pools.values():
        for variables in (template["variables"], process_template["variables"]):
            validate(pool.get("job_variables", {}), variables, raise_on_error=True,
                     preprocess=True, ignore_required=True)



def test_the_kubernetes_template_lets_no_flow_run_choose_what_runs():
    """The rule of ``autocompress serve``'s process pools (``serve.LOCKED_JOB_VARIABLES``)
    holds for the Kubernetes template: no ``command``/``env`` variable, no placeholder
    for one, and the variables schema refuses any name it does not list (#54)."""
    import re

    from prefect.utilities.schema_tools import ValidationError, validate

    from autocompress.commands.serve import LOCKED_JOB_VARIABLES

    text = K8S_TEMPLATE.read_text()
    template = json.loads(text)
    variables = template["variables"]
    assert variables["additionalProperties"] is False
    locked = [key for key in LOCKED_JOB_VARIABLES if key != "working_dir"]  # process-only
    for key in locked:
        assert key not in variables["properties"] and key not in template["job_configuration"]
    container = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"][
        "containers"][0]
    assert "args" not in container and "command" not in container and "env" not in container
    # Every placeholder names a variable, so none is left for an override to fill.
    placeholders = set(re.findall(r"{{\s*(\w+)\s*}}", text))
    assert placeholders <= set(variables["properties"]), placeholders
    for override in ({"command": "sh -c 'id > ~/pwned'"}, {"env": {"LD_PRELOAD": "/tmp/x"}}):
        with pytest.raises(ValidationError):  # what the API runs on create_flow_run
            validate(override, variables, raise_on_error=True, preprocess=True,
                     ignore_required=True)
    validate({"gpu": 0, "memory": "8Gi"}, variables, raise_on_error=True, preprocess=True,
             ignore_required=True)  # the pool's own settings are still variables


@pytest.mark.skipif(shutil.which("jq") is None, reason="the opt-in filter is a jq program")
def test_the_kubernetes_opt_in_gives_back_command_and_env_only():
    """infra/k8s/allow-job-overrides.jq (the README's opt-in) re-opens exactly the two
    variables: the result is a valid pool template whose pods are those of before."""
    import subprocess

    from prefect.server.schemas.actions import WorkPoolCreate
    from prefect.utilities.schema_tools import validate

    opened = json.loads(subprocess.run(
        ["jq", "-f", str(K8S_TEMPLATE.with_name("allow-job-overrides.jq")), str(K8S_TEMPLATE)],
        check=True, capture_output=True, text=True).stdout)
    WorkPoolCreate(name="accelerator", type="kubernetes", base_job_template=opened)
    validate({"command": "python -m x", "env": {"A": "b"}}, opened["variables"],
             raise_on_error=True, preprocess=True, ignore_required=True)
    closed = json.loads(K8S_TEMPLATE.read_text())
    assert set(opened["variables"]["properties"]) - set(closed["variables"]["properties"]) \
        == {"command", "env"}

def test_compose_file_has_the_services_it_promises():
    compose = yaml.safe_load((ROOT / "infra" / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"prefect-server", "worker", "mlflow", "postgres", "minio"} <= set(services)
    assert "postgresql://" in services["mlflow"]["command"]
    assert services["worker"]["environment"]["AUTOCOMPRESS_STORE"].startswith("s3://")
    dockerfile = (ROOT / "infra" / "Dockerfile").read_text()
    assert "ARG BASE=" in dockerfile and "TORCH_INDEX" in dockerfile
