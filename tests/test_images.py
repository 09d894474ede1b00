"""The Dockerfiles under images/, read with the official Dockerfile parser and checked against the repository."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from runtime.model.serving import InThread
from runtime.sdk import load
from tests.compose_local import free_port
from tests.compose_spec import ROOT, Image, image_of

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
HEALTHCHECK_SCRIPT = ROOT / "images" / "function" / "healthcheck.py"


def function_image(function: str = "math") -> Image:
    return image_of({"dockerfile": "images/function/Dockerfile", "args": {"FUNCTION": function}})


def model_image() -> Image:
    return image_of({"dockerfile": "images/model/Dockerfile"})


def run_lines(image: Image, stage: int) -> str:
    return "\n".join(c.value[0] for c in image.stages[stage] if c.cmd == "RUN")


def test_function_image_is_multi_stage_slim_and_non_root() -> None:
    image = function_image()
    assert len(image.stages) == 2 and image.stages[0][0].value[-1] == "build"
    assert re.fullmatch(r"python:3\.(\d+)-slim", image.base)
    minimum = PYPROJECT["project"]["requires-python"].removeprefix(">=")
    assert tuple(map(int, image.base.split(":")[1].removesuffix("-slim").split("."))) >= tuple(
        map(int, minimum.split("."))
    )
    uid = image.user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0  # numeric, so Kubernetes can verify runAsNonRoot
    # the final stage takes the built virtualenv and installs nothing itself
    assert [c.flags for c in image.final("COPY") if c.value[0] == "/opt/gymbus"] == [("--from=build",)]
    assert "pip install" not in run_lines(image, -1) and "apt-get" not in run_lines(image, -1)


def test_function_image_installs_its_function_and_runs_its_worker() -> None:
    image = function_image("math")
    build = run_lines(image, 0)
    assert "pip install --no-deps -r requirements.lock" in build  # pinned, nothing left to the resolver
    assert 'pip install -c requirements.lock -r "functions/${FUNCTION}/requirements.txt"' in build
    assert "pip check" in build  # a lock that no longer covers pyproject.toml fails the build
    assert image.entrypoint == ["gymbus", "worker"] and image.cmd == []
    assert image.env["GYMBUS_FUNCTION"] == "math"  # `gymbus worker` reads its FUNCTION argument from it
    assert [c.value for c in image.stages[0] if c.cmd == "ARG"] == [("FUNCTION",)]


def test_function_image_health_check_probes_the_worker_port() -> None:
    image = function_image()
    assert image.healthcheck == ["CMD", "python", "/usr/local/bin/gymbus-healthcheck"]
    assert image.copies["/usr/local/bin/gymbus-healthcheck"] == "images/function/healthcheck.py"
    assert image.expose == [int(image.env["GYMBUS_HTTP_PORT"])]


def test_function_image_lock_pins_every_dependency_of_pyproject() -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    lines = (ROOT / "images" / "function" / "requirements.lock").read_text().splitlines()
    pins = [Requirement(line) for line in lines if line and not line.startswith("#")]
    assert all(len(r.specifier) == 1 and next(iter(r.specifier)).operator == "==" for r in pins), "pins only"
    locked = {canonicalize_name(r.name): next(iter(r.specifier)).version for r in pins}
    for dependency in map(Requirement, PYPROJECT["project"]["dependencies"]):
        version = locked.get(canonicalize_name(dependency.name))
        assert version is not None, f"{dependency.name} is not in the lock: run scripts/lock-function-image"
        assert dependency.specifier.contains(version, prereleases=True), f"{dependency} but the lock has {version}"


def test_phoenix_image_serves_phoenix_as_a_non_root_user() -> None:
    image = image_of({"dockerfile": "images/phoenix/Dockerfile"})
    assert re.fullmatch(r"python:3\.(\d+)-slim", image.base)
    assert "arize-phoenix==" in run_lines(image, 0)
    assert image.entrypoint == ["phoenix", "serve"] and image.user.split(":")[0] == "10001"
    assert image.healthcheck and f"127.0.0.1:{image.env['PHOENIX_PORT']}/healthz" in image.healthcheck[-1]


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "functions").iterdir() if (p / "__init__.py").exists()))
def test_every_function_can_be_built_into_the_image(name: str) -> None:
    assert (ROOT / "functions" / name / "requirements.txt").is_file()
    assert load(name).name == name


def test_model_image_runs_gymbus_model_serve_on_vllm() -> None:
    image = model_image()
    assert image.base.startswith("vllm/vllm-openai:v")
    installed = re.search(r'pip install "/src\[(\w+)\]"', run_lines(image, 0))
    assert installed and installed.group(1) in PYPROJECT["project"]["optional-dependencies"]
    assert image.entrypoint == ["gymbus", "model", "serve"] and image.cmd == ["configs/model-serve.yaml"]
    assert image.user.split(":")[0] != "0" and image.user != "root"
    assert image.healthcheck and f"127.0.0.1:{image.expose[0]}/health" in image.healthcheck[-1]


@pytest.mark.parametrize(
    "make", [function_image, model_image, lambda: image_of({"dockerfile": "images/phoenix/Dockerfile"})]
)
def test_copied_sources_exist_in_the_build_context(make: object) -> None:
    image: Image = make()  # type: ignore[operator]
    ignored = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()}
    for stage in image.stages:
        for c in stage:
            if c.cmd == "COPY" and not c.flags:
                for source in c.value[:-1]:
                    assert (ROOT / source).exists(), source
                    assert source.split("/")[0].rstrip("/") not in ignored, f"{source} is excluded by .dockerignore"


@pytest.fixture(scope="module")
def health_server() -> object:
    async def ok(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def down(request: Request) -> PlainTextResponse:
        return PlainTextResponse("not connected", status_code=503)

    with InThread(Starlette(routes=[Route("/healthz", ok), Route("/down", down)])) as server:
        yield server


def healthcheck(*args: str, port: int | None = None) -> int:
    env = {"PATH": "/usr/bin:/bin", **({"GYMBUS_HTTP_PORT": str(port)} if port else {})}
    return subprocess.run([sys.executable, str(HEALTHCHECK_SCRIPT), *args], env=env, timeout=30).returncode


def test_health_check_script_passes_only_on_200(health_server: InThread) -> None:
    port = int(health_server.url.rsplit(":", 1)[1])
    assert healthcheck(port=port) == 0  # default: the worker's /healthz on GYMBUS_HTTP_PORT
    assert healthcheck(f"{health_server.url}/healthz") == 0
    assert healthcheck(f"{health_server.url}/down") == 1  # 503: not ready
    assert healthcheck(port=free_port()) == 1  # nothing listening
