"""The orchestration benchmark: the real stack (embedded broker, worker processes, the simulated
policy over HTTP) driven by a closed loop that keeps C rollouts in flight, one configuration at a time.

    python -m bench              # the full grid (bounded: rollouts and seconds per configuration)
    python -m bench --quick      # the CI-sized twin
"""
