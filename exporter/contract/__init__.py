"""The names every part of raypulse agrees on, in one room, each module importable on its own:

- `wire`: what the launcher, the exporter, the deploy agent and training code share (ports, paths,
  environment variables, tokens); the standard library only, it runs on every node and in training code;
- `labels`: the label contract of every series and of the queries over them (alerts, dashboards,
  Prometheus config);
- `strict`: the base of every model a person writes (pydantic), and its error wording;
- `node_exporter`: node_exporter's names for the node series, read by the alerts and the dashboards.

This file imports nothing: the deploy agent imports `exporter.contract.wire` on the nodes.
"""
