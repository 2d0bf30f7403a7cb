"""The healing soak's checks of the launcher's own accounts (issue 38), from a finished run's record
and the soak's independent accounting (scripts/heal_drill/ettr.py); pure, no Ray.

- The ledger (launcher/ledger.py): the causes `run.finished` kept (`seconds_by_cause`) add up to the
  run's wall time (created to finished) within LEDGER_TOLERANCE.
- Redone: the steps the launcher said each recovery lost (`health.recovered`'s steps_lost) agree with
  the soak's count within one step, and the ledger's redone seconds with the soak's within one step's
  time per fault.
- The launcher's part of each fault: from the fault (its injection, or the attempt's last step when
  steps were made after it) to the work of the next attempt's first step (its first step's report less
  one step's time), less the retry backoff: detect + stop + provision + startup. At most
  LAUNCHER_PART_S for a lost node or an XID, the hang threshold in force + LAUNCHER_PART_S for a hang
  (its threshold counts from the last step); a NaN's is shown, not bound.
- A hang is judged (its `health.fault`) within HANG_JUDGED_S of the attempt's last step.
- The checkpoint advice (launcher/checkpoint_advice.py) the run ends with: the interval used and the
  Young-Daly interval from the measured save cost and the run's own fault rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.contract import wire
from launcher import checkpoint_advice
from launcher.state import EventRecord, RunRecord
from scripts.heal_drill import ettr

LEDGER_TOLERANCE = 0.01  # the causes' sum against the wall time
LAUNCHER_PART_S = 20.0  # detect + stop + provision + startup, beyond a hang's threshold
HANG_JUDGED_S = 120.0  # from the last step to the hang's health.fault, with the default settings
NO_PAST = checkpoint_advice.FaultRate(0, 0.0)  # no other run's faults pooled into the advice
BOUND_KINDS = ("node-killed", "xid-79", "hang")  # the kinds whose launcher's part has a bound


@dataclass(frozen=True)
class LedgerCheck:
    """run.finished's seconds by cause against the record's wall time."""

    seconds: dict[str, float]
    wall: float  # finished_at - created_at

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    @property
    def error(self) -> float:
        """(sum - wall) / wall."""
        return (self.total - self.wall) / self.wall if self.wall > 0 else 0.0

    @property
    def ok(self) -> bool:
        return abs(self.error) <= LEDGER_TOLERANCE


@dataclass(frozen=True)
class FaultCheck:
    """One healed fault: the launcher's part, its bound, and what the launcher said against the soak."""

    index: int
    kind: str
    attempt: int
    launcher_s: float  # from the fault to the next attempt's first step's work, less the backoff
    bound_s: float | None
    steps_soak: int | None
    steps_launcher: float | None  # health.recovered's steps_lost
    threshold_s: float | None = None  # a hang's threshold in force when judged
    threshold_rule: str | None = None
    threshold_basis: str | None = None
    quiet_s: float | None = None  # a hang: the seconds without progress the watcher saw when it judged
    judged_after_last_step_s: float | None = None  # a hang: the fault's decision after the attempt's last step

    @property
    def part_ok(self) -> bool | None:
        return None if self.bound_s is None else self.launcher_s <= self.bound_s

    @property
    def steps_agree(self) -> bool | None:
        if self.steps_soak is None or self.steps_launcher is None:
            return None
        return abs(self.steps_soak - self.steps_launcher) <= 1

    @property
    def hang_ok(self) -> bool | None:
        if self.judged_after_last_step_s is None:
            return None
        return self.judged_after_last_step_s <= HANG_JUDGED_S


@dataclass(frozen=True)
class Checks:
    ledger: LedgerCheck | None  # None: the run has no run.finished with seconds_by_cause
    faults: list[FaultCheck]
    redone_ledger_s: float | None
    redone_soak_s: float
    redone_tolerance_s: float  # one step's time per fault
    advice: checkpoint_advice.Advice | None

    @property
    def redone_ok(self) -> bool | None:
        if self.redone_ledger_s is None:
            return None
        return abs(self.redone_ledger_s - self.redone_soak_s) <= self.redone_tolerance_s

    def failed(self) -> list[str]:
        """What missed, in words; empty when everything checked held."""
        missed = []
        if self.ledger is None:
            missed.append("the run ended without the ledger's split (run.finished's seconds_by_cause)")
        elif not self.ledger.ok:
            missed.append(f"the ledger's causes sum to {self.ledger.total:.1f} s against {self.ledger.wall:.1f} s of "
                          f"wall time ({self.ledger.error:+.2%})")
        if self.redone_ok is False:
            missed.append(f"the ledger's redone {self.redone_ledger_s:.1f} s against the soak's "
                          f"{self.redone_soak_s:.1f} s (more than {self.redone_tolerance_s:.1f} s apart)")
        for fault in self.faults:
            if fault.part_ok is False:
                missed.append(f"fault {fault.index} ({fault.kind}): the launcher's part {fault.launcher_s:.1f} s > "
                              f"{fault.bound_s:.1f} s")
            if fault.steps_agree is False:
                missed.append(f"fault {fault.index} ({fault.kind}): the launcher said {fault.steps_launcher:g} steps "
                              f"lost, the soak counted {fault.steps_soak}")
            if fault.hang_ok is False:
                missed.append(f"fault {fault.index} (hang): judged {fault.judged_after_last_step_s:.1f} s after the "
                              f"last step (> {HANG_JUDGED_S:g} s)")
        return missed


def ledger_check(record: RunRecord) -> LedgerCheck | None:
    finished = next((event for event in reversed(record.events) if event.kind == "run.finished"), None)
    split = finished.details.get("seconds_by_cause") if finished is not None else None
    if not isinstance(split, dict) or record.finished_at is None:
        return None
    return LedgerCheck({cause: float(value) for cause, value in split.items()}, record.finished_at - record.created_at)


def _fault_event(events: list[EventRecord], attempt: int) -> EventRecord | None:
    return next((event for event in events if event.kind == "health.fault" and event.attempt == attempt
                 and event.details.get("action") != "report"), None)


def launcher_part(recovery: ettr.Recovery, injected_at: float, step_seconds: float) -> float | None:
    """Seconds from the fault to the next attempt's first step's work, less the backoff (None: no next step)."""
    if recovery.next_first_step_at is None:
        return None
    since = max(injected_at, recovery.last_step_at or injected_at)
    return recovery.next_first_step_at - step_seconds - since - (recovery.backoff_seconds or 0.0)


def fault_check(index: int, kind: str, injected_at: float, recovery: ettr.Recovery, record: RunRecord,
                step_seconds: float) -> FaultCheck | None:
    """The checks of one recovery; `kind`: the soak's fault (soak.KINDS). None: no next attempt made a step."""
    launcher_s = launcher_part(recovery, injected_at, step_seconds)
    if launcher_s is None:
        return None
    event = _fault_event(record.events, recovery.attempt)
    evidence = _evidence(record, recovery.attempt) if kind == "hang" else {}
    threshold = hang_threshold(record, recovery.attempt) if kind == "hang" else None
    bound = None  # a NaN's, and a hang's the watcher did not judge one (no threshold to bound it by)
    if kind == "hang" and threshold is not None:
        bound = threshold + LAUNCHER_PART_S
    elif kind in BOUND_KINDS and kind != "hang":
        bound = LAUNCHER_PART_S
    judged = None
    if kind == "hang" and event is not None and recovery.last_step_at is not None:
        judged = event.time - recovery.last_step_at
    quiet, rule, basis = (evidence.get(key) for key in ("quiet_seconds", "threshold_rule", "threshold_basis"))
    return FaultCheck(index, kind, recovery.attempt, launcher_s, bound, recovery.steps_lost,
                      (recovery.said or {}).get("steps_lost"), threshold,
                      rule if isinstance(rule, str) else None, basis if isinstance(basis, str) else None,
                      float(quiet) if isinstance(quiet, int | float) else None, judged)


def _evidence(record: RunRecord, attempt: int) -> dict[str, object]:
    """What the watcher saw when it judged a hang of `attempt` (its health.fault's evidence); {} for other faults."""
    event = _fault_event(record.events, attempt)
    if event is None or event.details.get("fault") != wire.FAULT_HANG:
        return {}
    evidence = event.details.get("evidence")
    return evidence if isinstance(evidence, dict) else {}


def hang_threshold(record: RunRecord, attempt: int) -> float | None:
    """The hang threshold in force when the watcher judged `attempt` hung (its health.fault's evidence)."""
    value = _evidence(record, attempt).get("threshold")
    return float(value) if isinstance(value, int | float) else None


def checks(record: RunRecord, accounting: ettr.Accounting, faults: list[tuple[int, str, int, float]],
           past: checkpoint_advice.FaultRate = NO_PAST) -> Checks:
    """`faults`: the soak's injected faults as (index, kind, attempt hit, when); `past`: the other runs' faults that
    the launcher's advice pools with the run's (checkpoint_advice.past_faults)."""
    recoveries = {item.attempt: item for item in accounting.recoveries}
    step = accounting.step_seconds or 0.0
    found = [fault_check(index, kind, at, recoveries[attempt], record, step)
             for index, kind, attempt, at in faults if attempt in recoveries]
    split = ledger_check(record)
    advice = checkpoint_advice.for_run(record, past=past)
    healed = [item for item in found if item is not None]
    return Checks(split, healed, split.seconds.get("redone", 0.0) if split else None,
                  sum(item.redone_seconds for item in accounting.recoveries),
                  step * len(accounting.recoveries), advice)
