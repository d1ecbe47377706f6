"""Reading the shipped OpenStreetMap extract (c) OpenStreetMap contributors, ODbL 1.0.

pyosmium assembles multipolygon relations into areas; we keep what the benchmarks, tests and
demo need as shapely geometries in lon/lat.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import shapely
from shapely.geometry import MultiPolygon

EXTRACT = Path(__file__).resolve().parent / "data" / "liechtenstein-2013-08-03.osm.pbf"
OSM_CREDIT = "(c) OpenStreetMap contributors, ODbL 1.0"


def municipalities(path: Path = EXTRACT) -> dict[str, MultiPolygon]:
    """Named municipality boundaries (admin_level 8), by name, sorted by name."""
    import osmium  # heavy, and only needed here

    wkb = osmium.geom.WKBFactory()
    found: dict[str, MultiPolygon] = {}
    areas = osmium.FileProcessor(str(path)).with_areas(
        osmium.filter.TagFilter(("boundary", "administrative"))
    )
    for obj in areas:
        if not isinstance(obj, osmium.osm.Area):
            continue
        tags = obj.tags
        name = tags.get("name")
        if tags.get("boundary") == "administrative" and tags.get("admin_level") == "8" and name:
            geom = shapely.from_wkb(bytes.fromhex(wkb.create_multipolygon(obj)))
            if isinstance(geom, MultiPolygon) and geom.is_valid:
                found[name] = geom
    return dict(sorted(found.items()))


# --- Road network ---------------------------------------------------------------------------

# Drivable highway classes, fastest first; RoadNetwork.highway holds indices into this tuple,
# so its order is part of the data format (traffic.py maps each class to a speed).
HIGHWAY_CLASSES: tuple[str, ...] = (
    "motorway", "motorway_link", "trunk", "trunk_link", "primary", "primary_link",
    "secondary", "secondary_link", "tertiary", "tertiary_link", "unclassified",
    "residential", "living_street", "service",
)
_CLASS_CODE = {name: code for code, name in enumerate(HIGHWAY_CLASSES)}
# Access values that close a way to cars. The most specific key present decides (motorcar over
# motor_vehicle over vehicle over access), as OSM's access hierarchy says: `access=no` with
# `motorcar=yes` is open to cars. "destination" and "permissive" stay open: a demo car may go there.
_CLOSED = frozenset({"no", "private", "agricultural", "forestry", "emergency"})
_ACCESS_KEYS = ("motorcar", "motor_vehicle", "vehicle", "access")
EARTH_RADIUS_M = 6_371_008.8  # mean radius (IUGG)


@dataclass(frozen=True, eq=False)
class RoadNetwork:
    """A directed road graph, node and edge arrays (numpy), OSM-derived ((c) OSM contributors).

    Invariants (road_network guarantees them, tests check them):
    - nodes are 0..n-1; `node_id[i]` is the OSM node id, `lon[i]`, `lat[i]` its location;
    - edges are sorted by `src` (then `dst`), so `indptr` (n+1 entries) is a CSR index:
      the edges leaving node u are `indptr[u]:indptr[u+1]`;
    - a two-way road gives one edge each way, a oneway only the legal direction;
    - no self loops; `length_m > 0` is not guaranteed (two OSM nodes may share a location);
    - the graph is strongly connected: every node reaches every node.
    """

    node_id: npt.NDArray[np.int64]
    lon: npt.NDArray[np.float64]
    lat: npt.NDArray[np.float64]
    src: npt.NDArray[np.int32]
    dst: npt.NDArray[np.int32]
    length_m: npt.NDArray[np.float64]
    highway: npt.NDArray[np.int8]  # index into HIGHWAY_CLASSES
    indptr: npt.NDArray[np.int64]
    bbox: tuple[float, float, float, float]  # (lon0, lat0, lon1, lat1) of the extract itself
    dropped_nodes: int = 0  # drivable nodes outside the largest strongly connected component

    @property
    def n_nodes(self) -> int:
        return int(self.lon.size)

    @property
    def n_edges(self) -> int:
        return int(self.src.size)

    def edge_class(self, edge: int) -> str:
        return HIGHWAY_CLASSES[int(self.highway[edge])]


def haversine_m(
    lon0: npt.ArrayLike, lat0: npt.ArrayLike, lon1: npt.ArrayLike, lat1: npt.ArrayLike
) -> npt.NDArray[np.float64]:
    """Great-circle distance in metres (haversine, spherical Earth: error < 0.5 %)."""
    p0, p1 = np.radians(lat0), np.radians(lat1)
    dphi = p1 - p0
    dlam = np.radians(np.subtract(lon1, lon0))
    h = np.sin(dphi / 2) ** 2 + np.cos(p0) * np.cos(p1) * np.sin(dlam / 2) ** 2
    return np.asarray(2 * EARTH_RADIUS_M * np.arcsin(np.sqrt(np.minimum(h, 1.0))), dtype=np.float64)


def _direction(tags: Any, highway: str) -> int:
    """+1 forward only, -1 backward only, 0 both ways, 2 not drivable (reversible oneways)."""
    oneway = tags.get("oneway")
    if oneway in ("yes", "true", "1"):
        return 1
    if oneway in ("-1", "reverse"):
        return -1
    if oneway in ("reversible", "alternating"):
        return 2  # direction changes with time of day: no fixed direction to route on
    if oneway is None and (
        tags.get("junction") in ("roundabout", "circular") or highway == "motorway"
    ):
        return 1  # implied oneway (OSM wiki: roundabouts and motorways)
    return 0


def _open_to_cars(tags: Any) -> bool:
    for key in _ACCESS_KEYS:
        value = tags.get(key)
        if value is not None:
            return value not in _CLOSED
    return True


def road_network(path: Path = EXTRACT) -> RoadNetwork:
    """The drivable road graph of the extract, restricted to its largest strongly connected
    component so that every node can reach every other (a trip always has a path).

    Ways kept: `highway` in HIGHWAY_CLASSES, open to cars (see _CLOSED), not `area=yes`.
    Every node of a kept way is a graph node (not only junctions): positions are interpolated
    along these straight segments, and the ~10k nodes are cheap enough for Dijkstra as they are.
    Edge lengths are haversine distances between consecutive way nodes.
    """
    import osmium

    ref_pos: dict[int, int] = {}  # OSM node id -> graph node
    lons: list[float] = []
    lats: list[float] = []
    src: list[int] = []
    dst: list[int] = []
    cls: list[int] = []
    # Nodes must be read for the location cache; the filter (after the cache) hands us ways only.
    reader = (
        osmium.FileProcessor(str(path), osmium.osm.NODE | osmium.osm.WAY)
        .with_locations()
        .with_filter(osmium.filter.EntityFilter(osmium.osm.WAY))
        .with_filter(osmium.filter.TagFilter(*(("highway", c) for c in HIGHWAY_CLASSES)))
    )
    for way in reader:
        if not isinstance(way, osmium.osm.Way):
            continue
        tags = way.tags
        code = _CLASS_CODE.get(tags.get("highway") or "")
        if code is None or tags.get("area") == "yes" or not _open_to_cars(tags):
            continue
        direction = _direction(tags, HIGHWAY_CLASSES[code])
        if direction == 2:
            continue
        prev = -1
        for node in way.nodes:
            loc = node.location
            if not loc.valid():  # a way cut at the extract's edge: its path stops here
                prev = -1
                continue
            cur = ref_pos.get(node.ref)
            if cur is None:
                cur = ref_pos[node.ref] = len(lons)
                lons.append(loc.lon)
                lats.append(loc.lat)
            if prev >= 0 and prev != cur:
                if direction >= 0:
                    src.append(prev)
                    dst.append(cur)
                    cls.append(code)
                if direction <= 0:
                    src.append(cur)
                    dst.append(prev)
                    cls.append(code)
            prev = cur
    header_box = osmium.io.Reader(str(path), osmium.osm.NOTHING).header().box()
    bl, tr = header_box.bottom_left, header_box.top_right
    bbox = (float(bl.lon), float(bl.lat), float(tr.lon), float(tr.lat))

    n = len(lons)
    s = np.asarray(src, dtype=np.int32)
    d = np.asarray(dst, dtype=np.int32)
    keep_node = largest_scc(n, s, d)
    new_index = np.cumsum(keep_node, dtype=np.int64) - 1
    keep_edge = keep_node[s] & keep_node[d]  # an edge between two SCC nodes is inside the SCC
    s = new_index[s[keep_edge]].astype(np.int32)
    d = new_index[d[keep_edge]].astype(np.int32)
    c = np.asarray(cls, dtype=np.int8)[keep_edge]
    order = np.lexsort((d, s))
    s, d, c = s[order], d[order], c[order]
    lon = np.asarray(lons, dtype=np.float64)[keep_node]
    lat = np.asarray(lats, dtype=np.float64)[keep_node]
    ids = np.fromiter(ref_pos.keys(), dtype=np.int64, count=n)  # dicts keep insertion order
    m = int(keep_node.sum())
    indptr = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.bincount(s, minlength=m), out=indptr[1:])
    return RoadNetwork(
        node_id=ids[keep_node],
        lon=lon,
        lat=lat,
        src=s,
        dst=d,
        length_m=haversine_m(lon[s], lat[s], lon[d], lat[d]),
        highway=c,
        indptr=indptr,
        bbox=bbox,
        dropped_nodes=n - m,
    )


def largest_scc(
    n: int, src: npt.NDArray[np.integer[Any]], dst: npt.NDArray[np.integer[Any]]
) -> npt.NDArray[np.bool_]:
    """Mask of the nodes of the largest strongly connected component of a directed graph.

    Tarjan's algorithm with an explicit stack (no recursion: road chains are thousands of
    nodes deep, past Python's recursion limit). O(n + m). Ties between equal-sized components
    go to the one found first (deterministic for given arrays).
    """
    labels = strongly_connected_components(n, src, dst)
    if n == 0:
        return np.zeros(0, dtype=bool)
    sizes = np.bincount(labels)
    return np.asarray(labels == int(np.argmax(sizes)), dtype=bool)


def strongly_connected_components(
    n: int, src: npt.NDArray[np.integer[Any]], dst: npt.NDArray[np.integer[Any]]
) -> npt.NDArray[np.int64]:
    """Component label (0, 1, ... in order of completion) of every node; iterative Tarjan."""
    order = np.argsort(src, kind="stable")
    heads: list[int] = np.asarray(dst)[order].tolist()
    start: list[int] = np.concatenate(
        ([0], np.cumsum(np.bincount(np.asarray(src), minlength=n)))
    ).tolist()
    index = [-1] * n  # discovery order, -1 = unvisited
    low = [0] * n
    label = [-1] * n
    on_stack = [False] * n
    stack: list[int] = []  # Tarjan's stack of nodes of open components
    count = 0
    n_labels = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        index[root] = low[root] = count
        count += 1
        stack.append(root)
        on_stack[root] = True
        call: list[tuple[int, int]] = [(root, start[root])]  # (node, next edge to look at)
        while call:
            v, k = call[-1]
            if k < start[v + 1]:
                call[-1] = (v, k + 1)
                w = heads[k]
                if index[w] < 0:  # tree edge: "recurse" into w
                    index[w] = low[w] = count
                    count += 1
                    stack.append(w)
                    on_stack[w] = True
                    call.append((w, start[w]))
                elif on_stack[w] and index[w] < low[v]:
                    low[v] = index[w]
                continue
            call.pop()  # all of v's edges done: "return" to the caller
            if call:
                u = call[-1][0]
                if low[v] < low[u]:
                    low[u] = low[v]
            if low[v] == index[v]:  # v is the root of a component: pop it
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    label[w] = n_labels
                    if w == v:
                        break
                n_labels += 1
    return np.asarray(label, dtype=np.int64)


# --- Points of interest ---------------------------------------------------------------------

POI_KEYS = ("amenity", "tourism", "shop", "historic")  # first key present gives the kind


def points_of_interest(path: Path = EXTRACT, limit: int | None = None) -> list[tuple[str, float, float, str]]:
    """Named point features as (name, lon, lat, kind), kind like "amenity=restaurant".

    Only nodes (named buildings and areas are ways, left out: a fence around a POI wants a
    point). Sorted by (name, kind, lon, lat), so the order and `limit` do not depend on OSM ids
    or file order; names are not unique ("Coop" appears several times).
    """
    import osmium

    found: list[tuple[str, float, float, str]] = []
    for node in osmium.FileProcessor(str(path), osmium.osm.NODE).with_filter(
        osmium.filter.KeyFilter(*POI_KEYS)
    ):
        if not isinstance(node, osmium.osm.Node):
            continue
        tags = node.tags
        name = tags.get("name")
        if not name or not node.location.valid():
            continue
        key = next(k for k in POI_KEYS if k in tags)
        found.append((name, node.location.lon, node.location.lat, f"{key}={tags[key]}"))
    found.sort(key=lambda p: (p[0], p[3], p[1], p[2]))
    return found if limit is None else found[:limit]
