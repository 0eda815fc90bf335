package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/atoll-dev/atoll/api"
	atollmcp "github.com/atoll-dev/atoll/internal/mcp"
	"github.com/atoll-dev/atoll/internal/testenv"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// atoll's MCP server (internal/mcp) against a real `atoll serve`: the
// official TypeScript SDK's client over stdio and HTTP, then every tool
// from Go, then the HTTP endpoint's keys and tenants.

// mcpProgram installs the pinned MCP SDK (npm ci) if it is not there yet
// and returns the directory of the Node program.
func mcpProgram(t *testing.T) (dir, node string) {
	t.Helper()
	node, npm := requireNode(t)
	dir, err := filepath.Abs("testdata/mcp")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci: %v\n%s", err, out)
		}
	}
	return dir, node
}

// TestMCPClient runs testdata/mcp/test.mjs: the npm @modelcontextprotocol/sdk
// client lists the tools, creates a sandbox, runs a command (its output
// streamed as progress), writes and reads a file, and is refused bad
// arguments, over stdio (`atoll mcp`) and over the server's /v1/mcp.
func TestMCPClient(t *testing.T) {
	dir, node := mcpProgram(t)
	d, _, _ := startRooted(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test-reporter=spec", "test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "ATOLL_BIN="+d.bin, "ATOLL_URL="+d.url, "ATOLL_API_KEY="+d.key)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	t.Logf("node test.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("the MCP client program failed: %v\nserver log:\n%s", err, d.out.String())
	}
}

// mcpSession connects a Go MCP client to an MCP server of internal/mcp
// acting on d with key, in memory; progress notifications go to progress.
func mcpSession(t *testing.T, d *daemon, key string, progress func(*mcp.ProgressNotificationParams)) *mcp.ClientSession {
	t.Helper()
	st, ct := mcp.NewInMemoryTransports()
	s := atollmcp.New(atollmcp.Config{URL: d.url, Key: key, Version: "test", HTTPClient: d.httpClient()})
	ctx := context.Background()
	ss, err := s.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	opts := &mcp.ClientOptions{}
	if progress != nil {
		opts.ProgressNotificationHandler = func(_ context.Context, r *mcp.ProgressNotificationClientRequest) { progress(r.Params) }
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, opts).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// callTool calls tool name and returns its result; a call that fails as
// a protocol error (not a tool error) fails the test.
func callTool(t *testing.T, cs *mcp.ClientSession, name string, args any, meta ...mcp.Meta) *mcp.CallToolResult {
	t.Helper()
	p := &mcp.CallToolParams{Name: name, Arguments: args}
	if len(meta) > 0 {
		p.Meta = meta[0]
	}
	r, err := cs.CallTool(context.Background(), p)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return r
}

func toolText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// toolOK calls tool name and decodes its structured result into a T.
func toolOK[T any](t *testing.T, cs *mcp.ClientSession, name string, args any, meta ...mcp.Meta) T {
	t.Helper()
	r := callTool(t, cs, name, args, meta...)
	if r.IsError {
		t.Fatalf("%s %v: %s", name, args, toolText(r))
	}
	var v T
	b, _ := json.Marshal(r.StructuredContent)
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: decoding %s: %v", name, b, err)
	}
	return v
}

// toolErr calls tool name, wants a tool error of code, and returns its message.
func toolErr(t *testing.T, cs *mcp.ClientSession, code, name string, args any) string {
	t.Helper()
	r := callTool(t, cs, name, args)
	var e struct{ Code, Message string }
	b, _ := json.Marshal(r.Meta[atollmcp.ErrorMeta])
	json.Unmarshal(b, &e)
	if !r.IsError || e.Code != code || !strings.HasPrefix(toolText(r), code+": ") {
		t.Errorf("%s %v: isError %v, %s, want a tool error %s", name, args, r.IsError, toolText(r), code)
	}
	return e.Message
}

type args = map[string]any

// TestMCPTools calls every tool of internal/mcp against a real server,
// and each tool's refusals of bad arguments and of what the server refuses.
func TestMCPTools(t *testing.T) {
	testenv.RequireCommand(t, "git")
	d, _, c := startRooted(t)
	ctx := context.Background()
	var mu sync.Mutex
	var progress []string
	cs := mcpSession(t, d, d.key, func(p *mcp.ProgressNotificationParams) {
		mu.Lock()
		defer mu.Unlock()
		if p.ProgressToken == "run-1" {
			progress = append(progress, p.Message)
		}
	})

	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	if len(names) != 22 {
		t.Errorf("%d tools: %v", len(names), names)
	}

	// Sandboxes: create with limits, labels, env, timeout and an egress
	// policy (which this server, without networking, refuses as
	// unavailable: the policy reached it).
	msg := toolErr(t, cs, "unavailable", "create_sandbox", args{"egress": "deny-all", "allow": []string{"example.com"}})
	if !strings.Contains(msg, "network") {
		t.Errorf("create with an egress policy on a server without networking: %s", msg)
	}
	sb := toolOK[api.Sandbox](t, cs, "create_sandbox", args{"template": "host", "cpu": 1, "memory_mib": 256,
		"labels": args{"app": "mcp"}, "env": args{"GREETING": "hi"}, "timeout_sec": 900})
	if sb.State != api.StateRunning || sb.CPU != 1 || sb.MemoryMiB != 256 || sb.Labels["app"] != "mcp" || sb.ExpiresAt == nil {
		t.Errorf("create_sandbox: %+v", sb)
	}
	id := sb.ID
	if l := toolOK[api.SandboxList](t, cs, "list_sandboxes", args{"labels": args{"app": "mcp"}, "state": "running"}); len(l.Sandboxes) != 1 || l.Sandboxes[0].ID != id {
		t.Errorf("list_sandboxes: %+v", l)
	}
	if l := toolOK[api.SandboxList](t, cs, "list_sandboxes", args{"labels": args{"app": "other"}}); len(l.Sandboxes) != 0 {
		t.Errorf("list_sandboxes of another label: %+v", l)
	}
	if got := toolOK[api.Sandbox](t, cs, "inspect_sandbox", args{"sandbox": id}); got.ID != id || got.Env["GREETING"] != "hi" {
		t.Errorf("inspect_sandbox: %+v", got)
	}
	t.Logf("an unknown sandbox: %s", toolErr(t, cs, "not_found", "inspect_sandbox", args{"sandbox": "aaaaaaaaaaaaaaaaaaaa"}))
	toolErr(t, cs, "invalid", "inspect_sandbox", args{"sandbox": ""})
	toolErr(t, cs, "invalid", "inspect_sandbox", args{})
	toolErr(t, cs, "invalid", "create_sandbox", args{"cpu": -1})
	toolErr(t, cs, "invalid", "create_sandbox", args{"template": "no such/template"})

	// exec: cwd, env, stdin, argv; output streamed as progress when the
	// call has a progress token; the exit code; the timeout.
	type execOut struct {
		ExitCode  int    `json:"exit_code"`
		Stdout    string `json:"stdout"`
		Stderr    string `json:"stderr"`
		TimedOut  bool   `json:"timed_out"`
		Truncated bool   `json:"truncated"`
	}
	e := toolOK[execOut](t, cs, "exec", args{"sandbox": id, "command": `echo "$GREETING $A"; sleep 0.3; pwd >&2; sleep 0.3; cat; exit 7`,
		"cwd": "/tmp", "env": args{"A": "b"}, "stdin": "from stdin\n"}, mcp.Meta{"progressToken": "run-1"})
	if e.ExitCode != 7 || e.Stdout != "hi b\nfrom stdin\n" || e.Stderr != "/tmp\n" {
		t.Errorf("exec: %+v", e)
	}
	// The server sends every notification before the result, but the
	// client may hand the last ones to the handler after the call returns.
	const streamed = "hi b\n/tmp\nfrom stdin\n"
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		got := strings.Join(progress, "")
		mu.Unlock()
		if len(got) >= len(streamed) || time.Now().After(deadline) {
			if got != streamed {
				t.Errorf("exec's progress notifications: %q", got)
			}
			break
		}
	}
	if e := toolOK[execOut](t, cs, "exec", args{"sandbox": id, "argv": []string{"printf", "%s|", "a b", "c"}}); e.Stdout != "a b|c|" || e.ExitCode != 0 {
		t.Errorf("exec with argv: %+v", e)
	}
	start := time.Now()
	if e := toolOK[execOut](t, cs, "exec", args{"sandbox": id, "command": "sleep 30", "timeout_sec": 1}); !e.TimedOut || e.ExitCode != -1 {
		t.Errorf("exec past its timeout: %+v", e)
	}
	if time.Since(start) > 15*time.Second {
		t.Errorf("exec with timeout_sec 1 took %v", time.Since(start))
	}
	if e := toolOK[execOut](t, cs, "exec", args{"sandbox": id, "command": "head -c 1100000 /dev/zero | tr '\\0' x"}); !e.Truncated || len(e.Stdout) != 1<<20 {
		t.Errorf("exec of 1.1 MB of output: truncated %v, %d bytes", e.Truncated, len(e.Stdout))
	}
	toolErr(t, cs, "invalid", "exec", args{"sandbox": id})
	toolErr(t, cs, "invalid", "exec", args{"sandbox": id, "command": "true", "argv": []string{"true"}})
	toolErr(t, cs, "invalid", "exec", args{"sandbox": id, "command": "true", "timeout_sec": 99999})
	toolErr(t, cs, "invalid", "exec", args{"sandbox": id, "command": "true", "timeout_sec": "soon"})
	toolErr(t, cs, "not_found", "exec", args{"sandbox": "aaaaaaaaaaaaaaaaaaaa", "command": "true"})

	// Files: text and binary, modes, listing, deleting.
	type fileOut struct{ Path, Encoding, Content string }
	fi := toolOK[api.FileInfo](t, cs, "write_file", args{"sandbox": id, "path": "/work/bin/run.sh", "content": "#!/bin/sh\necho ran\n", "mode": "0755"})
	if fi.Mode&0o777 != 0o755 || fi.Size != 19 {
		t.Errorf("write_file: %+v", fi)
	}
	if e := toolOK[execOut](t, cs, "exec", args{"sandbox": id, "command": "/work/bin/run.sh"}); e.Stdout != "ran\n" {
		t.Errorf("running the written script: %+v", e)
	}
	bin := []byte{0, 1, 2, 0xff, 0xfe, 'x'}
	toolOK[api.FileInfo](t, cs, "write_file", args{"sandbox": id, "path": "/work/b.bin", "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64"})
	if f := toolOK[fileOut](t, cs, "read_file", args{"sandbox": id, "path": "/work/b.bin"}); f.Encoding != "base64" || f.Content != base64.StdEncoding.EncodeToString(bin) {
		t.Errorf("read_file of binary: %+v", f)
	}
	if f := toolOK[fileOut](t, cs, "read_file", args{"sandbox": id, "path": "/work/bin/run.sh"}); f.Encoding != "text" || f.Content != "#!/bin/sh\necho ran\n" {
		t.Errorf("read_file: %+v", f)
	}
	if l := toolOK[api.FileList](t, cs, "list_files", args{"sandbox": id, "path": "/work"}); len(l.Files) != 2 {
		t.Errorf("list_files: %+v", l)
	}
	toolErr(t, cs, "not_found", "read_file", args{"sandbox": id, "path": "/work/nothing"})
	toolErr(t, cs, "invalid", "write_file", args{"sandbox": id, "path": "/work/x", "content": "%%%", "encoding": "base64"})
	toolErr(t, cs, "invalid", "write_file", args{"sandbox": id, "path": "/work/x", "content": "x", "encoding": "utf16"})
	toolErr(t, cs, "invalid", "write_file", args{"sandbox": id, "path": "/work/x", "content": "x", "mode": "rwx"})
	toolErr(t, cs, "invalid", "write_file", args{"sandbox": id, "path": "", "content": "x"})
	toolErr(t, cs, "conflict", "delete_file", args{"sandbox": id, "path": "/work/bin"})
	toolOK[any](t, cs, "delete_file", args{"sandbox": id, "path": "/work/bin", "recursive": true})
	toolErr(t, cs, "not_found", "read_file", args{"sandbox": id, "path": "/work/bin/run.sh"})

	// Resources: a file by its URI.
	res, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: atollmcp.FileURI(id, "/work/b.bin")})
	if err != nil || len(res.Contents) != 1 || !bytes.Equal(res.Contents[0].Blob, bin) {
		t.Errorf("reading a binary file as a resource: %v %+v", err, res)
	}
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: atollmcp.FileURI(id, "/work/none")}); err == nil {
		t.Errorf("reading a missing file as a resource: no error")
	}
	tpls, err := cs.ListResourceTemplates(ctx, nil)
	if err != nil || len(tpls.ResourceTemplates) != 1 {
		t.Errorf("resource templates: %v %+v", err, tpls)
	}

	// Directories as tar.
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for name, body := range map[string]string{"src/main.go": "package main\n", "README.md": "# up\n"} {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(body))
	}
	tw.Close()
	toolOK[any](t, cs, "upload_dir", args{"sandbox": id, "path": "/work/up", "tar_base64": base64.StdEncoding.EncodeToString(tb.Bytes())})
	if e := toolOK[execOut](t, cs, "exec", args{"sandbox": id, "command": "cat /work/up/src/main.go /work/up/README.md"}); e.Stdout != "package main\n# up\n" {
		t.Errorf("files of the uploaded tar: %+v", e)
	}
	dl := toolOK[struct {
		Tar   string `json:"tar_base64"`
		Bytes int
	}](t, cs, "download_dir", args{"sandbox": id, "path": "/work/up"})
	raw, _ := base64.StdEncoding.DecodeString(dl.Tar)
	var got []string
	tr := tar.NewReader(bytes.NewReader(raw))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		if h.Typeflag == tar.TypeReg {
			got = append(got, strings.TrimPrefix(h.Name, "./"))
		}
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"README.md", "src/main.go"}) || dl.Bytes != len(raw) {
		t.Errorf("download_dir: %v (%d bytes, said %d)", got, len(raw), dl.Bytes)
	}
	toolErr(t, cs, "invalid", "upload_dir", args{"sandbox": id, "path": "/work/up", "tar_base64": "not base64!"})
	toolErr(t, cs, "invalid", "upload_dir", args{"sandbox": id, "path": "/work/up", "tar_base64": base64.StdEncoding.EncodeToString([]byte("not a tar archive at all, not at all"))})

	// Snapshots, restore, fork.
	snap := toolOK[api.Snapshot](t, cs, "create_snapshot", args{"sandbox": id, "name": "clean"})
	if snap.SandboxID != id || snap.Name != "clean" {
		t.Errorf("create_snapshot: %+v", snap)
	}
	if l := toolOK[api.SnapshotList](t, cs, "list_snapshots", args{"sandbox": id}); len(l.Snapshots) != 1 || l.Snapshots[0].ID != snap.ID {
		t.Errorf("list_snapshots: %+v", l)
	}
	toolOK[any](t, cs, "write_file", args{"sandbox": id, "path": "/work/up/README.md", "content": "changed\n"})
	toolOK[api.Sandbox](t, cs, "restore_sandbox", args{"sandbox": id, "snapshot": snap.ID})
	if f := toolOK[fileOut](t, cs, "read_file", args{"sandbox": id, "path": "/work/up/README.md"}); f.Content != "# up\n" {
		t.Errorf("the file after restore_sandbox: %q", f.Content)
	}
	toolErr(t, cs, "not_found", "restore_sandbox", args{"sandbox": id, "snapshot": "bbbbbbbbbbbbbbbbbbbb"})
	forks := toolOK[api.SandboxList](t, cs, "fork_sandbox", args{"sandbox": id, "count": 2, "labels": args{"fork": "yes"}})
	if len(forks.Sandboxes) != 2 {
		t.Fatalf("fork_sandbox: %+v", forks)
	}
	for _, f := range forks.Sandboxes {
		if got := toolOK[fileOut](t, cs, "read_file", args{"sandbox": f.ID, "path": "/work/up/README.md"}); got.Content != "# up\n" || f.Labels["fork"] != "yes" {
			t.Errorf("fork %s: %q %v", f.ID, got.Content, f.Labels)
		}
		toolOK[any](t, cs, "delete_sandbox", args{"sandbox": f.ID})
	}
	toolErr(t, cs, "invalid", "fork_sandbox", args{"sandbox": id, "count": 101})

	// Ports: this server runs without networking, so without the port
	// proxy (TestPorts covers the proxy): the tool passes the refusal on.
	if msg := toolErr(t, cs, "unavailable", "port_url", args{"sandbox": id, "port": 8080, "signed_for_sec": 60}); !strings.Contains(msg, "port proxy") {
		t.Errorf("port_url without a port proxy: %s", msg)
	}
	toolErr(t, cs, "invalid", "port_url", args{"sandbox": id, "port": 70000})
	toolErr(t, cs, "invalid", "port_url", args{"sandbox": id, "port": 80, "signed_for_sec": -1})

	// Stop, start, and what a stopped sandbox refuses.
	if got := toolOK[api.Sandbox](t, cs, "stop_sandbox", args{"sandbox": id}); got.State != api.StateStopped {
		t.Errorf("stop_sandbox: %s", got.State)
	}
	t.Logf("exec in a stopped sandbox: %s", toolErr(t, cs, "conflict", "exec", args{"sandbox": id, "command": "true"}))
	if got := toolOK[api.Sandbox](t, cs, "start_sandbox", args{"sandbox": id}); got.State != api.StateRunning {
		t.Errorf("start_sandbox: %s", got.State)
	}
	if f := toolOK[fileOut](t, cs, "read_file", args{"sandbox": id, "path": "/work/up/src/main.go"}); f.Content != "package main\n" {
		t.Errorf("a file after stop and start: %q", f.Content)
	}

	// Vaults: write (a commit pushed over git), read, search.
	if _, err := c.CreateVault(ctx, api.CreateVaultRequest{Name: "mem", Layout: "agent"}); err != nil {
		t.Fatal(err)
	}
	type written struct {
		Commit  string
		Changed bool
	}
	w := toolOK[written](t, cs, "vault_write", args{"vault": "mem", "path": "entities/ada.md", "content": "---\ntitle: Ada Lovelace\n---\nwrote the first program for the analytical engine\n", "message": "ada"})
	if len(w.Commit) != 40 || !w.Changed {
		t.Errorf("vault_write: %+v", w)
	}
	w2 := toolOK[written](t, cs, "vault_write", args{"vault": "mem", "path": "entities/ada.md", "content": "met [[Babbage]]\n", "append": true})
	if !w2.Changed || w2.Commit == w.Commit {
		t.Errorf("vault_write with append: %+v", w2)
	}
	if same := toolOK[written](t, cs, "vault_write", args{"vault": "mem", "path": "entities/ada.md", "content": "---\ntitle: Ada Lovelace\n---\nwrote the first program for the analytical engine\nmet [[Babbage]]\n"}); same.Changed || same.Commit != w2.Commit {
		t.Errorf("vault_write of the same text: %+v", same)
	}
	if f := toolOK[fileOut](t, cs, "vault_read", args{"vault": "mem", "path": "entities/ada.md"}); !strings.HasSuffix(f.Content, "engine\nmet [[Babbage]]\n") {
		t.Errorf("vault_read: %q", f.Content)
	}
	if f := toolOK[fileOut](t, cs, "vault_read", args{"vault": "mem", "path": "entities/ada.md", "rev": w.Commit}); strings.Contains(f.Content, "Babbage") {
		t.Errorf("vault_read at the first commit: %q", f.Content)
	}
	if log, err := c.VaultLog(ctx, "mem", "", 1); err != nil || len(log) != 1 || log[0].ID != w2.Commit {
		t.Errorf("the vault's log after vault_write: %v %+v", err, log)
	}
	var hits api.VaultSearch
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		hits = toolOK[api.VaultSearch](t, cs, "vault_search", args{"vault": "mem", "query": "analytical"})
		if len(hits.Hits) > 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(hits.Hits) != 1 || hits.Hits[0].Path != "entities/ada.md" {
		t.Errorf("vault_search: %+v", hits)
	}
	toolErr(t, cs, "invalid", "vault_search", args{"vault": "mem", "query": `"unbalanced`})
	toolErr(t, cs, "not_found", "vault_read", args{"vault": "nope", "path": "index.md"})
	toolErr(t, cs, "not_found", "vault_write", args{"vault": "nope", "path": "a.md", "content": "x"})
	toolErr(t, cs, "invalid", "vault_write", args{"vault": "mem", "path": "../a.md", "content": "x"})
	toolErr(t, cs, "invalid", "vault_write", args{"vault": "mem", "path": ".git/config", "content": "x"})

	// Delete.
	toolOK[any](t, cs, "delete_sandbox", args{"sandbox": id})
	if _, err := c.GetSandbox(ctx, id); err == nil {
		t.Errorf("the sandbox is there after delete_sandbox")
	}
	toolErr(t, cs, "not_found", "delete_sandbox", args{"sandbox": id})
	// An unknown tool is a protocol error, as MCP says.
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "rm_rf", Arguments: args{}}); err == nil {
		t.Errorf("an unknown tool: no error")
	}
}

// headers adds h to every request.
type headers struct {
	h    http.Header
	next http.RoundTripper
}

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.h {
		r.Header[k] = v
	}
	return h.next.RoundTrip(r)
}

// httpSession connects a Go MCP client to d's /v1/mcp with header (and
// its value) carrying the key.
func httpSession(ctx context.Context, d *daemon, header, value string) (*mcp.ClientSession, error) {
	hc := &http.Client{Transport: headers{http.Header{header: {value}}, http.DefaultTransport}}
	return mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: d.url + "/v1/mcp", HTTPClient: hc}, nil)
}

// TestMCPHTTPKeys checks the HTTP endpoint's keys: none or a wrong one is
// 401, a tenant's session sees its sandboxes only, and a session cannot
// be taken over with another key.
func TestMCPHTTPKeys(t *testing.T) {
	d, _, c := startRooted(t)
	ctx := context.Background()
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}`
	post := func(hdr http.Header) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", d.url+"/v1/mcp", strings.NewReader(initialize))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range hdr {
			req.Header[k] = v
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	for name, hdr := range map[string]http.Header{
		"no key":          {},
		"a wrong key":     {"Authorization": {"Bearer atoll_wrong"}},
		"a wrong api key": {"X-Api-Key": {"atoll_wrong"}},
	} {
		if resp, body := post(hdr); resp.StatusCode != http.StatusUnauthorized || !strings.Contains(body, `"unauthorized"`) {
			t.Errorf("%s: %d %s, want 401 unauthorized", name, resp.StatusCode, body)
		}
	}
	if _, err := httpSession(ctx, d, "Authorization", "Bearer atoll_wrong"); err == nil {
		t.Errorf("an MCP client with a wrong key connected")
	}

	// Tenant A's sandbox is not there for tenant B's session.
	sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Template: "host"})
	if err != nil {
		t.Fatal(err)
	}
	k, err := c.CreateKey(ctx, api.CreateKeyRequest{Name: "team-b"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := httpSession(ctx, d, "X-API-Key", k.Key)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, call := range []struct {
		tool string
		args args
	}{
		{"inspect_sandbox", args{"sandbox": sb.ID}},
		{"exec", args{"sandbox": sb.ID, "command": "id"}},
		{"read_file", args{"sandbox": sb.ID, "path": "/etc/hostname"}},
		{"delete_sandbox", args{"sandbox": sb.ID}},
	} {
		toolErr(t, b, "not_found", call.tool, call.args)
	}
	if l := toolOK[api.SandboxList](t, b, "list_sandboxes", args{}); len(l.Sandboxes) != 0 {
		t.Errorf("tenant B lists %+v", l)
	}
	if _, err := c.GetSandbox(ctx, sb.ID); err != nil {
		t.Errorf("tenant A's sandbox after tenant B's calls: %v", err)
	}
	// B's own sandbox, through its session, is B's.
	mine := toolOK[api.Sandbox](t, b, "create_sandbox", args{})
	if _, err := c.GetSandbox(ctx, mine.ID); !errors.Is(err, atoll.ErrNotFound) {
		t.Errorf("tenant A sees tenant B's sandbox: %v", err)
	}
	if _, err := d.clientWith(k.Key).GetSandbox(ctx, mine.ID); err != nil {
		t.Errorf("tenant B's sandbox made over MCP: %v", err)
	}

	// A's session, then a request of it with B's key: refused.
	a, err := httpSession(ctx, d, "Authorization", "Bearer "+d.key)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	req, _ := http.NewRequest("POST", d.url+"/v1/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_sandboxes","arguments":{}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", a.ID())
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	req.Header.Set("Authorization", "Bearer "+k.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || strings.Contains(string(body), sb.ID) {
		t.Errorf("A's session with B's key: %d %s, want 403", resp.StatusCode, body)
	}
	if l := toolOK[api.SandboxList](t, a, "list_sandboxes", args{}); len(l.Sandboxes) != 1 || l.Sandboxes[0].ID != sb.ID {
		t.Errorf("A's session lists %+v", l)
	}

	// The audit log has each tool's REST request once, and the MCP
	// requests only where a key was refused (written in batches: waited
	// for).
	var made []api.AuditEntry
	for deadline := time.Now().Add(10 * time.Second); len(made) == 0; time.Sleep(50 * time.Millisecond) {
		l, err := c.Audit(ctx, api.AuditQuery{Sandbox: mine.ID})
		if err != nil {
			t.Fatal(err)
		}
		made = l.Entries
		if time.Now().After(deadline) {
			t.Fatal("no audit entry of the sandbox made over MCP")
		}
	}
	if len(made) != 1 || made[0].Action != "POST /v1/sandboxes" {
		t.Errorf("audit entries of the sandbox made over MCP: %+v, want its create once", made)
	}
	l, err := c.Audit(ctx, api.AuditQuery{Action: "POST /v1/mcp", Limit: 500})
	if err != nil {
		t.Fatal(err)
	}
	refused := 0
	for _, e := range l.Entries {
		if e.Status != http.StatusUnauthorized && e.Status != http.StatusForbidden {
			t.Errorf("an MCP request in the audit log: %+v, want only those refused for their key", e)
		}
		refused++
	}
	if refused < 3 {
		t.Errorf("%d refused MCP requests in the audit log, want the 3 refused keys at least", refused)
	}

	// Open sessions (each with its stream of server messages, a GET that
	// stays open) do not hold up the server's drain on SIGTERM.
	start := time.Now()
	d.stop()
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the server took %v to stop with MCP sessions open", took)
	}
}
