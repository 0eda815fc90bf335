// Drives atoll's web dashboard (served by `atoll serve` at /ui) in Debian's
// chromium through playwright-core, as a user would: run by
// cmd/atoll/dashboard_e2e_test.go with ATOLL_URL, ATOLL_API_KEY (an admin
// key) and CHROMIUM; ATOLL_UI_SCREENSHOTS=DIR saves screenshots there, and
// ATOLL_TEST_STRICT=1 (CI) fails where a part of the server is missing
// instead of checking that its page says so.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile, mkdir } from "node:fs/promises";
import { chromium } from "playwright-core";

const base = process.env.ATOLL_URL;
const adminKey = process.env.ATOLL_API_KEY;
const shots = process.env.ATOLL_UI_SCREENSHOTS;
const wide = { width: 1280, height: 800 };
const strict = process.env.ATOLL_TEST_STRICT === "1";
const auth = { "X-API-Key": adminKey };

async function shot(page, name) {
  if (!shots) return;
  await mkdir(shots, { recursive: true });
  // Let charts draw and fonts settle; the banner of an action a step
  // before is no part of the page shown.
  await page.waitForTimeout(300);
  await page.evaluate(() => { document.querySelector("#flash").hidden = true; });
  await page.screenshot({ path: `${shots}/${name}.png` });
}

// routeExists tells whether the server has an API route and serves it: a
// "no route" 404 (a feature this server predates) or a 503 (a part it runs
// without) say it does not. Only the answer's head is read: a stream's
// body never ends.
async function routeExists(path) {
  const ctl = new AbortController();
  const r = await fetch(base + path, { headers: { "X-API-Key": adminKey }, signal: ctl.signal });
  if (r.status === 503) { ctl.abort(); return false; }
  if (r.status !== 404) { ctl.abort(); return true; }
  const b = await r.json().catch(() => ({}));
  return !/^no route/.test(b.message || "");
}

// served is routeExists for a part the test covers: without
// ATOLL_TEST_STRICT=1 a server lacking it is checked to say "not
// available"; with it (CI, whose server has every part) the test fails.
async function served(t, path, what) {
  if (await routeExists(path)) return true;
  assert.ok(!strict, `${what}: the server does not serve ${path} (no route, or 503), and ATOLL_TEST_STRICT=1 tests every part`);
  t.diagnostic(`this server has no ${what}: its page says so`);
  return false;
}

// call calls the API with the admin key and returns its JSON.
async function call(method, path, body) {
  const r = await fetch(base + path, {
    method, headers: { ...auth, ...(body ? { "Content-Type": "application/json" } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  });
  const text = await r.text();
  assert.ok(r.ok, `${method} ${path}: ${r.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

// run runs cmd in a sandbox through the API: its stdout and exit code.
async function run(id, cmd) {
  const r = await fetch(`${base}/v1/sandboxes/${id}/exec`, {
    method: "POST", headers: { ...auth, "Content-Type": "application/json" }, body: JSON.stringify({ cmd }),
  });
  assert.equal(r.status, 200, `exec ${cmd}`);
  let out = "", code;
  for (const l of (await r.text()).split("\n").filter(Boolean)) {
    const e = JSON.parse(l);
    if (e.type === "stdout") out += Buffer.from(e.data, "base64").toString();
    if (e.type === "exit") code = e.exit_code;
  }
  return { out, code };
}

// tar makes a tar archive (ustar) of files, {name: text}: a build context.
function tar(files) {
  const parts = [];
  for (const [name, text] of Object.entries(files)) {
    const data = Buffer.from(text);
    const hd = Buffer.alloc(512);
    const put = (off, len, v) => hd.write(v, off, len, "ascii");
    const octal = (n, len) => n.toString(8).padStart(len - 1, "0") + "\0";
    put(0, 100, name);
    put(100, 8, octal(0o644, 8));
    put(108, 8, octal(0, 8));
    put(116, 8, octal(0, 8));
    put(124, 12, octal(data.length, 12));
    put(136, 12, octal(0, 12));
    put(148, 8, " ".repeat(8)); // the checksum counts its own field as spaces
    put(156, 1, "0");
    put(257, 8, "ustar\x0000");
    put(148, 8, octal(hd.reduce((a, b) => a + b, 0), 7) + " ");
    parts.push(hd, data, Buffer.alloc((512 - (data.length % 512)) % 512));
  }
  parts.push(Buffer.alloc(1024));
  return Buffer.concat(parts);
}

// buildTemplate builds a Dockerfile into the template name through the
// API (POST /v1/templates/build) and returns the template it made.
async function buildTemplate(name, dockerfile) {
  const r = await fetch(`${base}/v1/templates/build?name=${name}`, {
    method: "POST", headers: { ...auth, "Content-Type": "application/x-tar" }, body: tar({ Dockerfile: dockerfile }),
  });
  const text = await r.text();
  assert.equal(r.status, 200, text);
  const events = text.split("\n").filter(Boolean).map((l) => JSON.parse(l));
  const last = events[events.length - 1];
  assert.equal(last.type, "done", `building ${name}: ${text}`);
  return last.template;
}

async function signIn(page, key) {
  await page.goto(base + "/ui/");
  await page.fill("#signin-key", key);
  await page.click("#signin-form button[type=submit]");
}

// termText is the terminal's screen, row by row.
const termRows = (page) => page.$$eval("#terminal .xterm-rows > div", (rows) => rows.map((r) => r.textContent.replace(/\u00a0/g, " ").trimEnd()));

async function typeInTerminal(page, line) {
  await page.click("#terminal");
  await page.keyboard.type(line);
  await page.keyboard.press("Enter");
}

async function waitForRow(page, want, timeout = 30000) {
  await page.waitForFunction((w) => [...document.querySelectorAll("#terminal .xterm-rows > div")]
    .some((r) => r.textContent.replace(/\u00a0/g, " ").trim() === w), want, { timeout });
}

// noSideScroll asserts that the page is no wider than the window.
async function noSideScroll(page, what) {
  const [sw, iw] = await page.evaluate(() => [document.documentElement.scrollWidth, window.innerWidth]);
  assert.ok(sw <= iw + 1, `${what}: the page is ${sw}px wide in a ${iw}px window`);
}

test("dashboard", async (t) => {
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM, args: ["--no-sandbox"] });
  t.after(() => browser.close());
  const ctx = await browser.newContext({ viewport: wide, acceptDownloads: true });
  const page = await ctx.newPage();
  page.on("dialog", (d) => d.accept());
  const errors = [];
  page.on("pageerror", (e) => errors.push(e.message));
  let id = "";

  await t.test("a wrong key is refused with a message", async () => {
    await page.goto(base + "/ui/");
    await shot(page, "signin");
    await signIn(page, "atoll_" + "0".repeat(48));
    await page.waitForSelector("#signin-error:not([hidden])");
    assert.match(await page.textContent("#signin-error"), /Wrong API key/);
    assert.ok(await page.isHidden("#app"));
  });

  await t.test("sign in and create a sandbox", async () => {
    await signIn(page, adminKey);
    await page.waitForSelector("#sandboxes");
    await page.waitForSelector("a[data-nav=keys]", { state: "visible", timeout: 10000 }); // an admin key shows the admin pages
    await page.fill("#create-labels", "team=ui,purpose=test");
    await page.click("#create-sandbox");
    await page.waitForURL(/#\/sandboxes\/[a-z0-9]{20}$/, { timeout: 60000 });
    id = page.url().split("/").pop();
    await page.waitForSelector("#sandbox-head [data-state=running]");
  });

  await t.test("echo hi in the terminal shows hi", async () => {
    await page.waitForSelector("#terminal .xterm-rows");
    await page.waitForFunction(() => /connected/.test(document.querySelector("#terminal-status").textContent), null, { timeout: 30000 });
    await typeInTerminal(page, "echo hi");
    await waitForRow(page, "hi");
    // A burn of 5 CPU-seconds (of the process's own CPU time, however
    // busy the machine), for the metrics and usage below.
    await typeInTerminal(page, `python3 -c 'import time; exec("while time.process_time() < 5: pass")'; echo burnt`);
    await waitForRow(page, "burnt", 120000);
    await shot(page, "terminal");
  });

  await t.test("upload and download a file", async () => {
    await page.click("a[href$='/files']");
    await page.waitForSelector("#files table, #files .notavail");
    const content = "hello from the browser\n" + Date.now() + "\n";
    await page.setInputFiles("#files-upload", { name: "hello.txt", mimeType: "text/plain", buffer: Buffer.from(content) });
    await page.waitForSelector("#files tr[data-file='hello.txt']");
    // The shell sees what the browser uploaded.
    const [dl] = await Promise.all([
      page.waitForEvent("download"),
      page.click("#files tr[data-file='hello.txt'] [data-download]"),
    ]);
    assert.equal(dl.suggestedFilename(), "hello.txt");
    assert.equal(await readFile(await dl.path(), "utf8"), content);
    await shot(page, "files");
  });

  await t.test("logs", async () => {
    await page.click("a[href$='/logs']");
    if (!(await served(t, `/v1/sandboxes/${id}/logs`, "sandbox logs"))) {
      await page.waitForSelector("[data-notavailable]");
      return;
    }
    // A background process's output is kept in the sandbox's logs.
    const r = await fetch(`${base}/v1/sandboxes/${id}/exec`, {
      method: "POST", headers: { "X-API-Key": adminKey, "Content-Type": "application/json" },
      body: JSON.stringify({ cmd: ["sh", "-c", "echo from-the-logs"], background: true }),
    });
    assert.equal(r.status, 200);
    await page.waitForFunction(() => /from-the-logs/.test(document.querySelector("#logs")?.textContent || ""), null, { timeout: 30000 });
  });

  await t.test("metrics charts", async () => {
    await page.click("a[href$='/metrics']");
    await page.waitForSelector("#metrics [data-chart='CPU %'] canvas");
    if (shots) await page.waitForTimeout(12000); // a few more samples to show
    await shot(page, "metrics");
  });

  await t.test("the list shows state, template, runtime, age, labels and live figures", async () => {
    await page.click("a[data-nav=sandboxes]");
    const row = `#sandboxes tr[data-id='${id}']`;
    await page.waitForSelector(row);
    assert.match(await page.textContent(row), /running/);
    assert.match(await page.textContent(row), /team=ui/);
    await page.waitForFunction((r) => document.querySelector(r + " [data-mem]").textContent.includes("/"), row, { timeout: 30000 });
    const sb = await call("GET", `/v1/sandboxes/${id}`);
    assert.equal(await page.textContent(`${row} [data-template]`), sb.template);
    assert.equal(sb.template, "host");
    assert.equal(await page.textContent(`${row} [data-runtime]`), sb.runtime);
    assert.match(sb.runtime, /^(ns|gvisor|vm)$/);
    // The age is the time since the sandbox's creation: seconds, then
    // minutes (the list is redrawn every 5 s).
    assert.equal(await page.getAttribute(`${row} [data-age]`, "data-age"), sb.created_at);
    const shown = await page.textContent(`${row} [data-age]`);
    const m = shown.match(/^(\d+)(s|m)$/);
    assert.ok(m, `age ${shown}`);
    const secs = Number(m[1]) * (m[2] === "m" ? 60 : 1), since = (Date.now() - Date.parse(sb.created_at)) / 1000;
    assert.ok(secs <= since + 1 && secs >= since - (m[2] === "m" ? 70 : 15), `age ${shown} of a sandbox made ${since.toFixed(0)} s ago`);
  });

  await t.test("snapshot, pause, resume and fork from the pages", async () => {
    await page.goto(`${base}/ui/#/sandboxes/${id}/snapshots`);
    await page.fill("#snapshot-name", "from-the-ui");
    await page.click("#snapshot-take");
    await page.waitForSelector("#snapshots tr:has-text('from-the-ui')");
    await page.click("a[data-nav=sandboxes]");
    const row = `#sandboxes tr[data-id='${id}']`;
    await page.click(`${row} [data-action=pause]`);
    await page.waitForSelector(`${row} [data-state=paused]`, { timeout: 30000 });
    await page.click(`${row} [data-action=resume]`);
    await page.waitForSelector(`${row} [data-state=running]`, { timeout: 30000 });
    const before = await page.$$eval("#sandboxes tr[data-id]", (rs) => rs.length);
    await page.click(`${row} [data-action=fork]`);
    await page.waitForFunction((n) => document.querySelectorAll("#sandboxes tr[data-id]").length === n + 1, before, { timeout: 60000 });
    assert.match(await page.textContent("#flash"), /Forked: [a-z0-9]{20}/);
  });

  await t.test("stop and start from the pages, and a shell after", async () => {
    await page.click("a[data-nav=sandboxes]");
    const row = `#sandboxes tr[data-id='${id}']`;
    await page.click(`${row} [data-action=stop]`);
    await page.waitForSelector(`${row} [data-state=stopped]`, { timeout: 60000 });
    assert.equal((await call("GET", `/v1/sandboxes/${id}`)).state, "stopped");
    // A stopped sandbox offers start, not stop or pause.
    assert.equal(await page.$(`${row} [data-action=stop]`), null);
    assert.equal(await page.$(`${row} [data-action=pause]`), null);
    // Start it from its own page.
    await page.goto(`${base}/ui/#/sandboxes/${id}/details`);
    await page.click("#sandbox-head [data-action=start]");
    await page.waitForSelector("#sandbox-head [data-state=running]", { timeout: 60000 });
    assert.equal((await call("GET", `/v1/sandboxes/${id}`)).state, "running");
    // Its files survived, and a new shell works in it.
    await page.click("a[href$='/terminal']");
    await page.waitForFunction(() => /connected/.test(document.querySelector("#terminal-status")?.textContent || ""), null, { timeout: 30000 });
    await typeInTerminal(page, "cat /root/hello.txt | head -1; echo after-$((40+2))");
    await waitForRow(page, "hello from the browser");
    await waitForRow(page, "after-42");
  });

  await t.test("events as they happen, and webhooks", async () => {
    await page.click("a[data-nav=events]");
    if (!(await served(t, "/v1/events", "event stream"))) {
      await page.waitForSelector("[data-notavailable]");
      await page.waitForSelector("#webhooks table, #webhooks .notavail");
      return;
    }
    await page.waitForFunction(() => /^live/.test(document.querySelector("#events-status").textContent), null, { timeout: 20000 });
    for (const op of ["pause", "resume"]) {
      const r = await fetch(`${base}/v1/sandboxes/${id}/${op}`, { method: "POST", headers: { "X-API-Key": adminKey } });
      assert.equal(r.status, 200, op);
    }
    await page.waitForSelector(`#events-feed tr[data-event=paused]:has-text('${id}')`, { timeout: 20000 });
    await page.waitForSelector(`#events-feed tr[data-event=resumed]:has-text('${id}')`, { timeout: 20000 });
    await page.fill("#webhook-url", "https://hooks.example.com/atoll");
    await page.fill("#webhook-events", "created,deleted");
    await page.click("form:has(#webhook-url) button[type=submit]");
    await page.waitForSelector("#webhooks tr:has-text('hooks.example.com')");
    assert.match(await page.textContent("#webhooks"), /created, deleted/);
    await shot(page, "events");
    await page.click("#webhooks tr:has-text('hooks.example.com') button.danger");
    await page.waitForSelector("#webhooks tr:has-text('hooks.example.com')", { state: "detached" });
  });

  await t.test("the network page shows the sandbox's policy, and a change on it is in force", async () => {
    if (!(await served(t, `/v1/sandboxes/${id}/network`, "sandbox networking"))) {
      await page.goto(`${base}/ui/#/sandboxes/${id}/network`);
      await page.waitForSelector("#network .notavail");
      return;
    }
    // From inside the sandbox: does a name resolve, does its host answer?
    // (The test's network serves allowed.example and other.example; under
    // deny-all a name not allowed does not resolve.)
    const resolves = async (name) => (await run(id, ["getent", "hosts", name])).code === 0;
    const get = async (name) => (await run(id, ["python3", "-c", `import urllib.request as u; print(u.urlopen("http://${name}/", timeout=10).read().decode())`])).out.trim();

    // A policy set through the API is what the page shows.
    await call("PUT", `/v1/sandboxes/${id}/network`, { egress: "deny-all", allow: ["allowed.example"], deny: ["203.0.113.7"] });
    assert.ok(await resolves("allowed.example"));
    assert.ok(!(await resolves("other.example")), "other.example resolves under a policy that does not allow it");
    await page.goto(`${base}/ui/#/sandboxes/${id}/network`);
    await page.waitForSelector("#net-policy");
    const n0 = await call("GET", `/v1/sandboxes/${id}/network`);
    assert.match(await page.textContent("#network"), new RegExp(`Addresses: ${n0.ipv4.replace(/\./g, "\\.")}`));
    assert.equal(await page.inputValue("#net-egress"), "deny-all");
    assert.equal(await page.inputValue("#net-allow"), "allowed.example");
    assert.equal(await page.inputValue("#net-deny"), "203.0.113.7");
    assert.equal(await page.textContent("#net-policy"), "only allowed.example, never 203.0.113.7");

    // Changed on the page, it is the sandbox's policy on the API, and in
    // the sandbox.
    await page.fill("#net-allow", "other.example\n*.pythonhosted.org");
    await page.fill("#net-deny", "");
    await page.fill("#net-up", "50");
    await page.click("#network button[type=submit]");
    await page.waitForFunction(() => /other\.example/.test(document.querySelector("#net-policy")?.textContent || ""), null, { timeout: 20000 });
    const n = await call("GET", `/v1/sandboxes/${id}/network`);
    assert.equal(n.policy.egress, "deny-all");
    assert.deepEqual([...n.policy.allow].sort(), ["*.pythonhosted.org", "other.example"]);
    assert.deepEqual(n.policy.deny || [], []);
    assert.equal(n.policy.bandwidth?.egress_mbit, 50);
    // The page shows the policy the server answered with (its order).
    assert.equal(await page.textContent("#net-policy"), `only ${n.policy.allow.join(", ")} · out ≤ 50 Mbit/s`);
    assert.match(await get("other.example"), /^inet \S+ other\.example$/);
    assert.ok(!(await resolves("allowed.example")), "allowed.example still resolves once the page took it out");
    // A reload shows it from the server.
    await page.reload();
    await page.waitForSelector("#net-policy");
    assert.equal(await page.inputValue("#net-allow"), n.policy.allow.join("\n"));
    await shot(page, "network");
  });

  let appId = "";
  await t.test("templates with versions, and what holds the old one", async () => {
    // Version 1 of app, a sandbox made from it on the Sandboxes page,
    // then version 2: the sandbox keeps version 1.
    const v1 = await buildTemplate("app", "FROM host\nRUN echo v1 > /v\n");
    assert.equal(v1.version, 1);
    await page.click("a[data-nav=sandboxes]");
    await page.waitForSelector("#create-template option[value=app]", { state: "attached" });
    await page.selectOption("#create-template", "app");
    await page.fill("#create-labels", "team=tpl");
    await page.click("#create-sandbox");
    await page.waitForURL(/#\/sandboxes\/[a-z0-9]{20}$/, { timeout: 60000 });
    appId = page.url().split("/").pop();
    await page.waitForSelector("#sandbox-head [data-state=running]", { timeout: 30000 });
    const v2 = await buildTemplate("app", "FROM host\nRUN echo v2 > /v\n");
    assert.equal(v2.version, 2);
    assert.equal((await call("GET", `/v1/sandboxes/${appId}`)).template_version, v1.version_id);
    assert.equal((await run(appId, ["cat", "/v"])).out, "v1\n");

    await page.click("a[data-nav=templates]");
    const tr = "#templates tr[data-template=app]";
    await page.waitForSelector(tr);
    assert.equal(await page.textContent(`${tr} [data-version]`), "2", "the name's current version");
    assert.equal(await page.textContent(`${tr} [data-old-versions]`), "1", "the old version, held by the sandbox");
    assert.equal(await page.getAttribute(`${tr} [data-size]`, "data-size"), String(v2.size));
    assert.ok(v2.size > 0, "a built template's size is its layer's files");
    await page.waitForSelector("#templates tr[data-template=host]");
    await shot(page, "templates");

    await page.click(`${tr} a`);
    const cur = "#template tr[data-version='2']", old = "#template tr[data-version='1']";
    await page.waitForSelector(old);
    assert.equal(await page.getAttribute(cur, "data-current"), "true");
    assert.equal(await page.getAttribute(old, "data-current"), "false");
    assert.match(await page.textContent(`${cur} td.mono`), new RegExp(v2.version_id));
    assert.match(await page.textContent(`${old} td.mono`), new RegExp(v1.version_id));
    assert.match(await page.textContent(`${old} [data-used-by]`), new RegExp(`${appId}\\s*running`));
    assert.doesNotMatch(await page.textContent(`${cur} [data-used-by]`), new RegExp(appId));
    assert.match(await page.textContent("#template-current"), /version 2 v[0-9a-f]{19}; 1 older version is still held/);
    assert.doesNotMatch(await page.textContent("#template"), /\b(null|undefined)\b/);
    await shot(page, "template");
    await page.click(`${old} a[href='#/sandboxes/${appId}']`);
    await page.waitForSelector("#sandbox-head [data-state=running]");

    // The list says which template each sandbox came from.
    await page.click("a[data-nav=sandboxes]");
    await page.waitForSelector(`#sandboxes tr[data-id='${appId}'] [data-template=app]`);
    assert.equal(await page.textContent(`#sandboxes tr[data-id='${id}'] [data-template]`), "host");
    await page.waitForFunction((r) => document.querySelector(r + " [data-mem]").textContent.includes("/"), `#sandboxes tr[data-id='${appId}']`, { timeout: 30000 });
    await shot(page, "sandboxes");
  });

  await t.test("usage after a CPU burn", async () => {
    await page.click("a[data-nav=usage]");
    if (!(await served(t, "/v1/usage", "usage metering"))) {
      await page.waitForSelector("#usage [data-notavailable]");
      return;
    }
    await page.selectOption("#usage-group", "sandbox");
    // Metering writes every few seconds: reload until the burn shows.
    const deadline = Date.now() + 60000;
    let cpu = 0;
    while (Date.now() < deadline) {
      const cell = await page.$(`#usage tr[data-group='${id}'] td[data-metric=cpu_seconds]`);
      cpu = cell ? parseFloat(await cell.textContent()) : 0;
      if (cpu >= 4.5) break;
      await page.waitForTimeout(2000);
      await page.selectOption("#usage-group", "tenant");
      await page.selectOption("#usage-group", "sandbox");
    }
    if (cpu < 4.5) {
      const now = Math.floor(Date.now() / 1000);
      const r = await call("GET", `/v1/usage?from=${now - 86400}&to=${now}&step=1h&group_by=sandbox`);
      assert.fail(`usage shows ${cpu} CPU-seconds for a sandbox that burned 5; the API says ${JSON.stringify(r)}`);
    }
    const [dl] = await Promise.all([page.waitForEvent("download"), page.click("#usage-csv")]);
    const csv = (await readFile(await dl.path(), "utf8")).trim().split("\n");
    assert.match(csv[0], /^time,group,cpu_seconds,/);
    const mine = csv.filter((l) => l.split(",")[1] === id).map((l) => parseFloat(l.split(",")[2]));
    assert.ok(mine.reduce((a, b) => a + b, 0) >= 4.5, `the CSV's CPU-seconds of the sandbox: ${mine}`);
    // By label: the key typed groups by its value; a sandbox without
    // the label is in the group "(none)".
    await page.selectOption("#usage-group", "label");
    await page.fill("#usage-label", "purpose");
    await page.dispatchEvent("#usage-label", "change");
    await page.waitForSelector("#usage tr[data-group='test']", { timeout: 20000 });
    assert.ok(parseFloat(await page.textContent("#usage tr[data-group='test'] td[data-metric=cpu_seconds]")) >= 4.5, "the burn, under purpose=test");
    await page.fill("#usage-label", "team");
    await page.dispatchEvent("#usage-label", "change");
    await page.waitForSelector("#usage tr[data-group='ui']", { timeout: 20000 });
    assert.equal(await page.$("#usage tr[data-group='test']"), null, "grouped by team, not purpose");
    // By template: host, and app once metering has seen its sandbox.
    const until = Date.now() + 60000;
    await page.selectOption("#usage-group", "template");
    while (!(await page.$("#usage tr[data-group='app']")) && Date.now() < until) {
      await page.waitForTimeout(2000);
      await page.selectOption("#usage-group", "tenant");
      await page.selectOption("#usage-group", "template");
    }
    await page.waitForSelector("#usage tr[data-group='host']");
    await page.waitForSelector("#usage tr[data-group='app']");
    await shot(page, "usage");
  });

  await t.test("tenants and the audit log", async () => {
    await page.click("a[data-nav=tenants]");
    await page.waitForSelector("#tenants tr[data-tenant=default]");
    await shot(page, "tenants");
    await page.click("a[data-nav=audit]");
    await page.waitForSelector("#audit table, #audit .notavail");
  });

  await t.test("a revoked key goes back to the sign-in page", async () => {
    await page.click("a[data-nav=keys]");
    await page.fill("#key-name", "ui-revoked");
    await page.click("#key-create");
    const secret = (await (await page.waitForSelector("#key-secret")).textContent()).trim();
    await shot(page, "keys");
    const other = await (await browser.newContext({ viewport: wide })).newPage();
    await signIn(other, secret);
    await other.waitForSelector("#sandboxes");
    await other.waitForFunction(() => document.querySelector("#whoami") && performance.getEntriesByName("atoll:list").length);
    await other.waitForTimeout(500); // the admin check has answered 403 by now
    assert.ok(await other.isHidden("a[data-nav=keys]"), "a tenant's key hides the admin pages");
    assert.equal(await other.$(`#sandboxes tr[data-id='${id}']`), null, "another tenant sees no sandbox of the admin's");
    await page.click("#keys tr[data-key='ui-revoked'] button.danger");
    await page.waitForSelector("#keys tr[data-key='ui-revoked']", { state: "detached" });
    // The list refreshes every 5 s: its next call is refused.
    await other.waitForSelector("#signin:not([hidden])", { timeout: 20000 });
    assert.match(await other.textContent("#signin-error"), /refused the API key/);
    assert.equal(await other.evaluate(() => sessionStorage.getItem("atoll.key")), null, "the key is forgotten");
  });

  await t.test("a narrow window", async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    await page.click("a[data-nav=sandboxes]");
    await page.waitForSelector(`#sandboxes tr[data-id='${id}']`);
    await noSideScroll(page, "sandboxes");
    // The table scrolls inside its box: its rows stay a line high (its
    // buttons do not stack).
    const heights = await page.$$eval("#sandboxes tr[data-id]", (rs) => rs.map((r) => r.getBoundingClientRect().height));
    assert.ok(Math.max(...heights) < 60, `rows of the narrow list are ${heights} px high`);
    await shot(page, "narrow");
    await page.goto(`${base}/ui/#/templates/app`);
    await page.waitForSelector("#template tr[data-version]");
    await noSideScroll(page, "a template's page");
    await page.goto(`${base}/ui/#/sandboxes/${id}/terminal`);
    await page.waitForFunction(() => /connected/.test(document.querySelector("#terminal-status")?.textContent || ""), null, { timeout: 30000 });
    await noSideScroll(page, "terminal");
    await typeInTerminal(page, "stty size");
    const rows = await termRows(page);
    await page.waitForFunction(() => [...document.querySelectorAll("#terminal .xterm-rows > div")].some((r) => /^\d+ \d+$/.test(r.textContent.replace(/\u00a0/g, " ").trim())));
    const size = (await termRows(page)).find((r) => /^\d+ \d+$/.test(r.trim()));
    assert.ok(size && Number(size.trim().split(" ")[1]) < 60, `the terminal fits the window: stty size ${size} (rows ${rows.length})`);
    for (const view of ["files", "metrics", "network"]) {
      await page.click(`a[href$='/${view}']`);
      await page.waitForTimeout(500);
      await noSideScroll(page, view);
    }
    await page.setViewportSize(wide);
  });

  await t.test("delete the sandbox", async () => {
    await page.click("a[data-nav=sandboxes]");
    const row = `#sandboxes tr[data-id='${id}']`;
    await page.click(`${row} [data-action=delete]`);
    await page.waitForSelector(row, { state: "detached", timeout: 30000 });
    const r = await fetch(`${base}/v1/sandboxes/${id}`, { headers: { "X-API-Key": adminKey } });
    assert.equal(r.status, 404);
    // The audit log has the delete, with its key and status.
    if (await served(t, "/v1/audit", "audit log")) {
      await page.click("a[data-nav=audit]");
      await page.fill("#audit-sandbox", id);
      await page.press("#audit-sandbox", "Enter");
      await page.dispatchEvent("#audit-sandbox", "change");
      await page.waitForFunction((id) => [...document.querySelectorAll("#audit tr[data-seq]")].some((tr) => {
        const cells = [...tr.children].map((td) => td.textContent);
        return cells[4] === "DELETE /v1/sandboxes/{id}" && cells[5] === id && cells[6] === "204" && cells[2] !== "";
      }), id, { timeout: 20000 });
      await shot(page, "audit");
    }
  });

  assert.deepEqual(errors, [], "no uncaught errors in the page");
});
