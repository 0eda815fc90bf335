// Drives atoll's web dashboard (served by `atoll serve` at /ui) in Debian's
// chromium through playwright-core, as a user would: run by
// cmd/atoll/dashboard_e2e_test.go with ATOLL_URL, ATOLL_API_KEY (an admin
// key) and CHROMIUM; ATOLL_UI_SCREENSHOTS=DIR saves screenshots there.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile, mkdir } from "node:fs/promises";
import { chromium } from "playwright-core";

const base = process.env.ATOLL_URL;
const adminKey = process.env.ATOLL_API_KEY;
const shots = process.env.ATOLL_UI_SCREENSHOTS;
const wide = { width: 1280, height: 800 };

async function shot(page, name) {
  if (!shots) return;
  await mkdir(shots, { recursive: true });
  // Let charts draw and fonts settle.
  await page.waitForTimeout(300);
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
    if (!(await routeExists(`/v1/sandboxes/${id}/logs`))) {
      await page.waitForSelector("[data-notavailable]");
      t.diagnostic("this server keeps no sandbox logs: the tab says so");
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

  await t.test("the list shows state, labels and live figures", async () => {
    await page.click("a[data-nav=sandboxes]");
    const row = `#sandboxes tr[data-id='${id}']`;
    await page.waitForSelector(row);
    assert.match(await page.textContent(row), /running/);
    assert.match(await page.textContent(row), /team=ui/);
    await page.waitForFunction((r) => document.querySelector(r + " [data-mem]").textContent.includes("/"), row, { timeout: 30000 });
    await shot(page, "sandboxes");
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

  await t.test("events as they happen, and webhooks", async () => {
    await page.click("a[data-nav=events]");
    if (!(await routeExists("/v1/events"))) {
      await page.waitForSelector("[data-notavailable]");
      t.diagnostic("this server streams no events: the page says so");
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

  await t.test("templates", async () => {
    await page.click("a[data-nav=templates]");
    await page.waitForSelector("#templates tr[data-template], #templates .notavail");
    await shot(page, "templates");
  });

  await t.test("usage after a CPU burn", async () => {
    await page.click("a[data-nav=usage]");
    if (!(await routeExists("/v1/usage"))) {
      await page.waitForSelector("#usage [data-notavailable]");
      t.diagnostic("this server has no /v1/usage: the page says so");
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
    assert.ok(cpu >= 4.5, `usage shows ${cpu} CPU-seconds for a sandbox that burned 5`);
    const [dl] = await Promise.all([page.waitForEvent("download"), page.click("#usage-csv")]);
    const csv = (await readFile(await dl.path(), "utf8")).trim().split("\n");
    assert.match(csv[0], /^time,group,cpu_seconds,/);
    const mine = csv.filter((l) => l.split(",")[1] === id).map((l) => parseFloat(l.split(",")[2]));
    assert.ok(mine.reduce((a, b) => a + b, 0) >= 4.5, `the CSV's CPU-seconds of the sandbox: ${mine}`);
    await page.selectOption("#usage-group", "template");
    await page.waitForSelector("#usage tr[data-group='host']");
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
    await shot(page, "narrow");
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
    if (await routeExists("/v1/audit")) {
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
