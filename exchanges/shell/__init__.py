"""The asyncio shell every sidecar shares: configuration, connections, intake, publishing,
dead-lettering, lifecycle. The roles' shells (ingress/sidecar.py, exchanges/x_geo/sidecar.py,
fence/x_fence/sidecar.py) only decode, call their core, publish what it returns and settle.

One module per concept, each with its invariants:
- config: `SidecarConfig` from the GEOFENCE_* variables (through exchanges/settings.py), `ConfigError`;
- counters: `Counters` (counts, gauges, histograms), `reason_key`;
- metrics: the Counters as Prometheus metric families, `metrics_server` (/metrics);
- connections: connections and channels, `InstanceLock`, `connection_lost`, `BROKER_GONE`,
  `Backoff`;
- publish: `Out`, `Plains`, `publish_all`, `publish_sample`, `dead_letter`, `reply`,
  `PublishRefused`;
- pipeline: `send`, `Pipeline` (batches in flight, their tails in order), `PipelineRefused`;
- intake: `Intake`, `run_batches`, `settle`, `SidecarFault`, `reason_of`;
- lifecycle: the `Sidecar` protocol, `run_sidecar`, `serve`, `run_session`, `periodic`.
Imports go one way, config/counters <- metrics, connections <- publish <- pipeline <- intake <- lifecycle, and
nothing here imports a role (fence/, ingress/, spark_jobs/, deploy/): only
exchanges.topology and exchanges.contract.

The roles use the names re-exported here (`shell.publish_all`, ...). A re-export is a second
binding of the same object: replacing `shell.publish_all` (a test) reaches the roles' calls,
not the package's own (`run_batches` calls `publish.publish_all`): patch the module the
caller looks the name up in.
"""

from exchanges.backoff import Backoff
from exchanges.settings import ConfigError
from exchanges.shell.bulk_consumer import BulkConnection, BulkQueue, BulkQueues
from exchanges.shell.config import ENV_KEYS, SidecarConfig, setup_logging
from exchanges.shell.connections import (
    BROKER_GONE,
    InstanceLock,
    InstanceLocked,
    TookOver,
    connection_lost,
    open_bulk_connection,
    open_channel,
    open_connection,
)
from exchanges.shell.counters import Counters, reason_key
from exchanges.shell.intake import (
    SUSPECT_DELIVERIES,
    Intake,
    SidecarFault,
    delivery_count,
    reason_of,
    run_batches,
    settle,
)
from exchanges.shell.lifecycle import (
    EXIT_TOOK_OVER,
    Session,
    Sidecar,
    consume_queue,
    install_signal_handlers,
    periodic,
    run_session,
    run_sidecar,
    serve,
)
from exchanges.shell.pipeline import Pipeline, PipelineRefused, send
from exchanges.shell.publish import (
    PERSISTENT,
    Out,
    Plains,
    PublishRefused,
    dead_letter,
    publish_all,
    publish_sample,
    reply,
)

__all__ = [
    "BROKER_GONE",
    "ENV_KEYS",
    "EXIT_TOOK_OVER",
    "PERSISTENT",
    "SUSPECT_DELIVERIES",
    "Backoff",
    "BulkConnection",
    "BulkQueue",
    "BulkQueues",
    "ConfigError",
    "Counters",
    "InstanceLock",
    "InstanceLocked",
    "Intake",
    "Out",
    "Pipeline",
    "PipelineRefused",
    "Plains",
    "PublishRefused",
    "Session",
    "Sidecar",
    "SidecarConfig",
    "SidecarFault",
    "TookOver",
    "connection_lost",
    "consume_queue",
    "dead_letter",
    "delivery_count",
    "install_signal_handlers",
    "open_bulk_connection",
    "open_channel",
    "open_connection",
    "periodic",
    "publish_all",
    "publish_sample",
    "reason_key",
    "reason_of",
    "reply",
    "run_batches",
    "run_session",
    "run_sidecar",
    "send",
    "serve",
    "settle",
    "setup_logging",
]
