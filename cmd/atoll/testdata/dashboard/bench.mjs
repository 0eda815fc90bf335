// Times the web dashboard's loads in Debian's chromium (playwright-core),
// for `go run ./bench -only dashboard`: node bench.mjs N with ATOLL_URL,
// ATOLL_API_KEY, CHROMIUM and ATOLL_SANDBOX (a running sandbox for the
// terminal). Prints one JSON object of durations in milliseconds:
//   signin:   a fresh browser profile (nothing cached) opens /ui/ until
//             the sign-in form is shown;
//   list:     the same, signed in already (the key in the tab's session),
//             until the sandbox list is drawn;
//   reload:   a reload of the list in the same profile (files revalidated)
//             until it is drawn again;
//   terminal: from opening a sandbox's terminal page (signed in, cached)
//             to its shell's prompt.
// Each is timed from here (around the browser's navigation, as a user
// waits) and, as signinPage, listPage and reloadPage, by the page itself:
// from its navigation start to its performance mark (app.js's mark()),
// without this program's round trips to the browser.
import { chromium } from "playwright-core";

const n = Number(process.argv[2] || 20);
const base = process.env.ATOLL_URL, key = process.env.ATOLL_API_KEY, sb = process.env.ATOLL_SANDBOX;
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM, args: ["--no-sandbox"] });
const out = { signin: [], list: [], reload: [], terminal: [], signinPage: [], listPage: [], reloadPage: [] };
const markAt = (page, name) => page.evaluate((n) => performance.getEntriesByName(n)[0].startTime, name);
const since = (t0) => performance.now() - t0;
const signedIn = (k) => { sessionStorage.setItem("atoll.key", k); };

for (let i = 0; i < n; i++) {
  let ctx = await browser.newContext();
  let page = await ctx.newPage();
  let t0 = performance.now();
  await page.goto(base + "/ui/");
  await page.waitForSelector("#signin-key", { state: "visible" });
  out.signin.push(since(t0));
  out.signinPage.push(await markAt(page, "atoll:signin"));
  await ctx.close();

  ctx = await browser.newContext();
  page = await ctx.newPage();
  await page.addInitScript(signedIn, key);
  t0 = performance.now();
  await page.goto(base + "/ui/#/sandboxes");
  await page.waitForSelector("#sandboxes tr[data-id]");
  out.list.push(since(t0));
  out.listPage.push(await markAt(page, "atoll:list"));

  t0 = performance.now();
  await page.reload();
  await page.waitForSelector("#sandboxes tr[data-id]");
  out.reload.push(since(t0));
  out.reloadPage.push(await markAt(page, "atoll:list"));

  t0 = performance.now();
  await page.goto(`${base}/ui/#/sandboxes/${sb}/terminal`);
  await page.waitForFunction(() => [...document.querySelectorAll("#terminal .xterm-rows > div")].some((r) => /[#$]\s*$/.test(r.textContent.replace(/\u00a0/g, " ").trim())), null, { timeout: 30000 });
  out.terminal.push(since(t0));
  await ctx.close();
}
await browser.close();
console.log(JSON.stringify(out));
