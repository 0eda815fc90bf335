package main

import (
	"bytes"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// TestRenderUsage checks the usage table and CSV against testdata.
func TestRenderUsage(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	rep := api.UsageReport{From: t0, To: t0.Add(2 * time.Hour), Step: "1h", GroupBy: "label:team", Usage: []api.UsageEntry{
		{Start: t0, Group: "", CPUSeconds: 0.125, MemoryGiBSeconds: 3.5, DiskGiBHours: 0.00025, NetInBytes: 999, NetOutBytes: 1_500_000,
			States: api.UsageStates{Running: 3600}},
		{Start: t0.Add(time.Hour), Group: "ml, \"vision\"", CPUSeconds: 1234.5, MemoryGiBSeconds: 1e6, SnapshotGiBHours: 2, ArchiveGiBHours: 1.5,
			NetInBytes: 12_345_678_901, States: api.UsageStates{Running: 1800, Paused: 600, Suspended: 300, Stopped: 600, Archived: 300}},
	}}
	var b bytes.Buffer
	if err := renderUsage(&b, rep); err != nil {
		t.Fatal(err)
	}
	golden(t, "usage", b.String())
	b.Reset()
	if err := renderUsageCSV(&b, rep); err != nil {
		t.Fatal(err)
	}
	golden(t, "usage-csv", b.String())
}
