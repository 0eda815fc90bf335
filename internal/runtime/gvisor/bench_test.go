package gvisor_test

import (
	"encoding/json"
	"os"
	osexec "os/exec"
	"path/filepath"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/runtime/runtimetest"
)

// The benchmarks report medians and p99 (p50-ms, p99-ms) beside Go's mean:
// start and stop times under ptrace have long tails. The API-level figures come from bench/.

// BenchmarkStartExecStop measures the runtime alone, per phase: start to
// agent ready, one exec of true, stop.
func BenchmarkStartExecStop(b *testing.B) { runtimetest.BenchStartExecStop(b, newRuntime) }

// BenchmarkExec measures an exec of true through the agent socket alone.
func BenchmarkExec(b *testing.B) { runtimetest.BenchExec(b, newRuntime) }

// BenchmarkRunscTrue is the peer: `runsc run` of true over the same kind of
// root (the host template's overlay and binds), with the same flags, until
// it has exited and runsc has cleaned up after it; no agent, no limits.
func BenchmarkRunscTrue(b *testing.B) {
	rt, env := newRuntime(b)
	_ = rt
	dir := b.TempDir()
	tmpl, err := env.Layers.Template(layers.HostTemplate)
	if err != nil {
		b.Fatal(err)
	}
	w, err := env.Layers.CreateWritable("peer", 1<<30)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { env.Layers.RemoveWritable("peer") })
	rootfs := filepath.Join(dir, "rootfs")
	os.Mkdir(rootfs, 0o700)
	opts := "lowerdir=" + tmpl.Layers[0] + ",upperdir=" + w + "/upper,workdir=" + w + "/work,userxattr"
	if err := unix.Mount("overlay", rootfs, "overlay", 0, opts); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Unmount(rootfs, unix.MNT_DETACH) })
	spec := specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{Args: []string{"/usr/bin/true"}, Env: []string{"PATH=/usr/bin"}, Cwd: "/"},
		Root:    &specs.Root{Path: rootfs},
		Linux:   &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.MountNamespace}}},
	}
	for _, bd := range tmpl.Binds {
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: bd.Target, Type: "bind", Source: bd.Source, Options: []string{"rbind", "ro"}})
	}
	cfg, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfg, 0o600); err != nil {
		b.Fatal(err)
	}
	flags := []string{"--root", filepath.Join(dir, "state"), "--network=none", "--platform=" + rt.Platform(), "--overlay2=none"}
	var d []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		out, err := osexec.Command("runsc", append(flags, "run", "--bundle", dir, "peer")...).CombinedOutput()
		if err != nil {
			b.Fatalf("runsc run: %v: %s", err, out)
		}
		d = append(d, time.Since(t0))
	}
	runtimetest.Report(b, "", d)
}
