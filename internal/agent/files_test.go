package agent

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/atoll-dev/atoll/api"
)

func TestLargeFile(t *testing.T) {
	e := startAgent(t, Config{})
	ctx := context.Background()
	const size = 64 << 20
	p := filepath.Join(e.dir, "new", "parents", "big.bin")

	h := sha256.New()
	src := io.TeeReader(io.LimitReader(rand.NewChaCha8([32]byte{1}), size), h)
	fi, err := e.c.WriteFile(ctx, p, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := h.Sum(nil)
	if fi.Size != size || fi.Mode != 0o644 || fi.Type != api.FileTypeFile || fi.Path != p || fi.Name != "big.bin" {
		t.Errorf("written: %+v", fi)
	}
	if tmps, _ := filepath.Glob(filepath.Join(filepath.Dir(p), ".atoll-write-*")); len(tmps) > 0 {
		t.Errorf("temp files left: %v", tmps)
	}

	resp, err := e.c.HTTPClient().Get(baseURL + "/files?" + url.Values{"path": {p}}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.ContentLength != size {
		t.Errorf("Content-Length %d", resp.ContentLength)
	}
	h.Reset()
	if n, err := io.Copy(h, resp.Body); err != nil || n != size {
		t.Fatalf("read %d bytes: %v", n, err)
	}
	if got := h.Sum(nil); !cmp.Equal(want, got) {
		t.Error("content differs")
	}
}

func TestFiles(t *testing.T) {
	e := startAgent(t, Config{})
	ctx := context.Background()
	d := e.dir
	read := func(p string) string {
		t.Helper()
		r, err := e.c.ReadFile(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		b, _ := io.ReadAll(r)
		return string(b)
	}
	ignore := cmpopts.IgnoreFields(api.FileInfo{}, "ModTime", "Size")

	// write: mode, then mode and owner kept on rewrite, through symlinks
	fi, err := e.c.WriteFile(ctx, d+"/a.sh", strings.NewReader("#!/bin/sh\n"), 0o750)
	if err != nil || fi.Mode != 0o750 {
		t.Fatalf("write with mode: %+v, %v", fi, err)
	}
	os.Chown(d+"/a.sh", 1000, 1001)
	fi, err = e.c.WriteFile(ctx, d+"/a.sh", strings.NewReader("echo hi\n"), 0)
	if err != nil || fi.Mode != 0o750 || fi.UID != 1000 || fi.GID != 1001 {
		t.Fatalf("rewrite: %+v, %v", fi, err)
	}
	if got := read(d + "/a.sh"); got != "echo hi\n" {
		t.Errorf("read %q", got)
	}
	os.Symlink("a.sh", d+"/link")
	if _, err := e.c.WriteFile(ctx, d+"/link", strings.NewReader("via link\n"), 0); err != nil {
		t.Fatal(err)
	}
	if got := read(d + "/a.sh"); got != "via link\n" {
		t.Errorf("write through symlink: %q", got)
	}
	if got := read(d + "/dir/../a.sh"); got != "via link\n" {
		t.Errorf("uncleaned path: %q", got)
	}
	os.WriteFile(d+"/empty", nil, 0o600)
	if got := read(d + "/empty"); got != "" {
		t.Errorf("empty file: %q", got)
	}
	if got := read("/proc/self/status"); !strings.Contains(got, "Name:") {
		t.Errorf("size-0 proc file read as %q", got)
	}

	// stat
	fi, err = e.c.Stat(ctx, d+"/link")
	want := api.FileInfo{Name: "link", Path: d + "/link", Type: api.FileTypeSymlink, Mode: 0o777, Target: "a.sh"}
	if diff := cmp.Diff(want, fi, ignore); err != nil || diff != "" {
		t.Errorf("stat symlink: %v (-want +got):\n%s", err, diff)
	}

	// mkdir -p with mode, idempotent
	fi, err = e.c.Mkdir(ctx, api.MkdirRequest{Path: d + "/m/n/o", Mode: 0o700})
	want = api.FileInfo{Name: "o", Path: d + "/m/n/o", Type: api.FileTypeDir, Mode: 0o700}
	if diff := cmp.Diff(want, fi, ignore); err != nil || diff != "" {
		t.Errorf("mkdir: %v (-want +got):\n%s", err, diff)
	}
	if _, err := e.c.Mkdir(ctx, api.MkdirRequest{Path: d + "/m/n/o"}); err != nil {
		t.Errorf("mkdir again: %v", err)
	}
	os.WriteFile(d+"/m/n/o/f", []byte("x"), 0o644)

	// list
	files, err := e.c.List(ctx, d+"/m/n")
	if err != nil || len(files) != 1 || files[0].Name != "o" || files[0].Path != d+"/m/n/o" {
		t.Errorf("list: %+v, %v", files, err)
	}
	if files, _ := e.c.List(ctx, d+"/m/n/o"); len(files) != 1 || files[0].Size != 1 {
		t.Errorf("list: %+v", files)
	}

	// chmod, setuid bits included
	fi, err = e.c.Chmod(ctx, d+"/a.sh", 0o4755)
	if err != nil || fi.Mode != 0o4755 {
		t.Errorf("chmod: %+v, %v", fi, err)
	}

	// rename
	fi, err = e.c.Rename(ctx, d+"/m", d+"/renamed")
	if err != nil || fi.Path != d+"/renamed" || fi.Type != api.FileTypeDir {
		t.Errorf("rename: %+v, %v", fi, err)
	}
	if _, err := e.c.Stat(ctx, d+"/m"); err == nil {
		t.Error("old name still there")
	}

	// remove
	wantStatus(t, e.c.Remove(ctx, d+"/renamed", false), 409, "conflict")
	if err := e.c.Remove(ctx, d+"/renamed", true); err != nil {
		t.Fatal(err)
	}
	_, err = e.c.Stat(ctx, d+"/renamed")
	wantStatus(t, err, 404, "not_found")
	if err := e.c.Remove(ctx, d+"/link", false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d + "/a.sh"); err != nil {
		t.Errorf("removing a symlink touched its target: %v", err)
	}
}

// watchEvents starts a recursive watch of dir and returns its events.
func watchEvents(t *testing.T, e *testEnv, dir string) <-chan api.WatchEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", baseURL+"/files/watch?"+url.Values{"path": {dir}, "recursive": {"true"}}.Encode(), nil)
	resp, err := e.c.HTTPClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events := make(chan api.WatchEvent, 100)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var ev api.WatchEvent
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
				t.Errorf("bad line %q", sc.Text())
				return
			}
			events <- ev
		}
	}()
	return events
}

func TestWatch(t *testing.T) {
	e := startAgent(t, Config{})
	d := filepath.Join(e.dir, "w")
	os.Mkdir(d, 0o755)
	events := watchEvents(t, e, d)
	// expect reads events until want, skipping others (writes come in bursts).
	expect := func(want api.WatchEvent) {
		t.Helper()
		timeout := time.After(5 * time.Second)
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("stream ended before %+v", want)
				}
				if ev == want {
					return
				}
			case <-timeout:
				t.Fatalf("no %+v", want)
			}
		}
	}
	os.WriteFile(d+"/a", []byte("x"), 0o644)
	expect(api.WatchEvent{Type: api.WatchCreate, Path: d + "/a"})
	expect(api.WatchEvent{Type: api.WatchWrite, Path: d + "/a"})
	os.Chmod(d+"/a", 0o600)
	expect(api.WatchEvent{Type: api.WatchChmod, Path: d + "/a"})
	os.Rename(d+"/a", d+"/b")
	expect(api.WatchEvent{Type: api.WatchRename, Path: d + "/a"})
	expect(api.WatchEvent{Type: api.WatchCreate, Path: d + "/b"})
	os.Remove(d + "/b")
	expect(api.WatchEvent{Type: api.WatchRemove, Path: d + "/b"})
	// New directories are watched too.
	os.Mkdir(d+"/sub", 0o755)
	expect(api.WatchEvent{Type: api.WatchCreate, Path: d + "/sub"})
	os.WriteFile(d+"/sub/c", []byte("x"), 0o644)
	expect(api.WatchEvent{Type: api.WatchCreate, Path: d + "/sub/c"})
	// Removing the watched directory ends the stream.
	os.RemoveAll(d)
	expect(api.WatchEvent{Type: api.WatchRemove, Path: d})
	for range events {
	}
}

// A write through the agent replaces its target atomically, by rename; a
// watcher sees it as E2B's envd's write in place: the target created (if
// new), chmod'ed and written, and never the temporary file.
func TestWatchWrite(t *testing.T) {
	e := startAgent(t, Config{})
	ctx := context.Background()
	d := filepath.Join(e.dir, "ww")
	os.MkdirAll(d+"/sub", 0o755)
	events := watchEvents(t, e, d)
	// next reads the events up to a marker file the test creates.
	marks := 0
	next := func() []api.WatchEvent {
		t.Helper()
		marks++
		mark := filepath.Join(d, fmt.Sprintf("mark%d", marks))
		os.WriteFile(mark, nil, 0o644)
		var got []api.WatchEvent
		timeout := time.After(5 * time.Second)
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatalf("stream ended; got %+v", got)
				}
				if ev.Path == mark {
					return got
				}
				got = append(got, ev)
			case <-timeout:
				t.Fatalf("no marker; got %+v", got)
			}
		}
	}
	next() // the watch is in place

	for _, c := range []struct {
		name, path string
		want       []string
	}{
		{"new file", d + "/a.txt", []string{api.WatchCreate, api.WatchChmod, api.WatchWrite}},
		{"overwrite", d + "/a.txt", []string{api.WatchChmod, api.WatchWrite}},
		{"new file in a subdirectory", d + "/sub/b.txt", []string{api.WatchCreate, api.WatchChmod, api.WatchWrite}},
		{"overwrite in a subdirectory", d + "/sub/b.txt", []string{api.WatchChmod, api.WatchWrite}},
	} {
		if _, err := e.c.WriteFile(ctx, c.path, strings.NewReader("content of "+c.name), 0); err != nil {
			t.Fatal(err)
		}
		var want []api.WatchEvent
		for _, typ := range c.want {
			want = append(want, api.WatchEvent{Type: typ, Path: c.path})
		}
		if diff := cmp.Diff(want, next()); diff != "" {
			t.Errorf("%s: events (-want +got):\n%s", c.name, diff)
		}
	}
	// A directory a write makes is reported, and so is the file in it.
	if _, err := e.c.WriteFile(ctx, d+"/new/c.txt", strings.NewReader("c"), 0); err != nil {
		t.Fatal(err)
	}
	for _, ev := range next() {
		if strings.Contains(ev.Path, ".atoll-write-") {
			t.Errorf("the temporary file shows: %+v", ev)
		}
	}
	if b, err := os.ReadFile(d + "/a.txt"); err != nil || string(b) != "content of overwrite" {
		t.Errorf("a.txt: %q, %v", b, err)
	}
}

// A user query parameter or field gives what a call creates to that user;
// an existing file keeps its owner.
func TestFileOwner(t *testing.T) {
	e := startAgent(t, Config{})
	ctx := context.Background()
	d := e.dir
	fi, err := e.c.WriteFileAs(ctx, d+"/o/p/q.txt", strings.NewReader("x"), 0, "user")
	if err != nil || fi.UID != 1000 || fi.GID != 1000 {
		t.Fatalf("write as user: %+v, %v", fi, err)
	}
	for _, p := range []string{d + "/o", d + "/o/p"} {
		if st, err := e.c.Stat(ctx, p); err != nil || st.UID != 1000 {
			t.Errorf("parent %s: %+v, %v", p, st, err)
		}
	}
	if st, err := e.c.Stat(ctx, d); err != nil || st.UID != 0 {
		t.Errorf("existing parent changed owner: %+v, %v", st, err)
	}
	if _, err := e.c.WriteFile(ctx, d+"/root.txt", strings.NewReader("x"), 0); err != nil {
		t.Fatal(err)
	}
	if fi, err := e.c.WriteFileAs(ctx, d+"/root.txt", strings.NewReader("y"), 0, "user"); err != nil || fi.UID != 0 {
		t.Errorf("rewrite kept owner: %+v, %v", fi, err)
	}
	fi, err = e.c.Mkdir(ctx, api.MkdirRequest{Path: d + "/m1/m2", User: "user"})
	if err != nil || fi.UID != 1000 {
		t.Errorf("mkdir as user: %+v, %v", fi, err)
	}
	_, err = e.c.WriteFileAs(ctx, d+"/nobody.txt", strings.NewReader("x"), 0, "nosuchuser")
	wantStatus(t, err, 400, "invalid")
}
