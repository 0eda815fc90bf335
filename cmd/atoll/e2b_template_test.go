package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/internal/testenv"
)

// E2B's template builds, through the real `atoll serve`: the official SDK's
// Template API (testdata/e2b/template.mjs), then hostile requests and
// uploads.

func TestE2BTemplateSDK(t *testing.T) {
	testenv.RequireRoot(t)
	dir, node := e2bProgram(t)
	d := startDaemon(t, filepath.Join(testenv.Dir(t), "data"))
	other, code := d.cli("key", "create", "--name", "other-team")
	if code != 0 {
		t.Fatalf("key create: %s", other)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test-reporter=spec", "--test-concurrency=1", "template.mjs")
	cmd.Dir = dir
	cmd.Env = append(e2bEnv(d), "E2B_TEST_OTHER_KEY="+strings.TrimSpace(other))
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	t.Logf("node template.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("the e2b SDK template program failed: %v\nserver log:\n%s", err, d.out.String())
	}
}

// tarOf makes a tar of entries, gzip-compressed when gz.
func tarOf(t *testing.T, gz bool, entries ...tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	tw := tar.NewWriter(w)
	for _, h := range entries {
		body := ""
		if h.Typeflag == tar.TypeReg {
			body = "content of " + h.Name + "\n"
			h.Size = int64(len(body))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, body)
	}
	tw.Close()
	if zw != nil {
		zw.Close()
	}
	return buf.Bytes()
}

func TestE2BTemplateHostile(t *testing.T) {
	testenv.RequireRoot(t)
	d := startDaemon(t, filepath.Join(testenv.Dir(t), "data"))
	other, code := d.cli("key", "create", "--name", "other-team")
	if code != 0 {
		t.Fatalf("key create: %s", other)
	}
	otherKey := strings.TrimSpace(other)
	key := d.key
	hash := strings.Repeat("ab", 32)

	// Templates are every tenant's: only the admin's key changes them.
	for _, r := range []e2bReq{
		{method: "POST", path: "/v3/templates", body: `{"name":"x"}`},
		{method: "GET", path: "/templates/x/files/" + hash},
		{method: "POST", path: "/v2/templates/x/builds/0b6a1f0e-0000-4000-8000-000000000000", body: `{}`},
		{method: "GET", path: "/templates/x/builds/0b6a1f0e-0000-4000-8000-000000000000/status"},
		{method: "POST", path: "/templates/tags", body: `{"target":"x","tags":["a"]}`},
		{method: "DELETE", path: "/templates/tags", body: `{"name":"x","tags":["a"]}`},
	} {
		r.key = otherKey
		d.e2b(t, r).want(t, "another tenant's "+r.method+" "+r.path, http.StatusForbidden)
		r.key = ""
		d.e2b(t, r).want(t, "no key: "+r.method+" "+r.path, http.StatusUnauthorized)
	}

	for _, c := range []struct{ body, what string }{
		{`{}`, "no name"},
		{`{"name":"Bad Name!"}`, "bad name"},
		{`{"name":"team/x"}`, "a namespace"},
		{`{"name":"x:3"}`, "a tag that is a version number"},
		{`{"name":"x:v0123456789abcdef012"}`, "a tag shaped as a version ID"},
		{`{"name":"x:bad tag"}`, "a bad tag"},
		{`{"name":"base"}`, "the base alias"},
		{`{"name":"` + strings.Repeat("a", 60) + `:long-tag"}`, "a name and tag over 63 characters"},
		{`{"name":`, "malformed JSON"},
	} {
		d.e2b(t, e2bReq{method: "POST", path: "/v3/templates", key: key, body: c.body}).want(t, c.what, http.StatusBadRequest)
	}
	d.e2b(t, e2bReq{method: "POST", path: "/v3/templates", key: key, body: `{"name":"x","tags":["` + strings.Repeat("a", 2<<20) + `"]}`}).
		want(t, "a body over 1 MiB", http.StatusRequestEntityTooLarge)

	// A build to attack.
	a := d.e2b(t, e2bReq{method: "POST", path: "/v3/templates", key: key, body: `{"name":"hostile"}`})
	a.want(t, "request build", http.StatusAccepted)
	var req struct {
		TemplateID, BuildID string
		Tags                []string
	}
	json.Unmarshal(a.body, &req)
	if req.TemplateID != "hostile" || req.BuildID == "" || len(req.Tags) != 1 || req.Tags[0] != "default" {
		t.Fatalf("request build answered %s", a.body)
	}
	buildPath := "/v2/templates/hostile/builds/" + req.BuildID

	for _, h := range []string{"short", strings.Repeat("g", 64), "..%2F..%2Fetc", strings.Repeat("A", 64)} {
		d.e2b(t, e2bReq{method: "GET", path: "/templates/hostile/files/" + h, key: key}).want(t, "files hash "+h, http.StatusBadRequest)
	}
	uploadURL := func(hash string) string {
		a := d.e2b(t, e2bReq{method: "GET", path: "/templates/hostile/files/" + hash, key: key})
		a.want(t, "upload link", http.StatusCreated)
		var link struct {
			Present bool
			URL     string
		}
		json.Unmarshal(a.body, &link)
		if link.Present || !strings.HasPrefix(link.URL, d.url+"/templates/hostile/files/"+hash+"?") {
			t.Fatalf("upload link %s", a.body)
		}
		return link.URL
	}
	put := func(u string, body []byte) (int, string) {
		r, err := http.NewRequest("PUT", u, bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		return fetch(t, http.DefaultClient, r)
	}

	// Uploads are authorised by their URL's signature, for that hash only.
	u := uploadURL(hash)
	good := tarOf(t, true, tar.Header{Name: "f.txt", Typeflag: tar.TypeReg})
	pu, _ := url.Parse(u)
	q := pu.Query()
	q.Set("signature", strings.Repeat("0", 64))
	for what, bad := range map[string]string{
		"no signature":       d.url + pu.Path,
		"a wrong signature":  d.url + pu.Path + "?" + q.Encode(),
		"another hash's URL": strings.Replace(u, hash, strings.Repeat("cd", 32), 1),
		"another template":   strings.Replace(u, "/hostile/", "/other/", 1),
		"a later expiry":     strings.Replace(u, "expires=", "expires=9", 1),
	} {
		if code, body := put(bad, good); code != http.StatusForbidden || !strings.Contains(body, `"code":403`) {
			t.Errorf("upload with %s: %d %s", what, code, body)
		}
	}

	// Hostile archives are refused with 400 and leave the host alone.
	marker := filepath.Join(t.TempDir(), "escaped")
	for _, c := range []struct {
		what    string
		entries []tar.Header
	}{
		{"tar slip", []tar.Header{{Name: "../../../../../../.." + marker, Typeflag: tar.TypeReg}}},
		{"an absolute path", []tar.Header{{Name: marker, Typeflag: tar.TypeReg}}},
		{"a symlink out, then a file through it", []tar.Header{
			{Name: "out", Typeflag: tar.TypeSymlink, Linkname: filepath.Dir(marker)},
			{Name: "out/escaped", Typeflag: tar.TypeReg}}},
		{"a hard link out", []tar.Header{{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}}},
		{"a device", []tar.Header{{Name: "dev", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}}},
	} {
		for _, gz := range []bool{false, true} {
			h := fmt.Sprintf("%064x", len(c.what)*2+map[bool]int{false: 0, true: 1}[gz])
			code, body := put(uploadURL(h), tarOf(t, gz, c.entries...))
			if code != http.StatusBadRequest || !strings.Contains(body, `"code":400`) {
				t.Errorf("upload of %s (gzip %v): %d %s", c.what, gz, code, body)
			}
			if _, err := os.Lstat(marker); err == nil {
				t.Fatalf("upload of %s wrote %s on the host", c.what, marker)
			}
		}
	}
	if code, body := put(uploadURL(strings.Repeat("ef", 32)), []byte("\x1f\x8bnot gzip at all")); code != http.StatusBadRequest {
		t.Errorf("upload of broken gzip: %d %s", code, body)
	}
	if code, body := put(uploadURL(strings.Repeat("ee", 32)), []byte("not a tar")); code != http.StatusBadRequest {
		t.Errorf("upload of garbage: %d %s", code, body)
	}
	// A body announcing more than the limit is refused before it is read.
	conn, err := net.Dial("tcp", strings.TrimPrefix(d.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	pu, _ = url.Parse(uploadURL(strings.Repeat("dd", 32)))
	fmt.Fprintf(conn, "PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", pu.RequestURI(), int64(5)<<30)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("an upload of 5 GiB: %d", resp.StatusCode)
	}
	conn.Close()

	// The good upload is kept: asked again, it is present.
	if code, body := put(u, good); code != http.StatusOK {
		t.Fatalf("good upload: %d %s", code, body)
	}
	if a := d.e2b(t, e2bReq{method: "GET", path: "/templates/hostile/files/" + hash, key: key}); !strings.Contains(string(a.body), `"present":true`) {
		t.Errorf("after the upload: %s", a.body)
	}

	// Steps atoll cannot build are refused before the build starts.
	for _, c := range []struct{ body, what string }{
		{`{"fromTemplate":"base","steps":[{"type":"ADD","args":["a","b"]}]}`, "an unknown step"},
		{`{"fromTemplate":"base","steps":[{"type":"COPY","args":["f.txt","/f"],"filesHash":"` + strings.Repeat("12", 32) + `"}]}`, "COPY of files not uploaded"},
		{`{"fromTemplate":"base","steps":[{"type":"COPY","args":["f.txt","/f"]}]}`, "COPY without a hash"},
		{`{"fromTemplate":"base","steps":[{"type":"COPY","args":["../f.txt","/f"],"filesHash":"` + hash + `"}]}`, "COPY from outside the context"},
		{`{"fromTemplate":"base","steps":[{"type":"COPY","args":["/etc/passwd","/f"],"filesHash":"` + hash + `"}]}`, "COPY of an absolute source"},
		{`{"fromTemplate":"base","steps":[{"type":"USER","args":["x; rm -rf /"]}]}`, "USER with a shell command"},
		{`{"fromTemplate":"base","steps":[{"type":"ENV","args":["K"]}]}`, "ENV without a value"},
		{`{"fromTemplate":"base","steps":[{"type":"RUN","args":[]}]}`, "RUN without a command"},
		{`{"fromTemplate":"base","steps":[{"type":"RUN","args":["a\u0000b"]}]}`, "a NUL byte"},
		{`{"fromImage":"x","fromImageRegistry":{"type":"registry","username":"u","password":"p"}}`, "registry credentials"},
		{`{"fromImage":"x","fromTemplate":"base"}`, "two bases"},
		{`{"fromTemplate":"base:3"}`, "a version of an alias"},
	} {
		d.e2b(t, e2bReq{method: "POST", path: buildPath, key: key, body: c.body}).want(t, c.what, map[bool]int{true: http.StatusNotFound, false: http.StatusBadRequest}[c.what == "a version of an alias"])
	}
	d.e2b(t, e2bReq{method: "POST", path: buildPath, key: key, body: `{"fromTemplate":"nope-nope"}`}).want(t, "an unknown base template", http.StatusNotFound)
	d.e2b(t, e2bReq{method: "POST", path: "/v2/templates/other/builds/" + req.BuildID, key: key, body: `{}`}).want(t, "the build under another template", http.StatusNotFound)
	d.e2b(t, e2bReq{method: "POST", path: "/v2/templates/hostile/builds/nope", key: key, body: `{}`}).want(t, "an unknown build", http.StatusNotFound)
	for _, q := range []string{"logsOffset=-1", "logsOffset=x", "limit=101"} {
		d.e2b(t, e2bReq{method: "GET", path: "/templates/hostile/builds/" + req.BuildID + "/status?" + q, key: key}).want(t, "status with "+q, http.StatusBadRequest)
	}

	// Started once; a second start is a conflict.
	d.e2b(t, e2bReq{method: "POST", path: buildPath, key: key, body: `{"fromTemplate":"base","steps":[{"type":"COPY","args":["f.txt","/f.txt"],"filesHash":"` + hash + `"}]}`}).
		want(t, "start", http.StatusAccepted)
	d.e2b(t, e2bReq{method: "POST", path: buildPath, key: key, body: `{"fromTemplate":"base"}`}).want(t, "a second start", http.StatusConflict)
	var st struct {
		Status string
		Reason *struct{ Message string }
	}
	for end := time.Now().Add(2 * time.Minute); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		a := d.e2b(t, e2bReq{method: "GET", path: "/templates/hostile/builds/" + req.BuildID + "/status", key: key})
		a.want(t, "status", http.StatusOK)
		json.Unmarshal(a.body, &st)
		if st.Status == "ready" || st.Status == "error" {
			break
		}
	}
	if st.Status != "ready" {
		t.Fatalf("build status %q (%+v)\nserver log:\n%s", st.Status, st.Reason, d.out.String())
	}

	// Tags: of unknown templates 404; bad tags 400.
	d.e2b(t, e2bReq{method: "POST", path: "/templates/tags", key: key, body: `{"target":"nope-nope","tags":["a"]}`}).want(t, "tagging an unknown template", http.StatusNotFound)
	d.e2b(t, e2bReq{method: "POST", path: "/templates/tags", key: key, body: `{"target":"hostile","tags":["7"]}`}).want(t, "a numeric tag", http.StatusBadRequest)
	d.e2b(t, e2bReq{method: "POST", path: "/templates/tags", key: key, body: `{"target":"hostile","tags":[]}`}).want(t, "no tags", http.StatusBadRequest)
	d.e2b(t, e2bReq{method: "POST", path: "/templates/tags", key: key, body: `{"target":"base","tags":["a"]}`}).want(t, "tagging the alias", http.StatusBadRequest)
	d.e2b(t, e2bReq{method: "DELETE", path: "/templates/tags", key: key, body: `{"name":"hostile","tags":["nope"]}`}).want(t, "removing an unknown tag", http.StatusNotFound)
	d.e2b(t, e2bReq{method: "GET", path: "/templates/nope-nope/tags", key: key}).want(t, "tags of an unknown template", http.StatusNotFound)
	d.e2b(t, e2bReq{method: "GET", path: "/templates/aliases/nope-nope", key: otherKey}).want(t, "an unknown alias", http.StatusNotFound)
	d.e2b(t, e2bReq{method: "GET", path: "/templates/aliases/hostile", key: otherKey}).want(t, "a template, for another tenant", http.StatusOK)
}
