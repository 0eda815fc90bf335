package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/atoll-dev/atoll/internal/e2b/envd"
	"github.com/atoll-dev/atoll/internal/e2b/envd/spec/filesystem"
	"github.com/atoll-dev/atoll/internal/e2b/envd/spec/filesystem/filesystemconnect"
	"github.com/atoll-dev/atoll/internal/e2b/envd/spec/process"
	"github.com/atoll-dev/atoll/internal/e2b/envd/spec/process/processconnect"
	"github.com/atoll-dev/atoll/internal/network"
	"github.com/atoll-dev/atoll/internal/network/nettest"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// The E2B-compatible API, served by the real `atoll serve` with real
// sandboxes: first the official e2b npm SDK runs its program against it
// (testdata/e2b), then hostile requests check E2B's status codes.

// requireNode finds node (at least 20.18, which the e2b SDK needs) and npm.
func requireNode(t *testing.T) (node, npm string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		testenv.Skip(t, "node is not installed (scripts/test.sh installs nodejs and npm)")
	}
	npm, err = exec.LookPath("npm")
	if err != nil {
		testenv.Skip(t, "npm is not installed (scripts/test.sh installs nodejs and npm)")
	}
	out, err := exec.Command(node, "-p", "process.versions.node").Output()
	if err != nil {
		t.Fatalf("node -p: %v", err)
	}
	var major, minor int
	fmt.Sscanf(strings.TrimSpace(string(out)), "%d.%d", &major, &minor)
	if major < 20 || major == 20 && minor < 18 || major == 21 {
		testenv.Skip(t, "the e2b SDK needs node 20.18 or later (22+), this is "+strings.TrimSpace(string(out)))
	}
	return node, npm
}

// e2bProgram installs the pinned SDKs (npm ci) if it is not there yet and
// returns the directory of the Node programs.
func e2bProgram(t *testing.T) (dir, node string) {
	t.Helper()
	node, npm := requireNode(t)
	dir, err := filepath.Abs("testdata/e2b")
	if err != nil {
		t.Fatal(err)
	}
	// Both SDKs: a tree installed before the code-interpreter's was added
	// lacks the second.
	_, err1 := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json"))
	_, err2 := os.Stat(filepath.Join(dir, "node_modules", "@e2b", "code-interpreter", "package.json"))
	if err1 != nil || err2 != nil {
		cmd := exec.Command(npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm ci: %v\n%s", err, out)
		}
	}
	return dir, node
}

func e2bEnv(d *daemon) []string {
	return append(os.Environ(), "E2B_API_URL="+d.url, "E2B_SANDBOX_URL="+d.url, "E2B_API_KEY="+d.key)
}

// TestE2BSDK runs the SDK program against a server with networking on, in
// a network of its own (netWorld), so that getHost() and egress policies
// are real: the program reaches the world's "internet" host at
// E2B_TEST_INTERNET_URL from inside sandboxes.
func TestE2BSDK(t *testing.T) {
	testenv.RequireRoot(t)
	if err := network.Probe(); err != nil {
		testenv.Skip(t, err.Error())
	}
	dir, node := e2bProgram(t)
	w := newNetWorld(t)
	d := startDaemonIn(t, filepath.Join(testenv.Dir(t), "data"), w.host, "--network", "on", "--network-bridge", w.id,
		"--dns-upstream", wInet4, "--network-pool", "1", "--proxy-listen", "127.0.0.1:0", "--tls-listen", "127.0.0.1:0")
	other, code := d.cli("key", "create", "--name", "other-team")
	if code != 0 {
		t.Fatalf("key create: %s", other)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test-reporter=spec", "test.mjs")
	cmd.Dir = dir
	// getHost() names the HTTPS listener, whose certificates the SDK
	// program trusts through the server's CA.
	tlsURL, err := os.ReadFile(filepath.Join(d.data, "tls-url"))
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(strings.TrimSpace(string(tlsURL)))
	cmd.Env = append(e2bEnv(d), "E2B_DOMAIN=localhost:"+u.Port(), "E2B_TEST_INTERNET_URL=http://"+wInet4+"/",
		"E2B_TEST_OTHER_KEY="+strings.TrimSpace(other), "NODE_EXTRA_CA_CERTS="+filepath.Join(d.data, "tls-ca.pem"))
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := nettest.In(w.host, cmd.Start); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	t.Logf("node test.mjs:\n%s", out.String())
	if err != nil {
		t.Fatalf("the e2b SDK program failed: %v\nserver log:\n%s", err, d.out.String())
	}
}

// The .proto files atoll generates its envd code from must describe the
// same wire format as the descriptors the pinned SDK embeds: same packages,
// messages, fields, numbers and types (options and JSON names aside).
func TestE2BProtoMatchesSDK(t *testing.T) {
	dir, _ := e2bProgram(t)
	js, err := os.ReadFile(filepath.Join(dir, "node_modules", "e2b", "dist", "index.js"))
	if err != nil {
		t.Fatal(err)
	}
	sdk := map[string]*descriptorpb.FileDescriptorProto{}
	for _, m := range regexp.MustCompile(`fileDesc\)\("([^"]+)"`).FindAllSubmatch(js, -1) {
		b, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(string(m[1]), "=")) // protobuf-es drops the padding
		if err != nil {
			t.Fatal(err)
		}
		fd := &descriptorpb.FileDescriptorProto{}
		if err := proto.Unmarshal(b, fd); err != nil {
			t.Fatal(err)
		}
		sdk[fd.GetName()] = fd
	}
	wire := func(fd *descriptorpb.FileDescriptorProto) *descriptorpb.FileDescriptorProto {
		fd = proto.Clone(fd).(*descriptorpb.FileDescriptorProto)
		fd.Options, fd.SourceCodeInfo, fd.Dependency = nil, nil, nil
		var strip func(m *descriptorpb.DescriptorProto)
		strip = func(m *descriptorpb.DescriptorProto) {
			for _, f := range m.Field {
				f.JsonName = nil
			}
			for _, n := range m.NestedType {
				strip(n)
			}
		}
		for _, m := range fd.MessageType {
			strip(m)
		}
		return fd
	}
	for _, f := range []protoreflect.FileDescriptor{process.File_process_process_proto, filesystem.File_filesystem_filesystem_proto} {
		theirs, ok := sdk[f.Path()]
		if !ok {
			t.Errorf("the SDK embeds no %s (it has %v)", f.Path(), slices.Collect(maps.Keys(sdk)))
			continue
		}
		if mine := protodesc.ToFileDescriptorProto(f); !proto.Equal(wire(mine), wire(theirs)) {
			t.Errorf("%s differs from the SDK's:\nours:   %v\ntheirs: %v", f.Path(), wire(mine), wire(theirs))
		}
	}
}

// e2bReq is one request to the E2B API or a sandbox through it.
type e2bReq struct {
	method, path string
	key          string // X-API-Key
	body         string
	header       map[string]string
	host         string
}

type e2bAnswer struct {
	status int
	header http.Header
	body   []byte
}

func (d *daemon) e2b(t *testing.T, r e2bReq) e2bAnswer {
	t.Helper()
	req, err := http.NewRequest(r.method, d.url+r.path, strings.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
	if r.key != "" {
		req.Header.Set("X-API-Key", r.key)
	}
	if r.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range r.header {
		req.Header.Set(k, v)
	}
	if r.host != "" {
		req.Host = r.host
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", r.method, r.path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return e2bAnswer{resp.StatusCode, resp.Header, b}
}

// want checks the status, and that an error answer is E2B's {"code","message"}
// with the status as code.
func (a e2bAnswer) want(t *testing.T, what string, status int) {
	t.Helper()
	if a.status != status {
		t.Errorf("%s: status %d, want %d: %s", what, a.status, status, a.body)
		return
	}
	if status >= 400 {
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(a.body, &e); err != nil || e.Code != status || e.Message == "" {
			t.Errorf("%s: error body %q is not {\"code\":%d,\"message\":...}", what, a.body, status)
		}
	}
}

// headerTransport adds headers to every request, as E2B SDKs do.
type headerTransport map[string]string

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h {
		r.Header.Set(k, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func TestE2BHostileInput(t *testing.T) {
	testenv.RequireRoot(t)
	d := startDaemon(t, filepath.Join(testenv.Dir(t), "data"))
	key := d.key
	create := func(body string) (id, token string) {
		t.Helper()
		a := d.e2b(t, e2bReq{method: "POST", path: "/v2/sandboxes", key: key, body: body})
		a.want(t, "create", 201)
		var sb struct{ SandboxID, EnvdAccessToken, EnvdVersion string }
		if err := json.Unmarshal(a.body, &sb); err != nil || sb.SandboxID == "" || sb.EnvdAccessToken == "" || sb.EnvdVersion != envd.Version {
			t.Fatalf("create answered %s", a.body)
		}
		return sb.SandboxID, sb.EnvdAccessToken
	}
	id, token := create(`{"templateID":"base","metadata":{"who":"hostile"}}`)
	other, otherToken := create(`{"templateID":"base","timeout":60}`)

	t.Run("keys", func(t *testing.T) {
		d.e2b(t, e2bReq{method: "GET", path: "/v2/sandboxes"}).want(t, "no key", 401)
		d.e2b(t, e2bReq{method: "GET", path: "/v2/sandboxes", key: "e2b_00"}).want(t, "wrong key", 401)
		d.e2b(t, e2bReq{method: "GET", path: "/v2/sandboxes", key: strings.Repeat("k", 10000)}).want(t, "huge key", 401)
		d.e2b(t, e2bReq{method: "GET", path: "/v2/sandboxes", key: "e2b_" + strings.TrimPrefix(key, "atoll_")}).want(t, "E2B-format key", 200)
		d.e2b(t, e2bReq{method: "DELETE", path: "/sandboxes/" + id, key: "nope"}).want(t, "kill with wrong key", 401)
		// The API key opens the control plane, not a sandbox's envd.
		d.e2b(t, e2bReq{method: "POST", path: "/process.Process/List", body: "{}", key: key,
			header: map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983"}}).want(t, "envd with the API key only", 401)
		d.e2b(t, e2bReq{method: "GET", path: "/health"}).want(t, "health needs no key", 204)
	})

	t.Run("malformed IDs", func(t *testing.T) {
		for _, bad := range []string{"x", "AAAAAAAAAAAAAAAAAAAA", strings.Repeat("a", 300), "..%2F..%2Fetc", "%00", "a%20b", id + "x"} {
			for _, m := range []string{"GET", "DELETE"} {
				d.e2b(t, e2bReq{method: m, path: "/sandboxes/" + bad, key: key}).want(t, m+" "+bad, 404)
			}
			d.e2b(t, e2bReq{method: "POST", path: "/sandboxes/" + bad + "/timeout", key: key, body: `{"timeout":5}`}).want(t, "timeout "+bad, 404)
			d.e2b(t, e2bReq{method: "POST", path: "/v2/sandboxes/" + bad + "/connect", key: key, body: `{}`}).want(t, "connect "+bad, 404)
		}
		// E2B's old client suffix is stripped.
		d.e2b(t, e2bReq{method: "GET", path: "/sandboxes/" + id + "-6532622b", key: key}).want(t, "ID with client suffix", 200)
	})

	t.Run("bad create requests", func(t *testing.T) {
		for _, c := range []struct {
			body   string
			status int
		}{
			{`{"templateID":"no-such-template"}`, 404},
			{`{"templateID":"base:v2"}`, 404},
			{`{"templateID":"Not A Name"}`, 400},
			{`{"templateID":"` + strings.Repeat("a", 5000) + `"}`, 400},
			{`{}`, 400},
			{``, 400},
			{`{"templateID":`, 400},
			{`[1,2]`, 400},
			{`{"templateID":"base","timeout":-1}`, 400},
			{`{"templateID":"base","timeout":99999999999}`, 400},
			{`{"templateID":"base","metadata":{"bad key":"v"}}`, 400},
			{`{"templateID":"base","metadata":{"k":"` + strings.Repeat("v", 300) + `"}}`, 400},
			{`{"templateID":"base","envVars":{"A=B":"c"}}`, 400},
			{`{"templateID":"base","network":{"egressProxy":{"address":"p:1080"}}}`, 400},
			{`{"templateID":"base","network":{"rules":{"example.com":[{}]}}}`, 400},
			{`{"templateID":"base","network":{"maskRequestHost":"localhost:${PORT}"}}`, 400},
			{`{"templateID":"base","network":{"httpsPorts":[8443]}}`, 400},
			{`{"templateID":"base","network":{"denyOut":["example.com"]}}`, 400},
			{`{"templateID":"base","network":{"denyOut":["0.0.0.0/0"],"allowOut":["a..b"]}}`, 400},
			{`{"templateID":"base","network":{"denyOut":["1.2.3.4/99"]}}`, 400},
			{`{"templateID":"base","network":{"allowOut":"8.8.8.8"}}`, 400},
			// This server runs without networking: it cannot let a sandbox
			// reach only some places (but loopback is "no internet").
			{`{"templateID":"base","network":{"denyOut":["0.0.0.0/0"],"allowOut":["8.8.8.8"]}}`, 503},
			{`{"templateID":"base","network":{"denyOut":["8.8.8.8"]}}`, 503},
			{`{"templateID":"base","mcp":{"x":{}}}`, 400},
			{`{"templateID":"base","volumeMounts":[{"name":"v","path":"/v"}]}`, 400},
			{`{"templateID":"base","autoResume":{"enabled":true}}`, 400},
			{`{"templateID":"base","autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true}}`, 400},
			{`{"templateID":"base","timeout":"soon"}`, 400},
			{`{"templateID":"base","` + strings.Repeat("x", 2<<20) + `":1}`, 413},
		} {
			d.e2b(t, e2bReq{method: "POST", path: "/v2/sandboxes", key: key, body: c.body}).want(t, "create "+truncateForLog(c.body), c.status)
		}
	})

	t.Run("network", func(t *testing.T) {
		a := d.e2b(t, e2bReq{method: "POST", path: "/v2/sandboxes", key: key, body: `{"templateID":"base","allow_internet_access":false,"timeout":60}`})
		a.want(t, "create without internet on a server without networking", 201)
		var sb struct{ SandboxID string }
		json.Unmarshal(a.body, &sb)
		a = d.e2b(t, e2bReq{method: "GET", path: "/sandboxes/" + sb.SandboxID, key: key})
		if !bytes.Contains(a.body, []byte(`"allowInternetAccess":false`)) || !bytes.Contains(a.body, []byte(`"denyOut":["0.0.0.0/0"]`)) {
			t.Errorf("get: %s", a.body)
		}
		d.e2b(t, e2bReq{method: "DELETE", path: "/sandboxes/" + sb.SandboxID, key: key}).want(t, "kill", 204)
		for _, c := range []struct {
			body   string
			status int
		}{
			{``, 400}, {`{`, 400}, {`{"denyOut":["example.com"]}`, 400}, {`{"allowOut":[1]}`, 400},
			{`{"egressProxy":{"address":"p:1"}}`, 400}, {`{"rules":{"a.com":[]}}`, 400},
			{`{"denyOut":["` + strings.Repeat("1", 300) + `"]}`, 400},
			{`{}`, 503}, {`{"allow_internet_access":false}`, 503},
		} {
			d.e2b(t, e2bReq{method: "PUT", path: "/sandboxes/" + id + "/network", key: key, body: c.body}).want(t, "updateNetwork "+c.body, c.status)
		}
		d.e2b(t, e2bReq{method: "PUT", path: "/sandboxes/nosuchsandbox0000000/network", key: key, body: `{}`}).want(t, "updateNetwork of an unknown sandbox", 404)
		d.e2b(t, e2bReq{method: "PUT", path: "/sandboxes/x/network", key: key, body: `{}`}).want(t, "updateNetwork of a malformed ID", 404)
		d.e2b(t, e2bReq{method: "PUT", path: "/sandboxes/" + id + "/network", body: `{}`}).want(t, "updateNetwork without a key", 401)
	})

	t.Run("another key's sandbox", func(t *testing.T) {
		otherKey, code := d.cli("key", "create", "--name", "e2b-other")
		if code != 0 {
			t.Fatalf("key create: %s", otherKey)
		}
		otherKey = strings.TrimSpace(otherKey)
		theirs := d.e2b(t, e2bReq{method: "POST", path: "/v2/sandboxes", key: otherKey, body: `{"templateID":"base","timeout":120,"metadata":{"who":"hostile"}}`})
		theirs.want(t, "their create", 201)
		var tsb struct{ SandboxID, EnvdAccessToken string }
		json.Unmarshal(theirs.body, &tsb)
		for _, k := range []struct{ key, sb string }{{key, tsb.SandboxID}, {otherKey, id}, {"e2b_" + strings.TrimPrefix(otherKey, "atoll_"), id}} {
			for _, c := range []struct{ method, path, body string }{
				{"GET", "", ""}, {"DELETE", "", ""},
				{"POST", "/timeout", `{"timeout":10}`}, {"POST", "/refreshes", `{"duration":10}`},
				{"POST", "/pause", `{}`}, {"POST", "/resume", `{}`}, {"POST", "/connect", `{"timeout":10}`},
				{"POST", "/fork", `{}`}, {"POST", "/snapshots", `{}`}, {"PUT", "/network", `{}`},
				{"GET", "/metrics", ""},
			} {
				path := "/sandboxes/" + k.sb + c.path
				d.e2b(t, e2bReq{method: c.method, path: path, key: k.key, body: c.body}).want(t, "another key's "+c.method+" "+path, 404)
			}
			d.e2b(t, e2bReq{method: "POST", path: "/v2/sandboxes/" + k.sb + "/connect", key: k.key, body: `{}`}).want(t, "another key's v2 connect", 404)
		}
		// Lists show only the key's own.
		for _, k := range []struct{ key, own, not string }{{key, id, tsb.SandboxID}, {otherKey, tsb.SandboxID, id}} {
			for _, path := range []string{"/v2/sandboxes?metadata=" + url.QueryEscape("who=hostile"), "/sandboxes"} {
				a := d.e2b(t, e2bReq{method: "GET", path: path, key: k.key})
				a.want(t, "list "+path, 200)
				if !bytes.Contains(a.body, []byte(k.own)) || bytes.Contains(a.body, []byte(k.not)) {
					t.Errorf("list %s shows another key's sandbox or not its own: %s", path, a.body)
				}
			}
		}
		// Their sandbox still runs; its envd answers its own token only.
		d.e2b(t, e2bReq{method: "GET", path: "/sandboxes/" + tsb.SandboxID, key: otherKey}).want(t, "their get", 200)
		d.e2b(t, e2bReq{method: "GET", path: "/health", header: map[string]string{"E2b-Sandbox-Id": tsb.SandboxID, "E2b-Sandbox-Port": "49983"}}).want(t, "their envd health", 204)
		d.e2b(t, e2bReq{method: "POST", path: "/process.Process/List", body: "{}", key: key,
			header: map[string]string{"E2b-Sandbox-Id": tsb.SandboxID, "E2b-Sandbox-Port": "49983", "X-Access-Token": token}}).want(t, "their envd with my token", 401)
		// Their snapshots are not mine to list, use or delete.
		a := d.e2b(t, e2bReq{method: "POST", path: "/sandboxes/" + tsb.SandboxID + "/snapshots", key: otherKey, body: `{"name":"their-snap"}`})
		a.want(t, "their snapshot", 201)
		var snap struct{ SnapshotID string }
		json.Unmarshal(a.body, &snap)
		a = d.e2b(t, e2bReq{method: "GET", path: "/snapshots", key: key})
		if a.status != 200 || bytes.Contains(a.body, []byte(snap.SnapshotID)) {
			t.Errorf("my snapshot list: %d %s", a.status, a.body)
		}
		for _, tmpl := range []string{snap.SnapshotID, "their-snap"} {
			d.e2b(t, e2bReq{method: "POST", path: "/v2/sandboxes", key: key, body: `{"templateID":"` + tmpl + `"}`}).want(t, "create from their snapshot "+tmpl, 404)
		}
		d.e2b(t, e2bReq{method: "DELETE", path: "/templates/" + snap.SnapshotID, key: key}).want(t, "delete their snapshot", 404)
		d.e2b(t, e2bReq{method: "DELETE", path: "/templates/" + snap.SnapshotID, key: otherKey}).want(t, "they delete their snapshot", 204)
		d.e2b(t, e2bReq{method: "DELETE", path: "/sandboxes/" + tsb.SandboxID, key: otherKey}).want(t, "their kill", 204)
	})

	t.Run("bad queries and bodies", func(t *testing.T) {
		for _, q := range []string{"state=dead", "limit=0", "limit=101", "limit=x", "order=up", "startedAfter=yesterday", "nextToken=%25%25", "nextToken=bm9wZQ", "metadata=" + url.QueryEscape("k=%zz")} {
			d.e2b(t, e2bReq{method: "GET", path: "/v2/sandboxes?" + q, key: key}).want(t, "list "+q, 400)
		}
		a := d.e2b(t, e2bReq{method: "GET", path: "/v2/sandboxes?metadata=" + url.QueryEscape("who=hostile"), key: key})
		a.want(t, "list by metadata", 200)
		if !bytes.Contains(a.body, []byte(id)) || bytes.Contains(a.body, []byte(other)) {
			t.Errorf("metadata filter: %s", a.body)
		}
		d.e2b(t, e2bReq{method: "POST", path: "/sandboxes/" + id + "/timeout", key: key, body: `{}`}).want(t, "timeout without timeout", 400)
		d.e2b(t, e2bReq{method: "POST", path: "/sandboxes/" + id + "/timeout", key: key, body: `{"timeout":-5}`}).want(t, "negative timeout", 400)
		d.e2b(t, e2bReq{method: "POST", path: "/sandboxes/" + id + "/fork", key: key, body: `{"count":1000}`}).want(t, "fork 1000", 400)
		d.e2b(t, e2bReq{method: "POST", path: "/sandboxes/" + id + "/snapshots", key: key, body: `{"name":"../x"}`}).want(t, "snapshot name", 400)
		for _, q := range []string{"start=yesterday", "end=-1", "start=1.5", "start=99999999999999999999", "start=2000&end=1000"} {
			d.e2b(t, e2bReq{method: "GET", path: "/sandboxes/" + id + "/metrics?" + q, key: key}).want(t, "metrics?"+q, 400)
		}
		d.e2b(t, e2bReq{method: "GET", path: "/sandboxes/x/metrics", key: key}).want(t, "metrics of a malformed ID", 404)
		d.e2b(t, e2bReq{method: "GET", path: "/sandboxes/metrics?sandbox_ids=" + id + ",%2e%2e", key: key}).want(t, "latest metrics of a malformed ID", 400)
		d.e2b(t, e2bReq{method: "GET", path: "/sandboxes/" + id + "/logs", key: key}).want(t, "logs", 200)
		for _, q := range []string{"limit=-1", "limit=100000", "start=yesterday"} {
			d.e2b(t, e2bReq{method: "GET", path: "/sandboxes/" + id + "/logs?" + q, key: key}).want(t, "logs?"+q, 400)
		}
		d.e2b(t, e2bReq{method: "GET", path: "/v2/sandboxes/" + id + "/logs?direction=up", key: key}).want(t, "v2 logs direction=up", 400)
		d.e2b(t, e2bReq{method: "GET", path: "/sandboxes/aaaaaaaaaaaaaaaaaaaa/logs", key: key}).want(t, "logs of no sandbox", 404)
		d.e2b(t, e2bReq{method: "GET", path: "/no/such/route", key: key}).want(t, "unknown route", 404)
		d.e2b(t, e2bReq{method: "DELETE", path: "/templates/base", key: key}).want(t, "delete a template", 404)
	})

	// rpc returns Connect clients for sandbox sb with these extra headers.
	rpc := func(sb string, h map[string]string) (processconnect.ProcessClient, filesystemconnect.FilesystemClient) {
		hdr := headerTransport{"E2b-Sandbox-Id": sb, "E2b-Sandbox-Port": strconv.Itoa(envd.Port)}
		for k, v := range h {
			hdr[k] = v
		}
		hc := &http.Client{Transport: hdr}
		return processconnect.NewProcessClient(hc, d.url, connect.WithProtoJSON()),
			filesystemconnect.NewFilesystemClient(hc, d.url, connect.WithProtoJSON())
	}
	code := func(err error) connect.Code {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return ce.Code()
		}
		return 0
	}
	ctx := context.Background()

	t.Run("envd tokens", func(t *testing.T) {
		for name, h := range map[string]map[string]string{
			"no token":              nil,
			"wrong token":           {"X-Access-Token": "x"},
			"other sandbox's token": {"X-Access-Token": otherToken},
		} {
			p, f := rpc(id, h)
			if _, err := p.List(ctx, connect.NewRequest(&process.ListRequest{})); code(err) != connect.CodeUnauthenticated {
				t.Errorf("%s: List: %v", name, err)
			}
			if _, err := f.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "/"})); code(err) != connect.CodeUnauthenticated {
				t.Errorf("%s: Stat: %v", name, err)
			}
			hdr := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983"}
			for k, v := range h {
				hdr[k] = v
			}
			d.e2b(t, e2bReq{method: "GET", path: "/files?path=/etc/hostname", header: hdr}).want(t, name+": download", 401)
		}
		p, _ := rpc(id, map[string]string{"X-Access-Token": token})
		if _, err := p.List(ctx, connect.NewRequest(&process.ListRequest{})); err != nil {
			t.Errorf("List with the token: %v", err)
		}
	})

	t.Run("signed file URLs", func(t *testing.T) {
		hdr := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983"}
		file := func(q url.Values) e2bAnswer {
			return d.e2b(t, e2bReq{method: "GET", path: "/files?" + q.Encode(), header: hdr})
		}
		sig := envd.Signature("/etc/hostname", "read", "", token, 0)
		a := file(url.Values{"path": {"/etc/hostname"}, "signature": {sig}})
		a.want(t, "signed download", 200)
		if host, _ := os.ReadFile("/etc/hostname"); bytes.Equal(a.body, host) {
			t.Errorf("read the host's /etc/hostname")
		}
		file(url.Values{"path": {"/etc/passwd"}, "signature": {sig}}).want(t, "signature of another path", 401)
		file(url.Values{"path": {"/etc/hostname"}, "signature": {envd.Signature("/etc/hostname", "write", "", token, 0)}}).want(t, "write signature used to read", 401)
		file(url.Values{"path": {"/etc/hostname"}, "signature": {envd.Signature("/etc/hostname", "read", "", otherToken, 0)}}).want(t, "other sandbox's signature", 401)
		past := time.Now().Add(-time.Minute).Unix()
		file(url.Values{"path": {"/etc/hostname"}, "signature": {envd.Signature("/etc/hostname", "read", "", token, past)}, "signature_expiration": {strconv.FormatInt(past, 10)}}).want(t, "expired signature", 401)
		future := time.Now().Add(time.Minute).Unix()
		file(url.Values{"path": {"/etc/hostname"}, "signature": {envd.Signature("/etc/hostname", "read", "", token, future)}, "signature_expiration": {strconv.FormatInt(future, 10)}}).want(t, "signature with expiration", 200)
		file(url.Values{"path": {"/etc/hostname"}, "signature": {envd.Signature("/etc/hostname", "read", "", token, future)}, "signature_expiration": {"x"}}).want(t, "bad expiration", 401)
		// With E2B_SANDBOX_URL, SDKs' URLs name no sandbox: the signature does.
		unrouted := func(q url.Values) e2bAnswer { return d.e2b(t, e2bReq{method: "GET", path: "/files?" + q.Encode()}) }
		if a := unrouted(url.Values{"path": {"/etc/hostname"}, "signature": {sig}}); a.status != 200 || len(a.body) == 0 {
			t.Errorf("signed download naming no sandbox: %d %s", a.status, a.body)
		}
		unrouted(url.Values{"path": {"/etc/passwd"}, "signature": {sig}}).want(t, "another path's signature naming no sandbox", 404)
		unrouted(url.Values{"path": {"/etc/hostname"}, "signature": {"v1_junk"}}).want(t, "malformed signature naming no sandbox", 404)
		unrouted(url.Values{"path": {"/etc/hostname"}, "signature": {envd.Signature("/etc/hostname", "read", "", token, past)}, "signature_expiration": {strconv.FormatInt(past, 10)}}).want(t, "expired signature naming no sandbox", 401)
	})

	t.Run("envd hostile input", func(t *testing.T) {
		p, f := rpc(id, map[string]string{"X-Access-Token": token})
		h := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983", "X-Access-Token": token}
		for _, c := range []struct {
			name string
			err  error
			want connect.Code
		}{
			{"pid 0", errOnly(p.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 0}}, Signal: process.Signal_SIGNAL_SIGKILL}))), connect.CodeInvalidArgument},
			{"huge pid", errOnly(p.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 4000000000}}, Signal: process.Signal_SIGNAL_SIGKILL}))), connect.CodeInvalidArgument},
			{"no such pid", errOnly(p.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 99999}}, Signal: process.Signal_SIGNAL_SIGKILL}))), connect.CodeNotFound},
			{"signal 0", errOnly(p.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 1}}}))), connect.CodeInvalidArgument},
			{"no selector", errOnly(p.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{}))), connect.CodeInvalidArgument},
			{"empty command", startErr(ctx, p, &process.StartRequest{Process: &process.ProcessConfig{}}), connect.CodeInvalidArgument},
			{"no such cwd", startErr(ctx, p, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "true", Cwd: ptr("/nope")}}), connect.CodeInvalidArgument},
			{"NUL in args", startErr(ctx, p, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "echo", Args: []string{"a\x00b"}}}), connect.CodeInvalidArgument},
			{"huge pty", startErr(ctx, p, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "bash"}, Pty: &process.PTY{Size: &process.PTY_Size{Rows: 1 << 20, Cols: 80}}}), connect.CodeInvalidArgument},
			{"other user's home", errOnly(f.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "~root/x"}))), connect.CodeInvalidArgument},
			{"NUL in path", errOnly(f.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "/etc\x00/passwd"}))), connect.CodeInvalidArgument},
			{"list a file", errOnly(f.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: "/etc/hostname"}))), connect.CodeInvalidArgument},
			{"makeDir over a file", errOnly(f.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: "/etc/hostname"}))), connect.CodeInvalidArgument},
			{"remove /", errOnly(f.Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{Path: "/"}))), connect.CodeInvalidArgument},
			{"another sandbox's watcher", errOnly(f.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: watcherOf(t, ctx, rpc, other, otherToken)}))), connect.CodeNotFound},
		} {
			if code(c.err) != c.want {
				t.Errorf("%s: %v, want %v", c.name, c.err, c.want)
			}
		}
		// A user that does not exist is refused, as by E2B's envd.
		h["Authorization"] = "Basic " + basic("nobody-here")
		_, f2 := rpc(id, h)
		if _, err := f2.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "x"})); code(err) != connect.CodeUnauthenticated {
			t.Errorf("unknown user: %v", err)
		}
		delete(h, "Authorization")
		d.e2b(t, e2bReq{method: "GET", path: "/files?path=/etc", header: h}).want(t, "download a directory", 400)
		d.e2b(t, e2bReq{method: "GET", path: "/files?path=/nope", header: h}).want(t, "download a missing file", 404)
		d.e2b(t, e2bReq{method: "GET", path: "/files", header: h}).want(t, "download without path", 400)
		d.e2b(t, e2bReq{method: "GET", path: "/files?path=x&username=nobody-here", header: h}).want(t, "download as an unknown user", 401)
		d.e2b(t, e2bReq{method: "POST", path: "/files?path=/tmp/x", header: h, body: "raw"}).want(t, "upload of an unknown type", 400)
		h["Content-Type"] = "application/octet-stream"
		d.e2b(t, e2bReq{method: "POST", path: "/files", header: h, body: "raw"}).want(t, "raw upload without path", 400)
		d.e2b(t, e2bReq{method: "POST", path: "/files?path=/etc", header: h, body: "raw"}).want(t, "upload over a directory", 400)
		// File metadata past E2B's limits: a 400 and nothing written.
		many := map[string]string{}
		for i := range 500 {
			many[fmt.Sprintf("X-Metadata-Key%d", i)] = "v"
		}
		for name, meta := range map[string]map[string]string{
			"metadata key too long":  {"X-Metadata-" + strings.Repeat("k", 300): "v"},
			"metadata too large":     {"X-Metadata-K": strings.Repeat("v", 5000)},
			"too many metadata keys": many,
			"non-ASCII metadata":     {"X-Metadata-K": "\xc3\xa9"},
		} {
			hm := maps.Clone(h)
			maps.Copy(hm, meta)
			d.e2b(t, e2bReq{method: "POST", path: "/files?path=/tmp/meta", header: hm, body: "raw"}).want(t, name, 400)
		}
		d.e2b(t, e2bReq{method: "GET", path: "/files?path=/tmp/meta", header: h}).want(t, "a file refused for its metadata", 404)
		h["Content-Encoding"] = "gzip"
		d.e2b(t, e2bReq{method: "POST", path: "/files?path=/tmp/x", header: h, body: "not gzip"}).want(t, "bad gzip", 400)
	})

	t.Run("routing", func(t *testing.T) {
		h := func(sb, port string) map[string]string {
			return map[string]string{"E2b-Sandbox-Id": sb, "E2b-Sandbox-Port": port, "X-Access-Token": token}
		}
		d.e2b(t, e2bReq{method: "GET", path: "/health", header: h(id, "49983")}).want(t, "envd health", 204)
		d.e2b(t, e2bReq{method: "GET", path: "/health", header: h(id, "8080")}).want(t, "another port", 502)
		d.e2b(t, e2bReq{method: "GET", path: "/health", header: h(id, "0")}).want(t, "port 0", 400)
		d.e2b(t, e2bReq{method: "GET", path: "/health", header: h(id, "x")}).want(t, "port x", 400)
		wantNotFound(t, "unknown sandbox", d.e2b(t, e2bReq{method: "GET", path: "/health", header: h("nosuchsandbox0000000", "49983")}), "nosuchsandbox0000000")
		wantNotFound(t, "malformed sandbox", d.e2b(t, e2bReq{method: "GET", path: "/health", header: h("../../x", "49983")}), "../../x")
		wantNotFound(t, "unknown sandbox's port", d.e2b(t, e2bReq{method: "GET", path: "/", header: h("nosuchsandbox0000000", "8000")}), "nosuchsandbox0000000")
		// E2B_DOMAIN-style hosts reach the same sandbox, even under /v1.
		d.e2b(t, e2bReq{method: "GET", path: "/health", host: "49983-" + id + ".sandbox.test"}).want(t, "host routing", 204)
		// (envd's answer, not atoll's list: it wants the access token)
		d.e2b(t, e2bReq{method: "GET", path: "/v1/sandboxes", host: "49983-" + id + ".sandbox.test"}).want(t, "host routing under /v1", 401)
		// atoll's own API is unaffected.
		d.e2b(t, e2bReq{method: "GET", path: "/v1/health"}).want(t, "atoll health", 200)
	})

	t.Run("killed sandbox", func(t *testing.T) {
		d.e2b(t, e2bReq{method: "DELETE", path: "/sandboxes/" + other, key: key}).want(t, "kill", 204)
		d.e2b(t, e2bReq{method: "DELETE", path: "/sandboxes/" + other, key: key}).want(t, "kill again", 404)
		for _, c := range []struct{ method, path, body string }{
			{"GET", "", ""},
			{"POST", "/timeout", `{"timeout":10}`},
			{"POST", "/refreshes", `{"duration":10}`},
			{"POST", "/pause", `{}`},
			{"POST", "/resume", `{}`},
			{"POST", "/connect", `{"timeout":10}`},
			{"POST", "/fork", `{}`},
			{"POST", "/snapshots", `{}`},
		} {
			path := "/sandboxes/" + other + c.path
			d.e2b(t, e2bReq{method: c.method, path: path, key: key, body: c.body}).want(t, c.method+" "+path, 404)
		}
		wantNotFound(t, "envd of a killed sandbox", d.e2b(t, e2bReq{method: "POST", path: "/process.Process/List", body: "{}",
			header: map[string]string{"E2b-Sandbox-Id": other, "E2b-Sandbox-Port": "49983", "X-Access-Token": otherToken}}), other)
		wantNotFound(t, "envd of a killed sandbox by host", d.e2b(t, e2bReq{method: "GET", path: "/health", host: "49983-" + other + ".sandbox.test"}), other)
	})

	t.Run("states", func(t *testing.T) {
		d.e2b(t, e2bReq{method: "POST", path: "/sandboxes/" + id + "/resume", key: key, body: `{}`}).want(t, "resume a running sandbox", 409)
		d.e2b(t, e2bReq{method: "POST", path: "/sandboxes/" + id + "/pause", key: key}).want(t, "pause", 204)
		d.e2b(t, e2bReq{method: "POST", path: "/sandboxes/" + id + "/pause", key: key}).want(t, "pause again", 409)
		d.e2b(t, e2bReq{method: "POST", path: "/sandboxes/" + id + "/timeout", key: key, body: `{"timeout":10}`}).want(t, "timeout of a paused sandbox", 404)
		wantNotFound(t, "envd of a paused sandbox", d.e2b(t, e2bReq{method: "GET", path: "/health", header: map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49983"}}), id)
		d.e2b(t, e2bReq{method: "POST", path: "/sandboxes/" + id + "/connect", key: key, body: `{"timeout":30}`}).want(t, "connect wakes it", 201)
		d.e2b(t, e2bReq{method: "POST", path: "/sandboxes/" + id + "/connect", key: key, body: `{"timeout":30}`}).want(t, "connect to a running one", 200)
	})
}

// wantNotFound checks that a is E2B's proxy's answer for a sandbox it
// cannot reach, word for word: SDKs and agent code match on it.
func wantNotFound(t *testing.T, what string, a e2bAnswer, id string) {
	t.Helper()
	a.want(t, what, 502)
	var got map[string]any
	if err := json.Unmarshal(a.body, &got); err != nil {
		t.Fatalf("%s: %v: %s", what, err, a.body)
	}
	want := map[string]any{"code": 502.0, "message": "The sandbox was not found", "sandboxId": id}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s: body (-want +got):\n%s", what, diff)
	}
}

func errOnly[T any](_ T, err error) error { return err }

func ptr[T any](v T) *T { return &v }

func basic(user string) string {
	r, _ := http.NewRequest("GET", "/", nil)
	r.SetBasicAuth(user, "")
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Basic ")
}

// startErr is the error a Start stream ends with.
func startErr(ctx context.Context, p processconnect.ProcessClient, req *process.StartRequest) error {
	s, err := p.Start(ctx, connect.NewRequest(req))
	if err != nil {
		return err
	}
	defer s.Close()
	for s.Receive() {
	}
	return s.Err()
}

// watcherOf creates a polling watcher in sandbox sb and returns its ID.
func watcherOf(t *testing.T, ctx context.Context, rpc func(string, map[string]string) (processconnect.ProcessClient, filesystemconnect.FilesystemClient), sb, token string) string {
	t.Helper()
	_, f := rpc(sb, map[string]string{"X-Access-Token": token})
	resp, err := f.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: "/tmp"}))
	if err != nil {
		t.Fatalf("CreateWatcher: %v", err)
	}
	return resp.Msg.WatcherId
}

func truncateForLog(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
