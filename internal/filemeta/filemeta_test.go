package filemeta

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// Hostile metadata is refused, with ErrInvalid, before anything is written.
func TestValidate(t *testing.T) {
	many := map[string]string{}
	for i := range 500 {
		many[strings.Repeat("k", 3)+string(rune('a'+i%26))+strings.Repeat("x", i/26)] = ""
	}
	tests := []struct {
		name string
		m    map[string]string
		ok   bool
	}{
		{"none", nil, true},
		{"plain", map[string]string{"owner": "agent-7", "Run-ID": "a b ~"}, true},
		{"longest key", map[string]string{strings.Repeat("k", MaxKeyLen): ""}, true},
		{"at the total", map[string]string{"k": strings.Repeat("v", MaxTotal-len(Prefix)-1)}, true},
		{"empty key", map[string]string{"": "v"}, false},
		{"key too long", map[string]string{strings.Repeat("k", MaxKeyLen+1): ""}, false},
		{"NUL in key", map[string]string{"a\x00b": "v"}, false},
		{"NUL in value", map[string]string{"k": "a\x00b"}, false},
		{"newline in value", map[string]string{"k": "a\nSet-Cookie: x"}, false},
		{"UTF-8 value", map[string]string{"k": "é"}, false},
		{"DEL in key", map[string]string{"k\x7f": "v"}, false},
		{"past the total", map[string]string{"k": strings.Repeat("v", MaxTotal-len(Prefix))}, false},
		{"too many keys", many, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Validate(tt.m)
			if (err == nil) != tt.ok {
				t.Fatalf("Validate = %v, want ok %v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v is not ErrInvalid", err)
			}
		})
	}
}

// openTemp makes a file on the test's temporary directory and skips when
// its file system keeps no user attributes.
func openTemp(t *testing.T) (*os.File, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "f")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := unix.Fsetxattr(int(f.Fd()), "user.probe", []byte("x"), 0); Unsupported(err) {
		t.Skipf("%s keeps no user extended attributes", p)
	} else if err != nil {
		t.Fatal(err)
	}
	unix.Fremovexattr(int(f.Fd()), "user.probe")
	return f, p
}

func TestWriteRead(t *testing.T) {
	f, p := openTemp(t)
	fd := int(f.Fd())
	if m, err := Read(p); err != nil || m != nil {
		t.Fatalf("Read of a bare file = %v, %v; want nil", m, err)
	}
	// Another tool's attribute is neither shown nor removed.
	if err := unix.Fsetxattr(fd, "user.other", []byte("keep"), 0); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a": "1", "Mixed-Case": "x y", "empty": ""}
	if err := Write(fd, want); err != nil {
		t.Fatal(err)
	}
	got, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("Read after Write (-want +got):\n%s", d)
	}
	// Write replaces: keys it lacks go.
	if err := Write(fd, map[string]string{"a": "2"}); err != nil {
		t.Fatal(err)
	}
	if got, _ := Read(p); !cmp.Equal(got, map[string]string{"a": "2"}) {
		t.Errorf("after a second Write: %v, want only a=2", got)
	}
	if err := Write(fd, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := Read(p); got != nil {
		t.Errorf("after Write(nil): %v, want none", got)
	}
	if v := make([]byte, 8); true {
		if n, err := unix.Getxattr(p, "user.other", v); err != nil || string(v[:n]) != "keep" {
			t.Errorf("user.other after Writes: %q, %v", v[:n], err)
		}
	}
	if err := Write(fd, map[string]string{"bad\x00": "v"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("Write of a NUL key = %v, want ErrInvalid", err)
	}
}

// What a sandbox's own processes set with setfattr is read back within
// bounds: not UTF-8 is left out, and big values stop at maxRead in all.
func TestReadOutOfBand(t *testing.T) {
	f, p := openTemp(t)
	fd := int(f.Fd())
	set := func(name string, v []byte) {
		t.Helper()
		if err := unix.Fsetxattr(fd, name, v, 0); err != nil {
			t.Skipf("setting %s (%d bytes): %v", name, len(v), err)
		}
	}
	set(Prefix+"bin", []byte{0xff, 0xfe})
	set(Prefix+"big", []byte(strings.Repeat("b", 3000))) // past Read's first buffer
	got, err := Read(p)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(map[string]string{"big": strings.Repeat("b", 3000)}, got); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	// ext4 keeps at most one block of attributes per inode; where more
	// fits, the total read stays bounded.
	for _, k := range []string{"h1", "h2", "h3", "h4", "h5"} {
		if err := unix.Fsetxattr(fd, Prefix+k, []byte(strings.Repeat("h", 60<<10)), 0); err != nil {
			t.Logf("%s keeps no more (%v); the bound is not reached here", p, err)
			return
		}
	}
	got, err = Read(p)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for k, v := range got {
		total += len(k) + len(v)
	}
	if total > maxRead {
		t.Errorf("Read returned %d bytes, more than %d", total, maxRead)
	}
}
