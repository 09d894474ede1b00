"""The model client an environment's named models (judges) are called through: one per worker, traced."""

from __future__ import annotations

from typing import Any

from nats.js import JetStreamContext

from runtime.model.client import Endpoints, ModelClient
from runtime.telemetry.genai import TracedModel

_CLIENTS: dict[int, tuple[ModelClient, Any]] = {}
"""Per broker connection (per worker): the model client and its traced wrapper."""


def env_client(js: JetStreamContext) -> Any:
    """The traced model client of this connection's worker, made on first use (most environments never call one)."""
    key = id(js._nc)
    if key not in _CLIENTS:
        client = ModelClient(Endpoints(js, None))
        _CLIENTS[key] = (client, TracedModel(client))
    return _CLIENTS[key][1]


async def close_client(js: JetStreamContext) -> None:
    """Close the client this connection's environment opened (its worker is stopping)."""
    opened = _CLIENTS.pop(id(js._nc), None)
    if opened is not None:
        await opened[0].close()
