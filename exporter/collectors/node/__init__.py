"""The node as procfs and sysfs show it (families `raypulse_node_*`); no name collides with
node_exporter's `node_*`, so both can run side by side."""
