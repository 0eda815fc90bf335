// Drives atoll's MCP server with the official MCP TypeScript SDK's client,
// over stdio (`atoll mcp`, started by the SDK) and over streamable HTTP
// (the server's /v1/mcp). Run by cmd/atoll/mcp_e2e_test.go with
// ATOLL_BIN, ATOLL_URL and ATOLL_API_KEY set.
import { test } from "node:test";
import assert from "node:assert/strict";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const { ATOLL_BIN, ATOLL_URL, ATOLL_API_KEY } = process.env;

const transports = {
  stdio: () =>
    new StdioClientTransport({
      command: ATOLL_BIN,
      args: ["mcp"],
      env: { ...process.env, ATOLL_URL, ATOLL_API_KEY },
      stderr: "inherit",
    }),
  http: () =>
    new StreamableHTTPClientTransport(new URL("/v1/mcp", ATOLL_URL), {
      requestInit: { headers: { Authorization: `Bearer ${ATOLL_API_KEY}` } },
    }),
};

const text = (r) => r.content.filter((c) => c.type === "text").map((c) => c.text).join("");

for (const [name, transport] of Object.entries(transports)) {
  test(`MCP over ${name}`, async (t) => {
    const client = new Client({ name: "atoll-mcp-test", version: "1.0.0" });
    await client.connect(transport());
    let id;
    try {
      await t.test("lists the tools", async () => {
        const { tools } = await client.listTools();
        const names = tools.map((x) => x.name);
        for (const want of ["create_sandbox", "list_sandboxes", "inspect_sandbox", "stop_sandbox", "start_sandbox",
          "delete_sandbox", "exec", "read_file", "write_file", "list_files", "delete_file", "upload_dir", "download_dir",
          "create_snapshot", "list_snapshots", "fork_sandbox", "restore_sandbox", "port_url", "vault_read", "vault_write", "vault_search"]) {
          assert.ok(names.includes(want), `no tool ${want} in ${names}`);
        }
        const exec = tools.find((x) => x.name === "exec");
        assert.deepEqual(exec.inputSchema.required, ["sandbox"]);
        assert.ok(exec.outputSchema.properties.exit_code, "exec has no exit_code in its output schema");
        assert.equal(tools.find((x) => x.name === "delete_sandbox").annotations.destructiveHint, true);
      });

      await t.test("creates a sandbox", async () => {
        const r = await client.callTool({ name: "create_sandbox", arguments: { labels: { via: `mcp-${name}` }, timeout_sec: 600 } });
        assert.ok(!r.isError, text(r));
        id = r.structuredContent.id;
        assert.match(id, /^[a-z0-9]{20}$/);
        assert.equal(r.structuredContent.state, "running");
        assert.equal(r.structuredContent.labels.via, `mcp-${name}`);
        const l = await client.callTool({ name: "list_sandboxes", arguments: { labels: { via: `mcp-${name}` } } });
        assert.deepEqual(l.structuredContent.sandboxes.map((s) => s.id), [id]);
      });

      await t.test("runs a command, its output streamed as progress", async () => {
        const progress = [];
        const r = await client.callTool(
          { name: "exec", arguments: { sandbox: id, command: 'echo "one $X"; sleep 1; echo two >&2; sleep 0.3; pwd; exit 3', cwd: "/tmp", env: { X: "ex" } } },
          undefined,
          { onprogress: (p) => progress.push({ ...p, at: Date.now() }) },
        );
        const done = Date.now();
        assert.ok(!r.isError, text(r));
        assert.equal(r.structuredContent.exit_code, 3);
        assert.equal(r.structuredContent.stdout, "one ex\n/tmp\n");
        assert.equal(r.structuredContent.stderr, "two\n");
        // The first line came while the command still ran, a second
        // before its result.
        assert.equal(progress[0]?.message, "one ex\n");
        assert.ok(done - progress[0].at >= 900, `the first output came ${done - progress[0].at} ms before the result`);
        // The SDK handles notifications a microtask after it reads them,
        // and drops those of a call whose result it has already taken:
        // the last line may come too late to be seen.
        const streamed = progress.map((p) => p.message).join("");
        assert.ok("one ex\ntwo\n/tmp\n".startsWith(streamed) && streamed.startsWith("one ex\ntwo\n"), `streamed ${JSON.stringify(streamed)}`);
        for (let i = 1; i < progress.length; i++) assert.ok(progress[i].progress > progress[i - 1].progress);
      });

      await t.test("writes and reads a file", async () => {
        const content = `hello from ${name}\nline two ✓\n`;
        const w = await client.callTool({ name: "write_file", arguments: { sandbox: id, path: "/work/notes/a.txt", content } });
        assert.ok(!w.isError, text(w));
        assert.equal(w.structuredContent.size, Buffer.byteLength(content));
        const r = await client.callTool({ name: "read_file", arguments: { sandbox: id, path: "/work/notes/a.txt" } });
        assert.ok(!r.isError, text(r));
        assert.equal(r.structuredContent.encoding, "text");
        assert.equal(r.structuredContent.content, content);
        const res = await client.readResource({ uri: `atoll://sandboxes/${id}/files/work/notes/a.txt` });
        assert.equal(res.contents[0].text, content);
        const ls = await client.callTool({ name: "list_files", arguments: { sandbox: id, path: "/work/notes" } });
        assert.deepEqual(ls.structuredContent.files.map((f) => f.name), ["a.txt"]);
      });

      await t.test("refuses bad arguments with a clear message", async () => {
        // A string where a number goes: the input schema refuses it.
        let r = await client.callTool({ name: "exec", arguments: { sandbox: id, command: "true", timeout_sec: "soon" } });
        assert.equal(r.isError, true);
        assert.equal(r._meta["atoll.dev/error"].code, "invalid");
        assert.match(text(r), /^invalid: .*timeout_sec/);
        // A misspelt argument.
        r = await client.callTool({ name: "read_file", arguments: { sandbox: id, file: "/etc/hostname" } });
        assert.equal(r.isError, true);
        assert.match(text(r), /^invalid: .*(file|path)/);
        // Neither command nor argv.
        r = await client.callTool({ name: "exec", arguments: { sandbox: id } });
        assert.equal(r.isError, true);
        assert.equal(text(r), "invalid: give either command (a shell command line) or argv");
        // The server's own refusal keeps its code.
        r = await client.callTool({ name: "inspect_sandbox", arguments: { sandbox: "zzzzzzzzzzzzzzzzzzzz" } });
        assert.equal(r.isError, true);
        assert.equal(r._meta["atoll.dev/error"].code, "not_found");
      });

      await t.test("deletes the sandbox", async () => {
        const r = await client.callTool({ name: "delete_sandbox", arguments: { sandbox: id } });
        assert.ok(!r.isError, text(r));
        const g = await client.callTool({ name: "inspect_sandbox", arguments: { sandbox: id } });
        assert.equal(g._meta["atoll.dev/error"].code, "not_found");
        id = undefined;
      });
    } finally {
      if (id) await client.callTool({ name: "delete_sandbox", arguments: { sandbox: id } }).catch(() => {});
      await client.close();
    }
  });
}
