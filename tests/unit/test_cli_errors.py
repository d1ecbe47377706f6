"""Every `geofence` command answers a settings error (an unknown GEOFENCE_* variable) the
same way: one line on stderr naming the command and the variable, exit code 2, no
traceback. The error comes before any service is contacted."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy import cli, exit_codes

T = ["--tenant", "acme"]
COMMANDS = [["status"], ["device", "list"], ["device", "list", *T], ["device", "add", "d1", *T],
            ["device", "remove", "d1", *T], ["gateway", "list"], ["gateway", "add", "gw-1", *T],
            ["topology", "show"], ["fence", "list"], ["fence", "list", *T], ["fence", "show", "f1", *T],
            ["fence", "add", "/nonexistent.geojson", *T], ["fence", "remove", "f1", *T],
            ["subscription", "show", "rs-1", *T], ["subscription", "remove", "rs-1", *T], ["tenant", "list"],
            ["inspect", "object", "o1"], ["inspect", "object", "o1", *T], ["inspect", "fence", "f1", *T],
            ["inspect", "ring"], ["inspect", "worldmap"], ["inspect", "topology"],
            ["dlq", "list"], ["spark", "rebuild-bindings"], ["spark", "occupancy-analytics"]]
# a tenant's things name their tenant (exchanges/tenancy.py): without --tenant, a usage error
NEEDS_TENANT = [["device", "add", "d1"], ["device", "remove", "d1"], ["gateway", "add", "gw-1"],
                ["fence", "show", "f1"], ["fence", "add", "/nonexistent.geojson"], ["fence", "remove", "f1"],
                ["subscription", "show", "rs-1"], ["subscription", "remove", "rs-1"]]


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_an_unknown_setting_is_one_line_and_exit_2(argv: list[str], monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GEOFENCE_HOSTT", "127.0.0.1")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"geofence {argv[0]}") and "GEOFENCE_HOSTT" in err
    assert "did you mean GEOFENCE_HOST" in err


@pytest.mark.parametrize("argv", NEEDS_TENANT, ids=" ".join)
def test_a_tenants_command_without_its_tenant_is_a_usage_error(argv: list[str],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "the following arguments are required: --tenant" in err and "Traceback" not in err


def test_other_errors_are_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(args: object) -> int:
        raise RuntimeError("a bug")

    parser, module = cli.build_parser(["status"])
    assert module is not None
    monkeypatch.setattr(module, "run", boom)
    monkeypatch.setattr(cli, "build_parser", lambda argv: (parser, module))
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["status"])


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib import metadata
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"geofence {metadata.version('geofence')}"


# The exit code table (deploy/exit_codes.py), with every service the commands need unreachable:
# a state dir of its own (secrets, a CA) and every port pointing where nothing listens.
UNREACHABLE_COMMANDS = [["device", "list"], ["gateway", "list"], ["app", "list"], ["sensor", "list"],
                        ["fence", "list"], ["fence", "show", "f1", *T], ["fence", "remove", "f1", *T],
                        ["tenant", "list"], ["subscription", "list"], ["dlq", "list"], ["region", "list"],
                        ["worker", "list"], ["ingress", "list"], ["inspect", "worldmap"],
                        ["inspect", "object", "o1"], ["device", "add", "d1", *T], ["migrate"]]


@pytest.fixture
def nothing_listens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datetime as dt

    from deploy import tls
    from deploy.settings import Settings, ensure_secrets
    monkeypatch.setenv("GEOFENCE_STATE_DIR", str(tmp_path))
    for n, key in enumerate(("AMQP", "MANAGEMENT", "PG", "MEMCACHED", "API", "FIREBASE_AUTH", "PROMETHEUS",
                             "MQTT", "GUARD"), start=1):
        monkeypatch.setenv(f"GEOFENCE_{key}_PORT", str(n))  # privileged, unbound: refused at once
    ensure_secrets(Settings.from_env())
    tls.ensure(tmp_path, "127.0.0.1", now=dt.datetime.now(dt.UTC))


@pytest.mark.parametrize("argv", UNREACHABLE_COMMANDS, ids=" ".join)
def test_a_service_unreachable_is_exit_3_in_one_line(argv: list[str], nothing_listens: None,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == exit_codes.UNREACHABLE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"geofence {argv[0]}") and "error:" in err


def test_bad_input_is_exit_2_and_a_refusal_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.geojson"
    bad.write_text("{not json")
    assert cli.main(["fence", "add", str(bad), *T]) == exit_codes.USAGE
    assert "invalid fence" in capsys.readouterr().err
    assert cli.main(["fence", "add", str(tmp_path / "missing.geojson"), *T]) == exit_codes.USAGE
    assert "cannot be read" in capsys.readouterr().err
    refused = exit_codes.say("x", RuntimeError("no such thing"))
    assert refused == exit_codes.FAILED
    # a connection refused deep inside whatever wraps it is still a service unreachable
    try:
        try:
            raise ConnectionRefusedError(111, "Connection refused")
        except ConnectionRefusedError:
            raise RuntimeError("the client gave up") from None
    except RuntimeError as exc:
        assert exit_codes.code_of(exc) == exit_codes.UNREACHABLE


def test_a_command_whose_extra_is_missing_says_which(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    import sys
    for name in [m for m in sys.modules if m == "deploy.demo_cmd" or m.split(".")[0] == "paho"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "paho", None)  # as if the demo extra were not installed
    assert cli.main(["demo"]) == exit_codes.USAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "geofence[demo]" in err and "Traceback" not in err, err
