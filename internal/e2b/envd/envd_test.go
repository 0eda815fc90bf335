package envd

import (
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/e2b/envd/spec/filesystem"
)

// The vectors come from the e2b npm SDK's getSignature (2.51.0).
func TestSignature(t *testing.T) {
	for _, c := range []struct {
		path, op, user, token string
		exp                   int64
		want                  string
	}{
		{"/home/user/a.txt", "read", "", "tok", 0, "v1_Zkbb3914oLJLvMBzCAHQhm2ydBLxbSx2eQUR/kLdvIY"},
		{"/x", "write", "root", "tok", 1700000000, "v1_yg+WWFKd4GZkRcXpOxzLtMFmkrfuGUapUQy/oh9Okgs"},
	} {
		if got := Signature(c.path, c.op, c.user, c.token, c.exp); got != c.want {
			t.Errorf("Signature(%q, %q, %q, %q, %d) = %s, want %s", c.path, c.op, c.user, c.token, c.exp, got, c.want)
		}
	}
}

func TestEndEvent(t *testing.T) {
	code := func(n int) *int { return &n }
	for _, c := range []struct {
		ev     api.ExecEvent
		status string
		err    bool
		exited bool
	}{
		{api.ExecEvent{ExitCode: code(0)}, "exit status 0", false, true},
		{api.ExecEvent{ExitCode: code(3)}, "exit status 3", true, true},
		{api.ExecEvent{ExitCode: code(-1), Signal: "SIGKILL"}, "signal: killed", true, false},
		{api.ExecEvent{ExitCode: code(-1), Signal: "SIGTERM"}, "signal: terminated", true, false},
	} {
		e := endEvent(c.ev)
		if e.Status != c.status || (e.Error != nil) != c.err || e.Exited != c.exited || e.Error != nil && *e.Error != c.status {
			t.Errorf("endEvent(%+v) = %+v", c.ev, e)
		}
	}
}

func TestEntryModes(t *testing.T) {
	for _, c := range []struct {
		fi   api.FileInfo
		want string
	}{
		{api.FileInfo{Type: api.FileTypeFile, Mode: 0o644}, "-rw-r--r--"},
		{api.FileInfo{Type: api.FileTypeDir, Mode: 0o755}, "drwxr-xr-x"},
		{api.FileInfo{Type: api.FileTypeDir, Mode: 0o1777}, "dtrwxrwxrwx"},
		{api.FileInfo{Type: api.FileTypeSymlink, Mode: 0o777}, "Lrwxrwxrwx"},
		{api.FileInfo{Type: api.FileTypeFile, Mode: 0o4755}, "urwxr-xr-x"},
	} {
		if got := goMode(c.fi).String(); got != c.want {
			t.Errorf("%+v: %s, want %s", c.fi, got, c.want)
		}
	}
	c := &call{accts: &accounts{users: map[int]string{1000: "user"}, groups: map[int]string{}, homes: map[string]string{}}}
	e := c.entry(t.Context(), api.FileInfo{Name: "f", Path: "/f", Type: api.FileTypeFile, Mode: 0o4755, UID: 1000, GID: 7, ModTime: time.Unix(5, 0)}, false)
	if e.Mode != 0o755 || e.Owner != "user" || e.Group != "7" || e.Type != filesystem.FileType_FILE_TYPE_FILE || e.ModifiedTime.AsTime().Unix() != 5 {
		t.Errorf("entry: %+v", e)
	}
}

func TestFsEventNames(t *testing.T) {
	for _, c := range []struct{ dir, path, want string }{
		{"/home/user/w", "/home/user/w/a.txt", "a.txt"},
		{"/home/user/w", "/home/user/w/sub/b", "sub/b"},
		{"/", "/etc/x", "etc/x"},
	} {
		if e := fsEvent(c.dir, api.WatchEvent{Type: api.WatchCreate, Path: c.path}); e == nil || e.Name != c.want || e.Type != filesystem.EventType_EVENT_TYPE_CREATE {
			t.Errorf("fsEvent(%q, %q) = %+v, want name %q", c.dir, c.path, e, c.want)
		}
	}
	if fsEvent("/", api.WatchEvent{Type: "bogus", Path: "/x"}) != nil {
		t.Error("unknown event type converted")
	}
}

func TestResolve(t *testing.T) {
	c := &call{user: "user", accts: &accounts{homes: map[string]string{"user": "/home/user", "root": "/root"}}}
	for _, tc := range []struct{ in, want string }{
		{"/a/../b", "/b"},
		{"rel/x", "/home/user/rel/x"},
		{"~", "/home/user"},
		{"~/x", "/home/user/x"},
		{"../../etc/passwd", "/etc/passwd"},
		{"", "/home/user"},
	} {
		if got, err := c.resolve(t.Context(), tc.in); err != nil || got != tc.want {
			t.Errorf("resolve(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"~root/x", "a\x00b"} {
		if _, err := c.resolve(t.Context(), bad); err == nil {
			t.Errorf("resolve(%q) succeeded", bad)
		}
	}
	c.user = "ghost"
	if _, err := c.resolve(t.Context(), "x"); err == nil {
		t.Error("relative path of an unknown user resolved")
	}
}

// SignedBy tells which token signed a file URL, as the E2B API needs for
// URLs that name no sandbox (E2B_SANDBOX_URL); only well-shaped signatures
// are worth the search.
func TestSignedBy(t *testing.T) {
	good := Signature("/a", "read", "", "tok", 0)
	for _, c := range []struct {
		method, target, token string
		want                  bool
	}{
		{"GET", "/files?path=/a&signature=" + url.QueryEscape(good), "tok", true},
		{"GET", "/files?path=/a&signature=" + url.QueryEscape(good), "other", false},
		{"GET", "/files?path=/b&signature=" + url.QueryEscape(good), "tok", false},
		{"POST", "/files?path=/a&signature=" + url.QueryEscape(good), "tok", false}, // a read signature
		{"GET", "/other?path=/a&signature=" + url.QueryEscape(good), "tok", false},
		{"DELETE", "/files?path=/a&signature=" + url.QueryEscape(good), "tok", false},
	} {
		r := httptest.NewRequest(c.method, c.target, nil)
		if got := SignedBy(r, c.token); got != c.want {
			t.Errorf("%s %s by %s: %v, want %v", c.method, c.target, c.token, got, c.want)
		}
	}
	for sig, want := range map[string]bool{good: true, "": false, "v1_": false, "v2_" + good[3:]: false, good + "A": false, "v1_" + strings.Repeat("!", 43): false} {
		if got := SignatureShaped(sig); got != want {
			t.Errorf("SignatureShaped(%q) = %v", sig, got)
		}
	}
}
