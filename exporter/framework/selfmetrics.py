"""The exporter's metrics about itself: build info and the health of every collector.

These families are filled by the scheduler from its own bookkeeping at render time (collector
"exporter"); the process's own CPU and memory come from an ordinary collector ("self").
"""

from __future__ import annotations

from exporter.framework.catalog import counter, gauge, info

EXPORTER = "exporter"

BUILD_INFO = info("raypulse_exporter_build_info", "Version of the running exporter and its runtime.",
                  collector=EXPORTER, labels=("version", "python_version", "prometheus_client_version"))
START_TIME = gauge("raypulse_exporter_start_time_seconds", "Unix time the exporter started.",
                   collector=EXPORTER, unit="seconds")
COLLECTOR_UP = gauge("raypulse_exporter_collector_up",
                     "1 if the collector's last run succeeded within its deadline, else 0.",
                     collector=EXPORTER, labels=("collector",))
COLLECTOR_LAST_SUCCESS = gauge("raypulse_exporter_collector_last_success_timestamp_seconds",
                               "Unix time of the collector's last successful run.",
                               collector=EXPORTER, labels=("collector",), unit="seconds",
                               only_when="after the collector's first successful run")
COLLECTOR_DURATION = gauge("raypulse_exporter_collector_duration_seconds",
                           "How long the collector's last finished run took.",
                           collector=EXPORTER, labels=("collector",), unit="seconds",
                           only_when="after the collector's first finished run")
COLLECTOR_INTERVAL = gauge("raypulse_exporter_collector_interval_seconds",
                           "Configured seconds between the collector's runs.",
                           collector=EXPORTER, labels=("collector",), unit="seconds")
COLLECTOR_RUNS = counter("raypulse_exporter_collector_runs_total", "Collector runs started.",
                         collector=EXPORTER, labels=("collector",))
COLLECTOR_ERRORS = counter("raypulse_exporter_collector_errors_total",
                           "Collector failures by kind: exception (the run raised), timeout (it missed "
                           "its deadline), busy (a previous run was still stuck, so none was started), "
                           "partial (a part of the source could not be read).",
                           collector=EXPORTER, labels=("collector", "kind"))
COLLECTOR_STUCK = gauge("raypulse_exporter_collector_stuck",
                        "1 while a run that missed its deadline has still not returned.",
                        collector=EXPORTER, labels=("collector",))
COLLECTOR_SERIES = gauge("raypulse_exporter_collector_series",
                         "Series the collector currently contributes to /metrics (0 once stale).",
                         collector=EXPORTER, labels=("collector",))

_OTLP = "when OTLP push is configured"
OTLP_EXPORTS = counter("raypulse_exporter_otlp_exports_total",
                       "OTLP export attempts by result; a failed export's batch is dropped, not retried later.",
                       collector=EXPORTER, labels=("result",), only_when=_OTLP)
OTLP_DROPPED_POINTS = counter("raypulse_exporter_otlp_dropped_points_total",
                              "Data points in OTLP batches that could not be delivered.", collector=EXPORTER,
                              only_when=_OTLP)
OTLP_LAST_SUCCESS = gauge("raypulse_exporter_otlp_last_success_timestamp_seconds",
                          "Unix time of the last OTLP export the endpoint accepted.", collector=EXPORTER,
                          unit="seconds", only_when="after the first OTLP export the endpoint accepted")

HTTP_CONNECTIONS = gauge("raypulse_exporter_http_connections", "Connections open to the exporter's HTTP ports "
                         "(/metrics and the progress endpoint together).", collector=EXPORTER)
HTTP_CONNECTION_LIMIT = gauge("raypulse_exporter_http_connection_limit", "The most connections served at once "
                              "(http.max_connections, at most a quarter of the file descriptor limit).",
                              collector=EXPORTER)
HTTP_REFUSED = counter("raypulse_exporter_http_refused_total", "Answered 503 because the exporter was busy, by "
                       "reason: connections (over http.max_connections), requests (over http.max_requests "
                       "scrapes at once).", collector=EXPORTER, labels=("reason",))
HTTP_CLOSED = counter("raypulse_exporter_http_closed_total", "Connections the exporter closed, by reason: idle "
                      "(no whole request header within http.idle_timeout_seconds), write (the client read "
                      "nothing for http.write_timeout_seconds), evicted (had sent nothing when a new "
                      "connection needed its place under http.max_connections).", collector=EXPORTER,
                      labels=("reason",))
HTTP_CLIENT_ERRORS = counter("raypulse_exporter_http_client_errors_total", "Requests that failed on the client's "
                             "side, by kind: bad_request (malformed HTTP, or a compressed request body: 415), "
                             "disconnect (went away mid-request), tls, timeout. Logged once a minute, without "
                             "traceback.", collector=EXPORTER, labels=("kind",))
