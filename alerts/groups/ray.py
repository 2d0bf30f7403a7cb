"""The Ray cluster: head (dashboard and GCS) unreachable, nodes lost, placement groups stuck.

The head exporter describes every Ray node by `node_id`; scrape targets found through its /sd
carry `ray_node_id` (and `node`, the name the other alerts use). label_replace() maps one onto the
other so that a dead node's alert carries the `node` label its own exporter's series had.
"""

from __future__ import annotations

from textwrap import indent

from alerts.config import Config
from alerts.model import Alert, Group, Record

NODE_NAMES = "ray_node:raypulse_node_name:last"


def group(c: Config) -> Group:
    t = c.tune
    head, lost = t("RaypulseRayHeadUnreachable"), t("RaypulseRayNodeLost")
    dead = ('max by (cluster, ray_node_id) (\n'
            '  label_replace(raypulse_ray_node_alive, "ray_node_id", "$1", "node_id", "(.+)")\n'
            ') == 0\n'
            'unless on (cluster, ray_node_id)\n'
            '  label_replace(\n'
            '    raypulse_ray_node_death_reason{reason=~"EXPECTED_TERMINATION|AUTOSCALER_DRAIN_IDLE"} == 1,\n'
            '    "ray_node_id", "$1", "node_id", "(.+)"\n'
            '  )')
    # The dead node's own `node` label where its exporter was ever scraped, else without it.
    lost_expr = (f"(\n{indent(dead, '  ')}\n) * on (cluster, ray_node_id) group_left (node) {NODE_NAMES}\n"
                 f"or\n(\n{indent(dead, '  ')}\n) unless on (cluster, ray_node_id) {NODE_NAMES}")
    return Group("ray", "Ray cluster (head, nodes, placement groups)", [
        Alert("RaypulseRayHeadUnreachable", "critical", "ray", f"""
            max by (cluster) (
              raypulse_ray_up
              and on (job, instance)
                (raypulse_ray_local_raylets > 0 or max_over_time(raypulse_ray_up[{head.history}]) == 1)
            ) == 0
            """,
              "No exporter of a Ray cluster can reach the Ray head.",
              "No exporter in cluster {{ $labels.cluster }} gets an answer from the Ray dashboard with a "
              "healthy GCS, though Ray runs there (a raylet on the host, or Ray answered within "
              f"{head.history}): the head node, its GCS or its dashboard is down."),
        # The scrape target (its `node` label) of each Ray node, remembered after the node is gone.
        Record(NODE_NAMES, f"""
            topk by (cluster, ray_node_id) (1,
              group by (cluster, ray_node_id, node) (
                last_over_time({c.up[:-1]}, ray_node_id!=""}}[{lost.history}])
              )
            )
            """),
        Alert("RaypulseRayNodeLost", "critical", "ray", lost_expr,
              "A Ray node died unexpectedly.",
              "Ray node {{ $labels.ray_node_id }}{{ with $labels.node }} ({{ . }}){{ end }} in cluster "
              "{{ $labels.cluster }} is dead "
              "and did not stop on purpose; the tasks and actors it ran were lost."),
        Alert("RaypulseRayPlacementGroupPendingTooLong", "warning", "ray", f"""
            max by (cluster) (raypulse_ray_placement_group_oldest_pending_seconds)
              > {t("RaypulseRayPlacementGroupPendingTooLong").age.seconds}
            """,
              "A placement group has waited too long for resources.",
              "The oldest pending placement group of cluster {{ $labels.cluster }} has waited "
              "{{ $value | humanizeDuration }} for resources the cluster does not have free."),
    ])
