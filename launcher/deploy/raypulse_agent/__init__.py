"""The cluster-side half of `launcher exporters`: Ray actors that keep one raypulse exporter on
every node, and the short driver (`python -m raypulse_agent`) that places or removes them.

This package is uploaded to the cluster as a Ray `py_modules` entry (top-level name
`raypulse_agent`, next to the `exporter` package), so it imports only the standard library,
`ray` and `exporter.contract.wire` (which travels with it): a node needs nothing beyond Ray to run it.

The registry of what runs where is the set of named actors in wire.DEPLOY_NAMESPACE: the
supervisor is wire.DEPLOY_SUPERVISOR, the actor of a node is `wire.node_actor_name(node id,
port)`. Ray's State API lists them over HTTP, which is how the head exporter's /sd and `launcher
exporters status` learn each node's exporter port without importing ray. They are all of one Ray
job, the deploy run that created the supervisor (the supervisor creates the node actors, which take
its job; a restarted supervisor keeps it), and deploy runs carry the job metadata
wire.META_TOOL=exporters, wire.META_TOOL_ACTION=deploy: readers list the actors of those jobs with a
filter the GCS applies itself (job_id, state), found however many other actors the cluster has.
"""

WEB_DIR = "raypulse_web"  # `deploy --web-config`: the bundle, one more py_module of the deploy job
WEB_CONFIG_FILE = "web-config.yml"  # the bundle's web config; the other files are the ones it names
