"""Device onboarding benchmark: `geofence device add --file` (definitions imports through
the management API) against `geofence device add ID` (broker CLI calls), in one run, on
the running local stack.

Figures, not tests: `.venv/bin/python -m bench.devices [--devices 10000] [--single 10]`.
It creates devices of the benchmarks' tenant (bench/tenant.py) named `bench-dev-<run>-<i>` (RabbitMQ
users `bench.bench-dev-<run>-<i>`), checks that a sample has the rights of a single `device add`
(the user's and the object's names masked) and that a second import changes nothing, then
removes them all.
Target (issue 16): 10,000 devices in under a minute.
"""

from __future__ import annotations

if __name__ == "__main__" and not __package__:  # run as a file: again as a module of bench
    import cli  # type: ignore[import-not-found]  # bench/cli.py, in this file's own folder

    cli.run_as_module(__file__)

import argparse
import sys
import time
import uuid

from bench import report
from bench import tenant as tn
from deploy.rabbitmq import apply as ap
from deploy.rabbitmq import credentials as cred
from deploy.rabbitmq import definitions as d
from deploy.rabbitmq import device_bulk, devices
from deploy.settings import Settings, load_secrets

TARGET_S = 60.0


def main() -> int:
    ap_ = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap_.add_argument("--devices", type=int, default=10_000)
    ap_.add_argument("--single", type=int, default=10, help="devices added one by one, for the ratio")
    args = ap_.parse_args()
    settings = Settings.from_env()
    pw = load_secrets(settings)
    mgmt = ap.management(settings, pw)
    broker = device_bulk.Broker(mgmt.request)
    run = uuid.uuid4().hex[:6]
    ids = [f"bench-dev-{run}-{i}" for i in range(args.devices)]
    singles = [f"bench-one-{run}-{i}" for i in range(args.single)]

    progress = report.Progress("device add --file")

    def add_all() -> tuple[list[tuple[str, str | None]], float]:
        """device_bulk.add_many of every id, and the seconds it took."""
        t0 = time.perf_counter()
        rows = device_bulk.add_many(broker, tn.TENANT, ids, lambda line: progress.show(line.strip()))
        seconds = time.perf_counter() - t0
        progress.close()
        return rows, seconds

    try:
        rows, bulk_s = add_all()
        assert sum(p is not None for _, p in rows) == len(ids), "not every device was new"
        again, again_s = add_all()
        assert all(p is None for _, p in again), "a second import created devices"
        t0 = time.perf_counter()
        for i in singles:
            devices.add(settings, pw, tn.TENANT, i, None, lambda s: None)
        single_s = (time.perf_counter() - t0) / max(1, len(singles))
        # a sample of the bulk devices has exactly the rights of a single `device add`, once
        # the names are masked: the user `<tenant>.<id>` (also regex-escaped), then the id
        def rights(object_id: str) -> tuple[object, ...]:
            user = cred.device_user(tn.TENANT, object_id)

            def masked(text: str) -> str:
                return text.replace(d.regex_escape(user), "U").replace(user, "U").replace(object_id, "O")

            perms = mgmt.get(f"api/users/{user}/permissions")
            topics = mgmt.get(f"api/users/{user}/topic-permissions")
            tags = mgmt.get(f"api/users/{user}")["tags"]
            return (sorted((p["vhost"], masked(p["configure"]), masked(p["write"]), masked(p["read"]))
                           for p in perms),
                    sorted((p["exchange"], masked(p["write"]), masked(p["read"])) for p in topics),
                    sorted(tags))
        sample = range(0, len(ids), max(1, len(ids) // 20))
        same = all(rights(ids[k]) == rights(singles[0]) for k in sample)
    finally:
        t0 = time.perf_counter()
        removed = device_bulk.remove_many(broker, tn.TENANT, ids + singles, lambda s: None)
        remove_s = time.perf_counter() - t0
    paths = [  # (path, devices, seconds, seconds a device)
        ("device add --file (definitions import)", len(ids), bulk_s, bulk_s / len(ids)),
        ("device add --file again (idempotent)", len(ids), again_s, again_s / len(ids)),
        ("device add ID, one by one", len(singles), single_s * len(singles), single_s),
        ("device remove --file", removed, remove_s, remove_s / max(1, removed))]
    print(report.table(["path", "devices", "seconds", "ms/device"],
                       [[p, f"{n:,}", f"{sec:.2f}", f"{1000 * each:.2f}"] for p, n, sec, each in paths]))
    one_by_one = single_s * len(ids)
    ok = bulk_s < TARGET_S and same
    under = report.times(report.ratio(bulk_s, TARGET_S, lower_is_better=True), "under", ".1f")
    faster = report.times(report.ratio(bulk_s, one_by_one, lower_is_better=True), "faster", ",.0f")
    print(report.summary([f"{len(ids):,} devices in {bulk_s:.1f} s (target < {TARGET_S:.0f} s: {under}), "
                          f"{faster} than one by one ({single_s:.2f} s a device: "
                          f"{one_by_one / 60:.0f} min for them all)",
                          f"rights as `device add`: {same}", "second import changed nothing"],
                         verdict="OK" if ok else "MISSED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
