"""deploy/progress.py: on a terminal a bar with its count, rate and ETA, the step lines left
out; in a pipe or a log the step lines, no bar."""

from __future__ import annotations

import io

import pytest

from deploy.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    out = Terminal()
    monkeypatch.setattr("sys.stderr", out)
    with Progress(300, "devices", "device") as bar:
        for done in (100, 200, 300):
            bar.say(f"  {done:,} / 300 devices")
            bar.to(done, 300)
    text = out.getvalue()
    assert "devices: 100%" in text and "300/300" in text and "/ 300 devices" not in text


def test_a_pipe_gets_the_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr("sys.stderr", out)
    with Progress(2, "devices", "device") as bar:
        bar.say("  1 / 2 devices")
        bar.to(1, 2)
        bar.say("  2 / 2 devices")
        bar.to(2, 2)
    assert out.getvalue() == "  1 / 2 devices\n  2 / 2 devices\n"


def test_output_lines_go_to_stdout_above_the_bar(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    err = Terminal()
    monkeypatch.setattr("sys.stderr", err)
    with Progress(0, "gf-ingress dead letters", "letter") as bar:
        bar.to(0, 2)
        bar.write("replayed  gf-ingress  x-ingress.p03  m-1")
        bar.to(2, 2)
    assert "replayed  gf-ingress  x-ingress.p03  m-1" in capsys.readouterr().out
    assert "2/2" in err.getvalue()
