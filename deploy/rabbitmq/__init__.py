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
- `nodes`: what this package needs of the local stack (its settings and secrets, as
  protocols; the second node's name): it sits below the rest of deploy/ and imports nothing
  from there but `deploy.processes`. The command-line side is above it:
  deploy/topology_cmd.py (`geofence topology`, `geofence device`) and
  deploy/inspect_topology_cmd.py (`geofence inspect topology`).
"""
