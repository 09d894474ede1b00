"""The orchestration benchmark: the real stack (embedded broker, worker processes, the simulated
policy over HTTP) driven by a closed loop that keeps C rollouts in flight, one configuration at a time.

    python -m runtime.bench              # the full grid (bounded: rollouts and seconds per configuration)
    python -m runtime.bench --quick      # the CI-sized twin
"""
