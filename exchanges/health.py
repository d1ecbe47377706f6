"""What a sidecar says on /metrics about its consumer (the gauges `consuming` and these): why
it does not consume on purpose. exchanges/shell/lifecycle.py sets them and its watchdog leaves
such a session alone; the GeofenceRoleDown alert, /ops (fence/ops.py) and `geofence status`
(deploy/stack.py) read them. A module of its own: the status command loads no broker client."""

# rebuilding its state, paused by a worker handover, its instance lock held by another
WAITING = ("recovering", "paused", "standby")
