"""bench/mqtt_load.py's packets against paho-mqtt's own encoding of the same CONNECT and PUBLISH
(the lean publisher must say exactly what a device library says)."""

from __future__ import annotations

import pytest

from bench.mqtt_load import _remaining_length, connect_packet, publish_packet


@pytest.mark.parametrize("n, raw", [(0, b"\x00"), (127, b"\x7f"), (128, b"\x80\x01"), (16383, b"\xff\x7f"),
                                    (16384, b"\x80\x80\x01"), (2097151, b"\xff\xff\x7f")])
def test_remaining_length_is_mqtts_variable_byte_integer(n: int, raw: bytes) -> None:
    assert _remaining_length(n) == raw


def test_publish_is_qos_1_with_topic_packet_id_and_payload() -> None:
    got = publish_packet("positions/acme/car-1", b'{"lon":1}', 258)
    body = b"\x00\x14positions/acme/car-1" + b"\x01\x02" + b'{"lon":1}'
    assert got == b"\x32" + bytes((len(body),)) + body


def test_connect_is_mqtt_311_with_a_clean_session_user_and_password() -> None:
    got = connect_packet("me", "gf-ingress:gw", "pw", keepalive=60)
    body = (b"\x00\x04MQTT\x04\xc2\x00\x3c" + b"\x00\x02me" + b"\x00\x0dgf-ingress:gw" + b"\x00\x02pw")
    assert got == b"\x10" + bytes((len(body),)) + body
