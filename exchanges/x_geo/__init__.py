"""x-geo, the region exchange type: its routing core (`core`: bindings, route, change), the
objects' latest positions it keeps (`latest`), its CROSS segment test (`crossings`), the
Hilbert range index it routes with (`range_index`), spatial queries (`queries`) and its sidecar
(`sidecar`)."""
