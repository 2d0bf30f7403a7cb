"""Every place a run can live, behind one protocol (base.py `Backend`), a folder (or module) each: a local
cluster started for the run (local/), an existing cluster (existing.py), a KubeRay RayJob (kuberay/).
`registry.resolve(spec)` binds the spec's backend once per command; the rest of the launcher asks it
instead of comparing names. kinds.py holds each backend's rules (fields it takes, what it refuses) as a
leaf the spec reads. Every backend's attempts are lived by one engine (launcher/run.py) through its
`Jobs` (base.py): rayjobs.py is Ray's Jobs API as one (local and existing), kuberay/follow.py a RayJob's.

Adding a backend (a Ray cluster on Slurm, a managed one reached through its dashboard): a folder here whose
class is its rules (a kinds.Kind) and implements `Backend`, listed in registry.py (or `registry.register`ed:
the spec's `backend` then takes its name), and its tests; nothing else (tests/test_toy_backend.py).
"""
