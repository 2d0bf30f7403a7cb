"""The collection framework: everything a collector relies on and nothing it knows about its source
(node_exporter's `registerCollector` + `execute` split).

- `collector`: what a collector is, and the registry every collector module adds itself to;
- `catalog`: every metric family, declared once by the module that emits it;
- `snapshot`: the samples of one run, frozen into an immutable snapshot when the run succeeds;
- `shared`: what the exporter's parts hand each other, typed (a collector never imports another);
- `scheduler`: runs every collector on its interval with a deadline and keeps its health;
- `selfmetrics`: the exporter's metrics about itself (build info, every collector's health).

This file imports nothing: collectors import the modules they need by name.
"""
