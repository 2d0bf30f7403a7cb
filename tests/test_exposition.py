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


def test_a_moved_value_of_the_same_series_is_read_alone_with_the_last_series():
    families: dict[str, Family] = {}
    first = exposition.read(ANSWER, KEEP, None, families)
    moved = ANSWER.replace('{rank="1"} 11', '{rank="1"} 12.5').replace('{gpu="0"} 1\n', '{gpu="0"} 2\n')
    read = exposition.read(moved, KEEP, first.keys, families, first.series)
    assert read.items == [0, exposition.Value(1, 12.5), exposition.Value(2, 2.0)]
    assert read.series == first.series  # the same series: the next read compares with them again
    again = exposition.read(moved.replace("12.5", "13"), KEEP, read.keys, families, read.series)
    assert again.items == [0, exposition.Value(1, 13.0), 2]
    # Without the last series (the health watcher), a changed line is parsed as before.
    assert exposition.read(moved, KEEP, first.keys, families).items[1] == Line(STEP, "raypulse_train_step",
                                                                                {"rank": "1"}, 12.5)


@pytest.mark.parametrize(("before", "after"), [
    ('raypulse_train_step{rank="0"} 10', 'raypulse_train_step{rank="0"} 11 1700000000000'),  # a timestamp
    ('raypulse_train_step{rank="0"} 10 1700000000000', 'raypulse_train_step{rank="0"} 11 1700000001000'),
    ('raypulse_train_step{rank="a} 7"} 10', 'raypulse_train_step{rank="a} 7"} 11'),  # a `}` in a label value
    ('raypulse_train_step{rank="0"} 10', 'raypulse_train_step{rank="0"} +Inf'),
    ('raypulse_train_step{rank="0"} 10', 'raypulse_train_step{rank="0"} NaN'),
    ('raypulse_train_step{rank="0"} 10', 'raypulse_train_step{rank="0"} 1e3'),
    ('raypulse_train_step 10', 'raypulse_train_step 11'),
    ('raypulse_train_step{rank="0"} 10', 'raypulse_train_step{rank="0"}\t11'),
    ('raypulse_train_step{rank="0"} 10', 'raypulse_train_step{rank="0"} 11 '),
    ('raypulse_train_step{rank="0"} 10', 'raypulse_train_step{rank="0"} ' + "9" * 400),  # an int past a float
])
def test_a_value_read_alone_is_what_the_parser_reads(before, after):
    """Whatever a changed line is, the fast path (a Value) or a parse gives the parser's reading of it, or
    the parser's refusal."""
    head = "# HELP raypulse_train_step Step.\n# TYPE raypulse_train_step gauge\n"
    families: dict[str, Family] = {}
    first = exposition.read(head + before + "\n", KEEP, None, families)
    try:
        expected = exposition.read(head + after + "\n", KEEP, None, {}).items[0]
    except (ValueError, OverflowError) as exc:
        with pytest.raises(type(exc)):
            exposition.read(head + after + "\n", KEEP, first.keys, families, first.series)
        return
    [item] = exposition.read(head + after + "\n", KEEP, first.keys, families, first.series).items
    assert isinstance(item, Line | exposition.Value)
    line = item if isinstance(item, Line) else Line(first.items[0].family, first.items[0].name,
                                                    first.items[0].labels, item.value)
    assert (line.name, line.labels) == (expected.name, expected.labels)
    assert line.value == expected.value or (line.value != line.value and expected.value != expected.value)


def test_an_underscore_in_a_value_is_refused_as_the_parser_refuses_it():
    families: dict[str, Family] = {}
    first = exposition.read(ANSWER, KEEP, None, families)
    with pytest.raises(ValueError, match="Invalid value"):
        exposition.read(ANSWER.replace('{rank="1"} 11', '{rank="1"} 1_1'), KEEP, first.keys, families, first.series)
