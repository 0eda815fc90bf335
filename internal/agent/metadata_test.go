package agent

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/filemeta"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// needUserXattrs skips where the test's directory keeps no user extended
// attributes.
func needUserXattrs(t *testing.T, dir string) {
	t.Helper()
	p := filepath.Join(dir, ".xattr-probe")
	os.WriteFile(p, nil, 0o644)
	defer os.Remove(p)
	if err := unix.Setxattr(p, "user.probe", []byte("x"), 0); err != nil {
		t.Skipf("%s keeps no user extended attributes: %v", dir, err)
	}
}

// Metadata written with a file is what stat, list and rename report; it
// stays on the file's own extended attributes, and a write without any
// leaves none.
func TestFileMetadata(t *testing.T) {
	e := startAgent(t, Config{})
	needUserXattrs(t, e.dir)
	ctx := context.Background()
	d := filepath.Join(e.dir, "meta")
	meta := map[string]string{"owner": "agent-7", "run": "42", "Empty": ""}

	fi, err := e.c.Write(ctx, d+"/a.txt", strings.NewReader("a"), WriteOptions{Metadata: meta, User: "user"})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(meta, fi.Metadata); d != "" {
		t.Errorf("write answer's metadata (-want +got):\n%s", d)
	}
	if fi.UID != 1000 {
		t.Errorf("owner %d, want 1000", fi.UID)
	}
	// On the file itself, as user.e2b.* attributes, for setfattr/getfattr.
	v := make([]byte, 64)
	if n, err := unix.Getxattr(d+"/a.txt", filemeta.Prefix+"owner", v); err != nil || string(v[:n]) != "agent-7" {
		t.Errorf("user.e2b.owner = %q, %v", v[:n], err)
	}
	if fi, err := e.c.Stat(ctx, d+"/a.txt"); err != nil || fi.Metadata != nil {
		t.Errorf("Stat without with_metadata: %v, %v; want no metadata", fi.Metadata, err)
	}
	fi, err = e.c.StatMetadata(ctx, d+"/a.txt")
	if err != nil || !cmp.Equal(meta, fi.Metadata) {
		t.Errorf("StatMetadata: %v, %v; want %v", fi.Metadata, err, meta)
	}
	// Set from inside the sandbox, by another tool.
	if err := unix.Setxattr(d+"/a.txt", filemeta.Prefix+"tool", []byte("setfattr"), 0); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(d+"/plain", nil, 0o644)
	list, err := e.c.ListMetadata(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]string{}
	for _, f := range list {
		got[f.Name] = f.Metadata
	}
	want := map[string]map[string]string{"a.txt": {"owner": "agent-7", "run": "42", "Empty": "", "tool": "setfattr"}, "plain": nil}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("ListMetadata (-want +got):\n%s", d)
	}
	fi, err = e.c.RenameMetadata(ctx, d+"/a.txt", d+"/b.txt")
	if err != nil || fi.Metadata["owner"] != "agent-7" || len(fi.Metadata) != 4 {
		t.Errorf("RenameMetadata: %v, %v", fi.Metadata, err)
	}
	// Overwritten without metadata: none left; with other metadata: only that.
	fi, err = e.c.Write(ctx, d+"/b.txt", strings.NewReader("b"), WriteOptions{})
	if err != nil || fi.Metadata != nil {
		t.Fatalf("overwrite: %v, %v", fi.Metadata, err)
	}
	if fi, _ := e.c.StatMetadata(ctx, d+"/b.txt"); fi.Metadata != nil {
		t.Errorf("metadata after an overwrite without any: %v", fi.Metadata)
	}
	e.c.Write(ctx, d+"/b.txt", strings.NewReader("b"), WriteOptions{Metadata: meta})
	fi, err = e.c.Write(ctx, d+"/b.txt", strings.NewReader("b"), WriteOptions{Metadata: map[string]string{"only": "me"}})
	if err != nil || !cmp.Equal(fi.Metadata, map[string]string{"only": "me"}) {
		t.Errorf("overwrite with other metadata: %v, %v", fi.Metadata, err)
	}
}

// Metadata past the limits, or not a JSON object of strings, is a 400
// before anything is written.
func TestFileMetadataHostile(t *testing.T) {
	e := startAgent(t, Config{})
	ctx := context.Background()
	p := filepath.Join(e.dir, "hostile")
	many := map[string]string{}
	for i := range 1000 {
		many[strings.Repeat("k", i%200+1)+string(rune('a'+i/200))] = "v"
	}
	for name, m := range map[string]map[string]string{
		"NUL in key":     {"a\x00b": "v"},
		"NUL in value":   {"k": "a\x00"},
		"CRLF in value":  {"k": "a\r\nX: y"},
		"key too long":   {strings.Repeat("k", filemeta.MaxKeyLen+1): ""},
		"value too long": {"k": strings.Repeat("v", filemeta.MaxTotal)},
		"too many keys":  many,
		"empty key":      {"": "v"},
	} {
		_, err := e.c.Write(ctx, p, strings.NewReader("x"), WriteOptions{Metadata: m})
		wantStatus(t, err, http.StatusBadRequest, "invalid")
		if _, err := os.Lstat(p); err == nil {
			t.Fatalf("%s: the file was written", name)
		}
	}
	for _, raw := range []string{`[]`, `{"k":1}`, `{"k":`, strings.Repeat(" ", 5*filemeta.MaxTotal) + "{}"} {
		q := url.Values{"path": {p}, "metadata": {raw}}
		resp, err := e.c.HTTPClient().Do(must(http.NewRequest("PUT", baseURL+"/files?"+q.Encode(), strings.NewReader("x"))))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("metadata %.20q: status %d, want 400", raw, resp.StatusCode)
		}
	}
	for _, path := range []string{"/files/stat", "/files/list"} {
		q := url.Values{"path": {e.dir}, "with_metadata": {"maybe"}}
		resp, err := e.c.HTTPClient().Get(baseURL + path + "?" + q.Encode())
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s with_metadata=maybe: status %d, want 400", path, resp.StatusCode)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// A watch with entries describes the file of each create, write and chmod
// event, metadata included, and nothing for removes and renames.
func TestWatchEntries(t *testing.T) {
	e := startAgent(t, Config{})
	needUserXattrs(t, e.dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := filepath.Join(e.dir, "we")
	os.Mkdir(d, 0o755)
	ws, err := e.c.WatchWith(ctx, d, WatchOptions{Recursive: true, Entries: true, NoNetworkMounts: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	events := make(chan api.WatchEvent, 100)
	go func() {
		defer close(events)
		for {
			ev, err := ws.Next()
			if err != nil {
				return
			}
			events <- ev
		}
	}()
	if _, err := e.c.Write(ctx, d+"/f", strings.NewReader("hello"), WriteOptions{Metadata: map[string]string{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
	var got []api.WatchEvent
	timeout := time.After(5 * time.Second)
	// The file goes only once the first event has come: an entry is
	// looked up when its event is, and a file removed before then has none.
	select {
	case ev := <-events:
		got = append(got, ev)
	case <-timeout:
		t.Fatal("no event for the write")
	}
	os.Remove(d + "/f")
	for len(got) == 0 || got[len(got)-1].Type != api.WatchRemove {
		select {
		case ev := <-events:
			got = append(got, ev)
		case <-timeout:
			t.Fatalf("no remove event; got %+v", got)
		}
	}
	for _, ev := range got {
		if ev.Type == api.WatchRemove || ev.Type == api.WatchRename {
			if ev.Entry != nil {
				t.Errorf("%s event with an entry: %+v", ev.Type, ev.Entry)
			}
			continue
		}
		// The file may be gone by the time a late event is looked at.
		if ev.Entry == nil {
			continue
		}
		if ev.Entry.Path != d+"/f" || ev.Entry.Size != 5 || ev.Entry.Type != api.FileTypeFile || ev.Entry.Metadata["k"] != "v" {
			t.Errorf("%s event's entry: %+v", ev.Type, ev.Entry)
		}
	}
	if got[0].Type != api.WatchCreate || got[0].Entry == nil {
		t.Errorf("first event %+v, want a create with its entry", got[0])
	}
}

// A watch may refuse network file systems, as E2B's envd does unless
// allowed: here a real FUSE mount, served by this test.
func TestWatchNetworkMounts(t *testing.T) {
	e := startAgent(t, Config{})
	if fs, err := networkFS(e.dir); err != nil || fs != "" {
		t.Fatalf("networkFS(%s) = %q, %v; want a local file system", e.dir, fs, err)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testenv.Skip(t, "no /dev/fuse: "+err.Error())
	}
	mnt := filepath.Join(e.dir, "fuse")
	os.Mkdir(mnt, 0o755)
	srv, err := fs.Mount(mnt, &fs.Inode{}, &fs.Options{MountOptions: fuse.MountOptions{DirectMount: true, FsName: "atolltest", Name: "atolltest"}})
	if err != nil {
		testenv.Skip(t, "mounting a FUSE file system: "+err.Error())
	}
	t.Cleanup(func() { srv.Unmount() })
	ctx := context.Background()
	_, err = e.c.WatchWith(ctx, mnt, WatchOptions{NoNetworkMounts: true})
	wantStatus(t, err, http.StatusBadRequest, "invalid")
	if !strings.Contains(err.Error(), "fuse") {
		t.Errorf("refusal %q does not name the file system", err)
	}
	ws, err := e.c.WatchWith(ctx, mnt, WatchOptions{})
	if err != nil {
		t.Fatalf("watching a FUSE mount, allowed: %v", err)
	}
	ws.Close()
}
