"""launcher/exposition.py, the one incremental reader of exporters' text for the health watcher and the
recorder: it keeps only the families asked for, parses a line again only when it changed at its place,
learns each family from a whole parse, and leaves a broken line to the parser to refuse."""

from __future__ import annotations

import pytest

from launcher import exposition
from launcher.exposition import Family, Line

ANSWER = """# HELP raypulse_node_load1 Load.
# TYPE raypulse_node_load1 gauge
raypulse_node_load1 3
# HELP raypulse_train_step Step.
# TYPE raypulse_train_step gauge
raypulse_train_step{rank="0"} 10
raypulse_train_step{rank="1"} 11
# HELP raypulse_gpu_xid_errors_total XIDs.
# TYPE raypulse_gpu_xid_errors_total counter
raypulse_gpu_xid_errors_total{gpu="0"} 1
# HELP raypulse_gpu_xid_errors_created XIDs.
# TYPE raypulse_gpu_xid_errors_created gauge
raypulse_gpu_xid_errors_created{gpu="0"} 1.7e9
"""  # as prometheus_client's text format writes a counter: its creation time a gauge beside it
KEEP = exposition.keeping(["raypulse_train_step"], prefixes=["raypulse_gpu_xid_"])
STEP = Family("raypulse_train_step", "gauge", "Step.")
XIDS = Family("raypulse_gpu_xid_errors", "counter", "XIDs.")


def test_a_first_answer_is_parsed_whole_keeping_only_the_families_asked_for():
    families: dict[str, Family] = {}
    read = exposition.read(ANSWER, KEEP, None, families)
    assert read.items == [Line(STEP, "raypulse_train_step", {"rank": "0"}, 10.0),
                          Line(STEP, "raypulse_train_step", {"rank": "1"}, 11.0),
                          Line(XIDS, "raypulse_gpu_xid_errors_total", {"gpu": "0"}, 1.0)]  # no _created
    assert families == {"raypulse_train_step": STEP, "raypulse_gpu_xid_errors_total": XIDS}
    assert len(read.keys) == 3


def test_a_name_is_kept_whole_and_a_prefix_starts_a_name():
    keep = exposition.keeping(["raypulse_gpu_up"], prefixes=["raypulse_train_"])
    kept = [line for line in ("raypulse_gpu_up 1", 'raypulse_gpu_up{gpu="0"} 1', "# TYPE raypulse_gpu_up gauge",
                              "# HELP raypulse_train_loss Loss.", 'raypulse_train_loss{rank="0"} 0.5')
            if keep.match(line)]
    assert len(kept) == 5
    assert not [line for line in ("raypulse_gpu_up_other 7", "raypulse_gpu_upx 1", "# TYPE raypulse_node_load1 gauge",
                                  "raypulse_node_load1 3", "# raypulse_gpu_up 1") if keep.match(line)]


def test_only_the_lines_that_changed_at_their_place_are_parsed_again():
    families: dict[str, Family] = {}
    first = exposition.read(ANSWER, KEEP, None, families)
    same = exposition.read(ANSWER, KEEP, first.keys, families)
    assert same.items == [0, 1, 2]
    assert same.keys == first.keys
    stepped = exposition.read(ANSWER.replace('{rank="1"} 11', '{rank="1"} 12'), KEEP, first.keys, families)
    assert stepped.items == [0, Line(STEP, "raypulse_train_step", {"rank": "1"}, 12.0), 2]  # typed as learnt


def test_a_changed_line_of_a_family_not_seen_whole_makes_the_answer_parsed_whole():
    families: dict[str, Family] = {}
    first = exposition.read(ANSWER, KEEP, None, families)
    families.clear()  # as for a reader that never parsed this family whole
    read = exposition.read(ANSWER.replace("} 10", "} 20"), KEEP, first.keys, families)
    assert read.items[0] == Line(STEP, "raypulse_train_step", {"rank": "0"}, 20.0)
    assert read.items[1:] == first.items[1:]
    assert families["raypulse_train_step"] == STEP


def test_a_broken_line_is_refused_by_the_parser_whole_or_alone():
    families: dict[str, Family] = {}
    first = exposition.read(ANSWER, KEEP, None, families)
    broken = ANSWER.replace('{rank="1"} 11', '{rank="1" 11')
    with pytest.raises(ValueError, match="could not convert"):
        exposition.read(broken, KEEP, first.keys, families)
    with pytest.raises(ValueError, match="could not convert"):
        exposition.read(broken, KEEP, None, families)
