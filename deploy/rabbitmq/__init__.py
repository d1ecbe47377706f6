"""The pipeline's RabbitMQ topology, as an operator applies it.

- `definitions`: what the broker must hold (vhosts, users, permissions, exchanges, queues,
  bindings, federation upstreams, policies), built from `exchanges.topology.Topology`; pure.
- `plan`: the `rabbitmqctl` commands (and management-API calls for exchanges, queues and
  bindings, which `rabbitmqctl` cannot declare) that turn what the broker holds into that;
  pure. `geofence topology show` prints every line of it for an empty broker.
- `apply`: reads the broker (management API), runs the plan; `geofence topology apply` and
  `geofence up` use it. Idempotent: a second run finds nothing to do.
- `devices`: per-device MQTT users (`geofence device add|remove|list`).
- `management`: a small client of the management HTTP API.
- `commands` (`geofence topology`, `geofence device`) and `inspect_cmd`
  (`geofence inspect topology`): the command-line side.
"""
