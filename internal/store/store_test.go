package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/tenant"
)

func open(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newSandbox(id string) *Sandbox {
	return &Sandbox{Sandbox: api.Sandbox{
		ID: id, State: api.StateCreating, Template: "host", Runtime: "ns", CPU: 1, MemoryMiB: 512,
		DiskGiB: 10, PIDs: 1024, Env: map[string]string{"A": "1"}, Labels: map[string]string{"team": "x"},
		CreatedAt: time.Unix(1700000000, 0).UTC(),
	}}
}

func TestCreateGetListDelete(t *testing.T) {
	ctx := context.Background()
	s := open(t)
	a, b, c := newSandbox("a"), newSandbox("b"), newSandbox("c")
	for _, sb := range []*Sandbox{a, b, c} {
		if err := s.Create(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	if a.Slot != 0 || b.Slot != 1 || c.Slot != 2 {
		t.Fatalf("slots %d %d %d", a.Slot, b.Slot, c.Slot)
	}
	got, err := s.Get(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(*b, got); diff != "" {
		t.Errorf("get (-want +got):\n%s", diff)
	}
	if err := s.Delete(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	// The freed slot is reused.
	d := newSandbox("d")
	if err := s.Create(ctx, d); err != nil {
		t.Fatal(err)
	}
	if d.Slot != 1 {
		t.Errorf("slot %d, want the freed 1", d.Slot)
	}
	list, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 {
		t.Errorf("list has %d", len(list))
	}
	if _, err := s.Get(ctx, "b"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get deleted: %v", err)
	}
	if err := s.Delete(ctx, "b"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("double delete: %v", err)
	}
	if err := s.Create(ctx, newSandbox("a")); err == nil {
		t.Error("duplicate id accepted")
	}
}

func TestUpdateIsCompareAndSet(t *testing.T) {
	ctx := context.Background()
	s := open(t)
	sb := newSandbox("a")
	if err := s.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	sb.State = api.StateRunning
	sb.PID, sb.StartTime, sb.Socket = 42, 7, "/run/x"
	if err := s.Update(ctx, sb, api.StateCreating); err != nil {
		t.Fatal(err)
	}
	sb.State = api.StateStopped
	if err := s.Update(ctx, sb, api.StateCreating); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("update from the wrong state: %v", err)
	}
	got, _ := s.Get(ctx, "a")
	if got.State != api.StateRunning || got.PID != 42 || got.StartTime != 7 {
		t.Errorf("after refused update: %+v", got)
	}
	missing := newSandbox("zz")
	if err := s.Update(ctx, missing, api.StateCreating); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("update of unknown: %v", err)
	}
	tr, err := s.Transitions(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	var steps []string
	for _, x := range tr {
		steps = append(steps, x.From+">"+x.To)
	}
	if diff := cmp.Diff([]string{">creating", "creating>running"}, steps); diff != "" {
		t.Errorf("transitions (-want +got):\n%s", diff)
	}
}

// TestUpdateAllIsAllOrNothing: one sandbox in the wrong state and none is
// written, as a fork's children are recorded running together.
func TestUpdateAllIsAllOrNothing(t *testing.T) {
	ctx := context.Background()
	s := open(t)
	a, b := newSandbox("a"), newSandbox("b")
	for _, sb := range []*Sandbox{a, b} {
		if err := s.Create(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	b.State = api.StateDeleting
	if err := s.Update(ctx, b, api.StateCreating); err != nil {
		t.Fatal(err)
	}
	a.State, b.State = api.StateRunning, api.StateRunning
	if err := s.UpdateAll(ctx, []*Sandbox{a, b}, api.StateCreating); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("update of a sandbox in the wrong state: %v", err)
	}
	if got, _ := s.Get(ctx, "a"); got.State != api.StateCreating {
		t.Errorf("a is %s after the refused update, want creating", got.State)
	}
	b.State = api.StateCreating
	if err := s.Update(ctx, b, api.StateDeleting); err != nil {
		t.Fatal(err)
	}
	b.State = api.StateRunning
	if err := s.UpdateAll(ctx, []*Sandbox{a, b}, api.StateCreating); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"a", "b"} {
		if got, _ := s.Get(ctx, id); got.State != api.StateRunning {
			t.Errorf("%s is %s, want running", id, got.State)
		}
	}
}

func TestKeysAndReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "atoll.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.AddKey(ctx, "h1aaaaaaaaaaaaaaaaaaaaaa", "first", ""); err != nil {
		t.Fatal(err)
	}
	if err := s.AddKey(ctx, "h2bbbbbbbbbbbbbbbbbbbbbb", "team", "team-a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Create(ctx, newSandbox("a")); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if k, err := s.LookupKey(ctx, "h1aaaaaaaaaaaaaaaaaaaaaa"); err != nil || k.Tenant != tenant.Default || k.Name != "first" || k.ID != "h1aaaaaaaaaaaaaaaaaa" {
		t.Errorf("key after reopen: %+v, %v", k, err)
	}
	if k, err := s.LookupKey(ctx, "h2bbbbbbbbbbbbbbbbbbbbbb"); err != nil || k.Tenant != "team-a" {
		t.Errorf("second key: %+v, %v", k, err)
	}
	if _, err := s.LookupKey(ctx, "h3"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown key: %v", err)
	}
	if err := s.DeleteKey(ctx, "h1aaaaaaaaaaaaaaaaaa"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("deleting the last admin key: %v", err)
	}
	if err := s.DeleteKey(ctx, "h2bbbbbbbbbbbbbbbbbb"); err != nil {
		t.Errorf("deleting a key: %v", err)
	}
	if err := s.DeleteKey(ctx, "h2bbbbbbbbbbbbbbbbbb"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("deleting it again: %v", err)
	}
	if ks, _ := s.ListKeys(ctx); len(ks) != 1 {
		t.Errorf("keys %+v", ks)
	}
	if _, err := s.Get(ctx, "a"); err != nil {
		t.Errorf("sandbox lost on reopen: %v", err)
	}
	for _, p := range []string{path, path + "-wal"} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, %v; want 0600", filepath.Base(p), fi.Mode().Perm(), err)
		}
	}
}

// A data directory made before tenants keeps working: its keys, sandboxes
// and snapshots are the default tenant's.
func TestMigrateToTenants(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "atoll.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{schema,
		`INSERT INTO api_keys (hash, created_at) VALUES ('0123456789abcdef0123456789', 1)`,
		`INSERT INTO sandboxes (id, state, template, runtime, cpu, memory_mib, disk_gib, pids, env, labels, slot, created_at)
			VALUES ('old', 'stopped', 'host', 'ns', 1, 512, 1, 100, '{}', '{}', 0, 1)`,
		`INSERT INTO snapshots (id, name, sandbox_id, template, created_at) VALUES ('snap', '', 'old', 'host', 1)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if k, err := s.LookupKey(ctx, "0123456789abcdef0123456789"); err != nil || k.Tenant != tenant.Default {
		t.Errorf("old key: %+v, %v", k, err)
	}
	if sb, err := s.Get(ctx, "old"); err != nil || sb.Tenant != tenant.Default {
		t.Errorf("old sandbox: %+v, %v", sb, err)
	}
	if sn, err := s.GetSnapshot(ctx, "snap"); err != nil || sn.Tenant != tenant.Default {
		t.Errorf("old snapshot: %+v, %v", sn, err)
	}
	sb := newSandbox("new")
	sb.Tenant = "team-a"
	if err := s.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(ctx, "new"); got.Tenant != "team-a" {
		t.Errorf("new sandbox's tenant %q", got.Tenant)
	}
	for tn, want := range map[string]int{"": 2, "team-a": 1, tenant.Default: 1, "team-b": 0} {
		if users, err := s.TemplateUsers(ctx, tn); err != nil || users["host"] != want {
			t.Errorf("users of host for %q: %v, %v; want %d", tn, users, err, want)
		}
	}
	for tn, want := range map[string]bool{"team-a": true, tenant.Default: true, "team-b": false} {
		if used, err := s.TenantInUse(ctx, tn); err != nil || used != want {
			t.Errorf("tenant %s in use: %v, %v", tn, used, err)
		}
	}
}

// TestTemplateVersions: a name moves to each new version; sandboxes and
// snapshots hold the version they were made from, and a version is
// collected only once nothing holds it.
func TestTemplateVersions(t *testing.T) {
	ctx := context.Background()
	s := open(t)
	v1 := Template{Name: "py", Source: "reg/py:3", Digest: "sha256:ab", Layers: []string{"l1", "l2"}, Size: 42,
		Config: TemplateConfig{Env: []string{"A=1"}, Workdir: "/app", User: "1000"}, CreatedAt: time.Unix(1700000000, 0).UTC()}
	got1, prev, err := s.PutTemplate(ctx, v1)
	if err != nil || prev != "" || got1.Number != 1 || !ValidVersionID(got1.ID) {
		t.Fatalf("first version: %+v, previous %q, %v", got1, prev, err)
	}
	if cur, err := s.GetTemplate(ctx, "py"); err != nil || cmp.Diff(got1, cur) != "" {
		t.Errorf("get (-want +got):\n%s %v", cmp.Diff(got1, cur), err)
	}
	// The same content again is the same version.
	if again, prev, err := s.PutTemplate(ctx, v1); err != nil || again.ID != got1.ID || again.Number != 1 || prev != got1.ID {
		t.Errorf("same content again: %+v, %q, %v", again, prev, err)
	}
	sb := newSandbox("a")
	sb.Template, sb.TemplateVersion = "py", got1.ID
	if err := s.Create(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := s.PutSnapshot(ctx, Snapshot{ID: "snap", SandboxID: "a", Template: "py", TemplateVersion: got1.ID, State: api.SnapshotReady}); err != nil {
		t.Fatal(err)
	}
	v2 := v1
	v2.Layers = []string{"l1", "l3"}
	got2, prev, err := s.PutTemplate(ctx, v2)
	if err != nil || prev != got1.ID || got2.Number != 2 || got2.ID == got1.ID {
		t.Fatalf("second version: %+v, previous %q, %v", got2, prev, err)
	}
	for ref, want := range map[string]string{"1": got1.ID, "2": got2.ID, got1.ID: got1.ID} {
		if v, err := s.GetTemplateVersion(ctx, "py", ref); err != nil || v.ID != want {
			t.Errorf("py@%s: %+v, %v", ref, v, err)
		}
	}
	for ref, kind := range map[string]error{"3": errdefs.ErrNotFound, "0": errdefs.ErrInvalid, "01": errdefs.ErrInvalid,
		"-1": errdefs.ErrInvalid, "v0000000000000000000": errdefs.ErrNotFound, "x; DROP TABLE": errdefs.ErrInvalid} {
		if _, err := s.GetTemplateVersion(ctx, "py", ref); !errors.Is(err, kind) {
			t.Errorf("py@%s: %v, want %v", ref, err, kind)
		}
	}
	if _, err := s.GetTemplateVersion(ctx, "other", got1.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another name's version by ID: %v", err)
	}
	if gone, err := s.CollectTemplates(ctx); err != nil || len(gone) != 0 {
		t.Errorf("collected versions in use: %+v, %v", gone, err)
	}
	users, _ := s.VersionUsers(ctx, "")
	if users[got1.ID] != (VersionUse{Sandboxes: 1, Snapshots: 1}) {
		t.Errorf("users %v", users)
	}
	s.Delete(ctx, "a")
	if gone, _ := s.CollectTemplates(ctx, got1.ID); len(gone) != 0 {
		t.Errorf("collected a version a snapshot holds: %+v", gone)
	}
	s.DeleteSnapshot(ctx, "snap")
	if gone, err := s.CollectTemplates(ctx, got2.ID); err != nil || len(gone) != 0 {
		t.Errorf("collected the current version: %+v, %v", gone, err)
	}
	if gone, err := s.CollectTemplates(ctx, got1.ID); err != nil || len(gone) != 1 || gone[0].ID != got1.ID {
		t.Errorf("collecting the unheld version: %+v, %v", gone, err)
	}
	// A sandbox of a collected version cannot be recorded.
	sb = newSandbox("b")
	sb.Template, sb.TemplateVersion = "py", got1.ID
	if err := s.Create(ctx, sb); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("create of a collected version: %v", err)
	}
	// A second name; removing a name leaves the version while another holds it.
	if _, err := s.PointTemplate(ctx, "py-tag", got2.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTemplate(ctx, "py"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTemplate(ctx, "py"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("double delete: %v", err)
	}
	if gone, _ := s.CollectTemplates(ctx); len(gone) != 0 {
		t.Errorf("collected a version a tag holds: %+v", gone)
	}
	if names, err := s.ListTemplates(ctx); err != nil || len(names) != 1 || names[0].Name != "py-tag" || names[0].Current.ID != got2.ID {
		t.Errorf("names: %+v, %v", names, err)
	}
	s.DeleteTemplate(ctx, "py-tag")
	if gone, _ := s.CollectTemplates(ctx); len(gone) != 1 {
		t.Errorf("collected %+v, want the last version", gone)
	}
	// Numbers go on from the highest version left.
	if v, _, err := s.PutTemplate(ctx, v1); err != nil || v.Number != 1 {
		t.Errorf("a name made again: %+v, %v", v, err)
	}
}

// A database of templates without versions: each becomes version 1 of its
// name, held by its sandboxes and snapshots.
func TestMigrateTemplates(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "atoll.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{schema, `CREATE TABLE templates (name TEXT PRIMARY KEY, source TEXT NOT NULL,
			digest TEXT NOT NULL, layers TEXT NOT NULL, size INTEGER NOT NULL, config TEXT NOT NULL, created_at INTEGER NOT NULL)`,
		`INSERT INTO templates VALUES ('py', 'reg/py', 'sha256:ab', '["l1"]', 7, '{"workdir":"/app"}', 1)`,
		`INSERT INTO sandboxes (id, state, template, runtime, cpu, memory_mib, disk_gib, pids, env, labels, slot, created_at)
			VALUES ('old', 'stopped', 'py', 'ns', 1, 512, 1, 100, '{}', '{}', 0, 1)`,
		`INSERT INTO sandboxes (id, state, template, runtime, cpu, memory_mib, disk_gib, pids, env, labels, slot, created_at)
			VALUES ('hosty', 'stopped', 'host', 'ns', 1, 512, 1, 100, '{}', '{}', 1, 1)`,
		`INSERT INTO snapshots (id, name, sandbox_id, template, created_at) VALUES ('snap', '', 'old', 'py', 1)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(q, err)
		}
	}
	db.Close()
	for range 2 { // and again, migrated already
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		v, err := s.GetTemplate(ctx, "py")
		if err != nil || v.Number != 1 || v.Config.Workdir != "/app" || v.ID != VersionID("py", []string{"l1"}, TemplateConfig{Workdir: "/app"}) {
			t.Errorf("migrated template: %+v, %v", v, err)
		}
		if sb, _ := s.Get(ctx, "old"); sb.TemplateVersion != v.ID {
			t.Errorf("migrated sandbox holds %q", sb.TemplateVersion)
		}
		if sb, _ := s.Get(ctx, "hosty"); sb.TemplateVersion != "" {
			t.Errorf("host sandbox holds %q", sb.TemplateVersion)
		}
		if sn, _ := s.GetSnapshot(ctx, "snap"); sn.TemplateVersion != v.ID {
			t.Errorf("migrated snapshot holds %q", sn.TemplateVersion)
		}
		s.Close()
	}
}

// TestGroupCommit writes from many goroutines at once: the writes share
// commits, yet each one succeeds or fails on its own (a refused update or
// delete undoes nothing of its neighbours'), concurrent creates get distinct
// slots, and everything acknowledged is there after a reopen.
func TestGroupCommit(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "atoll.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	const n = 48
	for i := range n {
		if err := s.Create(ctx, newSandbox(fmt.Sprintf("old%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	before := s.commits.Load()
	var wg sync.WaitGroup
	errs := make([]error, 3*n)
	created := make([]*Sandbox, n)
	for i := range n {
		wg.Add(3)
		go func() {
			defer wg.Done()
			created[i] = newSandbox(fmt.Sprintf("new%d", i))
			errs[i] = s.Create(ctx, created[i])
		}()
		go func() {
			// Refused: the sandbox is creating, not running.
			defer wg.Done()
			sb := newSandbox(fmt.Sprintf("old%d", i))
			sb.State = api.StateStopped
			errs[n+i] = s.Update(ctx, sb, api.StateRunning)
		}()
		go func() {
			defer wg.Done()
			errs[2*n+i] = s.Delete(ctx, fmt.Sprintf("missing%d", i))
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Errorf("create %d: %v", i, errs[i])
		}
		if !errors.Is(errs[n+i], errdefs.ErrConflict) {
			t.Errorf("update of a sandbox in the wrong state: %v", errs[n+i])
		}
		if !errors.Is(errs[2*n+i], errdefs.ErrNotFound) {
			t.Errorf("delete of a missing sandbox: %v", errs[2*n+i])
		}
	}
	if c := s.commits.Load() - before; c >= 3*n {
		t.Errorf("%d writes at once took %d commits: none shared one", 3*n, c)
	}
	s.Close()
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	slots := map[int]string{}
	sbs, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range sbs {
		if other, ok := slots[sb.Slot]; ok {
			t.Errorf("%s and %s share slot %d", sb.ID, other, sb.Slot)
		}
		slots[sb.Slot] = sb.ID
		if sb.State != api.StateCreating {
			t.Errorf("%s is %s after the refused updates, want creating", sb.ID, sb.State)
		}
	}
	if len(sbs) != 2*n {
		t.Errorf("%d sandboxes after reopening, want %d", len(sbs), 2*n)
	}
}
