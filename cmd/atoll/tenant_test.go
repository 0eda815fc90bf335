package main

import (
	"bytes"
	"testing"

	"github.com/atoll-dev/atoll/api"
)

// TestTenantRender checks `atoll tenant inspect`'s output against its
// golden file, and the units of sizes.
func TestTenantRender(t *testing.T) {
	var out bytes.Buffer
	tn := api.Tenant{Name: "team-a",
		Quota: api.TenantQuota{MaxSandboxes: 50, MaxCPU: 40, MaxMemoryMiB: 80 << 10, MaxDiskGiB: 500, CreatesPerSecond: 20},
		Used:  api.TenantUsage{Sandboxes: 10, CPU: 2.5, MemoryMiB: 5 << 10, DiskGiB: 100}}
	if err := renderTenant(&out, tn); err != nil {
		t.Fatal(err)
	}
	if err := renderTenant(&out, api.Tenant{Name: "default", Admin: true, Used: api.TenantUsage{Sandboxes: 1, CPU: 1, MemoryMiB: 768, DiskGiB: 2048}}); err != nil {
		t.Fatal(err)
	}
	golden(t, "tenant-inspect", out.String())
	for _, c := range []struct {
		n     int64
		shift uint
		want  string
	}{{0, 20, "0Mi"}, {512, 20, "512Mi"}, {1024, 20, "1Gi"}, {1536, 20, "1536Mi"}, {1 << 20, 20, "1Ti"}, {0, 30, "0Gi"}, {500, 30, "500Gi"}, {2048, 30, "2Ti"}} {
		if got := sizeText(c.n, c.shift); got != c.want {
			t.Errorf("sizeText(%d, %d) = %q, want %q", c.n, c.shift, got, c.want)
		}
	}
}

// TestQuotaFlags checks what `atoll tenant set` accepts and refuses.
func TestQuotaFlags(t *testing.T) {
	set := func(name, v string) (api.TenantQuota, error) {
		var q api.TenantQuota
		for _, f := range quotaFlags {
			if f.name == name {
				return q, f.set(&q, v)
			}
		}
		t.Fatalf("no flag %s", name)
		return q, nil
	}
	for _, c := range []struct {
		flag, v string
		want    api.TenantQuota
	}{
		{"max-sandboxes", "50", api.TenantQuota{MaxSandboxes: 50}}, {"max-sandboxes", "none", api.TenantQuota{}},
		{"max-cpu", "0.5", api.TenantQuota{MaxCPU: 0.5}}, {"max-cpu", "0", api.TenantQuota{}},
		{"max-memory", "80Gi", api.TenantQuota{MaxMemoryMiB: 80 << 10}}, {"max-memory", "512", api.TenantQuota{MaxMemoryMiB: 512}},
		{"max-disk", "500Gi", api.TenantQuota{MaxDiskGiB: 500}}, {"max-disk", "1Ti", api.TenantQuota{MaxDiskGiB: 1024}},
		{"creates-per-second", "20", api.TenantQuota{CreatesPerSecond: 20}},
	} {
		if got, err := set(c.flag, c.v); err != nil || got != c.want {
			t.Errorf("--%s %s: %+v, %v; want %+v", c.flag, c.v, got, err, c.want)
		}
	}
	for _, c := range []struct{ flag, v string }{
		{"max-sandboxes", "-1"}, {"max-sandboxes", "1.5"}, {"max-cpu", "NaN"}, {"max-cpu", "Inf"}, {"max-cpu", "-2"},
		{"max-memory", "80Qi"}, {"max-memory", "512Ki"}, {"max-disk", "100Mi"}, {"max-disk", ""}, {"creates-per-second", "fast"},
	} {
		if _, err := set(c.flag, c.v); err == nil {
			t.Errorf("--%s %q accepted", c.flag, c.v)
		}
	}
}
