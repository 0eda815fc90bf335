package main

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// wantQuotaErr fails t unless err is a 429 quota_exceeded naming quota
// name with limit (and, if used >= 0, that use).
func wantQuotaErr(t *testing.T, what string, err error, name string, limit, used float64) *atoll.Error {
	t.Helper()
	var e *atoll.Error
	if !errors.As(err, &e) || !errors.Is(err, atoll.ErrQuota) || e.StatusCode != 429 || e.Quota == nil {
		t.Fatalf("%s: %v, want 429 quota_exceeded with its quota", what, err)
	}
	if e.Quota.Name != name || e.Quota.Limit != limit || used >= 0 && e.Quota.Used != used || !strings.Contains(e.Message, name) {
		t.Fatalf("%s: %q %+v, want %s of %g with %g used", what, e.Message, *e.Quota, name, limit, used)
	}
	return e
}

// TestQuotas checks a tenant's quota on one machine, end to end: only
// admins set it (and bad limits are refused), a storm of creates never
// goes past max_sandboxes, a stopped sandbox is not started again over it
// nor a shelved one resumed,
// CPU and memory limits refuse what would pass them, the rate limit
// answers 429 with Retry-After, and the CLI shows use against the quota.
func TestQuotas(t *testing.T) {
	d, _, admin := startRooted(t, "--warm-pool", "1")
	ctx := context.Background()
	k, err := admin.CreateKey(ctx, api.CreateKeyRequest{Name: "team-q"})
	if err != nil {
		t.Fatal(err)
	}
	// No retries: the test wants to see the 429s.
	q := atoll.New(d.url, k.Key, atoll.WithBusyRetries(0))

	t.Run("admins only", func(t *testing.T) {
		if _, err := q.SetQuota(ctx, "team-q", api.TenantQuota{MaxSandboxes: 100}); !errors.Is(err, atoll.ErrForbidden) {
			t.Errorf("a tenant setting its own quota: %v, want 403", err)
		}
		if _, err := q.ListTenants(ctx); !errors.Is(err, atoll.ErrForbidden) {
			t.Errorf("a tenant listing tenants: %v, want 403", err)
		}
		if _, err := q.GetTenant(ctx, "default"); !errors.Is(err, atoll.ErrForbidden) {
			t.Errorf("a tenant reading another: %v, want 403", err)
		}
		if got, err := q.GetTenant(ctx, "team-q"); err != nil || got.Name != "team-q" || got.Admin {
			t.Errorf("a tenant reading its own: %+v, %v", got, err)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, body := range []string{`{"max_cpu":-1}`, `{"max_sandboxes":-3}`, `{"creates_per_second":-0.5}`,
			`{"max_memory_mib":"80Qi"}`, `{"max_disk_gib":1.5}`, `{"max_sandboxes":1e30}`, `{"max_ram":1}`, `[]`, `{`} {
			status, b := d.v1(t, "PUT", "/v1/tenants/team-q/quota", d.key, body)
			wantV1(t, body, status, b, 400, api.CodeInvalid)
		}
		status, b := d.v1(t, "PUT", "/v1/tenants/Team_Q/quota", d.key, `{"max_cpu":1}`)
		wantV1(t, "bad tenant name", status, b, 400, api.CodeInvalid)
		for _, args := range [][]string{{"--max-memory", "80Qi"}, {"--max-sandboxes", "-1"}, {"--max-cpu", "lots"}, {"--max-disk", "1Pi"}, {}} {
			out, code := d.cli(append([]string{"tenant", "set", "team-q"}, args...)...)
			if code == 0 || len(args) > 0 && !strings.Contains(out, args[1]) {
				t.Errorf("tenant set %v: exit %d, %q; want an error naming the value", args, code, out)
			}
		}
		if got, _ := admin.GetTenant(ctx, "team-q"); got.Quota != (api.TenantQuota{}) {
			t.Errorf("bad input changed the quota: %+v", got.Quota)
		}
	})

	out, code := d.cli("tenant", "set", "team-q", "--max-sandboxes", "10", "--max-memory", "80Gi", "--max-disk", "1Ti")
	if code != 0 || !strings.Contains(out, "0 of 10") || !strings.Contains(out, "0Mi of 80Gi") || !strings.Contains(out, "1Ti") {
		t.Fatalf("tenant set: exit %d:\n%s", code, out)
	}

	t.Run("storm", func(t *testing.T) {
		var mu sync.Mutex
		var made []string
		refused := 0
		var wg sync.WaitGroup
		t0 := time.Now()
		for range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sb, err := q.CreateSandbox(ctx, api.CreateSandboxRequest{})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					made = append(made, sb.ID)
				case errors.Is(err, atoll.ErrQuota):
					var e *atoll.Error
					if errors.As(err, &e) && (e.Quota == nil || e.Quota.Name != "max_sandboxes" || e.Quota.Limit != 10) {
						t.Errorf("refusal without its quota: %q %+v", e.Message, e.Quota)
					}
					refused++
				default:
					t.Errorf("create: %v", err)
				}
			}()
		}
		wg.Wait()
		t.Logf("40 creates against max_sandboxes 10: %d made, %d refused in %v", len(made), refused, time.Since(t0).Round(time.Millisecond))
		if len(made) != 10 || refused != 30 {
			t.Fatalf("%d made, %d refused; want 10 and 30", len(made), refused)
		}
		_, err := q.CreateSandbox(ctx, api.CreateSandboxRequest{})
		e := wantQuotaErr(t, "eleventh", err, "max_sandboxes", 10, 10)
		t.Logf("eleventh: %d %s", e.StatusCode, e.Message)

		// Stopped, a sandbox leaves room for another; started again, it
		// would make eleven.
		if _, err := q.StopSandbox(ctx, made[0]); err != nil {
			t.Fatal(err)
		}
		if _, err := q.CreateSandbox(ctx, api.CreateSandboxRequest{}); err != nil {
			t.Fatalf("create after a stop: %v", err)
		}
		_, err = q.StartSandbox(ctx, made[0])
		wantQuotaErr(t, "restart over quota", err, "max_sandboxes", 10, 10)
		if sb, err := q.GetSandbox(ctx, made[0]); err != nil || sb.State != api.StateStopped {
			t.Errorf("after a refused start: %s, %v; want stopped", sb.State, err)
		}

		// Shelved (paused without memory), likewise: its resume is
		// checked.
		if _, err := q.ShelveSandbox(ctx, made[1]); err != nil {
			t.Fatal(err)
		}
		if _, err := q.CreateSandbox(ctx, api.CreateSandboxRequest{}); err != nil {
			t.Fatalf("create after a shelve: %v", err)
		}
		_, err = q.ResumeSandbox(ctx, made[1])
		wantQuotaErr(t, "resume over quota", err, "max_sandboxes", 10, 10)
		if sb, err := q.GetSandbox(ctx, made[1]); err != nil || sb.State != api.StateShelved {
			t.Errorf("after a refused resume: %s, %v; want shelved", sb.State, err)
		}

		tn, err := q.GetTenant(ctx, "team-q")
		if err != nil || tn.Used.Sandboxes != 10 || tn.Quota.MaxSandboxes != 10 || tn.Used.DiskGiB == 0 {
			t.Errorf("tenant: %+v, %v", tn, err)
		}
		out, code := d.cli("tenant", "inspect", "team-q")
		if code != 0 || !strings.Contains(out, "10 of 10") {
			t.Errorf("tenant inspect: exit %d:\n%s", code, out)
		}
		out, code = d.cli("tenant", "ls")
		if code != 0 || !strings.Contains(out, "team-q") || !strings.Contains(out, "default") || !strings.Contains(out, "10 of 10") {
			t.Errorf("tenant ls: exit %d:\n%s", code, out)
		}
		for _, id := range made {
			if err := q.DeleteSandbox(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
	})

	t.Run("cpu and memory", func(t *testing.T) {
		all, err := q.ListSandboxes(ctx, atoll.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range all {
			q.DeleteSandbox(ctx, sb.ID)
		}
		if _, err := admin.SetQuota(ctx, "team-q", api.TenantQuota{MaxCPU: 1.5, MaxMemoryMiB: 1024}); err != nil {
			t.Fatal(err)
		}
		_, err = q.CreateSandbox(ctx, api.CreateSandboxRequest{CPU: 2})
		wantQuotaErr(t, "2 CPUs", err, "max_cpu", 1.5, 0)
		_, err = q.CreateSandbox(ctx, api.CreateSandboxRequest{CPU: 1, MemoryMiB: 2048})
		wantQuotaErr(t, "2 GiB", err, "max_memory_mib", 1024, 0)
		sb, err := q.CreateSandbox(ctx, api.CreateSandboxRequest{CPU: 1, MemoryMiB: 512})
		if err != nil {
			t.Fatal(err)
		}
		_, err = q.CreateSandbox(ctx, api.CreateSandboxRequest{CPU: 1, MemoryMiB: 256})
		wantQuotaErr(t, "another CPU", err, "max_cpu", 1.5, 1)
		if err := q.DeleteSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("rate", func(t *testing.T) {
		if _, err := admin.SetQuota(ctx, "team-q", api.TenantQuota{CreatesPerSecond: 0.5}); err != nil {
			t.Fatal(err)
		}
		if _, err := q.CreateSandbox(ctx, api.CreateSandboxRequest{Ephemeral: true}); err != nil {
			t.Fatal(err)
		}
		_, err := q.CreateSandbox(ctx, api.CreateSandboxRequest{})
		e := wantQuotaErr(t, "second create at once", err, "creates_per_second", 0.5, 0)
		if e.RetryAfter < time.Second || e.RetryAfter > 2*time.Second {
			t.Errorf("Retry-After %v, want 1-2 s (a create every 2 s)", e.RetryAfter)
		}
		// A client that waits as told gets through: the SDK's default.
		retrying := atoll.New(d.url, k.Key)
		if _, err := retrying.CreateSandbox(ctx, api.CreateSandboxRequest{}); err != nil {
			t.Errorf("create after Retry-After: %v", err)
		}
		// Other tenants are not held back.
		for range 3 {
			if _, err := admin.CreateSandbox(ctx, api.CreateSandboxRequest{}); err != nil {
				t.Errorf("another tenant's create: %v", err)
			}
		}
	})
}
