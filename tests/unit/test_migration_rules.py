"""deploy/migration_rules.py: the migrations add constraints to existing tables NOT VALID and
validate them in a later file; the rule itself flags what it must."""

from __future__ import annotations

from deploy.migrate import FILE_RE, MIGRATIONS_DIR
from deploy.migration_rules import FIRST_CHECKED, lock_problems


def _files() -> dict[int, str]:
    out = {}
    for path in MIGRATIONS_DIR.glob("*.sql"):
        m = FILE_RE.fullmatch(path.name)
        assert m, path.name
        out[int(m.group(1))] = path.read_text()
    return out


def test_the_migrations_follow_the_rule() -> None:
    files = _files()
    assert max(files) >= FIRST_CHECKED - 1  # the rule starts right after what exists
    assert lock_problems(files) == []


N = FIRST_CHECKED


def test_the_rule_flags_what_locks_a_table() -> None:
    base = {1: "CREATE TABLE fence_event (id text, ts double precision);"}
    cases = {
        "ALTER TABLE fence_event ADD CONSTRAINT c1 CHECK (ts > 0);": "without NOT VALID",
        "ALTER TABLE fence_event ADD CONSTRAINT c2 FOREIGN KEY (id) REFERENCES fence (id) NOT VALID;":
            "no later file validates it",
        "ALTER TABLE fence_event ADD COLUMN f text REFERENCES fence (id);": "a column added",
        "ALTER TABLE fence_event ALTER COLUMN ts SET NOT NULL;": "SET NOT NULL scans",
    }
    for sql, why in cases.items():
        problems = lock_problems({**base, N: sql})
        assert len(problems) == 1 and why in problems[0], (sql, problems)


def test_what_the_rule_allows() -> None:
    ok = {1: "CREATE TABLE fence_event (id text, ts double precision);",
          N: "ALTER TABLE fence_event ADD CONSTRAINT c1 CHECK (ts > 0) NOT VALID;\n"
             "ALTER TABLE fence_event ADD CONSTRAINT c3 CHECK (id IS NOT NULL) NOT VALID;",
          N + 1: "ALTER TABLE fence_event VALIDATE CONSTRAINT c1;\n"
                 "ALTER TABLE fence_event VALIDATE CONSTRAINT c3;",
          N + 2: "ALTER TABLE fence_event ALTER COLUMN id SET NOT NULL;",
          N + 3: "CREATE TABLE webhook (id text PRIMARY KEY);\n"
                 "ALTER TABLE webhook ADD CONSTRAINT w1 CHECK (id <> '');"}  # a new table is empty
    assert lock_problems(ok) == []
