"""deploy/migrate.py: reading the ordered migration files (no database needed)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from deploy.migrate import FILE_RE, MIGRATIONS_DIR, Migration, MigrationError, migrations


def write(directory: Path, *names: str) -> None:
    for name in names:
        (directory / name).write_text(f"-- {name}\nSELECT 1;\n")


def test_sorted_by_number_whatever_the_creation_order(tmp_path: Path) -> None:
    write(tmp_path, "0003_three.sql", "0001_one.sql", "0010_ten.sql", "0002_two.sql", "0004_four.sql",
          "0005_five.sql", "0006_six.sql", "0007_seven.sql", "0008_eight.sql", "0009_nine.sql")
    found = migrations(tmp_path)
    assert [m.number for m in found] == list(range(1, 11))
    assert [m.name for m in found][:3] == ["one", "two", "three"]
    assert found[-1] == Migration(10, "ten", "-- 0010_ten.sql\nSELECT 1;\n")


def test_the_text_is_read_exactly(tmp_path: Path) -> None:
    sql = "CREATE TABLE t (x int);\n-- é ünïcode\n\nINSERT INTO t VALUES (1);"
    (tmp_path / "0001_make_t.sql").write_text(sql)
    (m,) = migrations(tmp_path)
    assert (m.number, m.name, m.sql) == (1, "make_t", sql)


def test_empty_directory_has_no_migrations(tmp_path: Path) -> None:
    assert migrations(tmp_path) == []


def test_other_files_are_ignored(tmp_path: Path) -> None:
    write(tmp_path, "0001_one.sql")
    (tmp_path / "README.md").write_text("notes")
    (tmp_path / "0002_draft.sql.bak").write_text("SELECT 2;")
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", "0002_nested.sql")
    assert [m.name for m in migrations(tmp_path)] == ["one"]


@pytest.mark.parametrize("names", [
    ("0001_one.sql", "0003_three.sql"),
    ("0002_two.sql",),
    ("0000_zero.sql", "0001_one.sql"),
    ("0001_one.sql", "0001_again.sql"),
    ("0001_one.sql", "0002_two.sql", "0004_four.sql"),
])
def test_gaps_duplicates_and_wrong_start_are_refused(tmp_path: Path, names: tuple[str, ...]) -> None:
    write(tmp_path, *names)
    with pytest.raises(MigrationError, match=r"numbered 1, 2, 3\.\.\. without gaps") as info:
        migrations(tmp_path)
    numbers = sorted(int(n[:4]) for n in names)
    assert str(numbers) in str(info.value)


@pytest.mark.parametrize("bad", ["1_one.sql", "001_one.sql", "00001_one.sql", "0002-two.sql", "0002_Two.sql",
                                 "0002_two words.sql", "0002_.sql", "0002.sql", "two.sql", "0002_two.SQL.sql",
                                 "0002_tw-o.sql"])
def test_bad_names_are_refused_by_name(tmp_path: Path, bad: str) -> None:
    write(tmp_path, "0001_one.sql", bad)
    with pytest.raises(MigrationError) as info:
        migrations(tmp_path)
    assert str(info.value) == f"{bad}: migration files are named NNNN_name.sql"


def test_file_name_pattern() -> None:
    assert FILE_RE.fullmatch("0042_add_index_2.sql")
    assert not FILE_RE.fullmatch("0042_add_index.sql.orig")


def test_the_real_migrations_parse_and_start_at_one() -> None:
    found = migrations()
    assert found == migrations(MIGRATIONS_DIR)
    assert found, "deploy/migrations has no migration"
    assert [m.number for m in found] == list(range(1, len(found) + 1))
    assert found[0].number == 1
    for m in found:
        assert m.sql.strip(), f"{m.number:04d}_{m.name}.sql is empty"
        assert (MIGRATIONS_DIR / f"{m.number:04d}_{m.name}.sql").read_text() == m.sql
        assert len(m.sha256) == 64


def test_sha256_is_of_the_text_and_changes_with_it() -> None:
    a = Migration(1, "one", "SELECT 1;")
    assert a.sha256 == hashlib.sha256(b"SELECT 1;").hexdigest()
    assert Migration(1, "one", "SELECT 1; ").sha256 != a.sha256
    assert Migration(1, "one", "select 1;").sha256 != a.sha256
    # only the text counts, not the number or the name
    assert Migration(2, "renamed", "SELECT 1;").sha256 == a.sha256


def test_sha256_of_a_file_changes_when_the_file_does(tmp_path: Path) -> None:
    path = tmp_path / "0001_one.sql"
    path.write_text("CREATE TABLE a (x int);")
    before = migrations(tmp_path)[0].sha256
    assert migrations(tmp_path)[0].sha256 == before  # stable
    path.write_text("CREATE TABLE a (x bigint);")
    assert migrations(tmp_path)[0].sha256 != before


def test_migration_error_is_a_runtime_error() -> None:
    assert issubclass(MigrationError, RuntimeError)
