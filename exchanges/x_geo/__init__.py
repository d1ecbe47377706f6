"""x-geo, the region exchange type: its routing core (`core`: bindings, route, change), the
Hilbert range index it routes with (`range_index`) and its sidecar (`sidecar`)."""
