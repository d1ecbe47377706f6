"""Every `geofence` command answers a settings error (an unknown GEOFENCE_* variable) the
same way: one line on stderr naming the command and the variable, exit code 2, no
traceback. The error comes before any service is contacted."""

from __future__ import annotations

import pytest

from deploy import cli

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
