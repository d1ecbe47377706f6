"""exchanges/shell/ without a broker: configuration (SidecarConfig from the environment, the
durability settings), URL masking, amqp_for and describe. Beside it: test_shell_counters.py
(reason keys, counters, backoff), test_shell_intake.py (the intake / settle machinery, with small
fakes of aio-pika's queue and messages) and test_shell_broker_gone.py (a lost broker, the
instance lock)."""

from __future__ import annotations

import os
import re
from urllib.parse import parse_qs, urlsplit

import pytest

from exchanges import topology as t
from exchanges.settings import mask
from exchanges.shell import ConfigError, SidecarConfig

AMQP = "amqp://geofence:amqp-s3cret@localhost:5672/"
PG = "postgresql://geofence:pg-pa55word@localhost:5433/geofence"
ENV = {"GEOFENCE_AMQP_URL": AMQP, "GEOFENCE_POSTGRES_URL": PG}


def config(**env: str) -> SidecarConfig:
    return SidecarConfig.from_env("x-geo", "a", {**ENV, **env})


# --------------------------------------------------------------------------- mask_url


@pytest.mark.parametrize(("url", "masked"), [
    ("amqp://user:secret@host:5672/vh", "amqp://user:****@host:5672/vh"),
    ("amqps://user:secret@host/?name=x", "amqps://user:****@host/?name=x"),
    ("postgresql://geofence:pg-pa55word@localhost:5433/geofence",
     "postgresql://geofence:****@localhost:5433/geofence"),
    ("postgres://u:p%40ss@db/x?sslmode=require", "postgres://u:****@db/x?sslmode=require"),
    # the password also spelled elsewhere in the URL: only the password is masked
    ("amqp://guest:guest@guest:5672/guest", "amqp://guest:****@guest:5672/guest"),
    ("amqp://user:@host/", "amqp://user:****@host/"),
])
def test_mask_url_hides_the_password(url: str, masked: str) -> None:
    assert mask(url) == masked


@pytest.mark.parametrize("url", ["amqp://user@host:5672/", "amqp://host/", "postgresql://localhost/geofence",
                                 "postgresql:///geofence?host=/run/pg", "not a url"])
def test_mask_url_without_password_is_unchanged(url: str) -> None:
    assert mask(url) == url


# --------------------------------------------------------------------------- from_env


def test_from_env_minimal_takes_the_defaults() -> None:
    c = SidecarConfig.from_env("x-fence", "w0", {**ENV, "PATH": "/bin", "HOME": "/root"})
    assert (c.role, c.instance, c.amqp_url, c.postgres_url) == ("x-fence", "w0", AMQP, PG)
    assert c.regions == t.Topology.regions == ("a", "b")
    assert c.workers == t.Topology.workers == ("w0", "w1")
    assert (c.drain_s, c.batch_max, c.prefetch, c.log_level) == (10.0, 5000, 10_000, "INFO")
    assert c.name == "x-fence-w0"


def test_from_env_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in [k for k in os.environ if k.startswith("GEOFENCE_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("GEOFENCE_AMQP_URL", AMQP)
    monkeypatch.setenv("GEOFENCE_POSTGRES_URL", PG)
    monkeypatch.setenv("GEOFENCE_BATCH_MAX", "17")
    assert SidecarConfig.from_env("x-ingress", "").batch_max == 17


def test_from_env_all_settings() -> None:
    c = config(GEOFENCE_REGIONS=" north , south,east ", GEOFENCE_WORKERS="w-0,w-1,w-2",
               GEOFENCE_DRAIN_S="2.5", GEOFENCE_BATCH_MAX="100", GEOFENCE_PREFETCH="300",
               GEOFENCE_LOG_LEVEL="debug")
    assert c.regions == ("north", "south", "east")
    assert c.workers == ("w-0", "w-1", "w-2")
    assert c.drain_s == 2.5 and c.batch_max == 100 and c.prefetch == 300
    assert isinstance(c.batch_max, int) and isinstance(c.prefetch, int)
    assert c.log_level == "DEBUG"
    assert c.topology.regions == ("north", "south", "east")


@pytest.mark.parametrize("missing", ["GEOFENCE_AMQP_URL", "GEOFENCE_POSTGRES_URL"])
def test_required_urls(missing: str) -> None:
    env = dict(ENV)
    del env[missing]
    with pytest.raises(ConfigError, match=f"^{missing} must be set"):
        SidecarConfig.from_env("x-geo", "a", env)
    with pytest.raises(ConfigError, match=f"^{missing} must be set"):
        SidecarConfig.from_env("x-geo", "a", {**env, missing: ""})


def test_both_urls_missing_are_both_named() -> None:
    with pytest.raises(ConfigError, match="GEOFENCE_AMQP_URL and GEOFENCE_POSTGRES_URL must be set"):
        SidecarConfig.from_env("x-geo", "a", {})


def test_unknown_setting_is_named() -> None:
    with pytest.raises(ConfigError) as info:
        config(GEOFENCE_BATCHMAX="10")
    msg = str(info.value)
    assert msg.startswith("unknown setting GEOFENCE_BATCHMAX (did you mean GEOFENCE_BATCH_MAX?);")
    assert "GEOFENCE_BATCH_MAX" in msg  # the known ones are listed


def test_several_unknown_settings_are_all_named_sorted() -> None:
    hint = r"( \(did you mean \w+\?\))?"
    with pytest.raises(ConfigError, match=rf"^unknown settings GEOFENCE_A{hint}, GEOFENCE_Z{hint};"):
        config(GEOFENCE_Z="1", GEOFENCE_A="1")


def test_unknown_setting_is_refused_even_without_urls() -> None:
    with pytest.raises(ConfigError, match="unknown setting GEOFENCE_TYPO"):
        SidecarConfig.from_env("x-geo", "a", {"GEOFENCE_TYPO": "1"})


def test_also_known_keys_are_accepted() -> None:
    env = {**ENV, "GEOFENCE_MQTT_PORT": "1883", "GEOFENCE_EXTRA": "x"}
    c = SidecarConfig.from_env("x-ingress", "", env, also_known=("GEOFENCE_MQTT_PORT", "GEOFENCE_EXTRA"))
    assert c.amqp_url == AMQP
    with pytest.raises(ConfigError, match=r"unknown setting GEOFENCE_EXTRA( \(did you mean \w+\?\))?;"):
        SidecarConfig.from_env("x-ingress", "", env, also_known=["GEOFENCE_MQTT_PORT"])


@pytest.mark.parametrize(("key", "raw", "why"), [
    ("GEOFENCE_DRAIN_S", "0", "must be positive"),
    ("GEOFENCE_DRAIN_S", "-1", "must be positive"),
    ("GEOFENCE_DRAIN_S", "nan", "must be positive"),
    ("GEOFENCE_DRAIN_S", "ten", "not a number"),
    ("GEOFENCE_DRAIN_S", "", "not a number"),
    ("GEOFENCE_BATCH_MAX", "0", "must be positive"),
    ("GEOFENCE_BATCH_MAX", "-5", "must be positive"),
    ("GEOFENCE_BATCH_MAX", "1.5", "not a number"),
    ("GEOFENCE_PREFETCH", "0", "must be positive"),
    ("GEOFENCE_PREFETCH", "many", "not a number"),
])
def test_non_positive_or_non_numbers_refused(key: str, raw: str, why: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(f'{key}={raw!r}: {why}')}$"):
        config(**{key: raw})


@pytest.mark.parametrize("url", ["http://u:amqp-s3cret@host/", "localhost:5672", "mqtt://u:amqp-s3cret@h/",
                                 "postgresql://u:amqp-s3cret@h/db"])
def test_bad_amqp_scheme_is_refused_without_showing_the_password(url: str) -> None:
    with pytest.raises(ConfigError, match=r"GEOFENCE_AMQP_URL=.*not an amqp:// URL") as info:
        config(GEOFENCE_AMQP_URL=url)
    assert "amqp-s3cret" not in str(info.value)


@pytest.mark.parametrize("url", ["mysql://u:pg-pa55word@h/db", "amqp://u:pg-pa55word@h/", "localhost/db"])
def test_bad_postgres_scheme_is_refused_without_showing_the_password(url: str) -> None:
    with pytest.raises(ConfigError, match=r"GEOFENCE_POSTGRES_URL=.*not a postgresql:// URL") as info:
        config(GEOFENCE_POSTGRES_URL=url)
    assert "pg-pa55word" not in str(info.value)


def test_amqps_and_postgres_schemes_accepted() -> None:
    c = config(GEOFENCE_AMQP_URL="amqps://u:p@h/", GEOFENCE_POSTGRES_URL="postgres://u:p@h/db")
    assert c.amqp_url == "amqps://u:p@h/" and c.postgres_url == "postgres://u:p@h/db"


@pytest.mark.parametrize(("key", "value"), [
    ("GEOFENCE_REGIONS", "a,,b"),
    ("GEOFENCE_REGIONS", ""),
    ("GEOFENCE_REGIONS", "a,a"),
    ("GEOFENCE_REGIONS", "a_b"),
    ("GEOFENCE_REGIONS", "a.b,c"),
    ("GEOFENCE_WORKERS", "w0,w0"),
    ("GEOFENCE_WORKERS", "w0, ,w1"),
    ("GEOFENCE_WORKERS", "w 0"),
])
def test_bad_regions_or_workers_refused(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=r"^GEOFENCE_REGIONS / GEOFENCE_WORKERS: "):
        config(**{key: value})


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


# --------------------------------------------------------------------------- amqp_for, describe


def query(url: str) -> dict[str, list[str]]:
    return parse_qs(urlsplit(url).query)


def test_amqp_for_sets_the_vhost_and_names_the_connection() -> None:
    url = config().amqp_for("gf-region-a")
    assert url == "amqp://geofence:amqp-s3cret@localhost:5672/gf-region-a?name=x-geo-a"


def test_amqp_for_quotes_the_vhost() -> None:
    c = config()
    assert urlsplit(c.amqp_for("/")).path == "/%2F"
    assert urlsplit(c.amqp_for("a/b c")).path == "/a%2Fb%20c"
    assert urlsplit(c.amqp_for("x?y#z")).path == "/x%3Fy%23z"


def test_amqp_for_replaces_the_path_of_the_url() -> None:
    c = config(GEOFENCE_AMQP_URL="amqp://u:p@h:5672/some-vhost")
    assert urlsplit(c.amqp_for("gf-fences")).path == "/gf-fences"


def test_amqp_for_keeps_a_given_connection_name_and_other_parameters() -> None:
    c = config(GEOFENCE_AMQP_URL="amqp://u:p@h:5672/?heartbeat=30&name=my%20sidecar")
    url = c.amqp_for("gf-ingress")
    assert query(url) == {"heartbeat": ["30"], "name": ["my sidecar"]}
    assert urlsplit(url).netloc == "u:p@h:5672"


def test_amqp_for_name_without_instance_is_the_role() -> None:
    c = SidecarConfig.from_env("x-ingress", "", ENV)
    assert c.name == "x-ingress"
    assert query(c.amqp_for("gf-ingress")) == {"name": ["x-ingress"]}


def test_describe_never_contains_the_passwords() -> None:
    c = config(GEOFENCE_REGIONS="a,b,c", GEOFENCE_DRAIN_S="2.5")
    d = c.describe()
    assert "amqp-s3cret" not in d and "pg-pa55word" not in d
    assert "amqp://geofence:****@localhost:5672/" in d
    assert "postgresql://geofence:****@localhost:5433/geofence" in d
    assert d.startswith("x-geo-a: ")
    assert "regions a,b,c" in d and "workers w0,w1" in d
    assert "batch <= 5000" in d and "prefetch 10000" in d and "drain 2.5s" in d


def test_describe_hides_a_password_given_as_a_dsn_parameter() -> None:
    c = config(GEOFENCE_POSTGRES_URL="postgresql://geofence@localhost:5433/geofence?password=pg-pa55word")
    assert "pg-pa55word" not in c.describe()


# --------------------------------------------------------------------------- durability settings


def test_journal_dir_and_persistence() -> None:
    c = SidecarConfig.from_env("x-fence", "w0", ENV)
    assert (c.journal_dir, c.persistence) == ("", True)
    c = SidecarConfig.from_env("x-fence", "w0", {**ENV, "GEOFENCE_JOURNAL_DIR": "/srv/x",
                                                 "GEOFENCE_PERSISTENCE": "OFF"})
    assert (c.journal_dir, c.persistence) == ("/srv/x", False)
    assert "PERSISTENCE OFF" in c.describe() and "journal /srv/x" in c.describe()
    with pytest.raises(ConfigError, match="not absolute"):
        SidecarConfig.from_env("x-fence", "w0", {**ENV, "GEOFENCE_JOURNAL_DIR": "rel/dir"})
    with pytest.raises(ConfigError, match="on or off"):
        SidecarConfig.from_env("x-fence", "w0", {**ENV, "GEOFENCE_PERSISTENCE": "maybe"})


def test_x_fence_refuses_to_run_durably_without_a_journal_dir() -> None:
    from fence.x_fence.sidecar import FenceSidecar

    with pytest.raises(ConfigError, match="GEOFENCE_JOURNAL_DIR"):
        FenceSidecar(SidecarConfig.from_env("x-fence", "w0", ENV))
    fast = SidecarConfig.from_env("x-fence", "w0", {**ENV, "GEOFENCE_PERSISTENCE": "off"})
    assert FenceSidecar(fast).journal is None
