"""exchanges/text.py: the one rule for ids and the one for names, types and addresses, and the
places that use them (fence names, tenant names, hives)."""

from __future__ import annotations

import unicodedata
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exchanges.fence_def import InvalidFence, check_name
from exchanges.text import ADDRESS_MAX, NAME_MAX, TextError, check_id, check_text, shown
from fence import tenants
from fence.venues.owner_store import _checked_hive
from fence.venues.user_store import UserError

HIVE = {"id": "cafe-1", "name": "Café Central", "type": "cafe", "lon": 9.52, "lat": 47.14}


@pytest.mark.parametrize("good", ["a", "A-1_b", "x" * 64, "0van"])
def test_an_id_of_the_alphabet_is_taken(good: str) -> None:
    assert check_id(good, "id") == good


@pytest.mark.parametrize("bad", ["", "-x", "x" * 65, "a.b", "../../x", "a/b", "a b", "a\x00b", "ä",
                                 "x\n", "a:b", 7, None, ["a"]])
def test_an_id_outside_the_alphabet_is_refused_with_its_rule(bad: Any) -> None:
    with pytest.raises(TextError, match=r"sensor id .*1-64 characters"):
        check_id(bad, "sensor id")


HEBREW_WITH_A_MARK = "\u05e9\u05dc\u05d5\u05dd\u200f\u05e2\u05d5\u05dc\u05dd"  # RLM between two words


@pytest.mark.parametrize("good", ["Vaduz", "Zürich Hauptbahnhof", "東京駅", "مقهى", "<b>bold</b> & co",
                                  HEBREW_WITH_A_MARK, "a\u200eb", "\U0001F600 emoji", "x" * NAME_MAX])
def test_text_in_any_script_and_markup_is_taken(good: str) -> None:
    assert check_text(good, "name") == unicodedata.normalize("NFC", good)


@pytest.mark.parametrize(("bad", "why"), [
    ("a\x00b", "a control character U\\+0000 at character 2"),
    ("two\nlines", "control character U\\+000A"),
    ("tab\there", "control character U\\+0009"),
    ("\x1b[31mred", "control character U\\+001B at character 1"),
    ("bell\x7f", "control character U\\+007F"),
    ("\x85next", "control character U\\+0085"),
    ("invoice\u202efdp.exe", "bidirectional override, embedding or isolate U\\+202E at character 8"),
    ("a\u202ab", "bidirectional .* U\\+202A"),
    ("a\u2066b\u2069", "bidirectional .* U\\+2066"),
    ("a\ud800b", "lone surrogate"),
    ("a\ufdd0", "noncharacter U\\+FDD0"),
    ("a\uffff", "noncharacter U\\+FFFF"),
    ("a\U0010fffe", "noncharacter U\\+10FFFE"),
    (" padded", "white space around"),
    ("padded ", "white space around"),
    ("\u00a0nbsp", "white space around"),
    ("x" * (NAME_MAX + 1), f"{NAME_MAX + 1:,} characters; at most {NAME_MAX:,}"),
    ("x" * 100_000, "100,000 characters; at most"),
    ("", "must not be empty"),
])
def test_text_that_could_show_something_else_is_refused_saying_why(bad: str, why: str) -> None:
    with pytest.raises(TextError, match=why) as caught:
        check_text(bad, "name")
    assert str(caught.value).startswith("name")
    assert len(str(caught.value)) < 300  # a huge input is never echoed whole


def test_text_is_stored_in_one_normal_form_and_its_length_counted_after() -> None:
    decomposed = "Cafe\u0301"  # e + combining acute: 5 code points, 4 in NFC
    assert check_text(decomposed, "name") == "Café"
    assert check_text("e\u0301" * 150, "name", 150) == "é" * 150  # 300 code points in, 150 after


def test_an_optional_text_may_be_empty_and_a_non_string_never() -> None:
    assert check_text("", "address", ADDRESS_MAX, required=False) == ""
    for bad in (None, 3, b"bytes", {"a": 1}):
        with pytest.raises(TextError, match="a string expected"):
            check_text(bad, "address", required=False)


@given(st.text(max_size=60))
def test_accepted_text_is_clean_and_refusals_name_the_field(text: str) -> None:
    try:
        out = check_text(text, "field")
    except TextError as exc:
        assert str(exc).startswith("field")
        return
    assert out and out == out.strip() and out == unicodedata.normalize("NFC", out)
    assert not any(unicodedata.category(c) in ("Cc", "Cs") for c in out)
    assert not any(0x202A <= ord(c) <= 0x202E or 0x2066 <= ord(c) <= 0x2069 for c in out)
    out.encode("utf-8")  # storable


def test_shown_is_bounded_and_escapes() -> None:
    assert shown("a\x00b") == "'a\\x00b'"
    assert len(shown("x" * 10_000)) == 80
    assert "digits" in shown(10 ** 5000)


# --------------------------------------------------------------------------- where it is used


def test_a_fence_name_follows_the_rule() -> None:
    assert check_name("") == ""
    assert check_name("Cafe\u0301") == "Café"
    for bad in ("a\u202eb", "x\x00", "x" * 201, " x", 5):
        with pytest.raises(InvalidFence, match="name"):
            check_name(bad)


def test_a_tenant_name_follows_the_rule() -> None:
    assert tenants.check_name("Flotte AG") == "Flotte AG"
    for bad in ("a\u202eb", "x\nforged line", "x" * 201):
        with pytest.raises(tenants.InvalidTenantName, match="name"):
            tenants.check_name(bad)


@pytest.mark.parametrize(("field", "value", "why"), [
    ("id", "../../x", "id '../../x': 1-64 characters"),
    ("id", "a\x00b", "id 'a\\\\x00b': 1-64"),
    ("id", "", "id '': 1-64"),
    ("name", "x" * 100_000, "name: 100,000 characters"),
    ("name", "bar\x00", "name: a control character U\\+0000"),
    ("name", "evil\u202etxt.exe", "name: a bidirectional"),
    ("type", "", "type: must not be empty"),
    ("address", "x" * 100_000, "address: 100,000 characters"),
    ("address", "Street 1\r\nX-Injected: 1", "address: a control character U\\+000D"),
])
def test_a_hive_refuses_bad_text_with_a_422_naming_the_field(field: str, value: str, why: str) -> None:
    with pytest.raises(UserError, match=why) as caught:
        _checked_hive(HIVE | {field: value})
    assert caught.value.status == 422


def test_a_hive_keeps_good_text_in_normal_form() -> None:
    h = _checked_hive(HIVE | {"name": "Cafe\u0301 Central", "address": "Städtle 1, Vaduz"})
    assert (h["name"], h["address"], h["type"]) == ("Café Central", "Städtle 1, Vaduz", "cafe")
    assert _checked_hive(HIVE)["address"] == ""
