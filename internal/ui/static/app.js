// atoll's dashboard. Plain JavaScript, no build step: the page signs in with
// an API key (kept in sessionStorage, so it dies with the tab) and calls the
// public /v1 API as any client does (docs/api.md). Views are functions of
// the location's hash (#/sandboxes, #/sandboxes/ID/terminal, ...); each
// returns an element and may register timers and sockets that are undone
// when the view changes.
"use strict";

const keyStore = "atoll.key";
const $ = (sel, root = document) => root.querySelector(sel);

// ---------- API ----------

// NotAvailable is a route this server does not have (404 "no route"): a
// feature that came after it, so its view says "not available".
class NotAvailable extends Error {}
// APIError is an error answer of the API: its status and api.Error body.
class APIError extends Error {
  constructor(status, body) {
    super(body && body.message ? body.message : `HTTP ${status}`);
    this.status = status;
    this.code = body && body.code;
  }
}

function key() { return sessionStorage.getItem(keyStore) || ""; }

// api calls the API and returns its JSON (or the Response with raw). A 401
// means the key is wrong, revoked or gone: back to the sign-in page.
async function api(method, path, { body, raw, headers = {}, signal, quiet } = {}) {
  const init = { method, headers: { "X-API-Key": key(), ...headers }, signal };
  if (body instanceof Blob || body instanceof ArrayBuffer || typeof body === "string") {
    init.body = body;
  } else if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  const resp = await fetch(path, init);
  if (!resp.ok) {
    let b = null;
    try { b = await resp.json(); } catch { /* not JSON */ }
    if (resp.status === 401 && !quiet) {
      signOut("The server refused the API key (" + (b && b.message || "unauthorized") +
        "). It may be mistyped, revoked, or the server's keys changed: sign in again.");
    }
    if (resp.status === 404 && b && /^no route/.test(b.message || "")) throw new NotAvailable(path);
    throw new APIError(resp.status, b);
  }
  if (raw) return resp;
  if (resp.status === 204) return null;
  return resp.json();
}

const q = (params) => {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== "" && v !== null) u.set(k, v);
  const s = u.toString();
  return s ? "?" + s : "";
};
const sbPath = (id, rest = "") => `/v1/sandboxes/${encodeURIComponent(id)}${rest}`;

// ---------- DOM helpers ----------

// h makes an element: h("a", {href: "#/x", onclick: f}, "text", child...).
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function table(headers, rows, empty = "Nothing here yet.") {
  if (!rows.length) return h("div", { class: "notavail" }, empty);
  return h("div", { class: "scroll" },
    h("table", {}, h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
      h("tbody", {}, rows)));
}

function notAvailable(what) {
  return h("div", { class: "notavail", "data-notavailable": "" },
    `${what} is not available on this server: its API route is missing (an older atoll).`);
}

function flash(msg, ok = false) {
  const f = $("#flash");
  f.textContent = msg;
  f.className = "flash" + (ok ? " ok" : "");
  f.hidden = false;
  clearTimeout(flash.t);
  flash.t = setTimeout(() => { f.hidden = true; }, ok ? 3000 : 8000);
}

// act runs an action for a button: disabled while it runs, errors shown.
async function act(btn, fn, done) {
  if (btn) btn.disabled = true;
  try {
    const r = await fn();
    if (done) done(r);
    return r;
  } catch (e) {
    if (!(e instanceof APIError && e.status === 401)) flash(e.message);
  } finally {
    if (btn) btn.disabled = false;
  }
}

const units = ["B", "KiB", "MiB", "GiB", "TiB"];
function bytes(n) {
  if (n === undefined || n === null) return "";
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  // Bytes whole (an axis's quarter of a small range is a fraction).
  return (i ? n.toFixed(n < 10 ? 1 : 0) : Math.round(n)) + " " + units[i];
}
function age(t) {
  if (!t) return "";
  const s = Math.max(0, (Date.now() - new Date(t).getTime()) / 1000);
  if (s < 60) return Math.floor(s) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m";
  if (s < 86400) return Math.floor(s / 3600) + "h" + (Math.floor(s / 60) % 60 ? Math.floor(s / 60) % 60 + "m" : "");
  return Math.floor(s / 86400) + "d";
}
const plural = (n, one, many = one + "s") => `${n} ${n === 1 ? one : many}`;
const time = (t) => (t ? new Date(t).toLocaleString() : "");
const badge = (state) => h("span", { class: "badge " + state, "data-state": state }, state);
const labels = (l) => Object.entries(l || {}).map(([k, v]) => h("span", { class: "label" }, `${k}=${v}`));
function meter(pct, text) {
  const p = Math.max(0, Math.min(100, pct || 0));
  return h("span", {}, h("span", { class: "meter" }, h("i", { style: `width:${p}%` })), text);
}
function parseLabels(s) {
  const out = {};
  for (const part of s.split(",").map((x) => x.trim()).filter(Boolean)) {
    const i = part.indexOf("=");
    if (i <= 0) throw new Error(`label "${part}": want key=value`);
    out[part.slice(0, i).trim()] = part.slice(i + 1).trim();
  }
  return out;
}
function download(blob, name) {
  const a = h("a", { href: URL.createObjectURL(blob), download: name });
  document.body.append(a);
  a.click();
  setTimeout(() => { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
}

// ---------- charts (canvas) ----------

const palette = ["#1f6feb", "#2e7d32", "#b26a00", "#8e24aa", "#c62828", "#00838f", "#6d4c41", "#3949ab"];

// lineChart draws series [{name, points: [[t(ms), v], ...]}] on a canvas,
// scaled to max (or the data's largest value) and labelled with fmt; over
// span ([t0, t1], default the data's); with bar (a bucket's length in ms)
// as stacked bars, one per bucket.
function lineChart(title, series, { max, fmt = (v) => v.toFixed(1), stacked = false, span, bar } = {}) {
  if (bar) stacked = true;
  const canvas = h("canvas", { role: "img", "aria-label": title });
  const box = h("div", { class: "chart", "data-chart": title }, h("h3", {}, title), canvas,
    series.length > 1 ? h("div", { class: "legend" }, series.map((s, i) => h("span", {}, h("i", { style: `background:${palette[i % palette.length]}` }), s.name))) : null);
  const draw = () => {
    const w = canvas.clientWidth, ht = canvas.clientHeight;
    if (!w) return;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = w * dpr; canvas.height = ht * dpr;
    const g = canvas.getContext("2d");
    g.scale(dpr, dpr);
    g.clearRect(0, 0, w, ht);
    const all = series.flatMap((s) => s.points);
    if (!all.length) {
      g.fillStyle = "#667085"; g.font = "12px system-ui";
      g.fillText("no samples yet", 8, ht / 2);
      return;
    }
    let [t0, t1] = span || [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
    if (t1 === t0) { t0 -= 1000; t1 += 1000; }
    let top = max;
    if (!top) {
      if (stacked) {
        const sums = new Map();
        for (const s of series) for (const [t, v] of s.points) sums.set(t, (sums.get(t) || 0) + v);
        top = Math.max(...sums.values());
      } else top = Math.max(...all.map((p) => p[1]));
      top = top > 0 ? top * 1.1 : 1;
    }
    const L = 52, R = 8, T = 6, B = 18;
    const x = (t) => L + ((t - t0) / (t1 - t0)) * (w - L - R);
    const y = (v) => T + (1 - v / top) * (ht - T - B);
    g.strokeStyle = "#e4e7ec"; g.fillStyle = "#667085"; g.font = "11px system-ui"; g.lineWidth = 1;
    for (let i = 0; i <= 4; i++) {
      const v = (top * i) / 4;
      g.beginPath(); g.moveTo(L, y(v)); g.lineTo(w - R, y(v)); g.stroke();
      g.fillText(fmt(v), 2, y(v) + 4);
    }
    // Past a day the axis needs dates too.
    const at = (t) => (t1 - t0 > 20 * 3600e3 ? new Date(t).toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" }) : new Date(t).toLocaleTimeString());
    g.fillText(at(t0), L, ht - 4);
    const end = at(t1);
    g.fillText(end, w - R - g.measureText(end).width, ht - 4);
    const base = new Map();
    if (bar) {
      const bw = Math.max(1, (x(t0 + bar) - x(t0)) * 0.8);
      series.forEach((s, i) => {
        g.fillStyle = palette[i % palette.length];
        for (const [t, v] of s.points) {
          const b = base.get(t) || 0;
          base.set(t, b + v);
          g.fillRect(x(t), y(b + v), bw, y(b) - y(b + v));
        }
      });
      return;
    }
    series.forEach((s, i) => {
      g.strokeStyle = palette[i % palette.length]; g.lineWidth = 1.6;
      g.beginPath();
      s.points.forEach(([t, v], j) => {
        const b = stacked ? base.get(t) || 0 : 0;
        if (stacked) base.set(t, b + v);
        j ? g.lineTo(x(t), y(b + v)) : g.moveTo(x(t), y(b + v));
      });
      g.stroke();
      // Few samples: dots, so that one sample shows at all.
      if (s.points.length < 30) {
        g.fillStyle = palette[i % palette.length];
        // base already holds this series' tops when stacked.
        for (const [t, v] of s.points) {
          const top = stacked ? base.get(t) : v;
          g.beginPath(); g.arc(x(t), y(top), 2.5, 0, 2 * Math.PI); g.fill();
        }
      }
    });
  };
  requestAnimationFrame(draw);
  new ResizeObserver(draw).observe(canvas);
  return box;
}

// ---------- session ----------

const session = { admin: false, tenant: "" };

function signOut(msg) {
  sessionStorage.removeItem(keyStore);
  cleanup();
  $("#app").hidden = true;
  $("#signin").hidden = false;
  const e = $("#signin-error");
  e.textContent = msg || "";
  e.hidden = !msg;
  $("#signin-key").value = "";
  $("#signin-key").focus();
  mark("atoll:signin");
}

// mark notes when a page first showed what it is for, from the page's
// navigation start (the load times in docs/benchmarks.md read it).
function mark(name) {
  if (!performance.getEntriesByName(name).length) performance.mark(name);
}

// signIn checks a typed key on a route every key may call before it
// shows anything; a key already in the tab's session (a reload) shows the
// page at once, and a 401 on its first call signs out. An admin-only
// route, asked beside, tells whether to show the admin pages.
async function signIn(k, { check = true } = {}) {
  sessionStorage.setItem(keyStore, k);
  const admin = api("GET", "/v1/keys", { quiet: true }).then(() => true, () => false);
  if (check) {
    try {
      await api("GET", "/v1/sandboxes", { quiet: true });
    } catch (e) {
      sessionStorage.removeItem(keyStore);
      throw e.status === 401 ? new Error("Wrong API key: the server refused it.") : e;
    }
  }
  $("#signin").hidden = true;
  $("#app").hidden = false;
  render();
  session.admin = await admin;
  document.body.classList.toggle("admin", session.admin);
  $("#whoami").textContent = session.admin ? "admin" : "";
}

$("#signin-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const btn = ev.submitter;
  if (btn) btn.disabled = true;
  try {
    await signIn($("#signin-key").value.trim());
  } catch (e) {
    const el = $("#signin-error");
    el.textContent = e.message;
    el.hidden = false;
  } finally {
    if (btn) btn.disabled = false;
  }
});
$("#signout").addEventListener("click", () => signOut(""));

// ---------- views and their lifetimes ----------

let undo = [];
function cleanup() {
  for (const f of undo) { try { f(); } catch { /* already gone */ } }
  undo = [];
}
function every(ms, f) {
  const t = setInterval(f, ms);
  undo.push(() => clearInterval(t));
}
// live keeps refreshing an element's content while the view lasts.
function live(el, ms, fill) {
  let busy = false;
  const run = async () => {
    if (busy) return;
    busy = true;
    try { await fill(el); } catch (e) {
      if (e instanceof NotAvailable) el.replaceChildren(notAvailable(el.dataset.what || "This"));
      // 503: a part this server runs without (no networking, no metering).
      else if (e instanceof APIError && e.status === 503) el.replaceChildren(h("div", { class: "notavail", "data-notavailable": "" }, e.message));
      else if (!(e instanceof APIError && e.status === 401)) el.replaceChildren(h("p", { class: "error" }, e.message));
    } finally { busy = false; }
  };
  run();
  if (ms) every(ms, run);
  return el;
}

const routes = [
  [/^sandboxes\/([a-z0-9]+)(?:\/(\w+))?$/, (m) => sandboxView(m[1], m[2] || "terminal")],
  [/^sandboxes$/, () => sandboxesView()],
  [/^templates\/([^/]+)$/, (m) => templateView(decodeURIComponent(m[1]))],
  [/^templates$/, () => templatesView()],
  [/^usage$/, () => usageView()],
  [/^keys$/, () => keysView()],
  [/^tenants$/, () => tenantsView()],
  [/^audit$/, () => auditView()],
  [/^events$/, () => eventsView()],
];

function render() {
  if (!key()) { signOut(""); return; }
  cleanup();
  const path = location.hash.replace(/^#\/?/, "") || "sandboxes";
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", path.startsWith(a.dataset.nav));
  const view = $("#view");
  for (const [re, f] of routes) {
    const m = path.match(re);
    if (m) { view.replaceChildren(f(m)); return; }
  }
  view.replaceChildren(h("p", {}, "No such page. ", h("a", { href: "#/sandboxes" }, "Sandboxes")));
}
window.addEventListener("hashchange", () => { if (key()) render(); });

// ---------- sandboxes ----------

// actions are what the list and the sandbox page offer, by state.
const actions = [
  { name: "stop", when: ["running", "paused"], call: (id) => api("POST", sbPath(id, "/stop")) },
  { name: "start", when: ["stopped", "error", "lost", "archived"], call: (id) => api("POST", sbPath(id, "/start")) },
  { name: "pause", when: ["running"], call: (id) => api("POST", sbPath(id, "/pause")) },
  { name: "resume", when: ["paused", "suspended", "shelved"], call: (id) => api("POST", sbPath(id, "/resume")) },
  { name: "fork", when: ["running", "stopped", "paused"], call: (id) => api("POST", sbPath(id, "/fork"), { body: { count: 1 } }),
    done: (r) => flash(`Forked: ${(r.sandboxes || []).map((s) => s.id).join(", ")}`, true) },
  { name: "delete", when: null, danger: true, confirm: (id) => `Delete sandbox ${id} and its files?`,
    call: (id) => api("DELETE", sbPath(id)) },
];

function actionButtons(sb, refresh) {
  return actions.filter((a) => !a.when || a.when.includes(sb.state)).map((a) =>
    h("button", {
      class: a.danger ? "danger" : "secondary", "data-action": a.name,
      onclick: (ev) => {
        if (a.confirm && !confirm(a.confirm(sb.id))) return;
        act(ev.currentTarget, () => a.call(sb.id), (r) => { if (a.done) a.done(r); refresh(a.name); });
      },
    }, a.name));
}

// usageNow returns the latest sample of a running sandbox's metrics.
async function usageNow(id) {
  const since = Math.floor(Date.now() / 1000) - 30;
  const m = await api("GET", sbPath(id, "/metrics") + q({ start: since }));
  const l = m.metrics || [];
  return l[l.length - 1];
}

function createForm(onCreated) {
  const tpl = h("select", { id: "create-template", name: "template" }, h("option", { value: "" }, "default"));
  const rt = h("select", { id: "create-runtime", name: "runtime" }, h("option", { value: "" }, "default"));
  const lab = h("input", { id: "create-labels", placeholder: "team=a,env=dev", size: 18 });
  const cpu = h("input", { id: "create-cpu", type: "number", min: "0.1", step: "0.1", placeholder: "cores", style: "width:7em" });
  const mem = h("input", { id: "create-memory", type: "number", min: "64", step: "64", placeholder: "MiB", style: "width:7em" });
  api("GET", "/v1/templates").then((r) => {
    for (const t of r.templates || []) if (!t.removed) tpl.append(h("option", { value: t.name }, t.name));
  }).catch(() => {});
  api("GET", "/v1/runtimes").then((r) => {
    for (const x of r.runtimes || []) if (x.available) rt.append(h("option", { value: x.name }, x.name + (x.default ? " (default)" : "")));
  }).catch(() => {});
  const field = (l, el) => h("div", { class: "field" }, h("label", { for: el.id }, l), el);
  const btn = h("button", { id: "create-sandbox", type: "submit" }, "Create sandbox");
  return h("form", {
    class: "bar", onsubmit: (ev) => {
      ev.preventDefault();
      act(btn, async () => {
        const body = { template: tpl.value || undefined, runtime: rt.value || undefined, labels: parseLabels(lab.value) };
        if (cpu.value) body.cpu = Number(cpu.value);
        if (mem.value) body.memory_mib = Number(mem.value);
        return api("POST", "/v1/sandboxes", { body });
      }, (sb) => { flash(`Created ${sb.id}`, true); onCreated(sb); });
    },
  }, field("Template", tpl), field("Runtime", rt), field("Labels", lab), field("CPU", cpu), field("Memory", mem), btn);
}

function sandboxesView() {
  const filter = h("input", { id: "filter-labels", placeholder: "filter labels: team=a", size: 20 });
  const state = h("select", { id: "filter-state" }, ["", "running", "paused", "stopped", "suspended", "shelved", "archived", "error", "lost"].map((s) => h("option", { value: s }, s || "any state")));
  const list = h("div", { id: "sandboxes", dataset: { what: "The sandbox list" } });
  const usage = new Map(); // id → latest metric
  const fill = async () => {
    let lq = {};
    try { lq = parseLabels(filter.value); } catch (e) { flash(e.message); }
    const params = { state: state.value };
    const ls = Object.entries(lq).map(([k, v]) => `${k}=${v}`);
    let path = "/v1/sandboxes" + q(params);
    for (const l of ls) path += (path.includes("?") ? "&" : "?") + "label=" + encodeURIComponent(l);
    const r = await api("GET", path);
    const sbs = (r.sandboxes || []).sort((a, b) => (a.created_at < b.created_at ? 1 : -1));
    const draw = () => list.replaceChildren(table(["ID", "State", "Template", "Runtime", "Age", "Labels", "CPU", "Memory", ""],
      sbs.map((sb) => {
        const u = sb.state === "running" ? usage.get(sb.id) : null;
        return h("tr", { "data-id": sb.id },
          h("td", {}, h("a", { class: "mono", href: `#/sandboxes/${sb.id}` }, sb.id)),
          h("td", {}, badge(sb.state)),
          h("td", { "data-template": sb.template, title: sb.template_version || "" }, sb.template),
          h("td", { "data-runtime": sb.runtime }, sb.runtime),
          h("td", { "data-age": sb.created_at, title: time(sb.created_at) }, age(sb.created_at)),
          h("td", {}, labels(sb.labels)),
          h("td", { "data-cpu": "" }, u ? meter(u.cpu_used_pct, u.cpu_used_pct.toFixed(0) + "% of " + sb.cpu) : ""),
          h("td", { "data-mem": "" }, u ? meter((100 * u.memory_used_bytes) / u.memory_total_bytes, bytes(u.memory_used_bytes) + " / " + bytes(u.memory_total_bytes)) : ""),
          h("td", { class: "actions" }, actionButtons(sb, () => fill())));
      }), "No sandboxes yet: create one above."));
    // The list at once (with the figures of the last round), then again
    // with the running ones' live figures (the first 50: a page, not a
    // census).
    draw();
    mark("atoll:list");
    await Promise.all(sbs.filter((s) => s.state === "running").slice(0, 50).map(async (s) => {
      try { usage.set(s.id, await usageNow(s.id)); } catch { /* gone meanwhile */ }
    }));
    draw();
  };
  filter.addEventListener("change", () => fill());
  state.addEventListener("change", () => fill());
  live(list, 5000, fill);
  return h("div", {},
    h("h1", {}, "Sandboxes"),
    createForm((sb) => { location.hash = `#/sandboxes/${sb.id}`; }),
    h("div", { class: "bar" }, filter, state),
    list);
}

const tabs = ["terminal", "files", "logs", "metrics", "snapshots", "network", "details"];

function sandboxView(id, tab) {
  const head = h("div", { id: "sandbox-head" });
  const body = h("div", { id: "sandbox-tab" });
  let sb = null;
  const fillHead = async () => {
    sb = await api("GET", sbPath(id));
    head.replaceChildren(
      h("div", { class: "bar" },
        h("h1", { class: "grow mono" }, id, " ", badge(sb.state)),
        h("span", { class: "actions", style: "display:flex;gap:4px;flex-wrap:wrap" }, actionButtons(sb, (name) => {
          if (name === "delete") location.hash = "#/sandboxes";
          else fillHead();
        }))),
      h("div", { class: "muted" }, `${sb.template} · ${sb.runtime} · ${sb.cpu} CPU · ${sb.memory_mib} MiB · ${sb.disk_gib} GiB · created ${age(sb.created_at)} ago `, labels(sb.labels)),
      h("p", { class: "error", hidden: !sb.error }, sb.error || ""),
      h("nav", { class: "tabs" }, tabs.map((t) => h("a", { href: `#/sandboxes/${id}/${t}`, class: t === tab ? "active" : "" }, t))));
    return sb;
  };
  live(head, 5000, async () => {
    try { await fillHead(); } catch (e) {
      if (e instanceof APIError && e.status === 404) {
        head.replaceChildren(h("p", {}, `Sandbox ${id} does not exist (any more). `, h("a", { href: "#/sandboxes" }, "Back to the list")));
        body.replaceChildren();
        return;
      }
      throw e;
    }
  });
  const views = { terminal: terminalTab, files: filesTab, logs: logsTab, metrics: metricsTab, snapshots: snapshotsTab, network: networkTab, details: detailsTab };
  body.replaceChildren((views[tab] || detailsTab)(id));
  return h("div", {}, head, body);
}

// ---------- terminal ----------

// xterm.js is loaded on first use, so that the other pages load without it.
let xtermLoaded = null;
function loadXterm() {
  if (!xtermLoaded) {
    const load = (tag, attrs) => new Promise((ok, fail) => {
      const el = h(tag, { ...attrs, onload: ok, onerror: () => fail(new Error("loading " + (attrs.src || attrs.href))) });
      document.head.append(el);
    });
    xtermLoaded = Promise.all([
      load("link", { rel: "stylesheet", href: "vendor/xterm.css" }),
      load("script", { src: "vendor/xterm.js" }).then(() => load("script", { src: "vendor/addon-fit.js" })),
    ]);
  }
  return xtermLoaded;
}

function terminalTab(id) {
  const box = h("div", { class: "term", id: "terminal" });
  const status = h("div", { class: "status-line", id: "terminal-status" }, "connecting…");
  const again = h("button", { class: "secondary", hidden: true, onclick: () => { again.hidden = true; open(); } }, "New shell");
  let term = null, fit = null, ws = null;
  const open = async () => {
    try {
      await loadXterm();
      if (!term) {
        term = new window.Terminal({ cursorBlink: true, fontSize: 13, convertEol: false, scrollback: 5000 });
        fit = new window.FitAddon.FitAddon();
        term.loadAddon(fit);
        term.open(box);
        fit.fit();
        undo.push(() => term.dispose());
        const onResize = () => { try { fit.fit(); } catch { /* hidden */ } };
        window.addEventListener("resize", onResize);
        undo.push(() => window.removeEventListener("resize", onResize));
        term.onData((d) => { if (ws && ws.readyState === 1) ws.send(new TextEncoder().encode(d)); });
        term.onResize(({ rows, cols }) => { if (ws && ws.readyState === 1) ws.send(JSON.stringify({ type: "resize", rows, cols })); });
      }
      const p = await api("POST", sbPath(id, "/exec"), {
        body: {
          cmd: ["/bin/sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash -l; else exec sh -l; fi"],
          env: { TERM: "xterm-256color" }, keep_stdin: true, background: true, tag: "atoll-dashboard",
          // What the shell prints before the socket is open (its prompt)
          // is kept by the agent and sent when the socket attaches.
          pty: { rows: term.rows, cols: term.cols },
        },
      });
      // Browsers cannot set headers on a websocket: the key goes as a
      // subprotocol, which the server takes and never passes on.
      const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}${sbPath(id, `/processes/${p.pid}/ws`)}`;
      ws = new WebSocket(url, ["atoll", "atoll.key." + key()]);
      ws.binaryType = "arraybuffer";
      undo.push(() => ws.close());
      ws.onopen = () => {
        ws.send(JSON.stringify({ type: "resize", rows: term.rows, cols: term.cols }));
        status.textContent = `connected: shell, process ${p.pid}`;
        term.focus();
      };
      ws.onmessage = (ev) => {
        if (typeof ev.data === "string") {
          let code = "";
          try { code = JSON.parse(ev.data).exit_code; } catch { /* not the exit event */ }
          term.write(`\r\n[process exited${code !== undefined ? " with code " + code : ""}]\r\n`);
          return;
        }
        term.write(new Uint8Array(ev.data));
      };
      ws.onclose = () => { status.textContent = "disconnected"; again.hidden = false; };
    } catch (e) {
      status.textContent = "";
      status.append(h("span", { class: "error" }, e.message));
      again.hidden = false;
    }
  };
  requestAnimationFrame(open);
  return h("div", {}, box, h("div", { class: "bar" }, status, again));
}

// ---------- files ----------

function filesTab(id) {
  let dir = "/root";
  const pathIn = h("input", { id: "files-path", value: dir, size: 30 });
  const list = h("div", { id: "files" });
  const upload = h("input", { id: "files-upload", type: "file", multiple: true });
  const join = (d, n) => (d.endsWith("/") ? d : d + "/") + n;
  const go = (d) => { dir = d; pathIn.value = d; fill(); };
  const fill = async () => {
    let r;
    try { r = await api("GET", sbPath(id, "/files/list") + q({ path: dir })); } catch (e) {
      list.replaceChildren(h("p", { class: "error" }, e.message));
      return;
    }
    const files = (r.files || []).sort((a, b) => (a.type === "dir") === (b.type === "dir") ? a.name.localeCompare(b.name) : a.type === "dir" ? -1 : 1);
    const up = dir === "/" ? null : h("tr", {}, h("td", {}, h("a", { href: "#", onclick: (ev) => { ev.preventDefault(); go(dir.replace(/\/[^/]*\/?$/, "") || "/"); } }, "..")), h("td"), h("td"), h("td"), h("td"));
    list.replaceChildren(table(["Name", "Size", "Mode", "Modified", ""], [up, ...files.map((f) =>
      h("tr", { "data-file": f.name },
        h("td", {}, f.type === "dir"
          ? h("a", { href: "#", onclick: (ev) => { ev.preventDefault(); go(f.path); } }, f.name + "/")
          : h("span", { class: "mono" }, f.name + (f.type === "symlink" ? " → " + f.target : ""))),
        h("td", {}, f.type === "file" ? bytes(f.size) : ""),
        h("td", { class: "mono" }, (f.mode & 0o7777).toString(8).padStart(4, "0")),
        h("td", {}, time(f.mod_time)),
        h("td", { class: "actions" },
          f.type === "file" ? h("button", { class: "secondary", "data-download": f.name, onclick: (ev) => act(ev.currentTarget, async () => {
            const resp = await api("GET", sbPath(id, "/files") + q({ path: f.path }), { raw: true });
            download(await resp.blob(), f.name);
          }) }, "download") : null,
          h("button", { class: "danger", onclick: (ev) => {
            if (!confirm(`Delete ${f.path}?`)) return;
            act(ev.currentTarget, () => api("DELETE", sbPath(id, "/files") + q({ path: f.path, recursive: f.type === "dir" ? "true" : "" })), fill);
          } }, "delete"))))].filter(Boolean), "Empty directory."));
  };
  upload.addEventListener("change", () => act(null, async () => {
    for (const file of upload.files) {
      await api("PUT", sbPath(id, "/files") + q({ path: join(dir, file.name) }), { body: file, headers: { "Content-Type": "application/octet-stream" } });
    }
    flash(`Uploaded ${[...upload.files].map((f) => f.name).join(", ")}`, true);
    upload.value = "";
  }, fill));
  pathIn.addEventListener("change", () => go(pathIn.value || "/"));
  fill();
  return h("div", {},
    h("div", { class: "bar" },
      h("div", { class: "field grow" }, h("label", { for: "files-path" }, "Directory"), pathIn),
      h("div", { class: "field" }, h("label", { for: "files-upload" }, "Upload to it"), upload),
      h("button", { class: "secondary", onclick: () => fill() }, "Refresh")),
    list);
}

// ---------- logs ----------

// logsTab shows GET …/logs: NDJSON api.LogEntry lines (seq, time, pid,
// tag, stream, line), fetched again every 2 s from after the last seq
// seen.
function logsTab(id) {
  const out = h("pre", { class: "logs", id: "logs" });
  const wrap = h("div", { dataset: { what: "Sandbox logs" } }, out);
  let since = 0, lines = 0;
  live(wrap, 2000, async () => {
    const resp = await api("GET", sbPath(id, "/logs") + q({ since: since || "" }), { raw: true });
    const text = await resp.text();
    if (!wrap.contains(out)) wrap.replaceChildren(out);
    const atEnd = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
    for (const l of text.split("\n")) {
      if (!l.trim()) continue;
      let e;
      try { e = JSON.parse(l); } catch { e = { line: l }; }
      if (e.seq) since = Math.max(since, e.seq);
      if (!lines) out.textContent = ""; // the placeholder goes
      const when = e.time ? new Date(e.time).toLocaleTimeString() + " " : "";
      const who = e.tag || (e.pid ? "pid " + e.pid : "");
      out.append(h("div", { class: e.stream === "stderr" ? "stderr" : "", "data-seq": e.seq },
        h("span", { class: "muted" }, when + (who ? who + " " : "")), e.line ?? ""));
      lines++;
    }
    // The newest 5,000 lines: what the agent keeps is at most a MiB.
    while (out.childElementCount > 5000) out.firstElementChild.remove();
    if (!lines) out.textContent = "Nothing logged yet: the start command's and background processes' output shows here.";
    if (atEnd) out.scrollTop = out.scrollHeight;
  });
  return h("div", {}, h("p", { class: "muted" }, "What the sandbox's start command and background processes print, as they print it (kept in memory while it runs)."), wrap);
}

// ---------- metrics ----------

function metricsTab(id) {
  const charts = h("div", { class: "charts", id: "metrics" });
  live(charts, 5000, async () => {
    const start = Math.floor(Date.now() / 1000) - 3600;
    const r = await api("GET", sbPath(id, "/metrics") + q({ start }));
    const ms = r.metrics || [];
    const pts = (f) => ms.map((m) => [new Date(m.time).getTime(), f(m)]);
    const last = ms[ms.length - 1];
    charts.replaceChildren(
      lineChart("CPU %", [{ name: "cpu", points: pts((m) => m.cpu_used_pct) }], { max: 100, fmt: (v) => v.toFixed(0) + "%" }),
      lineChart("Memory" + (last ? ` (limit ${bytes(last.memory_total_bytes)})` : ""), [
        { name: "used", points: pts((m) => m.memory_used_bytes) },
        { name: "page cache", points: pts((m) => m.memory_cache_bytes) },
      ], { fmt: bytes, stacked: true }),
      lineChart("Disk" + (last ? ` (quota ${bytes(last.disk_total_bytes)})` : ""), [{ name: "used", points: pts((m) => m.disk_used_bytes) }], { fmt: bytes }));
  });
  return h("div", {}, h("p", { class: "muted" }, "The last hour, refreshed every 5 s."), charts);
}

// ---------- snapshots ----------

function snapshotsTab(id) {
  const list = h("div", { id: "snapshots" });
  const name = h("input", { placeholder: "name (optional)", id: "snapshot-name" });
  const fill = async () => {
    const r = await api("GET", sbPath(id, "/snapshots"));
    list.replaceChildren(table(["ID", "Name", "State", "Created", "Sandboxes from it", ""], (r.snapshots || []).map((s) =>
      h("tr", {},
        h("td", { class: "mono" }, s.id), h("td", {}, s.name || ""), h("td", {}, badge(s.state)),
        h("td", {}, time(s.created_at)), h("td", {}, s.sandboxes),
        h("td", { class: "actions" },
          h("button", { class: "secondary", onclick: (ev) => {
            if (!confirm(`Put the files of snapshot ${s.id} back into ${id}?`)) return;
            act(ev.currentTarget, () => api("POST", sbPath(id, "/restore"), { body: { snapshot: s.id } }), () => flash("Restored", true));
          } }, "restore"),
          h("button", { class: "secondary", onclick: (ev) => act(ev.currentTarget, () => api("POST", "/v1/sandboxes", { body: { snapshot: s.id } }),
            (sb) => { location.hash = `#/sandboxes/${sb.id}`; }) }, "new sandbox"),
          h("button", { class: "danger", onclick: (ev) => {
            if (!confirm(`Delete snapshot ${s.id}?`)) return;
            act(ev.currentTarget, () => api("DELETE", `/v1/snapshots/${s.id}`), fill);
          } }, "delete")))), "No snapshots of this sandbox."));
  };
  live(list, 0, fill);
  const btn = h("button", { type: "submit", id: "snapshot-take" }, "Take snapshot");
  return h("div", {},
    h("form", { class: "bar", onsubmit: (ev) => { ev.preventDefault(); act(btn, () => api("POST", sbPath(id, "/snapshots"), { body: { name: name.value || undefined } }), () => { name.value = ""; fill(); }); } }, name, btn),
    list);
}

// ---------- network ----------

// policyText says in a line what a NetworkPolicy lets the sandbox reach.
function policyText(p) {
  const allow = p.allow || [], deny = p.deny || [];
  const egress = p.egress || (allow.length ? "deny-all" : "allow-all");
  let s = egress === "deny-all" ? (allow.length ? "only " + allow.join(", ") : "nothing outside") : "anywhere";
  if (deny.length) s += ", never " + deny.join(", ");
  const bw = p.bandwidth || {};
  if (bw.egress_mbit) s += ` · out ≤ ${bw.egress_mbit} Mbit/s`;
  if (bw.ingress_mbit) s += ` · in ≤ ${bw.ingress_mbit} Mbit/s`;
  return s;
}

// networkTab shows the sandbox's addresses and the policy the server has
// for it, in a form that replaces it (PUT …/network) and then shows what
// the server answered.
function networkTab(id) {
  const box = h("div", { id: "network" });
  const fill = async (answer) => {
    let n = answer;
    if (!n) {
      try { n = await api("GET", sbPath(id, "/network")); } catch (e) {
        if (e instanceof APIError && e.status === 503) {
          box.replaceChildren(h("div", { class: "notavail" }, e.message));
          return;
        }
        throw e;
      }
    }
    const p = n.policy || {};
    const egress = h("select", { id: "net-egress" }, ["", "allow-all", "deny-all"].map((v) => h("option", { value: v, selected: (p.egress || "") === v }, v || "default")));
    const allow = h("textarea", { id: "net-allow", placeholder: "one per line: 1.2.3.4, 10.0.0.0/8, example.com, *.example.com" }, (p.allow || []).join("\n"));
    const deny = h("textarea", { id: "net-deny", placeholder: "one per line" }, (p.deny || []).join("\n"));
    const up = h("input", { id: "net-up", type: "number", min: "0", step: "0.1", value: p.bandwidth?.egress_mbit || "", placeholder: "no cap", style: "width:8em" });
    const down = h("input", { id: "net-down", type: "number", min: "0", step: "0.1", value: p.bandwidth?.ingress_mbit || "", placeholder: "no cap", style: "width:8em" });
    const lines = (t) => t.value.split("\n").map((x) => x.trim()).filter(Boolean);
    const btn = h("button", { type: "submit" }, "Save policy");
    box.replaceChildren(
      h("p", {}, "Addresses: ", h("code", {}, n.ipv4 || "—"), " ", h("code", {}, n.ipv6 || "")),
      h("p", {}, "May connect to: ", h("strong", { id: "net-policy" }, policyText(p))),
      h("form", { class: "card", onsubmit: (ev) => {
        ev.preventDefault();
        const body = { egress: egress.value || undefined, allow: lines(allow), deny: lines(deny) };
        if (up.value || down.value) body.bandwidth = { egress_mbit: Number(up.value) || 0, ingress_mbit: Number(down.value) || 0 };
        act(btn, () => api("PUT", sbPath(id, "/network"), { body }), (r) => { flash("Policy saved", true); live(box, 0, () => fill(r)); });
      } },
      h("label", { for: "net-egress" }, "Egress by default"), egress,
      h("label", { for: "net-allow" }, "Allow"), allow,
      h("label", { for: "net-deny" }, "Deny"), deny,
      h("div", { class: "bar" }, h("div", { class: "field" }, h("label", { for: "net-up" }, "Out, Mbit/s"), up), h("div", { class: "field" }, h("label", { for: "net-down" }, "In, Mbit/s"), down)),
      btn));
  };
  live(box, 0, () => fill());
  return box;
}

function detailsTab(id) {
  const pre = h("pre", { class: "json" });
  live(pre, 0, async () => { pre.textContent = JSON.stringify(await api("GET", sbPath(id)), null, 2); });
  return pre;
}

// ---------- templates ----------

function templatesView() {
  const list = h("div", { id: "templates" });
  live(list, 0, async () => {
    const r = await api("GET", "/v1/templates");
    list.replaceChildren(table(["Name", "Version", "Source", "Size", "Layers", "Sandboxes", "Old versions", "Created"], (r.templates || []).map((t) =>
      h("tr", { "data-template": t.name },
        h("td", {}, h("a", { href: `#/templates/${encodeURIComponent(t.name)}` }, t.name), t.removed ? " (removed)" : ""),
        h("td", { "data-version": t.version || "" }, t.version || ""), h("td", { class: "mono" }, t.source), h("td", { "data-size": t.size }, bytes(t.size)),
        h("td", {}, (t.layers || []).length), h("td", { "data-sandboxes": t.sandboxes }, t.sandboxes),
        h("td", { "data-old-versions": t.old_versions }, t.old_versions), h("td", {}, time(t.created_at))))));
  });
  return h("div", {}, h("h1", {}, "Templates"), list);
}

// templateView shows a template's versions, newest first, and what holds
// each: the sandboxes this key sees that were made from it (a sandbox
// keeps the version it was made from when the name moves on), beside the
// API's counts of sandboxes and snapshots of every tenant.
function templateView(name) {
  const box = h("div", { id: "template" });
  live(box, 0, async () => {
    const [t, list] = await Promise.all([
      api("GET", `/v1/templates/${encodeURIComponent(name)}`),
      api("GET", "/v1/sandboxes").catch(() => ({ sandboxes: [] })),
    ]);
    const users = new Map();
    for (const sb of list.sandboxes || []) {
      if (sb.template_version) users.set(sb.template_version, [...(users.get(sb.template_version) || []), sb]);
    }
    const usedBy = (v) => {
      const mine = users.get(v.id) || [];
      const others = v.sandboxes - mine.length;
      return [mine.map((sb) => h("span", { class: "used-by" }, h("a", { class: "mono", href: `#/sandboxes/${sb.id}` }, sb.id), " ", badge(sb.state))),
        others > 0 ? h("span", { class: "muted" }, `${mine.length ? "+ " : ""}${others} this key does not see`) : null,
        v.snapshots ? h("span", { class: "muted" }, ` · ${v.snapshots} snapshot${v.snapshots > 1 ? "s" : ""}`) : null,
        !v.sandboxes && !v.snapshots ? h("span", { class: "muted" }, "nothing") : null];
    };
    box.replaceChildren(...[
      h("p", { class: "muted" }, `${t.source} · ${bytes(t.size)} · ${plural((t.layers || []).length, "layer")} (${t.shared_layers} shared) · ${plural(t.sandboxes, "sandbox", "sandboxes")}`),
      t.version ? h("p", { id: "template-current" }, "New sandboxes get version ", h("strong", {}, t.version), " ", h("code", {}, t.version_id || ""),
        t.old_versions ? `; ${t.old_versions} older version${t.old_versions > 1 ? "s are" : " is"} still held by what was made from ${t.old_versions > 1 ? "them" : "it"}.` : ".") : null,
      t.start_cmd ? h("p", {}, "Start command: ", h("code", {}, t.start_cmd)) : null,
      h("h2", {}, "Versions"),
      table(["Number", "ID", "Current", "Source", "Size", "Used by", "Created"], (t.versions || []).map((v) =>
        h("tr", { "data-version": v.number, "data-current": v.current ? "true" : "false" },
          h("td", {}, v.number), h("td", { class: "mono" }, v.id), h("td", {}, v.current ? "✓" : ""),
          h("td", { class: "mono" }, v.source), h("td", {}, bytes(v.size)), h("td", { "data-used-by": "" }, usedBy(v)), h("td", {}, time(v.created_at)))),
      "The built-in template has no versions.")].filter(Boolean));
  });
  return h("div", {}, h("h1", {}, h("a", { href: "#/templates" }, "Templates"), " / ", name), box);
}

// ---------- usage ----------

// usageMetrics are the usage figures the charts offer: field of an
// api.UsageEntry (the states flattened to running_seconds and so on),
// title, and how to show a value.
// small(d) shows a figure with d decimals, or with two significant digits
// one too small for them to tell apart (so that an axis's steps differ).
const small = (d) => (v) => (v > 0 && v < 10 ** (1 - d) ? v.toPrecision(2) : v.toFixed(d));
const usageMetrics = [
  ["cpu_seconds", "CPU-seconds", (v) => v.toFixed(1)],
  ["memory_gib_seconds", "Memory GiB·s", small(1)],
  ["disk_gib_hours", "Disk GiB·h", small(3)],
  ["snapshot_gib_hours", "Snapshots GiB·h", small(3)],
  ["archive_gib_hours", "Archives GiB·h", small(3)],
  ["network_out_bytes", "Network out", bytes],
  ["network_in_bytes", "Network in", bytes],
  ["running_seconds", "Running, s", (v) => v.toFixed(0)],
  ["paused_seconds", "Paused, s", (v) => v.toFixed(0)],
  ["suspended_seconds", "Suspended, s", (v) => v.toFixed(0)],
  ["stopped_seconds", "Stopped, s", (v) => v.toFixed(0)],
  ["archived_seconds", "Archived, s", (v) => v.toFixed(0)],
];

// ranges are the usage page's windows: seconds back from now, and the
// step of its buckets.
const ranges = { "1h": [3600, "1m"], "24h": [86400, "1h"], "7d": [7 * 86400, "1h"], "30d": [30 * 86400, "1d"] };
const stepMs = { "1m": 60e3, "1h": 3600e3, "1d": 86400e3 };

// usageRows flattens GET /v1/usage's api.UsageReport into rows of {group,
// time, field: value...}, one per bucket and group.
function usageRows(r) {
  return (r.usage || []).map((e) => {
    const row = { ...e, time: e.start, group: e.group };
    for (const [st, secs] of Object.entries(e.states || {})) row[st + "_seconds"] = secs;
    delete row.states;
    return row;
  });
}

function usageCSV(rows) {
  const cols = ["time", "group", ...usageMetrics.map((m) => m[0])];
  const esc = (v) => { const s = v === undefined || v === null ? "" : String(v); return /[",\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s; };
  return [cols.join(","), ...rows.map((r) => cols.map((c) => esc(r[c])).join(","))].join("\n") + "\n";
}

function usageView() {
  const range = h("select", { id: "usage-range" }, Object.keys(ranges).map((r) => h("option", { value: r, selected: r === "24h" }, "last " + r)));
  const group = h("select", { id: "usage-group" }, ["tenant", "template", "sandbox", "label"].map((g) => h("option", { value: g, selected: g === "template" }, "by " + g)));
  const labelKey = h("input", { id: "usage-label", placeholder: "label key", size: 10, hidden: true });
  const out = h("div", { id: "usage", dataset: { what: "Usage metering" } });
  let rows = [];
  const csv = h("button", { class: "secondary", id: "usage-csv", onclick: () => download(new Blob([usageCSV(rows)], { type: "text/csv" }), "atoll-usage.csv") }, "Export CSV");
  let gen = 0; // only the latest fill shows: the choices may change while one is out
  const fill = async () => {
    const my = ++gen;
    const [secs, step] = ranges[range.value];
    const now = Math.floor(Date.now() / 1000);
    const gb = group.value === "label" ? "label:" + (labelKey.value || "team") : group.value;
    const r = await api("GET", "/v1/usage" + q({ from: now - secs, to: now, step, group_by: gb }));
    if (my !== gen) return;
    rows = usageRows(r);
    const groups = [...new Set(rows.map((x) => x.group))];
    const totals = new Map(groups.map((g) => [g, {}]));
    for (const x of rows) for (const [f] of usageMetrics) if (typeof x[f] === "number") totals.get(x.group)[f] = (totals.get(x.group)[f] || 0) + x[f];
    // The figures anything used, CPU always.
    const shown = usageMetrics.filter(([f]) => f === "cpu_seconds" || rows.some((x) => x[f]));
    out.replaceChildren(
      h("div", { class: "charts" }, shown.map(([f, title, fmt]) => lineChart(title, groups.map((g) => ({
        name: g || "(none)", points: rows.filter((x) => x.group === g && typeof x[f] === "number").map((x) => [new Date(x.time).getTime(), x[f]]).sort((a, b) => a[0] - b[0]),
      })), { fmt, bar: stepMs[step], span: [new Date(r.from).getTime(), new Date(r.to).getTime()] }))),
      h("h2", {}, "Totals"),
      table(["Group", ...shown.map((m) => m[1])], groups.map((g) =>
        h("tr", { "data-group": g }, h("td", {}, g || "(none)"), shown.map(([f, , fmt]) => h("td", { "data-metric": f }, fmt(totals.get(g)[f] || 0))))),
      "No usage in this range."));
  };
  for (const el of [range, group, labelKey]) el.addEventListener("change", () => { labelKey.hidden = group.value !== "label"; live(out, 0, fill); });
  live(out, 30000, fill);
  return h("div", {}, h("h1", {}, "Usage"), h("div", { class: "bar" }, range, group, labelKey, csv), out);
}

// ---------- keys and tenants (admins) ----------

function keysView() {
  const list = h("div", { id: "keys" });
  const name = h("input", { id: "key-name", placeholder: "name", required: true });
  const tenant = h("input", { id: "key-tenant", placeholder: "tenant (default: a new one named after it)", size: 34 });
  const shown = h("div", { id: "key-new" });
  const fill = async () => {
    const r = await api("GET", "/v1/keys");
    list.replaceChildren(table(["ID", "Name", "Tenant", "Admin", "Created", ""], (r.keys || []).map((k) =>
      h("tr", { "data-key": k.name },
        h("td", { class: "mono" }, k.id), h("td", {}, k.name), h("td", {}, k.tenant), h("td", {}, k.admin ? "admin" : ""), h("td", {}, time(k.created_at)),
        h("td", { class: "actions" }, h("button", { class: "danger", onclick: (ev) => {
          if (!confirm(`Revoke key ${k.name} (${k.id})? Its users lose access at once.`)) return;
          act(ev.currentTarget, () => api("DELETE", `/v1/keys/${encodeURIComponent(k.id)}`), fill);
        } }, "revoke"))))));
  };
  live(list, 0, fill);
  const btn = h("button", { type: "submit", id: "key-create" }, "Create key");
  return h("div", {}, h("h1", {}, "API keys"),
    h("form", { class: "bar", onsubmit: (ev) => {
      ev.preventDefault();
      act(btn, () => api("POST", "/v1/keys", { body: { name: name.value, tenant: tenant.value || undefined } }), (k) => {
        shown.replaceChildren(h("div", { class: "flash ok", style: "margin:0 0 12px" }, "New key (shown once, copy it now): ", h("code", { id: "key-secret" }, k.key)));
        name.value = ""; tenant.value = "";
        fill();
      });
    } }, name, tenant, btn),
    shown, list);
}

function tenantsView() {
  const list = h("div", { id: "tenants" });
  const fill = async () => {
    const r = await api("GET", "/v1/tenants");
    const use = (u, max, fmt = (v) => v) => (max ? meter((100 * u) / max, `${fmt(u)} / ${fmt(max)}`) : `${fmt(u)}`);
    list.replaceChildren(table(["Tenant", "Sandboxes", "CPU", "Memory", "Disk", "Creates/s", ""], (r.tenants || []).map((t) => {
      const qt = t.quota || {}, u = t.used || {};
      return h("tr", { "data-tenant": t.name },
        h("td", {}, t.name, t.admin ? " (admin)" : ""),
        h("td", {}, use(u.sandboxes, qt.max_sandboxes)),
        h("td", {}, use(u.cpu, qt.max_cpu)),
        h("td", {}, use(u.memory_mib, qt.max_memory_mib, (v) => v + " MiB")),
        h("td", {}, use(u.disk_gib, qt.max_disk_gib, (v) => v + " GiB")),
        h("td", {}, qt.creates_per_second || "no limit"),
        h("td", { class: "actions" }, h("button", { class: "secondary", onclick: (ev) => quotaForm(ev.currentTarget.closest("tr"), t, fill) }, "quota")));
    })));
  };
  live(list, 10000, fill);
  return h("div", {}, h("h1", {}, "Tenants"), h("p", { class: "muted" }, "Use against quota (0 or empty is no limit)."), list);
}

function quotaForm(row, t, done) {
  const qt = t.quota || {};
  const fields = [["max_sandboxes", "Sandboxes"], ["max_cpu", "CPU"], ["max_memory_mib", "Memory MiB"], ["max_disk_gib", "Disk GiB"], ["creates_per_second", "Creates/s"]];
  const inputs = fields.map(([f]) => h("input", { type: "number", min: "0", step: "any", value: qt[f] || "", style: "width:7em", name: f }));
  const btn = h("button", { type: "submit" }, "Save");
  const form = h("form", { class: "bar", onsubmit: (ev) => {
    ev.preventDefault();
    const body = {};
    fields.forEach(([f], i) => { body[f] = Number(inputs[i].value) || 0; });
    act(btn, () => api("PUT", `/v1/tenants/${encodeURIComponent(t.name)}/quota`, { body }), done);
  } }, fields.map(([, l], i) => h("div", { class: "field" }, h("label", {}, l), inputs[i])), btn);
  row.after(h("tr", {}, h("td", { colspan: 7 }, form)));
}

// ---------- events and webhooks ----------

// streamEvents reads GET /v1/events (Server-Sent Events) with fetch, which
// unlike EventSource can send the key in a header, calling on(event) for
// each until the view changes.
async function streamEvents(on, onState) {
  const ctl = new AbortController();
  undo.push(() => ctl.abort());
  const resp = await api("GET", "/v1/events", { raw: true, signal: ctl.signal, headers: { Accept: "text/event-stream" } });
  onState("live");
  const rd = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  try {
    for (;;) {
      const { value, done } = await rd.read();
      if (done) break;
      buf += value;
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
        if (data) { try { on(JSON.parse(data)); } catch { /* not an event */ } }
      }
    }
  } catch (e) { if (e.name !== "AbortError") throw e; }
  onState("ended");
}

function eventsView() {
  const feed = h("tbody", { id: "events-feed" });
  const status = h("span", { class: "muted", id: "events-status" }, "connecting…");
  const box = h("div", { dataset: { what: "Lifecycle events" } },
    h("div", { class: "scroll" }, h("table", {}, h("thead", {}, h("tr", {}, ["Time", "Type", "Sandbox", "State", "Tenant", "Reason"].map((x) => h("th", {}, x)))), feed)));
  streamEvents((e) => {
    feed.prepend(h("tr", { "data-event": e.type },
      h("td", {}, time(e.time)), h("td", {}, badge(e.type)),
      h("td", { class: "mono" }, e.sandbox ? h("a", { href: `#/sandboxes/${e.sandbox}` }, e.sandbox) : ""),
      h("td", {}, e.state || ""), h("td", {}, e.tenant || ""), h("td", {}, e.reason || "")));
    while (feed.children.length > 500) feed.lastChild.remove();
  }, (st) => { status.textContent = st === "live" ? "live: new events appear as they happen" : "the stream ended; reload to reconnect"; })
    .catch((e) => {
      if (e instanceof NotAvailable) box.replaceChildren(notAvailable("The event stream"));
      else if (e instanceof APIError && e.status === 503) box.replaceChildren(h("div", { class: "notavail", "data-notavailable": "" }, e.message));
      else if (!(e instanceof APIError && e.status === 401)) status.textContent = e.message;
    });
  return h("div", {}, h("h1", {}, "Events"), h("p", {}, status), box, webhooksPanel());
}

function webhooksPanel() {
  const list = h("div", { id: "webhooks", dataset: { what: "Webhooks" } });
  const url = h("input", { id: "webhook-url", type: "url", placeholder: "https://example.com/hook", size: 34, required: true });
  const types = h("input", { id: "webhook-events", placeholder: "events: created,deleted (empty: all)", size: 30 });
  const shown = h("div");
  const fill = async () => {
    const r = await api("GET", "/v1/webhooks");
    list.replaceChildren(table(["URL", "Events", "Tenant", "Created", ""], (r.webhooks || []).map((w) => {
      const row = h("tr", { "data-webhook": w.id },
        h("td", { class: "mono" }, w.url), h("td", {}, (w.events || []).join(", ") || "all"), h("td", {}, w.tenant), h("td", {}, time(w.created_at)),
        h("td", { class: "actions" },
          h("button", { class: "secondary", onclick: (ev) => act(ev.currentTarget, () => api("GET", `/v1/webhooks/${encodeURIComponent(w.id)}/deliveries`), (d) => {
            row.after(h("tr", {}, h("td", { colspan: 5 }, table(["Event", "Type", "Sandbox", "State", "Attempts", "Last status", "Error"], (d.deliveries || []).map((x) =>
              h("tr", {}, h("td", { class: "mono" }, x.event.id), h("td", {}, x.event.type), h("td", { class: "mono" }, x.event.sandbox || ""),
                h("td", {}, badge(x.state)), h("td", {}, x.attempts), h("td", {}, x.last_status || ""), h("td", { class: "error" }, x.last_error || ""))), "No deliveries yet."))));
          }) }, "deliveries"),
          h("button", { class: "danger", onclick: (ev) => {
            if (!confirm(`Remove the webhook to ${w.url}?`)) return;
            act(ev.currentTarget, () => api("DELETE", `/v1/webhooks/${encodeURIComponent(w.id)}`), fill);
          } }, "remove")));
      return row;
    }), "No webhooks."));
  };
  live(list, 0, fill);
  const btn = h("button", { type: "submit" }, "Add webhook");
  return h("div", {}, h("h2", {}, "Webhooks"),
    h("form", { class: "bar", onsubmit: (ev) => {
      ev.preventDefault();
      const events = types.value.split(",").map((x) => x.trim()).filter(Boolean);
      act(btn, () => api("POST", "/v1/webhooks", { body: { url: url.value, events: events.length ? events : undefined } }), (w) => {
        shown.replaceChildren(h("div", { class: "flash ok", style: "margin:0 0 12px" }, "Signing secret (shown once): ", h("code", {}, w.secret || "")));
        url.value = ""; types.value = "";
        fill();
      });
    } }, url, types, btn), shown, list);
}

// ---------- audit ----------

// auditView lists GET /v1/audit's api.AuditList, newest first, a page at a
// time ("Older" follows its next).
function auditView() {
  const f = {
    tenant: h("input", { id: "audit-tenant", placeholder: "tenant", size: 10 }),
    sandbox: h("input", { id: "audit-sandbox", placeholder: "sandbox or other target", size: 22 }),
    action: h("input", { id: "audit-action", placeholder: "action, e.g. DELETE", size: 16 }),
  };
  const out = h("div", { id: "audit", dataset: { what: "The audit log" } });
  const more = h("button", { class: "secondary", hidden: true }, "Older");
  let pages = [0]; // the before= of each page shown
  const keyNames = new Map();
  let gen = 0; // only the latest fill shows
  const fill = async () => {
    const my = ++gen;
    const before = pages[pages.length - 1];
    const r = await api("GET", "/v1/audit" + q({ tenant: f.tenant.value, sandbox: f.sandbox.value, action: f.action.value, limit: 100, before: before || "" }));
    if (my !== gen) return;
    const evs = r.entries || [];
    // Keys by name where the admin's key list has them (revoked ones
    // stay IDs).
    if (!keyNames.size) {
      try { for (const k of (await api("GET", "/v1/keys")).keys || []) keyNames.set(k.id, k.name); } catch { /* not an admin */ }
      if (my !== gen) return;
    }
    out.replaceChildren(table(["Time", "Tenant", "Key", "Source", "Action", "Target", "Status", "Request"], evs.map((e) =>
      h("tr", { "data-seq": e.seq },
        h("td", {}, time(e.time)), h("td", {}, e.tenant || ""), h("td", { class: "mono", title: e.key_id || "" }, keyNames.get(e.key_id) || e.key_id || ""),
        h("td", { class: "mono" }, e.source || ""), h("td", { class: "mono" }, e.action),
        h("td", { class: "mono" }, e.target ? h("a", { href: /^[a-z0-9]{20}$/.test(e.target) ? `#/sandboxes/${e.target}` : null }, e.target) : ""),
        h("td", { class: e.status >= 400 ? "error" : "" }, e.status), h("td", { class: "mono muted" }, e.request_id || ""))),
    "No audit entries match."));
    more.hidden = !r.next;
    more.onclick = () => { pages.push(r.next); live(out, 0, fill); };
  };
  for (const el of Object.values(f)) el.addEventListener("change", () => { pages = [0]; live(out, 0, fill); });
  live(out, 15000, async () => { if (pages.length === 1) await fill(); });
  return h("div", {}, h("h1", {}, "Audit log"),
    h("div", { class: "bar" }, Object.values(f), h("button", { class: "secondary", onclick: () => { pages = [0]; live(out, 0, fill); } }, "Newest")),
    out, h("div", { class: "bar" }, more));
}

// ---------- start ----------

if (key()) {
  signIn(key(), { check: false }).catch((e) => signOut(e.message));
} else {
  signOut("");
}
