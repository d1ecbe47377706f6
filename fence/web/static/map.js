// The live map: fences coloured by how many objects are inside, the objects as they move, each
// ENTER / LEAVE flashing its fence and listed in the panel. Frames come over /map/ws (at most two
// a second: a snapshot first, then deltas; fence/map_feed.py); fences from /map/fences; the
// background from /map/roads (offline) or a tile server (/pages/config says which).
"use strict";

const MAX_PANEL = 100;
const STALE_MS = 12000; // no frame for this long: the status says so (frames or heartbeats come every <= 5 s)
const SHADES = ["#ffffff00", "#fde68a", "#fbbf24", "#f97316", "#dc2626", "#7f1d1d"];
const LIMITS = [0, 1, 3, 10, 30, 100]; // a count >= LIMITS[i] takes SHADES[i]
const ROAD_WEIGHT = { motorway: 3, trunk: 3, primary: 2.6, secondary: 2.2, tertiary: 1.8 };

// Leaflet missing (its script a 404: no `npm ci` on the server): a message in place of the map
const noLeaflet = libraryMissing("L", "Leaflet", "/vendor/leaflet/leaflet.js", ["map"], "map");
const map = noLeaflet ? null : L.map("map", { preferCanvas: true, zoomControl: true });
// panes, bottom to top: fences (overlayPane, 400), roads over their fill, then the objects
for (const [name, z] of map ? [["roads", 450], ["objects", 550]] : []) {
  map.createPane(name).style.zIndex = z;
  map.getPane(name).style.pointerEvents = name === "roads" ? "none" : "auto";
}
const objectsRenderer = map && L.canvas({ padding: 0.2, pane: "objects" });
const fences = new Map(); // id -> {layer, name, count}
const objects = new Map(); // id -> circle marker
const state = { frames: 0, snapshots: 0, events: 0, lastFrame: 0, ws: null, live: false, moves: 0 };
window.gfMap = { map, fences, objects, state }; // what the browser test reads

function shade(n) {
  let i = 0;
  while (i + 1 < LIMITS.length && n >= LIMITS[i + 1]) i++;
  return SHADES[n > 0 ? Math.max(i, 1) : 0];
}

function fenceStyle(f) {
  return { color: f.count > 0 ? "#9a3412" : "#1f5fbf", weight: 1.5, opacity: 0.9,
           fillColor: shade(f.count), fillOpacity: f.count > 0 ? 0.45 : 0.05 };
}

function legend() {
  const el = document.getElementById("legend");
  el.replaceChildren("inside:");
  LIMITS.forEach((n, i) => {
    if (i === 0) return;
    const item = document.createElement("span"), box = document.createElement("i");
    box.style.background = SHADES[i];
    item.append(box, ` ${n}${i + 1 < LIMITS.length ? "–" + (LIMITS[i + 1] - 1) : "+"}`);
    el.append(item);
  });
}

async function getJSON(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(`${url}: HTTP ${r.status}`);
  return r.json();
}

async function loadBackground(config) {
  if (config.map && config.map.tiles) {
    L.tileLayer(config.map.tiles, { maxZoom: 19, attribution: "© OpenStreetMap contributors" }).addTo(map);
    return null;
  }
  if (!(config.map && config.map.roads)) return null;
  const roads = await getJSON(config.map.roads);
  const layer = L.geoJSON(roads, {
    interactive: false,
    renderer: L.canvas({ pane: "roads" }),
    style: (f) => ({ color: "#6b7280", weight: ROAD_WEIGHT[f.properties.highway] || 1, opacity: 0.55 }),
  }).addTo(map);
  map.attributionControl.addAttribution("roads © OpenStreetMap contributors (ODbL)");
  return layer.getBounds();
}

async function loadFences() {
  const list = document.getElementById("search-list");
  const seen = new Set();
  list.replaceChildren();
  let after = "";
  for (;;) {
    const page = await getJSON(`/map/fences?after=${encodeURIComponent(after)}`);
    for (const feat of page.features) {
      const f = { name: feat.properties.name || "", count: 0, layer: null };
      f.layer = L.geoJSON(feat, { style: () => fenceStyle(f) })
        .bindTooltip(() => `${feat.id}${f.name ? " · " + f.name : ""}: ${f.count} inside`, { sticky: true })
        .addTo(map);
      const old = fences.get(feat.id);
      if (old) { f.count = old.count; old.layer.remove(); }
      fences.set(feat.id, f);
      seen.add(feat.id);
      const opt = document.createElement("option");
      opt.value = feat.id;
      if (f.name) opt.label = f.name;
      list.append(opt);
    }
    if (!page.next_after) break;
    after = page.next_after;
  }
  for (const [id, f] of fences) if (!seen.has(id)) { f.layer.remove(); fences.delete(id); }
}

function setCount(id, n) {
  const f = fences.get(id);
  if (!f) return;
  f.count = n;
  f.layer.setStyle(fenceStyle(f));
}

function flash(id, kind) {
  const f = fences.get(id);
  if (!f) return;
  f.layer.setStyle({ color: kind === "enter" ? "#16a34a" : "#ea580c", weight: 5, opacity: 1 });
  clearTimeout(f.timer);
  f.timer = setTimeout(() => f.layer.setStyle(fenceStyle(f)), 900);
}

function place(cols) {
  for (let i = 0; i < cols.ids.length; i++) {
    const id = cols.ids[i], ll = [cols.lat[i], cols.lon[i]];
    const m = objects.get(id);
    if (m) {
      m.setLatLng(ll);
      state.moves++;
    } else {
      objects.set(id, L.circleMarker(ll, { renderer: objectsRenderer, radius: 3.5, weight: 1, color: "#0b3d91",
                                            fillColor: "#3b82f6", fillOpacity: 0.9 })
        .bindTooltip(id).addTo(map));
    }
  }
}

function addEvents(events) {
  const ol = document.getElementById("events");
  for (const [kind, fence, object, ts, reason] of events) {
    state.events++;
    flash(fence, kind);
    const li = document.createElement("li");
    li.dataset.fence = fence;
    const b = document.createElement("span");
    b.className = kind;
    b.textContent = kind.toUpperCase();
    const when = new Date(ts * 1000).toLocaleTimeString("en-GB");
    li.append(`${when} `, b, ` ${object} · ${fence}${reason === "entered" || reason === "exited" ? "" : " (" + reason + ")"}`);
    ol.prepend(li);
  }
  while (ol.children.length > MAX_PANEL) ol.lastChild.remove();
}

function stats(s) {
  setText("s-positions", fmt(s.positions_per_s));
  setText("s-events", fmt(s.events_per_s));
  setText("s-objects", fmt(s.objects));
  setText("s-inside", fmt(s.inside));
}

function apply(msg) {
  state.lastFrame = Date.now();
  state.live = msg.live !== false;
  if (msg.type === "snapshot") {
    state.snapshots++;
    const keep = new Set(msg.objects.ids);
    for (const [id, m] of objects) if (!keep.has(id)) { m.remove(); objects.delete(id); }
    for (const [id, f] of fences) if (f.count && !(id in msg.counts)) setCount(id, 0);
  }
  if (msg.objects) place(msg.objects);
  for (const id of msg.gone || []) { const m = objects.get(id); if (m) { m.remove(); objects.delete(id); } }
  for (const [id, n] of Object.entries(msg.counts || {})) setCount(id, n);
  if (msg.events && msg.events.length) addEvents(msg.events);
  if (msg.events_skipped) setText("events-note", `(${fmt(msg.events_skipped)} more not shown in the last frame)`);
  if (msg.stats) stats(msg.stats);
  state.frames++;
}

function connect() {
  const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/map/ws`);
  ws.binaryType = "arraybuffer";
  const decoder = new TextDecoder();
  ws.onmessage = (e) => apply(JSON.parse(typeof e.data === "string" ? e.data : decoder.decode(e.data)));
  ws.onclose = () => { state.ws = null; setTimeout(connect, 2000); };
  state.ws = ws;
}

function status() {
  const el = document.getElementById("status");
  const fresh = Date.now() - state.lastFrame < STALE_MS;
  el.className = "status " + (fresh && state.live ? "live" : "stale");
  el.textContent = !state.ws ? "reconnecting…" : !state.lastFrame ? "connecting…"
    : fresh && state.live ? `live · ${fences.size} fences` : "no data for a while (pipeline or broker down?)";
}

function search(ev) {
  ev.preventDefault();
  const q = document.getElementById("search-q").value.trim();
  const out = document.getElementById("search-result");
  if (!q) return;
  let f = fences.get(q);
  if (!f) for (const [, g] of fences) if (g.name.toLowerCase() === q.toLowerCase()) { f = g; break; }
  if (f) {
    map.fitBounds(f.layer.getBounds(), { maxZoom: 17 });
    f.layer.openTooltip(f.layer.getBounds().getCenter());
    out.textContent = `fence: ${f.count} inside`;
    return;
  }
  const m = objects.get(q);
  if (m) {
    map.setView(m.getLatLng(), Math.max(map.getZoom(), 16));
    m.openTooltip();
    out.textContent = "object";
    return;
  }
  getJSON(`/map/objects/${encodeURIComponent(q)}`)
    .then((p) => { map.setView([p.lat, p.lon], 16); out.textContent = `object, seen ${new Date(p.ts * 1000).toLocaleTimeString("en-GB")}`; })
    .catch(() => { out.textContent = "no such fence or object"; });
}

async function main() {
  legend();
  document.getElementById("search").addEventListener("submit", search);
  document.getElementById("events").addEventListener("click", (e) => {
    const li = e.target.closest("li");
    const f = li && fences.get(li.dataset.fence);
    if (f) map.fitBounds(f.layer.getBounds(), { maxZoom: 17 });
  });
  map.setView([47.14, 9.53], 11);
  const config = await getJSON("/pages/config");
  const roadBounds = await loadBackground(config);
  await loadFences();
  const all = L.featureGroup([...fences.values()].map((f) => f.layer));
  if (fences.size) map.fitBounds(all.getBounds(), { maxZoom: 15 });
  else if (roadBounds) map.fitBounds(roadBounds);
  connect();
  setInterval(() => loadFences().catch(() => {}), 60000); // fences made or deleted meanwhile
  setInterval(status, 1000);
  status();
}

if (map) {
  main().catch((err) => {
    const el = document.getElementById("status");
    el.className = "status error";
    el.textContent = String(err);
  });
} else {
  for (const el of document.querySelectorAll("#search input, #search button")) el.disabled = true;
}
