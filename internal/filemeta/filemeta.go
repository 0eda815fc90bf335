// Package filemeta keeps user metadata on files: string keys and values
// stored as extended attributes named user.e2b.<key>, the names E2B's envd
// uses, so a file carries its metadata wherever the file goes (snapshots,
// forks, pause, archives, tar with xattrs) and metadata set inside a
// sandbox with setfattr shows as well. The agent reads and writes it; the
// envd front end checks what clients send before any byte is written.
package filemeta

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// Prefix is the extended attribute namespace of metadata. user. is the
// namespace unprivileged processes may write; e2b. keeps the keys apart
// from other tools' user.* attributes and matches E2B's envd.
const Prefix = "user.e2b."

// Limits, E2B's, so metadata accepted there is accepted here and the other
// way round. MaxTotal bounds the key count too: at most
// MaxTotal/(len(Prefix)+1) = 409 one-byte keys with empty values.
const (
	// MaxKeyLen is what the kernel's 255-byte attribute name leaves.
	MaxKeyLen = 255 - len(Prefix)
	// MaxTotal is the sum over entries of len(Prefix)+len(key)+len(value):
	// about what ext4 holds in one inode's 4 KiB block, so a set that fits
	// here fits on every file system atoll stores sandboxes on.
	MaxTotal = 4096
)

// maxRead bounds what Read returns for one file. Metadata written through
// Write is at most MaxTotal; a process inside a sandbox can set far more
// with setfattr (64 KiB of names, 64 KiB per value), which would otherwise
// swell every listing of its directory.
const maxRead = 64 << 10

// ErrInvalid is the kind of every Validate error.
var ErrInvalid = errors.New("invalid metadata")

type invalidError struct{ msg string }

func (e *invalidError) Error() string { return e.msg }
func (e *invalidError) Unwrap() error { return ErrInvalid }

func invalid(format string, args ...any) error {
	return &invalidError{fmt.Sprintf(format, args...)}
}

// Validate checks m against the limits: keys non-empty and at most
// MaxKeyLen bytes, keys and values printable US-ASCII (what an HTTP header
// carries unmangled), MaxTotal in all. Errors wrap ErrInvalid.
func Validate(m map[string]string) error {
	total := 0
	for k, v := range m {
		if k == "" {
			return invalid("metadata key must not be empty")
		}
		if len(k) > MaxKeyLen {
			return invalid("metadata key %.32q... is %d bytes, more than %d", k, len(k), MaxKeyLen)
		}
		if i := unprintable(k); i >= 0 {
			return invalid("metadata key %q has byte %#02x at %d: keys and values must be printable US-ASCII", k, k[i], i)
		}
		if i := unprintable(v); i >= 0 {
			return invalid("metadata value of key %q has byte %#02x at %d: keys and values must be printable US-ASCII", k, v[i], i)
		}
		total += len(Prefix) + len(k) + len(v)
	}
	if total > MaxTotal {
		return invalid("metadata is %d bytes (%d keys, each counted with its %q prefix), more than %d", total, len(m), Prefix, MaxTotal)
	}
	return nil
}

// unprintable is the index of s's first byte outside 0x20-0x7e, or -1.
func unprintable(s string) int {
	for i := range len(s) {
		if s[i] < 0x20 || s[i] > 0x7e {
			return i
		}
	}
	return -1
}

// Unsupported reports whether err says the file system keeps no user
// extended attributes (tmpfs before Linux 6.6, proc, sysfs).
func Unsupported(err error) bool {
	return errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.EOPNOTSUPP)
}

// Read returns the metadata of the file at path, following symlinks as
// E2B's envd does; nil when it has none or its file system keeps none.
// Entries that are not valid UTF-8 (set from inside the sandbox) are left
// out, as are those past maxRead bytes in all.
func Read(path string) (map[string]string, error) {
	names, err := list(func(b []byte) (int, error) { return unix.Listxattr(path, b) })
	if err != nil {
		if Unsupported(err) {
			return nil, nil
		}
		return nil, err
	}
	var m map[string]string
	budget := maxRead
	buf := make([]byte, 512) // most values are short; longer ones are sized
	for name := range bytes.SplitSeq(names, []byte{0}) {
		key, ok := strings.CutPrefix(string(name), Prefix)
		if !ok || key == "" || !utf8.ValidString(key) || len(key) > budget {
			continue
		}
		n, err := unix.Getxattr(path, string(name), buf)
		if errors.Is(err, unix.ERANGE) {
			// Longer than buf: ask its size and read it if it fits.
			if n, err = unix.Getxattr(path, string(name), nil); err == nil && n <= budget-len(key) {
				buf = make([]byte, n)
				n, err = unix.Getxattr(path, string(name), buf)
			} else if err == nil {
				continue
			}
		}
		switch {
		case errors.Is(err, unix.ENODATA), errors.Is(err, unix.ERANGE):
			continue // removed or grown since the list
		case err != nil:
			return nil, err
		}
		v := buf[:n]
		if !utf8.Valid(v) || len(key)+n > budget {
			continue
		}
		budget -= len(key) + n
		if m == nil {
			m = map[string]string{}
		}
		m[key] = string(v)
	}
	return m, nil
}

// Write makes m the metadata of the open file fd: keys it lacks are
// removed, so an empty m clears it. m must pass Validate.
func Write(fd int, m map[string]string) error {
	if err := Validate(m); err != nil {
		return err
	}
	names, err := list(func(b []byte) (int, error) { return unix.Flistxattr(fd, b) })
	if err != nil && !(Unsupported(err) && len(m) == 0) {
		return err
	}
	for name := range bytes.SplitSeq(names, []byte{0}) {
		key, ok := strings.CutPrefix(string(name), Prefix)
		if _, keep := m[key]; !ok || keep {
			continue
		}
		if err := unix.Fremovexattr(fd, string(name)); err != nil && !errors.Is(err, unix.ENODATA) {
			return err
		}
	}
	for k, v := range m {
		if err := unix.Fsetxattr(fd, Prefix+k, []byte(v), 0); err != nil {
			return err
		}
	}
	return nil
}

// list reads an attribute name list with listxattr-like call, retrying
// when it grows between asking its size and reading it.
func list(call func([]byte) (int, error)) ([]byte, error) {
	for range 8 {
		n, err := call(nil)
		if err != nil || n == 0 {
			return nil, err
		}
		b := make([]byte, n)
		n, err = call(b)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return bytes.TrimRight(b[:n], "\x00"), nil
	}
	return nil, unix.ERANGE
}
