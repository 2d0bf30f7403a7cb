"""The KubeRay backend, one module a job:

    backend.py  the Backend: applies the run as a RayJob and hands it to the attempt engine (launcher/run.py)
    render.py   the RayJob, its Secret and PodMonitor as manifests (and apply)
    access.py   Kubernetes access as kubectl reads it (kubeconfig, context, service account)
    follow.py   the RayJob as the engine follows it: its status, attempts, logs, stop and restart
    heal.py     what the health watcher reads on KubeRay (the Ray pods' sidecars) and how a node is kept out
    proxy.py    one read of a pod's sidecar through the API server's pod proxy
    podlogs.py  every Ray pod's log as `kubectl ray log` gathers them, in one size budget (`logs --all-nodes`)
    evidence.py what a restart keeps before it deletes the RayJob: the job's stacks, the Ray pods' logs
"""
