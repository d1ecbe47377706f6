"""A client of the geofence platform (its HTTP and AMQP APIs, its events, its webhooks),
installed without the server: `pip install ./fence/client_package`."""

from geofence_client import webhooks
from geofence_client.amqp import FenceApiError, FenceClient, Reply
from geofence_client.events import FenceEvent, NotAnEvent, Position, ProximityEvent, parse
from geofence_client.http import ApiError, GeofenceHttp
from geofence_client.stream import EventStream

__all__ = ["ApiError", "EventStream", "FenceApiError", "FenceClient", "FenceEvent", "GeofenceHttp",
           "NotAnEvent", "Position", "ProximityEvent", "Reply", "parse", "webhooks"]
