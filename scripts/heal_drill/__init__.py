"""The healing drill (`make heal-drill`): faults injected into real runs on real local clusters, and
how fast the launcher's health watcher found them and the runs healed (docs/healing.md)."""
