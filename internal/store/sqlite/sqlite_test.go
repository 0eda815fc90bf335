package sqlite

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/storetest"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// TestConformance holds the SQLite store to the store contract.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, dir string) store.Store { return openDB(t, filepath.Join(dir, "atoll.db")) })
}

// openDB opens the database at path, which the caller closes.
func openDB(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestFileMode: the database holds sandboxes' environments, so it and its
// write-ahead log are readable by root only.
func TestFileMode(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "atoll.db")
	s := openDB(t, path)
	defer s.Close()
	if err := s.AddKey(ctx, "h1aaaaaaaaaaaaaaaaaaaaaa", "first", ""); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal"} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, %v; want 0600", filepath.Base(p), fi.Mode().Perm(), err)
		}
	}
}

// TestCrash kills a process that writes (SIGKILL: no Close, no
// deferred anything) and opens its database again: every write it
// acknowledged is there, each with its recorded transition, and the slots
// are still distinct. The test binary is the writer, re-run as a helper.
func TestCrash(t *testing.T) {
	if path := os.Getenv("ATOLL_TEST_CRASH_DB"); path != "" {
		crashWriter(path)
		return
	}
	path := filepath.Join(t.TempDir(), "atoll.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrash$")
	cmd.Env = append(os.Environ(), "ATOLL_TEST_CRASH_DB="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	acked := map[string]bool{}
	sc := bufio.NewScanner(out)
	for len(acked) < 200 && sc.Scan() {
		var id string
		if _, err := fmt.Sscanf(sc.Text(), "ack %s", &id); err == nil {
			acked[id] = true
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	if len(acked) < 200 {
		t.Fatalf("the writer acknowledged %d writes before it ended", len(acked))
	}
	ctx := context.Background()
	s := openDB(t, path)
	defer s.Close()
	sbs, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slots := map[int]bool{}
	for _, sb := range sbs {
		delete(acked, sb.ID)
		if slots[sb.Slot] {
			t.Errorf("slot %d twice", sb.Slot)
		}
		slots[sb.Slot] = true
		if tr, err := s.Transitions(ctx, sb.ID); err != nil || len(tr) != 1 {
			t.Errorf("%s: transitions %+v, %v", sb.ID, tr, err)
		}
	}
	if len(acked) > 0 {
		t.Errorf("%d acknowledged sandboxes lost in the crash", len(acked))
	}
}

// crashWriter creates sandboxes from several goroutines until it is
// killed, saying "ack <id>" once a create has returned.
func crashWriter(path string) {
	s, err := Open(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var mu sync.Mutex
	for g := range 4 {
		go func() {
			for i := 0; ; i++ {
				id := fmt.Sprintf("g%d-%d", g, i)
				if err := s.Create(context.Background(), storetest.NewSandbox(id)); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				mu.Lock()
				fmt.Println("ack", id)
				mu.Unlock()
			}
		}()
	}
	select {}
}

// oldDB makes a database as an older version left it: today's schema
// without the columns and tables later versions added, then stmts.
func oldDB(t *testing.T, stmts ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "atoll.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range append([]string{schema}, stmts...) {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(q, err)
		}
	}
	return path
}

// A data directory made before tenants keeps working: its keys, sandboxes
// and snapshots are the default tenant's.
func TestMigrateToTenants(t *testing.T) {
	ctx := context.Background()
	path := oldDB(t,
		`INSERT INTO api_keys (hash, created_at) VALUES ('0123456789abcdef0123456789', 1)`,
		`INSERT INTO sandboxes (id, state, template, runtime, cpu, memory_mib, disk_gib, pids, env, labels, slot, created_at)
			VALUES ('old', 'stopped', 'host', 'ns', 1, 512, 1, 100, '{}', '{}', 0, 1)`,
		`INSERT INTO snapshots (id, name, sandbox_id, template, created_at) VALUES ('snap', '', 'old', 'host', 1)`,
	)
	s := openDB(t, path)
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
	sb := storetest.NewSandbox("new")
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

// A database of templates without versions: each becomes version 1 of its
// name, held by its sandboxes and snapshots.
func TestMigrateTemplates(t *testing.T) {
	ctx := context.Background()
	path := oldDB(t, `CREATE TABLE templates (name TEXT PRIMARY KEY, source TEXT NOT NULL,
			digest TEXT NOT NULL, layers TEXT NOT NULL, size INTEGER NOT NULL, config TEXT NOT NULL, created_at INTEGER NOT NULL)`,
		`INSERT INTO templates VALUES ('py', 'reg/py', 'sha256:ab', '["l1"]', 7, '{"workdir":"/app"}', 1)`,
		`INSERT INTO sandboxes (id, state, template, runtime, cpu, memory_mib, disk_gib, pids, env, labels, slot, created_at)
			VALUES ('old', 'stopped', 'py', 'ns', 1, 512, 1, 100, '{}', '{}', 0, 1)`,
		`INSERT INTO sandboxes (id, state, template, runtime, cpu, memory_mib, disk_gib, pids, env, labels, slot, created_at)
			VALUES ('hosty', 'stopped', 'host', 'ns', 1, 512, 1, 100, '{}', '{}', 1, 1)`,
		`INSERT INTO snapshots (id, name, sandbox_id, template, created_at) VALUES ('snap', '', 'old', 'py', 1)`,
	)
	for range 2 { // and again, migrated already
		s := openDB(t, path)
		v, err := s.GetTemplate(ctx, "py")
		if err != nil || v.Number != 1 || v.Config.Workdir != "/app" || v.ID != store.VersionID("py", []string{"l1"}, store.TemplateConfig{Workdir: "/app"}) {
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

// TestGroupCommitAlone: one writer, one write after another. No commit
// waits for writes that are not coming; a burst's commits do.
func TestGroupCommitAlone(t *testing.T) {
	ctx := context.Background()
	s := openDB(t, filepath.Join(t.TempDir(), "atoll.db"))
	defer s.Close()
	for i := range 20 {
		if err := s.Create(ctx, storetest.NewSandbox(fmt.Sprintf("seq%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	if g := s.gathered.Load(); g != 0 {
		t.Errorf("20 writes one after another: %d commits waited for more", g)
	}
}

// TestGroupCommit writes from many goroutines at once: the writes share
// commits, yet each one succeeds or fails on its own (a refused update or
// delete undoes nothing of its neighbours'), concurrent creates get distinct
// slots, and everything acknowledged is there after a reopen.
func TestGroupCommit(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "atoll.db")
	s := openDB(t, path)
	const n = 48
	for i := range n {
		if err := s.Create(ctx, storetest.NewSandbox(fmt.Sprintf("old%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	before := s.commits.Load()
	var wg sync.WaitGroup
	errs := make([]error, 3*n)
	created := make([]*store.Sandbox, n)
	for i := range n {
		wg.Add(3)
		go func() {
			defer wg.Done()
			created[i] = storetest.NewSandbox(fmt.Sprintf("new%d", i))
			errs[i] = s.Create(ctx, created[i])
		}()
		go func() {
			// Refused: the sandbox is creating, not running.
			defer wg.Done()
			sb := storetest.NewSandbox(fmt.Sprintf("old%d", i))
			sb.State = api.StateStopped
			errs[n+i] = s.Update(ctx, sb, api.StateRunning)
		}()
		go func() {
			defer wg.Done()
			_, errs[2*n+i] = s.Delete(ctx, fmt.Sprintf("missing%d", i))
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
	s = openDB(t, path)
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

// A database made before cluster mode, whose slots were unique across the
// table: its sandboxes keep their slots, and slots become unique per node.
func TestMigrateSlotPerNode(t *testing.T) {
	ctx := context.Background()
	old := strings.Replace(schema, "slot INTEGER NOT NULL,", "slot INTEGER NOT NULL UNIQUE,", 1)
	if old == schema {
		t.Fatal("the schema's slot column changed; update the test")
	}
	path := oldDB(t, `DROP TABLE sandboxes`, old,
		`INSERT INTO sandboxes (id, state, template, runtime, cpu, memory_mib, disk_gib, pids, env, labels, slot, created_at)
			VALUES ('old', 'stopped', 'host', 'ns', 1, 512, 1, 100, '{}', '{}', 0, 1)`)
	for range 2 { // and again, migrated already
		s := openDB(t, path)
		if sb, err := s.Get(ctx, "old"); err != nil || sb.Slot != 0 || sb.Node != "" {
			t.Errorf("old sandbox: %+v, %v", sb, err)
		}
		s.Close()
	}
	s := openDB(t, path)
	defer s.Close()
	sb := storetest.NewSandbox("there")
	sb.Node = "n1"
	if err := s.Create(ctx, sb); err != nil || sb.Slot != 0 {
		t.Fatalf("slot %d on another node: %v", sb.Slot, err)
	}
	here := storetest.NewSandbox("here")
	if err := s.Create(ctx, here); err != nil || here.Slot != 1 {
		t.Fatalf("slot %d beside the old one: %v", here.Slot, err)
	}
}
