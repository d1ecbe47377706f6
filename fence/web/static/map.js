// The live map: fences coloured by how many objects are inside, the objects as they move, each
// ENTER / LEAVE flashing its fence and listed in the panel. The user signs in first (common.js);
// a member of several tenants picks one (the selector, or #tenant=<id> in the address), an
// operator may also watch every tenant. Fences come from /map/fences, frames over /map/ws (the
// token is the socket's first message; at most two frames a second: a snapshot first, then
// deltas; fence/map_feed.py), the background from /map/roads (offline) or a tile server
// (/pages/config says which). A tenant's map holds its tenant's fences and objects only, named
// as the tenant names them (fence/page_data.py).
"use strict";

const MAX_PANEL = 100;
const STALE_MS = 12000; // no frame for this long: the status says so (frames or heartbeats come every <= 5 s)
const RECONNECT_MS = 2000;
const FENCES_EVERY_MS = 60000; // fences made or deleted meanwhile
const TENANT_KEY = "geofence-map-tenant";
const SHADES = ["#ffffff00", "#fde68a", "#fbbf24", "#f97316", "#dc2626", "#7f1d1d"];
const LIMITS = [0, 1, 3, 10, 30, 100]; // a count >= LIMITS[i] takes SHADES[i]
const ROAD_WEIGHT = { motorway: 3, trunk: 3, primary: 2.6, secondary: 2.2, tertiary: 1.8 };
const TILES = ["s-positions", "s-events", "s-objects", "s-inside"];

// Leaflet missing (its script a 404: no `npm ci` on the server): a message in place of the map
const noLeaflet = libraryMissing("L", "Leaflet", "/vendor/leaflet/leaflet.js", ["map"], "map");
let map = null; // made once signed in (Leaflet measures its box, hidden before)
let objectsRenderer = null;
let background = null; // the roads' bounds, once loaded (a promise)
const fences = new Map(); // id -> {layer, name, count}
const objects = new Map(); // id -> circle marker
// session: bumped by each sign-in, tenant change and sign-out, so late answers of an earlier one are dropped
const state = { frames: 0, snapshots: 0, events: 0, lastFrame: 0, ws: null, live: false, moves: 0,
                refused: "", session: 0, retry: null };
window.gfMap = { get map() { return map; }, fences, objects, state }; // what the browser test reads

function shade(n) {
  let i = 0;
  while (i + 1 < LIMITS.length && n >= LIMITS[i + 1]) i++;
  return SHADES[n > 0 ? Math.max(i, 1) : 0];
}

function fenceStyle(f) {
  return { color: f.count > 0 ? "#9a3412" : "#1f5fbf", weight: 1.5, opacity: 0.9,
           fillColor: shade(f.count), fillOpacity: f.count > 0 ? 0.45 : 0.05 };
}

// a tooltip's content as text: Leaflet puts a string in as markup, an element as it is
function textBox(text) {
  const el = document.createElement("span");
  el.textContent = text;
  return el;
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

function ensureMap() {
  if (map) {
    map.invalidateSize();
    return;
  }
  map = L.map("map", { preferCanvas: true, zoomControl: true });
  // panes, bottom to top: fences (overlayPane, 400), roads over their fill, then the objects
  for (const [name, z] of [["roads", 450], ["objects", 550]]) {
    map.createPane(name).style.zIndex = z;
    map.getPane(name).style.pointerEvents = name === "roads" ? "none" : "auto";
  }
  objectsRenderer = L.canvas({ padding: 0.2, pane: "objects" });
  map.setView([47.14, 9.53], 11);
}

async function loadBackground() {
  const config = await pagesConfig();
  if (config.map && config.map.tiles) {
    L.tileLayer(config.map.tiles, { maxZoom: 19, attribution: "© OpenStreetMap contributors" }).addTo(map);
    return null;
  }
  if (!(config.map && config.map.roads)) return null;
  const r = await fetch(config.map.roads);
  if (!r.ok) throw new Error(`${config.map.roads}: HTTP ${r.status}`);
  const layer = L.geoJSON(await r.json(), {
    interactive: false,
    renderer: L.canvas({ pane: "roads" }),
    style: (f) => ({ color: "#6b7280", weight: ROAD_WEIGHT[f.properties.highway] || 1, opacity: 0.55 }),
  }).addTo(map);
  map.attributionControl.addAttribution("roads © OpenStreetMap contributors (ODbL)");
  return layer.getBounds();
}

async function loadFences(session) {
  const seen = new Set();
  const options = [];
  let after = "";
  for (;;) {
    const page = await apiJSON(`/map/fences?after=${encodeURIComponent(after)}`);
    if (session !== state.session) return false; // signed out or another tenant meanwhile
    for (const feat of page.features) {
      const id = String(feat.id);
      const f = { name: String(feat.properties.name || ""), count: 0, layer: null };
      f.layer = L.geoJSON(feat, { style: () => fenceStyle(f) })
        .bindTooltip(() => textBox(`${id}${f.name ? " · " + f.name : ""}: ${f.count} inside`), { sticky: true })
        .addTo(map);
      const old = fences.get(id);
      if (old) { f.count = old.count; old.layer.remove(); }
      fences.set(id, f);
      seen.add(id);
      const opt = document.createElement("option");
      opt.value = id;
      if (f.name) opt.label = f.name;
      options.push(opt);
    }
    if (!page.next_after) break;
    after = page.next_after;
  }
  for (const [id, f] of fences) if (!seen.has(id)) { f.layer.remove(); fences.delete(id); }
  document.getElementById("search-list").replaceChildren(...options);
  return true;
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
    const id = String(cols.ids[i]), ll = [cols.lat[i], cols.lon[i]];
    const m = objects.get(id);
    if (m) {
      m.setLatLng(ll);
      state.moves++;
    } else {
      objects.set(id, L.circleMarker(ll, { renderer: objectsRenderer, radius: 3.5, weight: 1, color: "#0b3d91",
                                            fillColor: "#3b82f6", fillOpacity: 0.9 })
        .bindTooltip(() => textBox(id)).addTo(map));
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
    b.className = kind === "enter" || kind === "leave" ? kind : "other";
    b.textContent = String(kind).toUpperCase();
    const when = new Date(ts * 1000).toLocaleTimeString("en-GB");
    li.append(`${when} `, b, ` ${object} · ${fence}${reason === "entered" || reason === "exited" ? "" : " (" + reason + ")"}`);
    ol.prepend(li);
  }
  while (ol.children.length > MAX_PANEL) ol.lastChild.remove();
}

// the tiles: a tenant's map has no platform-wide rates (they are the operators'): those tiles go
function stats(s) {
  for (const [tile, key] of [["t-positions", "positions_per_s"], ["t-events", "events_per_s"]]) {
    document.getElementById(tile).hidden = !(key in s);
  }
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

// the socket: the token its first message; 4401 (the token refused) asks for a sign-in again,
// 4403 (this tenant refused) says why and stops; anything else reconnects
function connect(session) {
  clearTimeout(state.retry);
  if (session !== state.session || !gfAuth.token) return;
  const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/map/ws`);
  ws.binaryType = "arraybuffer";
  const decoder = new TextDecoder();
  ws.onopen = () => ws.send(JSON.stringify({ token: gfAuth.token, tenant: gfAuth.tenant }));
  ws.onmessage = (e) => {
    if (state.ws === ws) apply(JSON.parse(typeof e.data === "string" ? e.data : decoder.decode(e.data)));
  };
  ws.onclose = (e) => {
    if (state.ws !== ws) return;
    state.ws = null;
    if (e.code === 4401) {
      showSignIn(`the map needs you to sign in again: ${e.reason || "your sign-in was refused"}`);
    } else if (e.code === 4403) {
      state.refused = `the map refused: ${e.reason || "not allowed"}`;
    } else {
      state.retry = setTimeout(() => connect(session), RECONNECT_MS);
    }
  };
  state.ws = ws;
}

function disconnect() {
  clearTimeout(state.retry);
  const ws = state.ws;
  state.ws = null;
  if (ws) {
    ws.onclose = null;
    ws.close();
  }
}

// nothing of a tenant's map stays once another tenant is chosen or the user signed out
function reset() {
  for (const f of fences.values()) f.layer.remove();
  fences.clear();
  for (const m of objects.values()) m.remove();
  objects.clear();
  for (const id of ["events", "search-list"]) document.getElementById(id).replaceChildren();
  for (const id of [...TILES, "events-note", "search-result"]) setText(id, id.startsWith("s-") ? "–" : "");
  document.getElementById("search-q").value = "";
  Object.assign(state, { lastFrame: 0, live: false, refused: "" });
}

function status() {
  if (!gfAuth.token) return;
  const el = document.getElementById("status");
  if (state.refused) {
    el.className = "status error";
    el.textContent = state.refused;
    return;
  }
  const fresh = Date.now() - state.lastFrame < STALE_MS;
  const whose = gfAuth.tenant ? ` of ${gfAuth.tenant}` : " of every tenant";
  el.className = "status " + (fresh && state.live ? "live" : "stale");
  el.textContent = !state.ws ? "connecting…" : !state.lastFrame ? "connecting…"
    : fresh && state.live ? `live · ${fences.size} fences${whose}` : "no data for a while (pipeline or broker down?)";
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
  const session = state.session;
  apiJSON(`/map/objects/${encodeURIComponent(q)}`)
    .then((p) => {
      if (session !== state.session) return;
      map.setView([p.lat, p.lon], 16);
      out.textContent = `object, seen ${new Date(p.ts * 1000).toLocaleTimeString("en-GB")}`;
    })
    .catch((e) => { if (!(e instanceof SignedOut)) out.textContent = "no such fence or object"; });
}

function setTenant(id) {
  gfAuth.tenant = id || null;
  if (id) sessionStorage.setItem(TENANT_KEY, id);
  else sessionStorage.removeItem(TENANT_KEY);
  const params = hashParams();
  if (id) params.set("tenant", id);
  else params.delete("tenant");
  const rest = params.toString();
  history.replaceState(null, "", location.pathname + location.search + (rest ? `#${rest}` : ""));
}

// which tenant's map: the user's tenants (GET /tenants); a member of several picks one (the
// selector, #tenant=, the last one this tab chose); an operator may also watch every tenant
async function chooseTenant() {
  gfAuth.tenant = null;
  const mine = (await apiJSON("/tenants")).tenants || [];
  const operator = isOperator();
  const options = mine.map((t) => [String(t.tenant), t.name ? `${t.tenant} · ${t.name}` : String(t.tenant)]);
  if (operator) options.unshift(["", "every tenant (operator)"]);
  const asked = hashParams().get("tenant") || sessionStorage.getItem(TENANT_KEY) || "";
  if (asked && operator && !options.some(([id]) => id === asked)) options.push([asked, asked]);
  const chosen = options.some(([id]) => id === asked) ? asked : options.length ? options[0][0] : "";
  const select = document.getElementById("tenant");
  select.replaceChildren(...options.map(([id, label]) => {
    const opt = document.createElement("option");
    opt.value = id;
    opt.textContent = label;
    return opt;
  }));
  select.value = chosen;
  document.getElementById("tenant-box").hidden = options.length < 2;
  setTenant(chosen);
}

// the chosen tenant's map: its fences, then its frames
async function open(session) {
  disconnect();
  reset();
  try {
    if (!(await loadFences(session))) return;
  } catch (e) {
    if (e instanceof SignedOut || session !== state.session) return;
    state.refused = String(e.message); // no tenant, not a member: the server's reason
    status();
    return;
  }
  const roads = await background;
  if (session !== state.session) return;
  const all = L.featureGroup([...fences.values()].map((f) => f.layer));
  if (fences.size) map.fitBounds(all.getBounds(), { maxZoom: 15 });
  else if (roads) map.fitBounds(roads);
  connect(session);
}

async function start() {
  const session = ++state.session;
  showSignedIn();
  ensureMap();
  if (!background) background = loadBackground().catch(() => null);
  await chooseTenant();
  if (session === state.session) await open(session);
}

function signedOut() {
  state.session++;
  disconnect();
  reset();
  document.getElementById("tenant-box").hidden = true;
}

if (noLeaflet) {
  // nothing can be drawn: the message in place of the map, no sign-in
  document.getElementById("content").hidden = false;
} else {
  legend();
  document.getElementById("search").addEventListener("submit", search);
  document.getElementById("events").addEventListener("click", (e) => {
    const li = e.target.closest("li");
    const f = li && fences.get(li.dataset.fence);
    if (f) map.fitBounds(f.layer.getBounds(), { maxZoom: 17 });
  });
  document.getElementById("tenant").addEventListener("change", (e) => {
    setTenant(e.target.value);
    const session = ++state.session;
    open(session).catch((err) => { state.refused = String(err.message || err); });
  });
  setInterval(() => {
    if (gfAuth.token && state.ws) {
      const session = state.session;
      loadFences(session).catch(() => {});
    }
  }, FENCES_EVERY_MS);
  setInterval(status, 1000);
  startSignIn(start, signedOut);
}
