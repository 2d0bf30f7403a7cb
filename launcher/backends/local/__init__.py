"""The local backend, one module a job:

    backend.py  the Backend: a cluster started for the run (or left running by an earlier submit)
    cluster.py  the Ray cluster on this machine: its nodes, exporters and teardown
"""
