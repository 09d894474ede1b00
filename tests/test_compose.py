"""compose.yaml against the compose spec and against the code: images, files, commands, addresses, checks.

Nothing here needs Docker: the file is validated with the compose-spec JSON Schema, every gymbus
command is parsed by the real CLI under the service's environment, and every address one service uses
for another is checked against what that other service listens on.
"""

from __future__ import annotations

import json
import re
from importlib.resources import files
from pathlib import Path

import jsonschema
import pytest
import yaml

from broker.topology import Limits
from runtime.engine.worker import Worker
from runtime.runs.config import load_config
from runtime.sdk import Agent, Environment, load
from tests.compose_spec import COMPOSE_FILE, ROOT, Service, load_compose, nats_config, services
from tests.gymbus_cli import envvars_read_by, parse_gymbus

SERVICES = services()
GYMBUS = {name: svc for name, svc in SERVICES.items() if svc.runs_gymbus}
WORKERS = {name: svc for name, svc in GYMBUS.items() if svc.argv[:2] == ["gymbus", "worker"]}
LONG_RUNNING = {name for name, svc in GYMBUS.items() if not svc.one_shot}
ON_THE_BROKER = {name for name, svc in GYMBUS.items() if "GYMBUS_NATS_URL" in svc.env}
VOLUMES = set(load_compose().get("volumes") or {})
LIMIT_VARS = {f"GYMBUS_{name.upper()}" for name in Limits.__dataclass_fields__}
PEER = re.compile(r"(?<![\w.-])(" + "|".join(sorted(map(re.escape, SERVICES), key=len, reverse=True)) + r"):(\d+)")


def per_service(names: object) -> list[object]:
    """One parameter per service name."""
    return [pytest.param(n, id=n) for n in names]  # type: ignore[attr-defined]


def peers(text: str) -> list[tuple[str, int]]:
    return [(m.group(1), int(m.group(2))) for m in PEER.finditer(text)]


def collector_config() -> dict:
    return yaml.safe_load((ROOT / "configs" / "otel-collector.yaml").read_text())


def default_config_path() -> str:
    submit = SERVICES["submit"].argv
    return submit[2]


# ---- the file ----------------------------------------------------------------------------------


def test_compose_file_follows_the_compose_spec() -> None:
    schema = json.loads((files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json").read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    raw = yaml.safe_load(COMPOSE_FILE.read_text())
    for document in (raw, load_compose(), load_compose({"GYMBUS_MODEL_URL": "", "RUN_ID": "x"})):
        errors = sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path))
        assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]
    assert "version" not in raw  # obsolete in the compose spec


@pytest.mark.parametrize("name", list(SERVICES))
def test_every_image_is_built_here_or_pinned(name: str) -> None:
    svc = SERVICES[name]
    if svc.image is not None:
        assert svc.image.path.is_file() and svc.image.path.parent.parent.name == "images"
        if "FUNCTION" in svc.build_args:
            assert (ROOT / "functions" / svc.build_args["FUNCTION"] / "requirements.txt").is_file()
    else:
        image = svc.spec["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin a tag, not {image!r}"


def referenced_files() -> list[object]:
    """(service, file) for every repository file a service mounts or names on its command line."""
    pairs = [(name, src.removeprefix("./")) for name, svc in SERVICES.items() for src, _ in svc.mounts]
    pairs = [(name, src) for name, src in pairs if src.split("/")[0] not in VOLUMES]  # a volume's subpath
    named = [(name, arg) for name, svc in SERVICES.items() for arg in svc.argv]
    pairs += [(name, arg) for name, arg in named if arg.startswith(("configs/", "functions/"))]
    pairs = [(name, path) for name, path in pairs if not path.startswith(("/", "~")) and "/" in path]
    return [pytest.param(n, f, id=f"{n}:{f}") for n, f in pairs]


@pytest.mark.parametrize("name,path", referenced_files())
def test_referenced_files_exist(name: str, path: str) -> None:
    assert (ROOT / path).is_file(), f"{name} names {path}, which does not exist"


# ---- commands and environment ------------------------------------------------------------------


@pytest.mark.parametrize("name", per_service(GYMBUS))
def test_gymbus_commands_are_real_with_valid_options(name: str) -> None:
    svc = GYMBUS[name]
    ctx = parse_gymbus(svc.argv[1:], svc.env)  # raises click's usage error on an unknown command or option
    if name in WORKERS:
        assert ctx.params["function"] == svc.build_args["FUNCTION"]  # from GYMBUS_FUNCTION, set by the image
    if "nats" in ctx.params:
        assert ctx.params["nats"] == "nats://nats:4222"


@pytest.mark.parametrize("name", per_service(GYMBUS))
def test_gymbus_variables_are_ones_gymbus_reads(name: str) -> None:
    svc = GYMBUS[name]
    # GYMBUS_FUNCTION and GYMBUS_HTTP_PORT come with the function image, whatever command it runs
    known = envvars_read_by(svc.argv[1:]) | LIMIT_VARS | {"GYMBUS_LOG", "GYMBUS_FUNCTION", "GYMBUS_HTTP_PORT"}
    unknown = {k for k in svc.env if k.startswith("GYMBUS_")} - known
    assert not unknown, f"{name} sets {sorted(unknown)}, which gymbus does not read"


@pytest.mark.parametrize("name", list(WORKERS))
def test_workers_serve_health_on_the_image_port(name: str) -> None:
    svc = WORKERS[name]
    assert "GYMBUS_HTTP_PORT" in envvars_read_by(svc.argv[1:])
    port = svc.env["GYMBUS_HTTP_PORT"]
    assert int(port) in svc.image.expose  # type: ignore[union-attr]
    ctx = parse_gymbus([*svc.argv[1:], "--http-port", port], svc.env)
    assert str(ctx.params["http_port"]) == port


def test_services_share_one_broker_collector_and_limits() -> None:
    for key in ["GYMBUS_NATS_URL", *sorted(LIMIT_VARS)]:
        values = {GYMBUS[name].env.get(key) for name in ON_THE_BROKER}
        assert len(values) == 1, f"{key} differs between services: {values}"
    traced = {name: svc for name, svc in GYMBUS.items() if name != "auth"}  # auth only writes files
    for key in ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_RESOURCE_ATTRIBUTES"]:
        values = {svc.env.get(key) for svc in traced.values()}
        assert len(values) == 1, f"{key} differs between services: {values}"
    assert ON_THE_BROKER == set(GYMBUS) - {"policy", "auth"}  # the simulated policy and the key writer need none
    names = [svc.env.get("OTEL_SERVICE_NAME") for svc in traced.values()]
    assert all(names) and len(set(names)) == len(names)


@pytest.mark.parametrize("name", list(SERVICES))
def test_addresses_name_a_service_on_a_port_it_listens_on(name: str) -> None:
    svc = SERVICES[name]
    texts = [*svc.argv, *svc.env.values(), *(svc.healthcheck or [])]
    texts += [(ROOT / src).read_text() for src, _ in svc.mounts if src.startswith("./")]
    for host, port in peers("\n".join(texts)):
        listening = SERVICES[host].ports
        assert port in listening, f"{name} reaches {host}:{port}, but {host} listens on {listening}"


def test_broker_listens_where_the_services_connect() -> None:
    conf, nats = nats_config(), SERVICES["nats"]
    assert {int(conf["port"]), int(conf["http_port"])} == nats.ports
    assert nats.spec["image"].startswith("nats:") and nats.spec["image"].endswith("-alpine")  # wget for the check
    assert nats.argv == ["nats-server", "--config", "/etc/nats/gymbus.conf"]
    assert ("./configs/nats-server-auth.conf", "/etc/nats/gymbus.conf") in nats.mounts
    assert ("./configs/nats-server.conf", "/etc/nats/nats-server.conf") in nats.mounts
    includes = re.findall(r"^include (\S+)", (ROOT / "configs" / "nats-server-auth.conf").read_text(), flags=re.M)
    assert includes == ["nats-server.conf", "auth/auth.conf"]  # the shipped settings, then the identities
    assert ("auth/server", "/etc/nats/auth") in nats.mounts  # what `gymbus auth init` writes there
    assert ("nats-data", conf["store_dir"]) in nats.mounts  # JetStream's store on a volume
    published = [str(p) for p in nats.spec["ports"]]
    assert published == [f"127.0.0.1:{conf['port']}:{conf['port']}"]  # clients on the host; monitoring unpublished


def test_traces_go_from_every_service_to_the_collector_and_on_to_jaeger() -> None:
    config, collector = collector_config(), SERVICES["otel-collector"]
    assert collector.spec["image"].startswith("otel/opentelemetry-collector-contrib:")
    assert SERVICES["jaeger"].spec["image"].startswith("jaegertracing/jaeger:2.")
    assert ("./configs/otel-collector.yaml", "/etc/otelcol-contrib/config.yaml") in collector.mounts
    assert collector.argv == ["--config=/etc/otelcol-contrib/config.yaml"]

    protocols = config["receivers"]["otlp"]["protocols"]
    listening = {kind: int(p["endpoint"].rsplit(":", 1)[1]) for kind, p in protocols.items()}
    assert set(listening.values()) <= collector.ports
    for svc in (s for name, s in GYMBUS.items() if name != "auth"):  # auth only writes files
        kind = "grpc" if svc.env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "grpc" else "http"
        assert peers(svc.env["OTEL_EXPORTER_OTLP_ENDPOINT"]) == [("otel-collector", listening[kind])]

    traces = config["service"]["pipelines"]["traces"]
    assert traces["receivers"] == ["otlp"]
    assert not {e.split("/")[0] for e in config["exporters"]} & {"jaeger", "logging"}  # removed from the collector
    to_jaeger = [e for e in traces["exporters"] if peers(config["exporters"][e].get("endpoint", ""))]
    assert [peers(config["exporters"][e]["endpoint"])[0][0] for e in to_jaeger] == ["jaeger"]
    assert all(e.split("/")[0] in ("otlp_grpc", "otlp") for e in to_jaeger)


# ---- health, order, scaling --------------------------------------------------------------------


def test_long_running_services_have_health_checks() -> None:
    """`docker compose up --wait` needs a check that means ready on every service that keeps running."""
    without = {name for name in LONG_RUNNING if SERVICES[name].healthcheck is None}
    assert without == set()
    for name in ["nats", "profiler", *WORKERS]:
        check = " ".join(SERVICES[name].healthcheck or [])
        assert "healthz" in check or "gymbus-healthcheck" in check, check
    assert f"localhost:{nats_config()['http_port']}/healthz" in " ".join(SERVICES["nats"].healthcheck or [])


def test_dependencies_wait_for_what_they_need() -> None:
    for name, svc in SERVICES.items():
        for dep, condition in svc.depends_on.items():
            assert dep in SERVICES, f"{name} depends on unknown {dep}"
            if condition == "service_healthy":
                assert SERVICES[dep].healthcheck is not None, f"{name} waits for {dep} to be healthy: it has no check"
            if condition == "service_completed_successfully":
                assert SERVICES[dep].one_shot, f"{name} waits for {dep} to finish: it never does"
    for name in ON_THE_BROKER - {"init"}:
        assert SERVICES[name].depends_on.get("nats") == "service_healthy"
        assert SERVICES[name].depends_on.get("init") == "service_completed_successfully"


@pytest.mark.parametrize("name", list(WORKERS))
def test_workers_scale_with_replicas(name: str) -> None:
    spec = WORKERS[name].spec
    assert "ports" not in spec and "container_name" not in spec  # either would stop --scale
    assert spec["deploy"]["replicas"] >= 1
    grace = int(str(spec["stop_grace_period"]).removesuffix("s"))
    assert grace > Worker.__dataclass_fields__["drain_timeout_s"].default  # SIGTERM drains before SIGKILL


def test_functions_named_are_real_and_served() -> None:
    served = {}
    for svc in WORKERS.values():
        fn = load(svc.build_args["FUNCTION"])
        assert fn.name == svc.build_args["FUNCTION"]
        served[fn.name] = fn
    ctx = parse_gymbus(GYMBUS["init"].argv[1:], GYMBUS["init"].env)
    assert all(isinstance(served[a], Agent) for a in ctx.params["agent"])
    assert all(isinstance(served[e], Environment) for e in ctx.params["env"])
    assert set(ctx.params["agent"]) | set(ctx.params["env"]) == set(served)

    cfg = load_config(ROOT / default_config_path())
    assert {cfg.agent, cfg.env} <= set(served)
    policy = parse_gymbus(GYMBUS["policy"].argv[1:], GYMBUS["policy"].env).params
    # the simulated policy knows the default tasks
    assert [str((ROOT / t).resolve()) for t in policy["tasks"]] == [str(Path(cfg.input).resolve())]
    assert policy["model"] == cfg.model.name


def test_model_tier_profiles() -> None:
    model, agent = SERVICES["model"], SERVICES["simple_agent"]
    assert model.profiles == ["gpu"] and model.spec["ipc"] == "host"
    [device] = model.spec["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert model.image is not None and model.image.path == ROOT / "images" / "model" / "Dockerfile"
    for name, svc in SERVICES.items():
        if not svc.profiles:
            assert "resources" not in (svc.spec.get("deploy") or {}), f"{name} reserves devices by default"
    # GYMBUS_MODEL_URL: unset -> the simulated policy; a URL -> that endpoint; empty -> the models bucket
    assert peers(agent.env["GYMBUS_MODEL_URL"]) == [("policy", 8000)]
    assert services(load_compose({"GYMBUS_MODEL_URL": "https://x/v1"}))["simple_agent"].env["GYMBUS_MODEL_URL"] == (
        "https://x/v1"
    )
    assert services(load_compose({"GYMBUS_MODEL_URL": ""}))["simple_agent"].env["GYMBUS_MODEL_URL"] == ""
    with_key = {name for name, svc in SERVICES.items() if "OPENAI_API_KEY" in svc.env}
    assert with_key == {"simple_agent"}  # the model key goes to the model client only


def test_tools_profile() -> None:
    box: Service = SERVICES["nats-box"]
    assert box.profiles == ["tools"] and box.spec["image"].startswith("natsio/nats-box:")
    assert peers(box.env["NATS_URL"]) == [("nats", 4222)]
    assert SERVICES["submit"].profiles == ["tools"] and SERVICES["submit"].one_shot


def test_every_broker_client_has_its_own_identity_and_nothing_else() -> None:
    """Each service mounts only its own seed (a subpath of the auth volume) and names it in NATS_NKEY."""
    from broker.auth import identities

    names = {i.name for i in identities(["simple_agent"], ["math"])}
    auth = SERVICES["auth"]
    assert auth.argv[:3] == ["gymbus", "auth", "init"] and auth.one_shot
    assert ("auth", auth.argv[3]) in auth.mounts
    for name, svc in SERVICES.items():
        if name in ON_THE_BROKER or name in ("nats-box", "model"):
            seed = svc.env["NATS_NKEY"]
            identity = seed.rsplit("/", 1)[1].removesuffix(".nk")
            assert identity in names, name
            assert [m for m in svc.mounts if m[0].startswith("auth")] == [(f"auth/{identity}", seed.rsplit("/", 1)[0])]
    used = {SERVICES[n].env["NATS_NKEY"].rsplit("/", 1)[1].removesuffix(".nk") for n in ON_THE_BROKER}
    assert used == {"admin", "agent-simple_agent", "env-math", "profiler", "janitor", "submitter", "model"}


def test_readme_describes_this_stack() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## `docker compose up`", 1)[1].split("\n## ", 1)[0]
    table = section.split("| service | runs | notes |", 1)[1].split("\n\n", 1)[0]
    listed = {
        name for row in re.findall(r"^\| (`[^|]+`) \|", table, flags=re.M) for name in re.findall(r"`([^`]+)`", row)
    }
    assert listed - {"service"} == {name for name, svc in SERVICES.items() if not svc.profiles}
    assert SERVICES["nats"].spec["image"] in section
    for scaled in re.findall(r"--scale (\w+)=", section):
        assert scaled in WORKERS or scaled == "policy"
    submit = SERVICES["submit"].argv
    assert f"run id {submit[submit.index('--run-id') + 1]}" in section
    assert "gpu" in SERVICES["model"].profiles and "--profile gpu" in section
