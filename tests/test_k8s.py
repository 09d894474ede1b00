"""deploy/k8s: the manifests against the Kubernetes schemas, and all of it against the code and compose.yaml."""

from __future__ import annotations

import re
from typing import Any

import kubernetes_validate
import pytest
import yaml

from broker import topology
from runtime.engine.worker import Worker, roles_of
from runtime.sdk import load
from tests.compose_spec import ROOT, nats_config, services
from tests.gymbus_cli import envvars_read_by, parse_gymbus

K8S = ROOT / "deploy" / "k8s"
KUBERNETES = "1.33.0"
"""Oldest Kubernetes version the manifests are checked against (strict: unknown fields are errors)."""
DOCS = [doc for path in sorted((K8S / "gymbus").glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]
VALUES = yaml.safe_load((K8S / "nats" / "values.yaml").read_text())
COMPOSE = services()


def of_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in DOCS if d["kind"] == kind]


def named(kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in of_kind(kind) if d["metadata"]["name"] == name]
    return doc


def container(workload: dict[str, Any]) -> dict[str, Any]:
    [c] = workload["spec"]["template"]["spec"]["containers"]
    return c


def env_of(c: dict[str, Any]) -> dict[str, str]:
    """The container's environment: its ConfigMaps, then its own variables, then what the image sets."""
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        env.update(named("ConfigMap", source["configMapRef"]["name"])["data"])
    env.update({e["name"]: e["value"] for e in c.get("env", [])})
    return env


def gymbus_args(c: dict[str, Any]) -> list[str]:
    """`gymbus ...` as the container runs it: command (else the image's entrypoint), then args."""
    entrypoint = c.get("command") or ["gymbus", "worker"]
    assert entrypoint[0] == "gymbus"
    return [*entrypoint[1:], *c.get("args", [])]


@pytest.mark.parametrize("doc", [d for d in DOCS if d["apiVersion"] != "keda.sh/v1alpha1"], ids=lambda d: d["kind"])
def test_manifests_follow_the_kubernetes_schemas(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)  # raises ValidationError with the field's path


@pytest.mark.parametrize("workload", of_kind("Deployment") + of_kind("Job"), ids=lambda d: d["metadata"]["name"])
def test_workloads_run_real_commands_from_the_compose_images(workload: dict[str, Any]) -> None:
    c = container(workload)
    image_env = {"GYMBUS_FUNCTION": ""}  # the image's ENV; the Deployments pass the function explicitly
    parse_gymbus(gymbus_args(c), {**image_env, **env_of(c)})
    built = {svc.spec.get("image") for svc in COMPOSE.values() if svc.image is not None}
    assert c["image"] in built, f"{c['image']} is not an image compose.yaml builds"
    limits = {f"GYMBUS_{name.upper()}" for name in topology.Limits.__dataclass_fields__}
    unknown = {k for k in env_of(c) if k.startswith("GYMBUS_")} - envvars_read_by(gymbus_args(c)) - limits
    assert unknown <= {"GYMBUS_LOG", "GYMBUS_HTTP_PORT", "GYMBUS_MODEL_URL"}, unknown
    pod = workload["spec"]["template"]["spec"]
    image = next(svc.image for svc in COMPOSE.values() if svc.spec.get("image") == c["image"])
    assert str(pod["securityContext"]["runAsUser"]) == image.user.split(":")[0]  # type: ignore[union-attr]
    assert pod["securityContext"]["runAsNonRoot"] is True


WORKER_DEPLOYMENTS = [d for d in of_kind("Deployment") if gymbus_args(container(d))[0] == "worker"]


@pytest.mark.parametrize("deployment", WORKER_DEPLOYMENTS, ids=lambda d: d["metadata"]["name"])
def test_workers_are_probed_on_their_health_port_and_drain(deployment: dict[str, Any]) -> None:
    c = container(deployment)
    [port] = c["ports"]
    assert str(port["containerPort"]) == env_of(c)["GYMBUS_HTTP_PORT"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    assert "httpGet" not in c["livenessProbe"]  # a broker outage makes /healthz 503: not a reason to restart
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > Worker.__dataclass_fields__["drain_timeout_s"].default


def test_every_workload_connects_as_its_own_identity() -> None:
    """A Secret per identity (`gymbus auth init`), mounted into the one workload that is that identity."""
    from broker.auth import identities

    names = {i.name for i in identities(["simple_agent"], ["math"])}
    used = []
    for workload in of_kind("Deployment") + of_kind("Job"):
        c, pod = container(workload), workload["spec"]["template"]["spec"]
        identity = env_of(c)["NATS_NKEY"].rsplit("/", 1)
        [volume] = [v for v in pod["volumes"] if v["name"] == "identity"]
        [mount] = [m for m in c["volumeMounts"] if m["name"] == "identity"]
        assert mount["mountPath"] == identity[0] and mount["readOnly"] is True
        name = identity[1].removesuffix(".nk")
        assert name in names and volume["secret"]["secretName"] == f"gymbus-{name.replace('_', '-')}"
        used.append(name)
    assert sorted(used) == ["admin", "agent-simple_agent", "env-math", "janitor"]


def test_config_reaches_the_helm_release() -> None:
    env = named("ConfigMap", "gymbus-env")["data"]
    conf = nats_config()
    assert env["GYMBUS_NATS_URL"] == f"nats://nats.nats.svc.cluster.local:{conf['port']}"  # release nats, ns nats
    compose_env = COMPOSE["simple_agent"].env
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == compose_env["OTEL_EXPORTER_OTLP_PROTOCOL"]
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"].endswith(":4318")  # OTLP over HTTP
    assert env["GYMBUS_MODEL_URL"] == ""  # empty: the models bucket (gymbus model serve registers there)


def test_init_job_provisions_every_deployed_function() -> None:
    args = gymbus_args(container(named("Job", "gymbus-init")))
    ctx = parse_gymbus(args, {})
    deployed = {gymbus_args(container(d))[1] for d in WORKER_DEPLOYMENTS}
    assert set(ctx.params["agent"]) | set(ctx.params["env"]) == deployed


@pytest.mark.parametrize("scaled", of_kind("ScaledObject"), ids=lambda d: d["metadata"]["name"])
def test_scaled_objects_watch_the_consumers_of_their_deployment(scaled: dict[str, Any]) -> None:
    spec = scaled["spec"]
    deployment = named("Deployment", spec["scaleTargetRef"]["name"])
    function = load(gymbus_args(container(deployment))[1])
    expected = {topology.durable(role, function.name) for role in roles_of(function)}
    triggers = spec["triggers"]
    assert {t["metadata"]["consumer"] for t in triggers} == expected
    for t in triggers:
        meta = t["metadata"]
        assert t["type"] == "nats-jetstream" and meta["stream"] == topology.WORK_STREAM
        assert meta["account"] == "$G"  # no accounts configured
        assert (
            meta["natsServerMonitoringEndpoint"]
            == f"nats-headless.nats.svc.cluster.local:{VALUES['config']['monitor']['port']}"
        )
        assert int(meta["lagThreshold"]) >= 1 and int(meta["activationLagThreshold"]) >= 0
    assert spec["minReplicaCount"] == 0 and spec["maxReplicaCount"] > 0  # from zero: the init Job made the consumers


def test_helm_values_match_the_compose_broker() -> None:
    conf, config = nats_config(), VALUES["config"]
    env = named("ConfigMap", "gymbus-env")["data"]
    assert int(env["GYMBUS_STREAM_REPLICAS"]) == config["cluster"]["replicas"]  # every stream on every node
    assert (
        config["cluster"]["enabled"] and config["cluster"]["replicas"] % 2 == 1 and config["cluster"]["replicas"] >= 3
    )
    assert config["jetstream"]["enabled"] and config["jetstream"]["fileStore"]["pvc"]["enabled"]
    assert config["jetstream"]["merge"]["sync_interval"] == conf["sync_interval"] == "always"
    assert config["merge"]["max_payload"] == _bytes(conf["max_payload"]) == topology.MAX_MSG_SIZE
    assert config["monitor"]["enabled"] and config["monitor"]["port"] == int(conf["http_port"])
    image = VALUES["container"]["image"]
    assert f"{image['repository']}:{image['tag']}" == COMPOSE["nats"].spec["image"]  # one server version


def _bytes(size: str) -> int:
    number, unit = re.fullmatch(r"(\d+)\s*([KMG]?)B?", size.upper()).groups()  # type: ignore[union-attr]
    return int(number) * 1024 ** " KMG".index(unit or " ")


def test_readme_lists_every_manifest() -> None:
    readme = (K8S / "README.md").read_text()
    for path in [*sorted((K8S / "gymbus").glob("*.yaml"))[1:], K8S / "nats" / "values.yaml"]:
        assert str(path.relative_to(K8S)) in readme
