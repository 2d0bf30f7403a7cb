"""raypulse's Prometheus alerting: rules as Python data, built into the YAML under alerts/rules/.

`alerts.config` is the one place to tune (selectors, thresholds, `for` durations); `alerts.groups`
holds one module per area; `python -m alerts.build` writes the rule files (and the drill variant);
`alerts.prometheus` finds the rule files and builds the Prometheus configuration that loads them.
The stack, the webhook receiver and the fault drill that exercise them are harness, under scripts/.
"""
