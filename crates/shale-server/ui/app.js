// Shale's web UI: one page, routed by the URL's hash, reading the node's public REST API.
// Pages: cluster, indexes (and one index), split map, compaction, search, metrics (PromQL).
// Every text from the API is put in the page as text (never as HTML). Charts are uPlot's;
// the split map is drawn here, as SVG.
"use strict";

// ---------------------------------------------------------------------------------------
// API access

/** The API token the login page stored, if any. */
function storedToken() {
  for (const part of document.cookie.split(";")) {
    const [name, ...rest] = part.trim().split("=");
    if (name === "shale_api_token") return decodeURIComponent(rest.join("="));
  }
  return null;
}

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** Calls the API; answers the parsed JSON or throws an ApiError worded as the API words it. */
async function api(path, options = {}) {
  const headers = Object.assign({}, options.headers || {});
  const token = storedToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  if (options.body && !headers["Content-Type"]) headers["Content-Type"] = "application/json";
  const response = await fetch(path, Object.assign({}, options, { headers }));
  const text = await response.text();
  let body = text;
  try {
    body = text ? JSON.parse(text) : null;
  } catch (_) {
    /* not JSON: keep the text */
  }
  if (response.status === 401) {
    window.location.assign("/ui/login");
    throw new ApiError(401, "the API token is missing or wrong");
  }
  if (!response.ok || (body && body.status === "error")) {
    const message =
      (body && typeof body === "object" && (body.message || (typeof body.error === "string" ? body.error : body.error && body.error.reason))) ||
      (typeof body === "string" && body) ||
      `HTTP ${response.status}`;
    throw new ApiError(response.status, message);
  }
  return body;
}

// ---------------------------------------------------------------------------------------
// DOM helpers

/** Creates an element; strings among `children` become text nodes. */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

function setAttrs(node, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "class") node.setAttribute("class", value);
    else if (key === "text") node.textContent = value;
    // Through the CSSOM: the Content Security Policy refuses inline style attributes.
    else if (key === "style") node.style.cssText = String(value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replaces a node's children (null children skipped, strings as text). */
function setChildren(node, ...children) {
  node.replaceChildren();
  append(node, children);
}

function table(headers, rows, attrs) {
  return el(
    "table",
    Object.assign({ class: "data" }, attrs),
    el("thead", null, el("tr", null, headers.map((h) => el("th", { class: h.num ? "num" : null }, h.label || h)))),
    el("tbody", null, rows),
  );
}

function card(label, value, test) {
  return el("div", { class: "card", "data-test": test }, el("div", { class: "label" }, label), el("div", { class: "value" }, value));
}

function errorBox(err) {
  return el("div", { class: "error", "data-test": "error" }, err && err.message ? err.message : String(err));
}

// ---------------------------------------------------------------------------------------
// Formatting

const NUM = new Intl.NumberFormat("en-US");
const fmtInt = (n) => (n === null || n === undefined ? "—" : NUM.format(Math.round(n)));

function fmtBytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i++;
  }
  return `${i === 0 ? n : n.toFixed(1)} ${units[i]}`;
}

/** Seconds since the epoch as `YYYY-MM-DD HH:MM:SS` UTC. */
function fmtTime(secs) {
  if (secs === null || secs === undefined) return "—";
  return new Date(secs * 1000).toISOString().replace("T", " ").slice(0, 19);
}

function fmtAge(ms) {
  if (ms === null || ms === undefined || ms < 0) return "unknown";
  if (ms < 1000) return `${ms} ms ago`;
  const s = Math.round(ms / 1000);
  if (s < 120) return `${s} s ago`;
  if (s < 7200) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d", "#4b5563", "#ea580c"];
const LEVEL_COLORS = ["#f59e0b", "#3b82f6", "#10b981", "#8b5cf6", "#ef4444", "#14b8a6", "#6366f1"];

function colorOf(key) {
  let h = 0;
  for (const c of String(key)) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return PALETTE[h % PALETTE.length];
}

// ---------------------------------------------------------------------------------------
// Routing and polling

const main = document.getElementById("main");
let routeGeneration = 0;
let charts = [];

/** The current route: `#/page/arg?k=v` → {page, arg, params}. */
function currentRoute() {
  const hash = window.location.hash.replace(/^#\/?/, "");
  const [path, query] = hash.split("?");
  const [page, ...rest] = path.split("/");
  return { page: page || "cluster", arg: rest.length ? decodeURIComponent(rest.join("/")) : null, params: new URLSearchParams(query || "") };
}

function go(page, arg, params) {
  const query = params && [...params].length ? `?${new URLSearchParams(params)}` : "";
  const hash = `#/${page}${arg ? `/${encodeURIComponent(arg)}` : ""}${query}`;
  if (window.location.hash !== hash) window.location.hash = hash;
}

/** Runs `refresh` now and every `ms` after it finishes, until the page changes. */
function poll(refresh, ms) {
  const generation = routeGeneration;
  const tick = async () => {
    if (generation !== routeGeneration) return;
    await refresh();
    if (generation === routeGeneration) setTimeout(tick, ms);
  };
  tick();
}

function isCurrent(generation) {
  return generation === routeGeneration;
}

const PAGES = {};

function route() {
  routeGeneration++;
  for (const chart of charts) chart.destroy();
  charts = [];
  hideTooltip();
  const { page, arg, params } = currentRoute();
  for (const link of document.querySelectorAll("#nav a")) {
    const active = link.dataset.page === page || (page === "index" && link.dataset.page === "indexes");
    link.classList.toggle("active", active);
  }
  setChildren(main);
  const render = PAGES[page] || PAGES.cluster;
  render(arg, params);
}

// ---------------------------------------------------------------------------------------
// Shared data

/** Every index's metadata, by id. */
async function loadIndexes() {
  const indexes = await api("/api/v1/indexes");
  indexes.sort((a, b) => a.index_config.index_id.localeCompare(b.index_config.index_id));
  return indexes;
}

function isMetricsIndex(index) {
  return !!index.index_config.metrics;
}

async function loadSplits(indexId, states) {
  const query = states ? `?split_states=${states}` : "";
  const answer = await api(`/api/v1/indexes/${encodeURIComponent(indexId)}/splits${query}`);
  return answer.splits;
}

function summarize(splits) {
  let docs = 0;
  let bytes = 0;
  let start = null;
  let end = null;
  for (const split of splits) {
    docs += split.num_docs;
    bytes += split.size_bytes;
    const range = split.time_range;
    if (range) {
      start = start === null ? range.start : Math.min(start, range.start);
      end = end === null ? range.end : Math.max(end, range.end);
    }
  }
  return { docs, bytes, splits: splits.length, start, end };
}

/** Published documents seen at each poll, per index: the rate is their slope. */
const docHistory = new Map();

function publishedRate(indexId, docs) {
  const now = Date.now() / 1000;
  const history = (docHistory.get(indexId) || []).filter((s) => now - s.t <= 60);
  history.push({ t: now, docs });
  docHistory.set(indexId, history);
  if (history.length < 2) return null;
  const first = history[0];
  const dt = now - first.t;
  return dt > 0 ? Math.max(0, (docs - first.docs) / dt) : null;
}

/** An index selector that navigates to `page` for the chosen index. */
function indexPicker(indexes, selected, page, filter) {
  const choices = indexes.filter(filter || (() => true));
  return el(
    "select",
    { "data-test": "index-picker", onchange: (e) => go(page, e.target.value) },
    choices.map((index) => {
      const id = index.index_config.index_id;
      return el("option", { value: id, selected: id === selected }, id);
    }),
  );
}

/** The index a per-index page shows: the route's, else the first user index. */
function pickIndex(indexes, arg, filter) {
  const choices = indexes.filter(filter || (() => true));
  if (arg && choices.some((i) => i.index_config.index_id === arg)) return arg;
  const user = choices.find((i) => !i.index_config.index_id.startsWith("otel-"));
  return (user || choices[0] || { index_config: {} }).index_config.index_id || null;
}

/**
 * The indexes and the one a per-index page shows (`filter` picks those it can show), with
 * the route's generation; `null` once the page said why there is none (an error, none).
 */
async function pageIndex(title, arg, filter, none) {
  const generation = routeGeneration;
  let indexes;
  try {
    indexes = await loadIndexes();
  } catch (err) {
    main.append(errorBox(err));
    return null;
  }
  if (!isCurrent(generation)) return null;
  const indexId = pickIndex(indexes, arg, filter);
  if (!indexId) {
    main.append(el("h1", null, title), el("p", null, none));
    return null;
  }
  return { generation, indexes, indexId, index: indexes.find((i) => i.index_config.index_id === indexId) };
}

// ---------------------------------------------------------------------------------------
// Cluster

PAGES.cluster = () => {
  const body = el("div");
  main.append(el("h1", null, "Cluster"), body);
  const generation = routeGeneration;
  poll(async () => {
    let cluster;
    try {
      cluster = await api("/api/v1/cluster");
    } catch (err) {
      if (isCurrent(generation)) setChildren(body, errorBox(err));
      return;
    }
    if (!isCurrent(generation)) return;
    const nodeRow = (node) =>
      el(
        "tr",
        { "data-test": "node-row" },
        el("td", null, el("strong", null, node.node_id), node.node_id === cluster.self_node_id ? el("span", { class: "muted" }, " (this node)") : null),
        el("td", { class: "num" }, node.generation),
        el("td", null, node.roles.join(", ")),
        el("td", { class: "mono" }, node.advertise_address),
        el("td", null, node.is_leader ? el("span", { class: "badge ok" }, "leader") : ""),
        el("td", null, fmtAge(node.heartbeat_age_ms)),
        el("td", { class: "num" }, node.shards.length),
        el("td", { class: "num" }, node.running_merges),
      );
    const headers = ["Node", { label: "Generation", num: true }, "Roles", "Address", "Leader", "Heartbeat", { label: "Shards", num: true }, { label: "Running merges", num: true }];
    const shards = cluster.live_nodes.flatMap((node) => node.shards.map((shard) => Object.assign({ node_id: node.node_id }, shard)));
    setChildren(body, 
      el(
        "div",
        { class: "cards" },
        card("Cluster", cluster.cluster_id),
        card("Live nodes", cluster.live_nodes.length, "live-nodes"),
        card("Departed nodes", cluster.dead_nodes.length, "dead-nodes"),
        card("Leader", cluster.leader ? `${cluster.leader.node_id} (gen ${cluster.leader.generation})` : "none"),
        card("Open shards", shards.filter((s) => s.shard_state === "Open").length),
      ),
      el("h2", null, "Live nodes"),
      el("div", { class: "panel" }, table(headers, cluster.live_nodes.map(nodeRow), { "data-test": "live-nodes-table" })),
      cluster.dead_nodes.length ? [el("h2", null, "Departed nodes"), el("div", { class: "panel" }, table(headers, cluster.dead_nodes.map(nodeRow)))] : null,
      el("h2", null, "Shards"),
      el(
        "div",
        { class: "panel" },
        table(
          ["Index", "Source", "Shard", "Node", "State"],
          shards.map((s) => el("tr", null, el("td", null, s.index_uid.split(":")[0]), el("td", null, s.source_id), el("td", { class: "mono" }, s.shard_id), el("td", null, s.node_id), el("td", null, s.shard_state))),
        ),
      ),
    );
  }, 2000);
};

// ---------------------------------------------------------------------------------------
// Indexes

PAGES.indexes = () => {
  const body = el("div");
  main.append(el("h1", null, "Indexes"), body);
  const generation = routeGeneration;
  poll(async () => {
    let rows;
    try {
      const indexes = await loadIndexes();
      rows = await Promise.all(
        indexes.map(async (index) => ({ index, summary: summarize(await loadSplits(index.index_config.index_id, "Published")) })),
      );
    } catch (err) {
      if (isCurrent(generation)) setChildren(body, errorBox(err));
      return;
    }
    if (!isCurrent(generation)) return;
    const totals = rows.reduce((t, r) => ({ docs: t.docs + r.summary.docs, bytes: t.bytes + r.summary.bytes, splits: t.splits + r.summary.splits }), { docs: 0, bytes: 0, splits: 0 });
    setChildren(body, 
      el("div", { class: "cards" }, card("Indexes", rows.length), card("Documents and samples", fmtInt(totals.docs)), card("Published splits", fmtInt(totals.splits)), card("Split bytes", fmtBytes(totals.bytes))),
      el(
        "div",
        { class: "panel" },
        table(
          ["Index", "Kind", { label: "Documents", num: true }, { label: "Splits", num: true }, { label: "Bytes", num: true }, { label: "Published docs/s", num: true }, "Merge policy", "Time range"],
          rows.map(({ index, summary }) => {
            const id = index.index_config.index_id;
            const rate = publishedRate(id, summary.docs);
            return el(
              "tr",
              { class: "clickable", "data-test": "index-row", "data-index": id, onclick: () => go("index", id) },
              el("td", null, el("a", { href: `#/index/${encodeURIComponent(id)}` }, id)),
              el("td", null, isMetricsIndex(index) ? "metrics" : "logs"),
              el("td", { class: "num", "data-test": "index-docs" }, fmtInt(summary.docs)),
              el("td", { class: "num", "data-test": "index-splits" }, fmtInt(summary.splits)),
              el("td", { class: "num" }, fmtBytes(summary.bytes)),
              el("td", { class: "num" }, rate === null ? "—" : rate.toFixed(1)),
              el("td", null, index.index_config.indexing_settings.merge_policy.type),
              el("td", { class: "muted" }, summary.start === null ? "—" : `${fmtTime(summary.start)} → ${fmtTime(summary.end)}`),
            );
          }),
          { "data-test": "indexes-table" },
        ),
      ),
    );
  }, 2000);
};

PAGES.index = (indexId) => {
  const body = el("div");
  main.append(el("h1", null, `Index ${indexId}`), body);
  const generation = routeGeneration;
  poll(async () => {
    let index;
    let splits;
    let cluster;
    let deleteTasks;
    try {
      [index, splits, cluster] = await Promise.all([
        api(`/api/v1/indexes/${encodeURIComponent(indexId)}`),
        loadSplits(indexId, "Published"),
        api("/api/v1/cluster"),
      ]);
      deleteTasks = isMetricsIndex(index) ? [] : await api(`/api/v1/${encodeURIComponent(indexId)}/delete-tasks`);
    } catch (err) {
      if (isCurrent(generation)) setChildren(body, errorBox(err));
      return;
    }
    if (!isCurrent(generation)) return;
    const summary = summarize(splits);
    const rate = publishedRate(indexId, summary.docs);
    const shards = cluster.live_nodes
      .concat(cluster.dead_nodes)
      .flatMap((node) => node.shards.map((shard) => Object.assign({ node_id: node.node_id }, shard)))
      .filter((shard) => shard.index_uid === index.index_uid);
    const sources = [...new Set(shards.map((s) => s.source_id).concat(Object.keys(index.checkpoints || {})))].sort();
    setChildren(body, 
      el(
        "div",
        { class: "toolbar" },
        el("a", { href: `#/splits/${encodeURIComponent(indexId)}` }, "Split map"),
        el("a", { href: `#/compaction/${encodeURIComponent(indexId)}` }, "Compaction"),
        isMetricsIndex(index) ? el("a", { href: `#/metrics/${encodeURIComponent(indexId)}` }, "Query") : el("a", { href: `#/search/${encodeURIComponent(indexId)}` }, "Search"),
      ),
      el(
        "div",
        { class: "cards" },
        card(isMetricsIndex(index) ? "Samples" : "Documents", fmtInt(summary.docs), "index-docs"),
        card("Published splits", fmtInt(summary.splits), "index-splits"),
        card("Bytes", fmtBytes(summary.bytes)),
        card("Published docs/s", rate === null ? "—" : rate.toFixed(1)),
        card("Time range", summary.start === null ? "—" : `${fmtTime(summary.start)} → ${fmtTime(summary.end)}`),
        card("Created", fmtTime(index.create_timestamp)),
      ),
      el("h2", null, "Sources"),
      el(
        "div",
        { class: "panel" },
        table(
          ["Source", "Shards (node: state)", "Checkpoint"],
          sources.map((source) =>
            el(
              "tr",
              { "data-test": "source-row" },
              el("td", null, source),
              el("td", null, shards.filter((s) => s.source_id === source).map((s) => `${s.node_id}: ${s.shard_state}`).join(", ") || "—"),
              el("td", null, el("pre", null, JSON.stringify((index.checkpoints || {})[source] || {}, null, 1))),
            ),
          ),
        ),
      ),
      deleteTasks.length ? [el("h2", null, "Delete tasks"), el("div", { class: "panel" }, deleteTaskTable(deleteTasks, splits))] : null,
      el("h2", null, "Config"),
      el("div", { class: "panel" }, el("pre", { "data-test": "index-config" }, JSON.stringify(index.index_config, null, 2))),
    );
  }, 5000);
};

/** Splits a delete task still has to purge: published, overlapping it, not yet applied. */
function splitsPendingDelete(task, splits) {
  const q = task.delete_query;
  return splits.filter((split) => {
    if (split.delete_opstamp >= task.opstamp) return false;
    const range = split.time_range;
    if (!range) return true;
    if (q.start_timestamp !== null && q.start_timestamp !== undefined && range.end < q.start_timestamp) return false;
    if (q.end_timestamp !== null && q.end_timestamp !== undefined && range.start >= q.end_timestamp) return false;
    return true;
  });
}

function deleteTaskTable(tasks, splits) {
  return table(
    [{ label: "Opstamp", num: true }, "Query", "Time range", "Created", "State"],
    tasks.map((task) => {
      const pending = splitsPendingDelete(task, splits).length;
      const q = task.delete_query;
      return el(
        "tr",
        { "data-test": "delete-task-row" },
        el("td", { class: "num" }, task.opstamp),
        el("td", { class: "mono" }, q.query),
        el("td", null, q.start_timestamp || q.end_timestamp ? `${fmtTime(q.start_timestamp)} → ${fmtTime(q.end_timestamp)}` : "all"),
        el("td", null, fmtTime(task.create_timestamp)),
        el("td", null, pending ? el("span", { class: "badge warn" }, `pending on ${pending} split${pending > 1 ? "s" : ""}`) : el("span", { class: "badge ok" }, "applied")),
      );
    }),
  );
}

// ---------------------------------------------------------------------------------------
// Sort keys

/** The byte values of a hex sort key. */
function keyBytes(hex) {
  const bytes = [];
  for (let i = 0; i + 1 < (hex || "").length; i += 2) bytes.push(parseInt(hex.slice(i, i + 2), 16));
  return bytes;
}

/** The type of each sort field, from the doc mapping (text when unknown). */
function sortFieldTypes(index, fields) {
  const mappings = (index.index_config.doc_mapping || {}).field_mappings || [];
  return (fields || []).map((name) => {
    if (name === "__series_id__") return "u64";
    const mapping = mappings.find((m) => m.name === name);
    return mapping ? mapping.type : "text";
  });
}

/** A sort key as its field values (`api / host-1`); a bound past the last key ends in `…`. */
function decodeKey(hex, types) {
  const bytes = keyBytes(hex);
  let i = 0;
  const parts = [];
  const readU64 = () => {
    let n = 0n;
    for (let k = 0; k < 8; k++) n = (n << 8n) | BigInt(bytes[i + k]);
    i += 8;
    return n;
  };
  for (const type of types) {
    if (i >= bytes.length) break;
    const tag = bytes[i++];
    if (tag === 0x00) {
      parts.push("∅");
      continue;
    }
    if (tag !== 0x01) return parts.concat("…").join(" / ");
    if (type === "text" || type === "json") {
      const chars = [];
      while (i < bytes.length) {
        if (bytes[i] === 0x00 && bytes[i + 1] === 0xff) {
          chars.push(0);
          i += 2;
        } else if (bytes[i] === 0x00) {
          i += 2;
          break;
        } else chars.push(bytes[i++]);
      }
      parts.push(new TextDecoder().decode(new Uint8Array(chars)));
    } else if (i + 8 <= bytes.length && (type === "u64" || type === "i64" || type === "datetime")) {
      let n = readU64();
      if (type !== "u64") n = BigInt.asIntN(64, n ^ (1n << 63n));
      parts.push(type === "datetime" ? fmtTime(Number(n / 1000000n)) : n.toString());
    } else if (type === "bool" && i < bytes.length) {
      parts.push(bytes[i++] ? "true" : "false");
    } else {
      return parts.concat("…").join(" / ");
    }
  }
  return parts.join(" / ");
}

/**
 * The part of a sort key that holds its sort fields (the trailing timestamp dropped), as hex;
 * an upper bound's `ff` is kept, so it sorts after the keys it bounds.
 */
function keyPrefix(hex, types) {
  const bytes = keyBytes(hex);
  let i = 0;
  for (const type of types) {
    if (i >= bytes.length || bytes[i] === 0x00) {
      i++;
      continue;
    }
    if (bytes[i] !== 0x01) break;
    i++;
    if (type === "text" || type === "json") {
      while (i < bytes.length) {
        if (bytes[i] === 0x00 && bytes[i + 1] === 0xff) i += 2;
        else if (bytes[i] === 0x00) {
          i += 2;
          break;
        } else i++;
      }
    } else if (type === "bool") i += 1;
    else i += 8;
  }
  i = Math.min(i, bytes.length);
  return hex.slice(0, 2 * i) + (bytes[i] === 0xff ? "ff" : "");
}

/**
 * Maps sort keys to [0, 1] by rank among the keys drawn (every split's bounds): order is
 * kept, so overlaps show as they are, and each key range gets room by how many bounds it
 * spans rather than by its bytes.
 */
function keyScale(keys) {
  const sorted = [...new Set(keys.filter((k) => k))].sort();
  if (sorted.length < 2) return () => 0.5;
  const rank = new Map(sorted.map((k, i) => [k, i / (sorted.length - 1)]));
  return (hex) => (rank.has(hex) ? rank.get(hex) : 0.5);
}

// ---------------------------------------------------------------------------------------
// Split map

let tooltip = null;

function showTooltip(event, text) {
  if (!tooltip) {
    tooltip = el("div", { class: "tooltip" });
    document.body.append(tooltip);
  }
  tooltip.textContent = text;
  tooltip.style.display = "block";
  tooltip.style.left = `${Math.min(event.clientX + 14, window.innerWidth - 440)}px`;
  tooltip.style.top = `${event.clientY + 14}px`;
}

function hideTooltip() {
  if (tooltip) tooltip.style.display = "none";
}

/** Seconds of a duration such as `15m`, `1h`, `30s` (null if unreadable). */
function durationSecs(text) {
  const match = /^\s*(\d+)\s*(s|m|h|d)?\s*$/.exec(String(text || ""));
  if (!match) return null;
  return Number(match[1]) * { s: 1, m: 60, h: 3600, d: 86400 }[match[2] || "s"];
}

/** Nice time ticks over [start, end] (seconds). */
function timeTicks(start, end, count) {
  const steps = [1, 5, 15, 30, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 7 * 86400, 30 * 86400];
  const step = steps.find((s) => (end - start) / s <= count) || steps[steps.length - 1];
  const ticks = [];
  for (let t = Math.ceil(start / step) * step; t <= end; t += step) ticks.push(t);
  const short = (t) => (end - start > 2 * 86400 ? fmtTime(t).slice(5, 16) : fmtTime(t).slice(11, step < 60 ? 19 : 16));
  // The first tick carries the date.
  return { ticks, label: (t) => (t === ticks[0] ? `${fmtTime(t).slice(0, 10)} ${short(t)}` : short(t)) };
}

/**
 * Draws published splits: time across, sort-key range (locality) or merge level (others)
 * down; colour by level or by node; merges in flight dashed, splits of departed nodes
 * outlined red, splits a delete task still has to purge hatched.
 */
function drawSplitMap(container, { index, splits, merging, liveNodes, deleteTasks, colorBy }) {
  const width = Math.max(600, container.clientWidth - 24);
  const locality = index.index_config.indexing_settings.merge_policy.type === "locality";
  const margin = { left: locality ? 170 : 70, right: 16, top: 12, bottom: 28 };
  // A locality split covers its whole time bucket (its documents' own range is in the
  // tooltip): the buckets line up as columns.
  const bucket = locality ? durationSecs(index.index_config.indexing_settings.merge_policy.time_bucket) : null;
  const span = (s) => {
    if (bucket && s.time_bucket_start !== null && s.time_bucket_start !== undefined && s.time_range) return [s.time_bucket_start, s.time_bucket_start + bucket];
    return s.time_range ? [s.time_range.start, s.time_range.end + 1] : null;
  };
  const timed = splits.filter((s) => span(s));
  let t0 = Math.min(...timed.map((s) => span(s)[0]));
  let t1 = Math.max(...timed.map((s) => span(s)[1]));
  if (!timed.length) {
    t0 = 0;
    t1 = 1;
  }
  const x = (t) => margin.left + ((t - t0) / Math.max(1, t1 - t0)) * (width - margin.left - margin.right);
  const pendingDelete = new Set();
  for (const task of deleteTasks) for (const split of splitsPendingDelete(task, splits)) pendingDelete.add(split.split_id);
  const level = (s) => (locality ? s.key_level || 0 : s.num_merge_ops);
  const fill = (s) => (colorBy === "node" ? colorOf(s.node_id) : LEVEL_COLORS[level(s) % LEVEL_COLORS.length]);
  // Vertical placement.
  let height;
  const place = new Map();
  const yLabels = [];
  if (locality) {
    height = 440;
    const inner = height - margin.top - margin.bottom;
    const fieldTypes = sortFieldTypes(index, (splits[0] || {}).sort_fields);
    const prefix = (key) => (key ? keyPrefix(key, fieldTypes) : key);
    const scale = keyScale(splits.flatMap((s) => [prefix(s.sort_key_min), prefix(s.sort_key_max)]));
    for (const s of splits) {
      const y0 = margin.top + scale(prefix(s.sort_key_min)) * inner;
      const y1 = margin.top + scale(prefix(s.sort_key_max)) * inner;
      place.set(s.split_id, { y: y0, h: Math.max(3, y1 - y0), dx: 0 });
    }
    // Level-0 splits of one bucket overlap: each is drawn a little offset from the one
    // before, as a deck, so their number shows.
    const decks = new Map();
    for (const s of splits.filter((x) => level(x) === 0)) {
      const key = (span(s) || [0])[0];
      const depth = decks.get(key) || 0;
      decks.set(key, depth + 1);
      const p = place.get(s.split_id);
      const offset = Math.min(depth, 12) * 5;
      p.dx = offset;
      p.y = Math.min(p.y + offset, margin.top + inner - 3);
      p.h = Math.max(3, Math.min(p.h, margin.top + inner - p.y));
    }
    // Labels: the first sort field's value at each bound where it changes.
    const types = sortFieldTypes(index, (splits[0] || {}).sort_fields);
    const bounds = [...new Set(splits.flatMap((s) => [prefix(s.sort_key_min), prefix(s.sort_key_max)]).filter((k) => k))].sort();
    let lastY = -100;
    let lastText = null;
    for (const key of bounds) {
      const text = decodeKey(key, types.slice(0, 1));
      const y = margin.top + scale(key) * inner;
      if (text && text !== lastText && text !== "…" && y - lastY >= 14) {
        yLabels.push({ y, text });
        lastY = y;
      }
      lastText = text;
    }
  } else {
    const laneHeight = 14;
    const levels = [...new Set(splits.map(level))].sort((a, b) => b - a);
    let y = margin.top;
    for (const lv of levels) {
      const lanes = [];
      const members = splits.filter((s) => level(s) === lv).sort((a, b) => (a.time_range ? a.time_range.start : 0) - (b.time_range ? b.time_range.start : 0));
      for (const s of members) {
        const start = s.time_range ? s.time_range.start : t0;
        let lane = lanes.findIndex((end) => end <= start);
        if (lane < 0) {
          lane = lanes.length;
          lanes.push(0);
        }
        lanes[lane] = s.time_range ? s.time_range.end + 1 : t1;
        place.set(s.split_id, { y: y + lane * laneHeight, h: laneHeight - 2 });
      }
      yLabels.push({ y: y + 10, text: `level ${lv}` });
      y += Math.max(1, lanes.length) * laneHeight + 10;
    }
    height = Math.max(120, y + margin.bottom);
  }
  const root = svg("svg", { class: "splitmap", width, height, viewBox: `0 0 ${width} ${height}`, "data-test": "split-map" });
  root.append(
    svg(
      "defs",
      null,
      svg("pattern", { id: "hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" }, svg("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#dc2626", "stroke-width": 2 })),
    ),
  );
  // Delete tasks: their time ranges, banded.
  for (const task of deleteTasks) {
    const q = task.delete_query;
    const a = x(q.start_timestamp !== null && q.start_timestamp !== undefined ? Math.max(t0, q.start_timestamp) : t0);
    const b = x(q.end_timestamp !== null && q.end_timestamp !== undefined ? Math.min(t1, q.end_timestamp) : t1);
    if (b > a) root.append(svg("rect", { class: "delete-band", x: a, y: margin.top, width: b - a, height: height - margin.top - margin.bottom }));
  }
  // Time axis.
  const axis = svg("g", { class: "axis" });
  const { ticks, label } = timeTicks(t0, t1, Math.floor(width / 110));
  for (const t of ticks) {
    axis.append(svg("line", { x1: x(t), x2: x(t), y1: margin.top, y2: height - margin.bottom }));
    axis.append(svg("text", { x: x(t), y: height - 10, "text-anchor": "middle", text: label(t) }));
  }
  for (const l of yLabels) axis.append(svg("text", { x: margin.left - 6, y: Math.min(l.y + 9, height - margin.bottom - 2), "text-anchor": "end", text: l.text }));
  root.append(axis);
  // Splits: level 1 and up first, level 0 (overlapping) on top.
  const order = [...splits].sort((a, b) => level(b) - level(a));
  for (const s of order) {
    const p = place.get(s.split_id);
    const [start, end] = span(s) || [t0, t1];
    const classes = ["split"];
    if (merging.has(s.split_id)) classes.push("merging");
    if (!liveNodes.has(s.node_id)) classes.push("orphan");
    const dx = p.dx || 0;
    const w = Math.max(2, x(end) - x(start) - 1 - dx);
    const attrs = { class: classes.join(" "), x: x(start) + dx, y: p.y, width: w, height: p.h, fill: fill(s), "fill-opacity": level(s) === 0 && locality ? 0.7 : 0.9, "data-split-id": s.split_id, "data-level": level(s) };
    const rect = svg("rect", attrs);
    const types = sortFieldTypes(index, s.sort_fields);
    const info = [
      `split ${s.split_id}`,
      `level ${level(s)} · ${s.num_merge_ops} merge ops · node ${s.node_id}${liveNodes.has(s.node_id) ? "" : " (departed: orphaned)"}`,
      `${fmtInt(s.num_docs)} ${isMetricsIndex(index) ? "samples" : "docs"} · ${fmtBytes(s.size_bytes)}`,
      s.time_range ? `time ${fmtTime(s.time_range.start)} → ${fmtTime(s.time_range.end)}` : "no time range",
      s.sort_key_min ? `keys ${decodeKey(s.sort_key_min, types)} → ${decodeKey(s.sort_key_max, types)}` : null,
      merging.has(s.split_id) ? "in a merge now" : null,
      pendingDelete.has(s.split_id) ? "a delete task has yet to purge it" : null,
    ].filter(Boolean);
    rect.addEventListener("mousemove", (e) => showTooltip(e, info.join("\n")));
    rect.addEventListener("mouseleave", hideTooltip);
    root.append(rect);
    if (pendingDelete.has(s.split_id)) root.append(svg("rect", { x: x(start) + dx, y: p.y, width: w, height: p.h, fill: "url(#hatch)", "pointer-events": "none" }));
  }
  setChildren(container, root);
}

PAGES.splits = async (arg, params) => {
  const chosen = await pageIndex("Split map", arg, null, "No index yet.");
  if (!chosen) return;
  const { generation, indexes, indexId, index } = chosen;
  const locality = index.index_config.indexing_settings.merge_policy.type === "locality";
  let colorBy = params.get("color") === "node" ? "node" : "level";
  const colorPicker = el(
    "select",
    { "data-test": "color-by", onchange: (e) => go("splits", indexId, { color: e.target.value }) },
    el("option", { value: "level", selected: colorBy === "level" }, "colour by level"),
    el("option", { value: "node", selected: colorBy === "node" }, "colour by node"),
  );
  const cards = el("div", { class: "cards" });
  const legend = el("div", { class: "legend" });
  const map = el("div", { class: "panel" });
  const errors = el("div");
  main.append(
    el("h1", null, "Split map"),
    el("div", { class: "toolbar" }, el("label", null, "Index"), indexPicker(indexes, indexId, "splits"), colorPicker, el("span", { class: "muted" }, locality ? "time across, sort-key range down; level-0 splits overlap, level-1 splits do not" : "time across, merge level down")),
    errors,
    cards,
    legend,
    map,
  );
  poll(async () => {
    let splits;
    let status;
    let cluster;
    let deleteTasks;
    try {
      [splits, status, cluster, deleteTasks] = await Promise.all([
        loadSplits(indexId, "Published"),
        api(`/api/v1/indexes/${encodeURIComponent(indexId)}/compaction?recent_merges=0`),
        api("/api/v1/cluster"),
        isMetricsIndex(index) ? Promise.resolve([]) : api(`/api/v1/${encodeURIComponent(indexId)}/delete-tasks`),
      ]);
    } catch (err) {
      if (isCurrent(generation)) setChildren(errors, errorBox(err));
      return;
    }
    if (!isCurrent(generation)) return;
    setChildren(errors);
    const merging = new Set(status.running.concat(status.pending).flatMap((t) => t.split_ids));
    const liveNodes = new Set(cluster.live_nodes.map((n) => n.node_id));
    const level = (s) => (locality ? s.key_level || 0 : s.num_merge_ops);
    const byLevel = new Map();
    for (const s of splits) byLevel.set(level(s), (byLevel.get(level(s)) || 0) + 1);
    const orphans = splits.filter((s) => !liveNodes.has(s.node_id)).length;
    const pendingDelete = new Set(deleteTasks.flatMap((t) => splitsPendingDelete(t, splits).map((s) => s.split_id)));
    setChildren(cards, 
      card("Published splits", fmtInt(splits.length), "map-splits"),
      ...[...byLevel.keys()].sort().map((lv) => card(`Level ${lv}`, fmtInt(byLevel.get(lv)), `map-level-${lv}`)),
      card("In merges now", fmtInt(splits.filter((s) => merging.has(s.split_id)).length), "map-merging"),
      card("Orphaned (node departed)", fmtInt(orphans), "map-orphans"),
      card("Delete pending", fmtInt(pendingDelete.size), "map-delete-pending"),
    );
    const swatches =
      colorBy === "node"
        ? [...new Set(splits.map((s) => s.node_id))].sort().map((n) => [colorOf(n), n])
        : [...byLevel.keys()].sort().map((lv) => [LEVEL_COLORS[lv % LEVEL_COLORS.length], `level ${lv}`]);
    setChildren(legend, 
      ...swatches.map(([color, text]) => el("span", null, el("span", { class: "swatch", style: `background:${color}` }), text)),
      el("span", null, el("span", { class: "swatch", style: "border:2px dashed #7c3aed" }), "in a merge"),
      el("span", null, el("span", { class: "swatch", style: "border:2px solid #dc2626" }), "orphaned"),
      el("span", null, el("span", { class: "swatch", style: "background:repeating-linear-gradient(45deg,#dc2626 0 2px,#fff 2px 5px)" }), "delete pending"),
    );
    if (!splits.length) {
      setChildren(map, el("p", { class: "muted", "data-test": "split-map-empty" }, "No published split."));
      return;
    }
    drawSplitMap(map, { index, splits, merging, liveNodes, deleteTasks, colorBy });
  }, 2000);
};

// ---------------------------------------------------------------------------------------
// Compaction

/** Pending and running merges sampled by this page, per index. */
const mergeSamples = new Map();

function timeChart(container, title, series, data, options = {}) {
  const width = Math.max(400, container.clientWidth - 24);
  const chart = new uPlot(
    Object.assign(
      {
        title,
        width,
        height: options.height || 220,
        scales: {
          x: { time: true },
          // Counts start at zero.
          y: { range: (u, min, max) => (options.fromZero ? [0, Math.max(1, max * 1.1)] : uPlot.rangeNum(min, max, 0.1, true)) },
        },
        tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
        series: [{}].concat(
          series.map((s, i) =>
            Object.assign({ stroke: PALETTE[i % PALETTE.length], width: 1.5, fill: s.bars ? `${PALETTE[i % PALETTE.length]}55` : undefined }, s.bars ? { paths: uPlot.paths.bars({ size: [0.8, 40] }), points: { show: false } } : {}, s),
          ),
        ),
        axes: [{}, { size: 60 }],
      },
      options.uplot || {},
    ),
    data,
    container,
  );
  charts.push(chart);
  return chart;
}

PAGES.compaction = async (arg) => {
  const chosen = await pageIndex("Compaction", arg, null, "No index yet.");
  if (!chosen) return;
  const { generation, indexes, indexId, index } = chosen;
  const errors = el("div");
  const cards = el("div", { class: "cards" });
  const finishedChart = el("div", { class: "panel chart" });
  const liveChart = el("div", { class: "panel chart" });
  const tables = el("div");
  main.append(
    el("h1", null, "Compaction"),
    el("div", { class: "toolbar" }, el("label", null, "Index"), indexPicker(indexes, indexId, "compaction"), el("span", { class: "muted" }, `merge policy ${index.index_config.indexing_settings.merge_policy.type}`)),
    errors,
    cards,
    finishedChart,
    liveChart,
    tables,
  );
  poll(async () => {
    let status;
    let splits;
    let compactions;
    let deleteTasks;
    try {
      [status, splits, compactions, deleteTasks] = await Promise.all([
        api(`/api/v1/indexes/${encodeURIComponent(indexId)}/compaction?recent_merges=500`),
        loadSplits(indexId),
        api(`/api/v1/indexes/${encodeURIComponent(indexId)}/compactions`),
        isMetricsIndex(index) ? Promise.resolve([]) : api(`/api/v1/${encodeURIComponent(indexId)}/delete-tasks`),
      ]);
    } catch (err) {
      if (isCurrent(generation)) setChildren(errors, errorBox(err));
      return;
    }
    if (!isCurrent(generation)) return;
    setChildren(errors);
    const byId = new Map(splits.map((s) => [s.split_id, s]));
    const published = splits.filter((s) => s.split_state === "Published");
    const publishedBytes = published.reduce((t, s) => t + s.size_bytes, 0);
    const rewritten = published.reduce((t, s) => t + s.size_bytes * s.num_merge_ops, 0);
    const amplification = publishedBytes ? (publishedBytes + rewritten) / publishedBytes : null;
    const succeeded = status.recent_merges.filter((m) => m.state === "Succeeded");
    const failed = status.recent_merges.filter((m) => m.state === "Failed");
    const outputBytes = (m) => (m.output_split_ids || []).reduce((t, id) => t + (byId.has(id) ? byId.get(id).size_bytes : 0), 0);
    const bytesMerged = succeeded.reduce((t, m) => t + outputBytes(m), 0);
    setChildren(cards, 
      card("Published splits", fmtInt(status.published_splits), "compaction-splits"),
      card("Immature splits", fmtInt(status.immature_splits)),
      card("Pending merges", fmtInt(status.pending.length), "compaction-pending"),
      card("Running merges", fmtInt(status.running.length), "compaction-running"),
      card(`Finished (last ${status.recent_merges.length})`, `${fmtInt(succeeded.length)} ok · ${fmtInt(failed.length)} failed`, "compaction-finished"),
      card("Write amplification", amplification === null ? "—" : `${amplification.toFixed(2)}×`, "compaction-wa"),
      card("Bytes written by those merges", fmtBytes(bytesMerged)),
    );
    // Finished merges per minute.
    const perMinute = new Map();
    for (const m of status.recent_merges) {
      const minute = Math.floor(m.update_timestamp / 60) * 60;
      const entry = perMinute.get(minute) || [0, 0];
      entry[m.state === "Succeeded" ? 0 : 1]++;
      perMinute.set(minute, entry);
    }
    // Every minute from the oldest finished merge (at most a day back) to now, empty ones 0.
    const nowMinute = Math.floor(Date.now() / 60000) * 60;
    const oldest = Math.min(...perMinute.keys(), nowMinute - 1800);
    const minutes = [];
    for (let m = Math.max(oldest, nowMinute - 86400); m <= nowMinute; m += 60) minutes.push(m);
    for (const m of minutes) if (!perMinute.has(m)) perMinute.set(m, [0, 0]);
    for (const c of charts.splice(0)) c.destroy();
    if (status.recent_merges.length) {
      setChildren(finishedChart);
      timeChart(finishedChart, "Merges finished per minute", [{ label: "succeeded", bars: true }, { label: "failed", bars: true, stroke: "#dc2626" }], [minutes, minutes.map((m) => perMinute.get(m)[0]), minutes.map((m) => perMinute.get(m)[1])], { fromZero: true });
    } else setChildren(finishedChart, el("p", { class: "muted" }, "No merge finished yet."));
    const samples = mergeSamples.get(indexId) || [];
    samples.push([Date.now() / 1000, status.pending.length, status.running.length]);
    if (samples.length > 900) samples.shift();
    mergeSamples.set(indexId, samples);
    setChildren(liveChart);
    // One sample alone is drawn from 2 s before it.
    const drawn = samples.length > 1 ? samples : [[samples[0][0] - 2, samples[0][1], samples[0][2]], samples[0]];
    timeChart(liveChart, "Pending and running merges (sampled every 2 s while this page is open)", [{ label: "pending" }, { label: "running" }], [drawn.map((s) => s[0]), drawn.map((s) => s[1]), drawn.map((s) => s[2])], { height: 180, fromZero: true });
    const now = Date.now() / 1000;
    const mergeRow = (m) =>
      el(
        "tr",
        { "data-test": "merge-row" },
        el("td", { class: "mono" }, m.task_id),
        el("td", null, m.kind),
        el("td", null, m.trigger),
        el("td", null, m.state === "Failed" ? el("span", { class: "badge bad" }, "Failed") : m.state),
        el("td", { class: "num" }, `${m.split_ids.length} → ${(m.output_split_ids || []).length}`),
        el("td", { class: "num" }, m.state === "Succeeded" ? fmtBytes(outputBytes(m)) : "—"),
        el("td", null, m.lease_owner || "—"),
        el("td", null, m.state === "Pending" || m.state === "Running" ? `${Math.round(now - m.create_timestamp)} s` : fmtTime(m.update_timestamp)),
        el("td", { class: "muted" }, m.error || ""),
      );
    const mergeHeaders = ["Task", "Kind", "Trigger", "State", { label: "Splits in → out", num: true }, { label: "Bytes out", num: true }, "Node", "Age / finished", "Error"];
    setChildren(tables, 
      el("h2", null, "Merges in flight"),
      el("div", { class: "panel" }, status.running.length + status.pending.length ? table(mergeHeaders, status.running.concat(status.pending).map(mergeRow)) : el("p", { class: "muted" }, "None.")),
      el("h2", null, "Manual compactions"),
      el(
        "div",
        { class: "panel" },
        compactions.length
          ? table(
              ["Compaction", "State", { label: "Merges done / planned", num: true }, { label: "Splits before → after", num: true }, { label: "Bytes read → written", num: true }, "Started", "Finished"],
              compactions.map((c) =>
                el(
                  "tr",
                  { "data-test": "compaction-row" },
                  el("td", { class: "mono" }, c.compaction_id),
                  el("td", null, c.state),
                  el("td", { class: "num" }, c.plan ? `${c.plan.completed} / ${c.plan.total}${c.plan.failed ? ` (${c.plan.failed} failed)` : ""}` : "—"),
                  el("td", { class: "num" }, `${c.splits_before ?? "—"} → ${c.splits_after ?? "—"}`),
                  el("td", { class: "num" }, `${fmtBytes(c.bytes_read)} → ${fmtBytes(c.bytes_written)}`),
                  el("td", null, fmtTime(c.started_at)),
                  el("td", null, fmtTime(c.finished_at)),
                ),
              ),
            )
          : el("p", { class: "muted" }, "None. Start one with POST /api/v1/indexes/{id}/compact or `shale compact`."),
      ),
      el("h2", null, "Delete tasks"),
      el("div", { class: "panel" }, deleteTasks.length ? deleteTaskTable(deleteTasks, published) : el("p", { class: "muted" }, "None.")),
      el("h2", null, "Finished merges"),
      el("div", { class: "panel" }, status.recent_merges.length ? table(mergeHeaders, status.recent_merges.slice(0, 50).map(mergeRow)) : el("p", { class: "muted" }, "None.")),
    );
  }, 2000);
};

// ---------------------------------------------------------------------------------------
// Search

const RANGES = [
  ["all", "All time", null],
  ["15m", "Last 15 minutes", 900],
  ["1h", "Last hour", 3600],
  ["24h", "Last 24 hours", 86400],
  ["7d", "Last 7 days", 7 * 86400],
  ["custom", "Custom", null],
];

const INTERVALS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 2 * 86400, 7 * 86400];

/** A date-histogram interval giving about 60 buckets over `span` seconds. */
function histogramInterval(span) {
  return INTERVALS.find((i) => span / i <= 60) || INTERVALS[INTERVALS.length - 1];
}

/** `YYYY-MM-DDTHH:MM` (UTC) for a datetime-local input, and back. */
const toInput = (secs) => (secs === null || secs === undefined ? "" : new Date(secs * 1000).toISOString().slice(0, 16));
const fromInput = (value) => (value ? Math.floor(Date.parse(`${value}:00Z`) / 1000) : null);

/** A hit's timestamp field as seconds, whatever its output format. */
function hitSeconds(value) {
  if (typeof value === "number") {
    if (value > 1e17) return value / 1e9;
    if (value > 1e14) return value / 1e6;
    if (value > 1e11) return value / 1e3;
    return value;
  }
  const parsed = Date.parse(value);
  return Number.isNaN(parsed) ? null : parsed / 1000;
}

PAGES.search = async (arg, params) => {
  const logIndexes = (i) => !isMetricsIndex(i);
  const chosen = await pageIndex("Search", arg, logIndexes, "No log index yet.");
  if (!chosen) return;
  const { generation, indexes, indexId, index } = chosen;
  const tsField = index.index_config.doc_mapping.timestamp_field;
  const query = el("input", { class: "query", "data-test": "query", placeholder: "query, e.g. level:ERROR AND service:api (empty: everything)", value: params.get("q") || "" });
  const range = el("select", { "data-test": "time-range" }, RANGES.map(([value, label]) => el("option", { value, selected: (params.get("range") || "all") === value }, label)));
  const from = el("input", { type: "datetime-local", "data-test": "from", value: params.get("from") || "", title: "start (UTC)" });
  const to = el("input", { type: "datetime-local", "data-test": "to", value: params.get("to") || "", title: "end (UTC)" });
  const showCustom = () => {
    const custom = range.value === "custom";
    from.hidden = !custom;
    to.hidden = !custom;
  };
  range.addEventListener("change", showCustom);
  showCustom();
  const submit = () => {
    const p = { q: query.value, range: range.value };
    if (range.value === "custom") Object.assign(p, { from: from.value, to: to.value });
    const hash = `#/search/${encodeURIComponent(indexId)}?${new URLSearchParams(p)}`;
    if (window.location.hash === hash) route();
    else window.location.hash = hash;
  };
  query.addEventListener("keydown", (e) => {
    if (e.key === "Enter") submit();
  });
  const results = el("div");
  main.append(
    el("h1", null, "Search"),
    el(
      "div",
      { class: "toolbar" },
      indexPicker(indexes, indexId, "search", logIndexes),
      query,
      range,
      from,
      to,
      el("button", { "data-test": "search-button", onclick: submit }, "Search"),
    ),
    el("div", { class: "muted" }, "Times are UTC. The query language is Tantivy's, as in the search API."),
    results,
  );
  if (!params.has("q")) return;
  // The time range: a preset, custom bounds, or (all time) the index's published range.
  let start = null;
  let end = null;
  const preset = RANGES.find((r) => r[0] === range.value);
  const now = Math.floor(Date.now() / 1000);
  if (preset && preset[2]) {
    start = now - preset[2];
    end = now + 1;
  } else if (range.value === "custom") {
    start = fromInput(from.value);
    end = fromInput(to.value);
  }
  setChildren(results, el("p", { class: "muted" }, "Searching…"));
  try {
    let spanStart = start;
    let spanEnd = end;
    if (tsField && (spanStart === null || spanEnd === null)) {
      const summary = summarize(await loadSplits(indexId, "Published"));
      if (spanStart === null) spanStart = summary.start;
      if (spanEnd === null) spanEnd = summary.end === null ? null : summary.end + 1;
    }
    const request = { query: query.value.trim() || "*", max_hits: 50 };
    if (start !== null) request.start_timestamp = start;
    if (end !== null) request.end_timestamp = end;
    let interval = null;
    if (tsField) {
      request.sort_by = `${tsField}:desc`;
      if (spanStart !== null && spanEnd !== null) {
        interval = histogramInterval(Math.max(1, spanEnd - spanStart));
        request.aggs = { histogram: { date_histogram: { field: tsField, fixed_interval: `${interval}s` } } };
      }
    }
    const began = performance.now();
    const answer = await api(`/api/v1/${encodeURIComponent(indexId)}/search`, { method: "POST", body: JSON.stringify(request) });
    if (!isCurrent(generation)) return;
    const elapsed = performance.now() - began;
    const histogram = el("div", { class: "panel chart", "data-test": "histogram" });
    const hitRows = [];
    for (const hit of answer.hits) {
      const detail = el("tr", { class: "hit-doc", hidden: true }, el("td", { colspan: 2 }, el("pre", null, JSON.stringify(hit, null, 2))));
      const ts = tsField ? hit[tsField] : null;
      const summaryText = JSON.stringify(hit);
      hitRows.push(
        el(
          "tr",
          { class: "clickable", "data-test": "hit-row", onclick: () => (detail.hidden = !detail.hidden) },
          el("td", { class: "mono", style: "white-space:nowrap" }, ts === null || ts === undefined ? "" : fmtTime(hitSeconds(ts))),
          el("td", { class: "mono" }, summaryText.length > 300 ? `${summaryText.slice(0, 300)}…` : summaryText),
        ),
        detail,
      );
    }
    setChildren(results, 
      el(
        "p",
        null,
        el("strong", { "data-test": "num-hits" }, fmtInt(answer.num_hits)),
        ` hits · showing ${answer.hits.length} · ${elapsed.toFixed(0)} ms in the browser, ${(answer.elapsed_time_micros / 1000).toFixed(1)} ms on the node`,
      ),
      answer.errors && answer.errors.length ? errorBox(answer.errors.join("\n")) : null,
      histogram,
      answer.hits.length ? el("div", { class: "panel" }, table(["Time", "Document (click to expand)"], hitRows, { "data-test": "hits-table" })) : el("p", { class: "muted" }, "No hit."),
    );
    const buckets = answer.aggregations && answer.aggregations.histogram ? answer.aggregations.histogram.buckets : null;
    if (buckets && interval) {
      // Every bucket of the range, the empty ones as zero.
      const counts = new Map(buckets.map((b) => [Math.floor(b.key / 1000), b.doc_count]));
      const xs = [];
      for (let t = Math.floor(spanStart / interval) * interval; t < spanEnd; t += interval) xs.push(t);
      timeChart(histogram, `Hits over time (${interval} s buckets)`, [{ label: "hits", bars: true }], [xs, xs.map((t) => counts.get(t) || 0)], { height: 180, fromZero: true });
    } else setChildren(histogram, el("p", { class: "muted" }, tsField ? "No time range to draw." : "This index has no timestamp field: no histogram."));
  } catch (err) {
    if (isCurrent(generation)) setChildren(results, errorBox(err));
  }
};

// ---------------------------------------------------------------------------------------
// Metrics (PromQL)

const PROM_RANGES = [
  ["15m", "Last 15 minutes", 900],
  ["1h", "Last hour", 3600],
  ["6h", "Last 6 hours", 6 * 3600],
  ["24h", "Last 24 hours", 86400],
  ["7d", "Last 7 days", 7 * 86400],
];

/** `name{k="v", …}` of a series' labels. */
function seriesName(metric) {
  const name = metric.__name__ || "";
  const labels = Object.entries(metric)
    .filter(([k]) => k !== "__name__")
    .map(([k, v]) => `${k}="${v}"`);
  return labels.length ? `${name}{${labels.join(", ")}}` : name || "{}";
}

PAGES.metrics = async (arg, params) => {
  const chosen = await pageIndex("Metrics", arg, isMetricsIndex, "No metrics index.");
  if (!chosen) return;
  const { generation, indexes, indexId } = chosen;
  const query = el("input", { class: "query", "data-test": "promql", placeholder: "PromQL, e.g. sum by (job) (rate(http_requests_total[5m]))", value: params.get("q") || "" });
  const range = el("select", { "data-test": "prom-range" }, PROM_RANGES.map(([value, label]) => el("option", { value, selected: (params.get("range") || "1h") === value }, label)));
  const submit = () => {
    const hash = `#/metrics/${encodeURIComponent(indexId)}?${new URLSearchParams({ q: query.value, range: range.value })}`;
    if (window.location.hash === hash) route();
    else window.location.hash = hash;
  };
  query.addEventListener("keydown", (e) => {
    if (e.key === "Enter") submit();
  });
  const results = el("div");
  main.append(
    el("h1", null, "Metrics"),
    el("div", { class: "toolbar" }, indexPicker(indexes, indexId, "metrics", isMetricsIndex), query, range, el("button", { "data-test": "prom-button", onclick: submit }, "Run")),
    el("div", { class: "muted" }, "PromQL over the index, answered like Prometheus's query_range."),
    results,
  );
  if (!params.get("q")) return;
  const seconds = (PROM_RANGES.find((r) => r[0] === range.value) || PROM_RANGES[1])[2];
  const end = Math.floor(Date.now() / 1000);
  const start = end - seconds;
  const step = Math.max(1, Math.ceil(seconds / 250));
  setChildren(results, el("p", { class: "muted" }, "Querying…"));
  try {
    const prefix = `/prometheus/${encodeURIComponent(indexId)}/api/v1`;
    const answer = await api(`${prefix}/query_range?${new URLSearchParams({ query: params.get("q"), start, end, step })}`);
    if (!isCurrent(generation)) return;
    const result = answer.data.result.slice(0, 40);
    const xs = [];
    for (let t = start; t <= end; t += step) xs.push(t);
    const position = new Map(xs.map((t, i) => [t, i]));
    const ys = result.map((series) => {
      const values = new Array(xs.length).fill(null);
      for (const [t, v] of series.values) {
        const i = position.get(Math.round(t));
        if (i !== undefined) values[i] = Number(v);
      }
      return values;
    });
    const chart = el("div", { class: "panel chart", "data-test": "prom-chart" });
    setChildren(results, 
      el("p", null, el("strong", { "data-test": "num-series" }, fmtInt(answer.data.result.length)), ` series${answer.data.result.length > result.length ? ` (the first ${result.length} drawn)` : ""}, step ${step} s`),
      chart,
    );
    if (result.length) timeChart(chart, params.get("q"), result.map((s) => ({ label: seriesName(s.metric) })), [xs, ...ys], { height: 320, uplot: { legend: { live: true } } });
    else setChildren(chart, el("p", { class: "muted" }, "No series."));
  } catch (err) {
    if (isCurrent(generation)) setChildren(results, errorBox(err));
  }
};

// ---------------------------------------------------------------------------------------
// Start

window.addEventListener("hashchange", route);
api("/api/v1/version")
  .then((v) => {
    document.getElementById("version").textContent = `v${v.version} · ${String(v.commit || "").slice(0, 8)}`;
  })
  .catch(() => {
    /* the header stays empty */
  });
// What the token signed in with may do (a node without tokens lets everyone do everything).
api("/api/v1/auth")
  .then((auth) => {
    if (!auth.auth_enabled) return;
    const may = ["read", "write", "admin"].filter((right) => auth.may[right]);
    const who = document.getElementById("role");
    who.textContent = `${auth.role}: ${may.join(", ")}`;
    who.title = auth.may.admin
      ? "this token may do everything"
      : `this token may only ${may.join(" and ")}; other actions answer 403`;
  })
  .catch(() => {
    /* the header says nothing */
  });
route();
