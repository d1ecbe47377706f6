"""`geofence inspect topology`: the topology's vhosts, their queues (messages, consumers,
policy) and the federation links, read from the management API. Exit status 1 when a vhost
or queue of the topology is missing or a federation link is not running. The command-line side
of deploy/rabbitmq/ (which sits below the rest of deploy/ and imports nothing from it)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from deploy import exit_codes
from deploy.processes import StackError
from deploy.rabbitmq import apply as ap
from deploy.rabbitmq import definitions as d
from deploy.settings import Settings, SettingsError, load_secrets
from exchanges import topology as t
from exchanges.settings import mask


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    return None


def expected_links(topology: t.Topology) -> list[tuple[str, str, str]]:
    """(downstream vhost, exchange, upstream) of every federation link of the topology."""
    links = [(t.FENCES_VHOST, t.FENCE_IN_EXCHANGE, t.upstream_name(v))
             for v in d.region_vhosts(topology)]
    links.append((t.INGRESS_VHOST, t.MQTT_TOPIC_EXCHANGE, t.upstream_name(t.FENCES_VHOST)))
    return links


def table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in (header, *rows)]


def report(topology: t.Topology, vhosts: set[str], queues: list[dict[str, Any]],
           links: list[dict[str, Any]]) -> tuple[list[str], bool]:
    """The lines to print and whether everything is as the topology wants. Pure."""
    ok = True
    lines: list[str] = []
    wanted_queues = {(q.vhost, q.name) for q in d.queues(topology)}
    for vhost in topology.vhosts:
        if vhost not in vhosts:
            lines.append(f"vhost {vhost}: MISSING (run `geofence topology apply`)")
            ok = False
            continue
        lines.append(f"vhost {vhost}")
        present = {q["name"]: q for q in queues if q.get("vhost") == vhost}
        rows = []
        for name in sorted(set(present) | {n for v, n in wanted_queues if v == vhost}):
            q = present.get(name)
            if q is None:
                rows.append([name, "MISSING", "", ""])
                ok = False
            else:
                rows.append([name, str(q.get("messages", 0) or 0), str(q.get("consumers", 0) or 0),
                             str(q.get("policy") or "-")])
        lines += table(["QUEUE", "MESSAGES", "CONSUMERS", "POLICY"], rows)
    lines.append("federation links")
    rows = []
    for vhost, exchange, upstream in expected_links(topology):
        found = [lk for lk in links if lk.get("vhost") == vhost and lk.get("exchange") == exchange
                 and lk.get("upstream") == upstream]
        status = str(found[0].get("status", "?")) if found else "MISSING"
        error = str(found[0].get("error", "")) if found else ""
        ok = ok and status == "running"
        rows.append([vhost, exchange, upstream, status, error.replace("\n", " ")[:100]])
    lines += table(["VHOST", "EXCHANGE", "UPSTREAM", "STATUS", "ERROR"], rows)
    return lines, ok


def run(args: argparse.Namespace) -> int:
    try:
        settings = Settings.from_env()
        pw = load_secrets(settings)
        mgmt = ap.management(settings, pw)
        vhosts, queues = set(), []
        for broker in range(1, settings.broker_count + 1):  # a placed region's vhost is on its node
            node = ap.management(settings, pw, broker)
            mine = {v for v in (x["name"] for x in node.get("api/vhosts?columns=name"))
                    if ap.broker_of_vhost(settings, v) == broker}
            vhosts |= mine
            queues += [q for q in node.get("api/queues?columns=vhost,name,messages,consumers,policy")
                       if q["vhost"] in mine]
        links = mgmt.get("api/federation-links") if mgmt.exists("api/federation-links") else []
    except (SettingsError, StackError) as exc:
        return exit_codes.say("inspect topology", exc)
    lines, ok = report(settings.topology, vhosts, queues, links)
    print(mask("\n".join(lines), pw.values()))
    return 0 if ok else 1
