package nsinit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// The node sends Config on the control socket as a frame of its own making,
// not JSON: a sandbox's init decodes it once, in a process that has just
// started, where encoding/json first builds its reflection caches for the
// types; that was 3% of a sandbox's CPU in a sustained run of creates
// (docs/benchmarks.md, issue #13).
//
// A frame is a 4-byte little-endian length, then wireVersion, then the
// fields in the order of encode: strings and byte strings as a uvarint
// length and the bytes, lists as a uvarint count and the items, integers
// as varints, booleans as one byte. The node and the init stage come from
// one build (the node installs the agent binary it was built with); the
// version byte makes a mismatch an error rather than a wrong config.

// wireVersion changes with the frame's layout.
const wireVersion = 1

// maxFrame bounds a frame: the seccomp program is the largest part, a few
// KiB.
const maxFrame = 1 << 20

// WriteConfig writes cfg to w as one frame.
func WriteConfig(w io.Writer, cfg Config) error {
	var e encoder
	e.b = append(e.b, 0, 0, 0, 0, wireVersion)
	e.str(cfg.Rootfs)
	e.strs(cfg.Lower)
	e.str(cfg.Upper)
	e.uint(uint64(len(cfg.Binds)))
	for _, b := range cfg.Binds {
		e.str(b.Source)
		e.str(b.Target)
	}
	e.str(cfg.Hostname)
	e.str(cfg.AgentEnv)
	e.str(cfg.User)
	e.str(cfg.Workdir)
	e.b = binary.AppendVarint(e.b, int64(cfg.Procs))
	e.bool(cfg.Volatile)
	e.bool(cfg.Setuid)
	e.bool(cfg.Net != nil)
	if cfg.Net != nil {
		e.str(cfg.Net.Files)
	}
	e.str(cfg.Sys)
	e.bool(cfg.NewCgroupNS)
	e.str(string(cfg.Seccomp))
	if len(e.b)-4 > maxFrame {
		return fmt.Errorf("config of %d bytes is too large", len(e.b)-4)
	}
	binary.LittleEndian.PutUint32(e.b, uint32(len(e.b)-4))
	_, err := w.Write(e.b)
	return err
}

// ReadConfig reads one frame from r.
func ReadConfig(r io.Reader) (Config, error) {
	var cfg Config
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return cfg, err
	}
	size := binary.LittleEndian.Uint32(n[:])
	if size == 0 || size > maxFrame {
		return cfg, fmt.Errorf("config frame of %d bytes", size)
	}
	d := decoder{b: make([]byte, size)}
	if _, err := io.ReadFull(r, d.b); err != nil {
		return cfg, err
	}
	if v := d.byte(); v != wireVersion {
		return cfg, fmt.Errorf("config frame version %d, want %d: the node and the agent binary differ", v, wireVersion)
	}
	cfg.Rootfs = d.str()
	cfg.Lower = d.strs()
	cfg.Upper = d.str()
	for range d.count() {
		cfg.Binds = append(cfg.Binds, Bind{Source: d.str(), Target: d.str()})
	}
	cfg.Hostname = d.str()
	cfg.AgentEnv = d.str()
	cfg.User = d.str()
	cfg.Workdir = d.str()
	cfg.Procs = int(d.int())
	cfg.Volatile = d.bool()
	cfg.Setuid = d.bool()
	if d.bool() {
		cfg.Net = &Net{Files: d.str()}
	}
	cfg.Sys = d.str()
	cfg.NewCgroupNS = d.bool()
	if s := d.str(); s != "" {
		cfg.Seccomp = []byte(s)
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d bytes after the config", len(d.b))
	}
	return cfg, d.err
}

type encoder struct{ b []byte }

func (e *encoder) uint(n uint64) { e.b = binary.AppendUvarint(e.b, n) }
func (e *encoder) str(s string)  { e.uint(uint64(len(s))); e.b = append(e.b, s...) }
func (e *encoder) bool(v bool) {
	if v {
		e.b = append(e.b, 1)
	} else {
		e.b = append(e.b, 0)
	}
}
func (e *encoder) strs(ss []string) {
	e.uint(uint64(len(ss)))
	for _, s := range ss {
		e.str(s)
	}
}

// decoder reads fields off b; after its first error, every read gives the
// zero value and err keeps that error.
type decoder struct {
	b   []byte
	err error
}

var errShort = errors.New("config frame cut short")

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 {
		d.fail(errShort)
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail(errShort)
		return 0
	}
	d.b = d.b[n:]
	return v
}

// int reads a varint (binary.AppendVarint's zig-zag form).
func (d *decoder) int() int64 {
	u := d.uint()
	x := int64(u >> 1)
	if u&1 != 0 {
		x = ^x
	}
	return x
}

// count is a list's length, which cannot exceed the bytes left (each item
// takes at least one).
func (d *decoder) count() int {
	n := d.uint()
	if n > uint64(len(d.b)) {
		d.fail(errShort)
		return 0
	}
	return int(n)
}

func (d *decoder) str() string {
	n := d.uint()
	if n > uint64(len(d.b)) {
		d.fail(errShort)
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) strs() []string {
	n := d.count()
	if n == 0 {
		return nil
	}
	ss := make([]string, 0, n)
	for range n {
		ss = append(ss, d.str())
	}
	return ss
}

func (d *decoder) bool() bool {
	switch d.byte() {
	case 0:
		return false
	case 1:
		return true
	default:
		d.fail(errors.New("config frame: a boolean is neither 0 nor 1"))
		return false
	}
}
