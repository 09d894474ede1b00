"""Reward profiling: how often the model is verifiably right, which tasks are hard, where time went.

    estimators.py   pass@k, majority@k, summary statistics
    sample.py       what profiling keeps of one Result
    table.py        one Sample per rollout, in columns (a run of any size)
    profile.py      the profile of a run, from its samples (offline and live agree)
    profiler.py     the live profiling consumer of the results stream
    report.py       report.html (with charts.py) and the profile files of a run folder
    tables.py       the terminal tables
    status.py       `gymbus status` and `gymbus profile`
    breakdown.py    `gymbus traces`: per-hop latency and waterfalls from traces.jsonl
"""
