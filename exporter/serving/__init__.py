"""How the metrics leave the exporter: the HTTP server and what guards it, and the OTLP push.

- `server`: `/metrics`, `/healthz`, `/readyz`, `/`, `/sd`, `/sd/ray`, `/sd/rollout` and the progress
  endpoint's listener;
- `exposition`: snapshots rendered into the bytes `/metrics` serves, once per change;
- `nodeexporter_sd`: node_exporter's targets in the head exporter's `/sd`;
- `guard`: bounds on connections, idle and slow clients, scrapes at once; `httplog`: what is logged about
  clients; `webconfig`: TLS, basic auth and a rate limit from an exporter-toolkit web config file;
- `aiohttp_lazy`: aiohttp without its import-time loads (the CA store, the MIME types);
- `otlp`: the same families pushed over OTLP/HTTP.

This file imports nothing: `exporter.cli` imports `aiohttp_lazy` before everything else.
"""
