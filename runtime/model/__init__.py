"""The model tier: OpenAI-compatible HTTP to the policy, and what serves it.

    client.py       ModelClient: one model call (Responses or Chat), retries, token ids, reasoning
    endpoints.py    the models bucket, endpoint pools, session-sticky balancing, probing
    translate.py    Responses items <-> Chat Completions messages, at the HTTP edge only
    tokens.py       token ids and logprobs as the server returned them
    simulator.py    the SIMULATED policy (not a model): demos, benchmarks, tests
    serving.py      serving an ASGI app on a socket of its own (foreground, or from a thread)
    launcher.py     `gymbus model serve`: replicas as Ray actors, registered in the models bucket
    replica.py      one replica's server process
"""
