package nsinit

import (
	"bytes"
	"encoding/binary"
	"reflect"
	"strings"
	"testing"
)

// TestConfigRoundTrip: every field of a Config comes through a frame as it
// went in, empty and full.
func TestConfigRoundTrip(t *testing.T) {
	full := Config{
		Rootfs: "/run/x/root", Lower: []string{"/run/x/mnt/l0", "/run/x/mnt/l1"}, Upper: "/run/x/mnt/up",
		Binds:    []Bind{{Source: "/run/x/mnt/b0", Target: "/opt/vault"}, {Source: "/s", Target: "/t"}},
		Hostname: "sbx", AgentEnv: `{"A":"1"}`, User: "user", Workdir: "/home/user", Procs: 3,
		Volatile: true, Setuid: true, Net: &Net{Files: "/run/x/net"}, Sys: "/run/x/sys", NewCgroupNS: true,
		Seccomp: []byte{1, 2, 3, 0, 4, 5, 6, 7},
	}
	for name, cfg := range map[string]Config{"empty": {}, "full": full, "negative procs": {Procs: -1}} {
		var b bytes.Buffer
		if err := WriteConfig(&b, cfg); err != nil {
			t.Fatal(err)
		}
		got, err := ReadConfig(&b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got, cfg) {
			t.Errorf("%s: got %+v, want %+v", name, got, cfg)
		}
		if b.Len() != 0 {
			t.Errorf("%s: %d bytes left after the frame", name, b.Len())
		}
	}
}

// TestConfigBadFrames: a frame that is cut short, of another version, too
// large, with a bad boolean or with bytes after the fields is an error,
// never a partial config taken as whole, and never a panic.
func TestConfigBadFrames(t *testing.T) {
	var good bytes.Buffer
	if err := WriteConfig(&good, Config{Rootfs: "/r", Lower: []string{"/l"}, Seccomp: []byte{1}}); err != nil {
		t.Fatal(err)
	}
	frame := good.Bytes()
	withBody := func(body []byte) []byte {
		b := binary.LittleEndian.AppendUint32(nil, uint32(len(body)))
		return append(b, body...)
	}
	body := frame[4:]
	cases := map[string][]byte{
		"empty":          {},
		"length only":    frame[:4],
		"zero length":    {0, 0, 0, 0},
		"too large":      {0xff, 0xff, 0xff, 0x7f},
		"other version":  withBody(append([]byte{wireVersion + 1}, body[1:]...)),
		"cut short":      withBody(body[:len(body)-3]),
		"trailing bytes": withBody(append(append([]byte{}, body...), 9)),
		"huge count":     withBody([]byte{wireVersion, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}),
		"bad boolean":    withBody(badBool()),
	}
	for name, in := range cases {
		if _, err := ReadConfig(bytes.NewReader(in)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	// Every prefix of a good frame's body, framed as whole, is refused.
	for i := 1; i < len(body); i++ {
		if _, err := ReadConfig(bytes.NewReader(withBody(body[:i]))); err == nil {
			t.Errorf("a body cut to %d of %d bytes was taken", i, len(body))
		}
	}
	if _, err := ReadConfig(bytes.NewReader(withBody(append([]byte{wireVersion + 1}, body[1:]...)))); err == nil || !strings.Contains(err.Error(), "differ") {
		t.Errorf("another version: %v, want it to say the binaries differ", err)
	}
}

// badBool is a body whose Volatile byte is 2.
func badBool() []byte {
	var e encoder
	e.b = append(e.b, wireVersion)
	e.str("")     // Rootfs
	e.strs(nil)   // Lower
	e.str("")     // Upper
	e.uint(0)     // Binds
	for range 4 { // Hostname, AgentEnv, User, Workdir
		e.str("")
	}
	e.b = binary.AppendVarint(e.b, 0) // Procs
	e.b = append(e.b, 2)              // Volatile
	return append(e.b, make([]byte, 8)...)
}
