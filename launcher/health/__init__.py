"""Self-healing runs: the launcher's watcher reads what the cluster's exporters already serve, decides
by the run's health policy whether an attempt is hung, on a faulty GPU, on a lost node or diverging,
takes evidence (every process's stack) and acts: a new attempt from the last checkpoint, on a
replaced or drained node. Every step is an event of the run's journal.

    policy.py     the `health:` section of the job spec, with defaults from alerts/config.py
    exporters.py  where the cluster's exporters are and what they serve now (one read of each)
    fleet.py      every node's digest in one read of the head exporter's fleet document
    promql.py     every node's digest from the user's Prometheus, one query per rule (health.source)
    faults.py     what a read means: the faults of one attempt, with their evidence (pure)
    watcher.py    reads every check interval, remembers what it already reported
    stacks.py     every process's Python stack through Ray's dashboard, grouped
"""
