"""Every place a run can live, behind one protocol (base.py `Backend`): a local cluster started for the
run (local.py), an existing cluster (existing.py), a KubeRay RayJob (kuberay.py). `registry.resolve(spec)`
binds the spec's backend once per command; the rest of the launcher asks it instead of comparing names.
kinds.py holds each backend's rules (fields it takes, what it refuses) as a leaf the spec reads.

Adding a backend (a Ray cluster on Slurm, a managed one reached through its dashboard): its rules as a
Kind in kinds.py, a module here whose class inherits them and implements `Backend`, listed in
registry.py, and its name in the spec's `backend` Literal (tests/test_backends.py holds these equal).
"""
