package main

import (
	"testing"

	"github.com/atoll-dev/atoll/api"
)

func TestNodeCapacity(t *testing.T) {
	c, err := nodeCapacity("cpu=6.5,memory=16Gi,disk=2Ti,sandboxes=40", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if c.CPU != 6.5 || c.MemoryMiB != 16<<10 || c.DiskGiB != 2048 || c.Sandboxes != 40 {
		t.Errorf("got %+v", c)
	}
	host, err := nodeCapacity("memory=512Mi", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if host.CPU < 1 || host.MemoryMiB != 512 || host.DiskGiB < 0 || host.Sandboxes != 1000 {
		t.Errorf("host defaults: %+v", host)
	}
	for _, bad := range []string{"cpu", "cpu=0", "cpu=-1", "cpu=NaN", "memory=-5Gi", "memory=lots", "disk=0",
		"sandboxes=0", "gpu=1", "memory=99999999999999Ti"} {
		if _, err := nodeCapacity(bad, t.TempDir()); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, err := nodeLabels([]string{"zone=a", "rack=r1"}); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"zone", "=a", api.NodeNameLabel + "=n9"} {
		if _, err := nodeLabels([]string{bad}); err == nil {
			t.Errorf("label %q accepted", bad)
		}
	}
}
