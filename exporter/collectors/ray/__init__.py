"""Ray, seen through the dashboard's REST API (never `import ray`) and through procfs.

`ray` (every node): is Ray reachable, which raylet(s) this exporter watches, Ray's version.
`ray_head` (head role): jobs, nodes, resources, actors, tasks, placement groups; serves /sd.
`ray_processes` (every node): Ray worker processes mapped to job, actor class and role, with
their CPU, memory and GPU use; this node's object store.
`train` (every node): what training code reports through `exporter.progress`.
"""
