package envd

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/e2b/envd/spec/filesystem"
	"github.com/atoll-dev/atoll/internal/e2b/envd/spec/filesystem/filesystemconnect"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// envdEnv is envd served over a real agent running in this process on a
// scratch directory; requests act as root, whom every host has.
type envdEnv struct {
	url string
	dir string
	fs  filesystemconnect.FilesystemClient
}

func startEnvd(t *testing.T) *envdEnv {
	t.Helper()
	testenv.RequireRoot(t)
	dir, err := os.MkdirTemp("", "envd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	probe := filepath.Join(dir, "probe")
	os.WriteFile(probe, nil, 0o644)
	if err := unix.Setxattr(probe, "user.probe", []byte("x"), 0); err != nil {
		testenv.Skip(t, dir+" keeps no user extended attributes: "+err.Error())
	}
	os.Remove(probe)
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Config{Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		a.Close()
	})
	client := agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	s := New(Config{})
	t.Cleanup(s.Close)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.Serve(w, r, Sandbox{ID: "sb", Agent: client})
	}))
	t.Cleanup(srv.Close)
	hc := &http.Client{Transport: rootAuth{}}
	return &envdEnv{url: srv.URL, dir: dir, fs: filesystemconnect.NewFilesystemClient(hc, srv.URL)}
}

// rootAuth names the user as E2B SDKs do, in basic auth.
type rootAuth struct{}

func (rootAuth) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.SetBasicAuth("root", "")
	return http.DefaultTransport.RoundTrip(r)
}

// upload posts body to path as the SDK does, raw or as a form, with the
// headers h; it returns the status and the answer's body.
func (e *envdEnv) upload(t *testing.T, path, body string, form bool, h map[string]string) (int, []byte) {
	t.Helper()
	var rb io.Reader = strings.NewReader(body)
	ct := "application/octet-stream"
	if form {
		var b bytes.Buffer
		mw := multipart.NewWriter(&b)
		fw, _ := mw.CreateFormFile("file", path)
		io.WriteString(fw, body)
		mw.Close()
		rb, ct = &b, mw.FormDataContentType()
	}
	req, _ := http.NewRequest("POST", e.url+"/files?"+url.Values{"path": {path}, "username": {"root"}}.Encode(), rb)
	req.Header.Set("Content-Type", ct)
	for k, v := range h {
		req.Header[k] = []string{v} // as sent: no canonical case
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func (e *envdEnv) stat(t *testing.T, p string) map[string]string {
	t.Helper()
	res, err := e.fs.Stat(t.Context(), connect.NewRequest(&filesystem.StatRequest{Path: p}))
	if err != nil {
		t.Fatalf("stat %s: %v", p, err)
	}
	return res.Msg.Entry.Metadata
}

// Metadata sent with an upload as X-Metadata-* headers is on the file's
// user.e2b.* attributes and in the upload's answer, Stat, ListDir and
// Move; an upload without it leaves none.
func TestUploadMetadata(t *testing.T) {
	e := startEnvd(t)
	for _, form := range []bool{false, true} {
		p := filepath.Join(e.dir, "m", map[bool]string{false: "raw.txt", true: "form.txt"}[form])
		status, body := e.upload(t, p, "data", form, map[string]string{"X-Metadata-Owner": "agent-7", "x-metadata-run": "42", "X-Metadata-Empty": ""})
		if status != 200 {
			t.Fatalf("upload: %d %s", status, body)
		}
		want := map[string]string{"owner": "agent-7", "run": "42", "empty": ""}
		var got []fileEntry
		if err := json.Unmarshal(body, &got); err != nil || len(got) != 1 {
			t.Fatalf("answer %s: %v", body, err)
		}
		if d := cmp.Diff(want, got[0].Metadata); d != "" {
			t.Errorf("upload answer's metadata (-want +got):\n%s", d)
		}
		if d := cmp.Diff(want, e.stat(t, p)); d != "" {
			t.Errorf("Stat metadata (-want +got):\n%s", d)
		}
		v := make([]byte, 16)
		if n, err := unix.Getxattr(p, "user.e2b.owner", v); err != nil || string(v[:n]) != "agent-7" {
			t.Errorf("user.e2b.owner of %s: %q, %v", p, v[:n], err)
		}
	}
	ls, err := e.fs.ListDir(t.Context(), connect.NewRequest(&filesystem.ListDirRequest{Path: filepath.Join(e.dir, "m")}))
	if err != nil || len(ls.Msg.Entries) != 2 {
		t.Fatalf("ListDir: %v, %v", ls, err)
	}
	for _, en := range ls.Msg.Entries {
		if en.Metadata["owner"] != "agent-7" {
			t.Errorf("ListDir entry %s: metadata %v", en.Name, en.Metadata)
		}
	}
	src, dst := filepath.Join(e.dir, "m", "raw.txt"), filepath.Join(e.dir, "moved", "raw.txt")
	mv, err := e.fs.Move(t.Context(), connect.NewRequest(&filesystem.MoveRequest{Source: src, Destination: dst}))
	if err != nil || mv.Msg.Entry.Metadata["run"] != "42" {
		t.Fatalf("Move: %v, %v", mv, err)
	}
	// Overwritten without metadata: none is left, in the answer or on disk.
	status, body := e.upload(t, dst, "new", false, nil)
	if status != 200 || bytes.Contains(body, []byte("metadata")) {
		t.Errorf("overwrite: %d %s", status, body)
	}
	if m := e.stat(t, dst); m != nil {
		t.Errorf("metadata after an overwrite without any: %v", m)
	}
}

// Hostile metadata is a 400 with envd's JSON error, and nothing is written.
func TestUploadMetadataHostile(t *testing.T) {
	e := startEnvd(t)
	p := filepath.Join(e.dir, "hostile.txt")
	many := map[string]string{}
	for i := range 500 {
		many["X-Metadata-K"+strings.Repeat("k", i%40)+string(rune('a'+i/40))] = "v"
	}
	for name, h := range map[string]map[string]string{
		"key too long":   {"X-Metadata-" + strings.Repeat("k", 247): "v"},
		"value too long": {"X-Metadata-K": strings.Repeat("v", 5000)},
		"too many keys":  many,
		"empty key":      {"X-Metadata-": "v"},
		// Control bytes and NUL never get here: Go's HTTP server refuses
		// them in any header.
		"UTF-8 value": {"X-Metadata-K": "\xc3\xa9"},
	} {
		for _, form := range []bool{false, true} {
			status, body := e.upload(t, p, "x", form, h)
			var je struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if status != 400 || json.Unmarshal(body, &je) != nil || je.Code != 400 || !strings.Contains(je.Message, "metadata") {
				t.Errorf("%s (form %v): %d %s, want a 400 naming metadata", name, form, status, body)
			}
			if _, err := os.Lstat(p); err == nil {
				t.Fatalf("%s: the file was written", name)
			}
		}
	}
	// A header the client repeats is refused rather than half taken.
	req, _ := http.NewRequest("POST", e.url+"/files?"+url.Values{"path": {p}, "username": {"root"}}.Encode(), strings.NewReader("x"))
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Add("X-Metadata-K", "1")
	req.Header.Add("X-Metadata-K", "2")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("repeated metadata header: %d, want 400", resp.StatusCode)
	}
}

// WatchDir and the polling watcher with include_entry give the entries of
// create, write and chmod events, metadata included.
func TestWatchIncludeEntry(t *testing.T) {
	e := startEnvd(t)
	dir := filepath.Join(e.dir, "w")
	os.Mkdir(dir, 0o755)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	stream, err := e.fs.WatchDir(ctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: dir, IncludeEntry: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("no start event: %v", stream.Err())
	}
	cw, err := e.fs.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: dir, IncludeEntry: true}))
	if err != nil {
		t.Fatal(err)
	}
	if status, body := e.upload(t, filepath.Join(dir, "f.txt"), "hello", false, map[string]string{"X-Metadata-K": "v"}); status != 200 {
		t.Fatalf("upload: %d %s", status, body)
	}
	check := func(how string, ev *filesystem.FilesystemEvent) bool {
		t.Helper()
		if ev.Name != "f.txt" {
			t.Errorf("%s: event %v", how, ev)
			return false
		}
		en := ev.GetEntry()
		if en == nil {
			t.Errorf("%s: %s event without an entry", how, ev.Type)
			return false
		}
		if en.Path != filepath.Join(dir, "f.txt") || en.Size != 5 || en.Type != filesystem.FileType_FILE_TYPE_FILE || en.Owner != "root" || en.Metadata["k"] != "v" {
			t.Errorf("%s: %s event's entry %v", how, ev.Type, en)
		}
		return ev.Type == filesystem.EventType_EVENT_TYPE_WRITE
	}
	for stream.Receive() {
		if fe := stream.Msg().GetFilesystem(); fe != nil && check("WatchDir", fe) {
			break
		}
	}
	var evs []*filesystem.FilesystemEvent
	for len(evs) < 3 && ctx.Err() == nil {
		res, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&filesystem.GetWatcherEventsRequest{WatcherId: cw.Msg.WatcherId}))
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, res.Msg.Events...)
		time.Sleep(50 * time.Millisecond)
	}
	if len(evs) < 3 {
		t.Fatalf("polling watcher: %v", evs)
	}
	for _, ev := range evs {
		check("GetWatcherEvents", ev)
	}
	// Removes carry none: the file went.
	os.Remove(filepath.Join(dir, "f.txt"))
	for stream.Receive() {
		if fe := stream.Msg().GetFilesystem(); fe != nil && fe.Type == filesystem.EventType_EVENT_TYPE_REMOVE {
			if fe.Entry != nil {
				t.Errorf("remove event with an entry: %v", fe.Entry)
			}
			break
		}
	}
	// Without include_entry, none.
	plain, err := e.fs.WatchDir(ctx, connect.NewRequest(&filesystem.WatchDirRequest{Path: dir, AllowNetworkMounts: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	plain.Receive()
	os.WriteFile(filepath.Join(dir, "g"), nil, 0o644)
	if !plain.Receive() || plain.Msg().GetFilesystem() == nil || plain.Msg().GetFilesystem().Entry != nil {
		t.Errorf("event without include_entry: %v, %v", plain.Msg(), plain.Err())
	}
}
