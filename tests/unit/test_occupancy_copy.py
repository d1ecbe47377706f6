"""The occupancy job's two CSV formats (pure): PostgreSQL's COPY output of the events parsed
into Arrow, and the staged rows written as PostgreSQL reads them (text[] literals included)."""

from __future__ import annotations

import datetime as dt
import io
import math

import pyarrow as pa
import pyarrow.csv as pcsv

from spark_jobs import occupancy, occupancy_core


def test_copy_csv_is_parsed_with_nulls_empty_strings_infinities_and_quotes_told_apart() -> None:
    data = (b'cafe,"say ""hi""",0,t,1709540000.25,1709540001.5\n'
            b'"a,b","",0,f,1709540002,1709540002\n'
            b'park,"two\nlines",1,t,-Infinity,-Infinity\n'
            b'gate,,2,,-3,0.1\n')
    t = occupancy.parse_events(data)
    assert t.schema == pa.schema(list(occupancy.EVENT_TYPES.items()))
    assert t.column("fence_id").to_pylist() == ["cafe", "a,b", "park", "gate"]
    assert t.column("object_id").to_pylist() == ['say "hi"', "", "two\nlines", None]
    assert t.column("kind").to_pylist() == [0, 0, 1, 2]
    assert t.column("enter").to_pylist() == [True, False, True, None]
    assert t.column("t").to_pylist()[:2] == [1709540000.25, 1709540002.0]
    assert t.column("t")[2].as_py() == -math.inf
    assert t.column("ts").to_pylist()[3] == 0.1
    assert occupancy.parse_events(b"").num_rows == 0


def test_object_lists_become_text_array_literals_every_element_quoted() -> None:
    lists = pa.array([["a", 'say "hi"'], ["back\\slash", "{x,y}"], []], pa.list_(pa.string()))
    assert occupancy.pg_text_arrays(lists).to_pylist() == [
        '{"a","say \\"hi\\""}', '{"back\\\\slash","{x,y}"}', "{}"]
    assert occupancy.pg_text_arrays(lists.slice(1, 1)).to_pylist() == ['{"back\\\\slash","{x,y}"}']


def test_staged_rows_are_the_tables_columns_with_dates_and_exact_floats() -> None:
    out = occupancy_core.core_table(
        2, kind=occupancy_core.HOURLY, fence_id=pa.array(["cafe", "a,b"]), day=pa.array([0, 2], pa.int32()),
        hour=pa.array([9, 23], pa.int16()), entries=[1, 0], exits=[0, 1], mean_occupancy=[1 / 3, 0.1],
        peak_occupancy=[1, 1], stays=[1, 0], dwell_p50_s=[12.5, float("nan")],
        dwell_p90_s=[12.5, float("nan")])
    columns, data = occupancy.stage_csv(out, "occupancy_hourly", dt.date(2024, 3, 4), "run-1", "3.1")
    assert columns == ["run_id", "task", "fence_id", "day", "hour", "entries", "exits", "mean_occupancy",
                       "peak_occupancy", "stays", "dwell_p50_s", "dwell_p90_s"]
    back = pcsv.read_csv(io.BytesIO(data), read_options=pcsv.ReadOptions(column_names=columns),
                         convert_options=pcsv.ConvertOptions(null_values=[""], strings_can_be_null=True,
                                                             column_types={"task": pa.string()}))
    rows = back.to_pylist()
    assert [(r["run_id"], r["task"], r["fence_id"], r["day"]) for r in rows] == [
        ("run-1", "3.1", "cafe", dt.date(2024, 3, 4)), ("run-1", "3.1", "a,b", dt.date(2024, 3, 6))]
    assert rows[0]["mean_occupancy"] == 1 / 3 and rows[1]["dwell_p50_s"] is None  # NaN: NULL
    assert occupancy.stage_csv(out, "occupancy_open", dt.date(2024, 3, 4), "r", "0.0")[1] == b""
