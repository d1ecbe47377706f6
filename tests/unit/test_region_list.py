"""`geofence region list`'s rows (deploy/region_cmd.py) from a worldmap, the stored bindings and
two rounds of x-geo answers: shares, intervals, rates, a region down, a drifted one flagged."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from deploy.region_cmd import add_arguments, human, rows, run
from exchanges.worldmap import TOP, Worldmap


def answer(fences: int, objects: int, positions: int, received: int) -> dict[str, object]:
    return {"stats": {"fences": fences, "objects": objects},
            "counters": {"positions": positions, "received": received}}


def test_rows_shares_rates_down_and_drift() -> None:
    quarter = (TOP + 1) // 4
    wm = Worldmap(3, ("a", "b", "c"), np.array([0, quarter, 2 * quarter, 3 * quarter], np.uint64),
                  np.array([0, 1, 0, 2], np.int64))
    stored = {"a": (10, 400), "b": (5, 90), "c": (2, 8), "old": (1, 1)}
    first = {"a": answer(10, 7, 1_000, 50), "b": answer(4, 3, 0, 0), "c": {"error": "no answer"}}
    second = {"a": answer(10, 9, 5_000, 90), "b": answer(4, 3, 200, 10), "c": {"error": "no answer"}}
    got = {r["region"]: r for r in rows(wm, stored, first, second, 2.0)}
    a, b, c, old = got["a"], got["b"], got["c"], got["old"]
    assert a["intervals"] == [(0, quarter - 1), (2 * quarter, 3 * quarter - 1)]
    assert abs(a["share"] - 0.5) < 1e-12 and abs(b["share"] - 0.25) < 1e-12
    assert abs(sum(r["share"] for r in got.values()) - 1.0) < 1e-12
    assert (a["positions_per_s"], a["messages_per_s"], a["objects"]) == (2_000.0, 20.0, 9)
    assert (a["fences_stored"], a["fences_bound"], a["ranges_stored"]) == (10, 10, 400)
    assert not c["up"] and "positions_per_s" not in c and c["intervals"] == [(3 * quarter, TOP)]
    assert not old["in_worldmap"] and old["intervals"] == [] and old["share"] == 0.0
    text = human(list(got.values()))
    assert "5/4 !" in text and "the x-geo holds another number of fences" in text
    assert "x-geo not answering: c, old" in text
    assert f"[0, {quarter - 1}], [{2 * quarter}, {3 * quarter - 1}]" in text


def test_a_single_round_has_no_rates() -> None:
    wm = Worldmap.single("a")
    got = rows(wm, {}, {"a": answer(0, 0, 5, 5)}, {"a": answer(0, 0, 9, 9)}, 0.0)
    assert got[0]["up"] and "positions_per_s" not in got[0] and got[0]["share"] == 1.0


def test_add_and_remove_refuse_incomplete_commands_and_an_overriding_environment(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser, "region")
    monkeypatch.delenv("GEOFENCE_REGIONS", raising=False)
    assert run(parser.parse_args(["add", "c"])) == 2
    assert "give the region and --split-from" in capsys.readouterr().err
    assert run(parser.parse_args(["remove", "c"])) == 2
    assert "--into" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # --at and --balance exclude each other
        parser.parse_args(["add", "c", "--split-from", "a", "--at", "5", "--balance"])
    monkeypatch.setenv("GEOFENCE_REGIONS", "a,b")
    assert run(parser.parse_args(["add", "c", "--split-from", "a"])) == 2
    assert "GEOFENCE_REGIONS is set" in capsys.readouterr().err


def test_worker_commands_refuse_incomplete_arguments(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from deploy import worker_cmd
    parser = argparse.ArgumentParser()
    worker_cmd.add_arguments(parser, "worker")
    monkeypatch.delenv("GEOFENCE_WORKERS", raising=False)
    assert worker_cmd.run(parser.parse_args(["hot", "F1"])) == 2  # hot needs --masters
    assert "--masters goes with hot" in capsys.readouterr().err
    assert worker_cmd.run(parser.parse_args(["add", "w9", "--masters", "2"])) == 2  # and only hot
    assert "--masters goes with hot" in capsys.readouterr().err
    assert worker_cmd.run(parser.parse_args(["hot", "--masters", "2"])) == 2
    assert "give the fences' names" in capsys.readouterr().err
    assert worker_cmd.run(parser.parse_args(["add", "w8", "w9"])) == 2  # one worker at a time
    assert "worker's name (one)" in capsys.readouterr().err
    monkeypatch.setenv("GEOFENCE_WORKERS", "w0,w1")
    assert worker_cmd.run(parser.parse_args(["hot", "F1", "--masters", "2"])) == 2
    assert "GEOFENCE_WORKERS is set" in capsys.readouterr().err
