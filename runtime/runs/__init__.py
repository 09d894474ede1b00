"""Runs: a run config turned into submitted rollouts, gathered Results and a run folder.

    config.py       the run config (YAML), strictly checked
    collect.py      `gymbus collect`: submit, gather, write runs/<run_id>/
    submit.py       `gymbus submit`: publish a run's rollouts and exit
    stack.py        the local stack: embedded broker, workers, simulated policy as child processes
    progress.py     the progress bar
"""
