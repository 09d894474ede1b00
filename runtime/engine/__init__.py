"""The engine: what runs a function's messages, exactly once.

    worker.py       Worker: binds a function to its durable consumers, runs, settles and drains messages
    pull.py         a worker's continuous pull requests, one-shot ones (profiler, janitor), handler slots
    transitions.py  the rollout state machine: one transition, exactly once (CAS on the step counter)
    admission.py    what an agent worker decides about a Start before any model call (defaults, checks)
    registry.py     a function's registration in KV functions (tools, task fields' schema, seed)
    agents.py       the agent role: Start and Resume run the agent's step
    environments.py the environment roles: Seed, Tools (the model's tool calls) and Verify
    inline.py       verifying in the agent's last turn, for environments declaring verify_inline
    records.py      session records and Results: opened from a Start, kept within one message
    failures.py     ending a rollout as one failed Result, whatever the message in hand
    retry.py        which failure kinds are redelivered
    janitor.py      the backstops: lost messages, rollout deadlines, unserved subjects
    deadletters.py  the dead-letter stream and replay
    metrics.py      a worker's /metrics and /healthz
    audit.py        the exactly-once audit of a run's streams (tests, the fault suite)
"""

HTTP_PORT_ENV = "GYMBUS_HTTP_PORT"
"""Where a worker serves /metrics and /healthz (``gymbus worker --http-port``); here so the CLI reads it cheaply."""
