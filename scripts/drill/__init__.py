"""The fault drill: inject every fault of the catalog into a real cluster and check which alert
reaches a real webhook, how fast (`make drill`; scripts/drill/run.py, faults.py, job.py)."""
