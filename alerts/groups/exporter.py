"""The exporter itself: a scrape target down or missing, a collector failing or stuck, OTLP push
failing, training reports refused or about to be, clients refused because it is busy; and the
Watchdog, which always fires so that a silent pipeline (Prometheus or Alertmanager down) is noticed
by whoever expects it: opt-in (Config.watchdog), since kube-prometheus-stack brings its own.

RaypulseExporterDown is a warning after 10m, as kube-prometheus-stack's TargetDown: a node that is
really gone also raises RaypulseRayNodeLost (critical) as soon as Ray declares it dead.
"""

from __future__ import annotations

from alerts.config import Config
from alerts.model import AT_NODE, Alert, Group
from alerts.prometheus import WATCHDOG


def group(c: Config) -> Group:
    t = c.tune
    up = c.up
    otlp = "raypulse_exporter_otlp_exports_total"
    otlp_window = t("RaypulseExporterOtlpPushFailing").window
    return Group("exporter", "The exporter itself (targets, collectors, OTLP, progress endpoint)", [
        Alert("RaypulseExporterDown", "warning", "exporter", f"{up} == 0",
              "A raypulse exporter cannot be scraped.",
              f"Prometheus cannot scrape the exporter on {AT_NODE}: the node, or the exporter on it, is down. "
              "Its GPU, node and training metrics are missing."),
        Alert("RaypulseExporterAbsent", "critical", "exporter", f"absent({up})",
              "Prometheus has no raypulse exporter to scrape.",
              "No scrape target matches {{ $labels.job }}: service discovery finds no exporter, or the "
              "scrape config lost them."),
        Alert("RaypulseExporterCollectorFailing", "warning", "exporter", """
            raypulse_exporter_collector_up == 0
            unless on (job, instance, collector) raypulse_exporter_collector_stuck == 1
            """,
              "An exporter collector keeps failing.",
              "Collector {{ $labels.collector }} of the exporter on " + AT_NODE +
              " fails; its series are missing (see raypulse_exporter_collector_errors_total)."),
        Alert("RaypulseExporterCollectorStuck", "warning", "exporter", "raypulse_exporter_collector_stuck == 1",
              "An exporter collector is stuck in a call that does not return.",
              "Collector {{ $labels.collector }} of the exporter on " + AT_NODE +
              " is stuck past its deadline (a hung driver call or network mount); its series went stale."),
        Alert("RaypulseExporterOtlpPushFailing", "warning", "exporter", f"""
            increase({otlp}{{result="failure"}}[{otlp_window}]) > 0
            and on (job, instance) increase({otlp}{{result="success"}}[{otlp_window}]) == 0
            """,
              "An exporter's OTLP pushes all fail.",
              "Every OTLP push of the exporter on " + AT_NODE +
              f" failed in the last {t('RaypulseExporterOtlpPushFailing').window}; the OTLP backend gets no data."),
        Alert("RaypulseExporterProgressReportsRejected", "warning", "exporter", f"""
            increase(raypulse_train_rejected_reports_total[{t("RaypulseExporterProgressReportsRejected").window}]) > 0
            """,
              "An exporter refuses training progress reports.",
              "The progress endpoint of the exporter on " + AT_NODE + " refused "
              "{{ $value | printf \"%.0f\" }} reports ({{ $labels.reason }}) in the last "
              f"{t('RaypulseExporterProgressReportsRejected').window}; that training progress is not monitored."),
        Alert("RaypulseExporterProgressStoreNearlyFull", "warning", "exporter", f"""
            raypulse_train_series / raypulse_train_series_limit > {t("RaypulseExporterProgressStoreNearlyFull").ratio:g}
            """,
              "An exporter's progress store is nearly full.",
              "The progress store of the exporter on " + AT_NODE + " holds {{ $value | humanizePercentage }} "
              "of progress.max_series; once full, reports of new jobs and ranks are refused."),
        Alert("RaypulseExporterBusy", "warning", "exporter", f"""
            increase(raypulse_exporter_http_refused_total[{t("RaypulseExporterBusy").window}]) > 0
            """,
              "An exporter answers 503: too many connections or scrapes at once.",
              "The exporter on " + AT_NODE + " refused {{ $value | printf \"%.0f\" }} {{ $labels.reason }} in the "
              f"last {t('RaypulseExporterBusy').window} (http.max_connections, http.max_requests): scrapes or "
              "progress reports may be failing."),
    ])


def watchdog_group(c: Config) -> Group:
    """Its own rule file (rules/watchdog.yaml with Config.watchdog, else the opt-in rules/watchdog.yml)."""
    return Group(WATCHDOG, "The alerting pipeline itself", [
        Alert("RaypulseWatchdog", "none", "meta", "vector(1)",
              "Always firing: proves that Prometheus, Alertmanager and the receiver work.",
              "The Watchdog of the Prometheus at {{ $externalURL }} always fires; a dead man's switch "
              "that expects it raises an alarm when its notifications stop.", tuning_key="RaypulseWatchdog"),
    ])
