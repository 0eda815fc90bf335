package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/storetest"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// serverURL is ATOLL_TEST_POSTGRES_URL, the database of a PostgreSQL server
// that scripts/test.sh starts; without it the tests skip (fail in strict
// mode).
func serverURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv("ATOLL_TEST_POSTGRES_URL")
	if u == "" {
		testenv.Skip(t, "ATOLL_TEST_POSTGRES_URL is not set (scripts/test.sh starts a PostgreSQL server and sets it)")
	}
	return u
}

// withParams is u with PostgreSQL connection parameters added, whether it
// is a URL or a key=value DSN.
func withParams(t *testing.T, u string, params map[string]string) string {
	t.Helper()
	if strings.HasPrefix(u, "postgres://") || strings.HasPrefix(u, "postgresql://") {
		p, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		q := p.Query()
		for k, v := range params {
			q.Set(k, v)
		}
		p.RawQuery = q.Encode()
		return p.String()
	}
	for k, v := range params {
		u += " " + k + "=" + v
	}
	return u
}

// schema makes a schema of its own for dir on the test server, dropped when
// the test ends, and returns a URL whose connections use it and are named
// (application_name) after it.
type schemas struct {
	mu   sync.Mutex
	made map[string]bool
}

func (sc *schemas) url(t *testing.T, dir string) (string, string) {
	t.Helper()
	base := serverURL(t)
	sum := sha256.Sum256([]byte(dir))
	name := "atoll_test_" + hex.EncodeToString(sum[:8])
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if !sc.made[name] {
		admin(t, base, `CREATE SCHEMA `+name)
		t.Cleanup(func() { admin(t, base, `DROP SCHEMA `+name+` CASCADE`) })
		if sc.made == nil {
			sc.made = map[string]bool{}
		}
		sc.made[name] = true
	}
	return withParams(t, base, map[string]string{"search_path": name, "application_name": name}), name
}

// admin runs sql on the test server on a connection of its own.
func admin(t *testing.T, u, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func openStore(t *testing.T, u string) *Store {
	t.Helper()
	st, err := Open(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestConformance(t *testing.T) {
	serverURL(t)
	var sc schemas
	storetest.Run(t, func(t *testing.T, dir string) store.Store {
		u, _ := sc.url(t, dir)
		return openStore(t, u)
	})
}

// TestConcurrentOpen: nodes opening one new database at once each get a
// working store, and the schema's steps are applied once.
func TestConcurrentOpen(t *testing.T) {
	var sc schemas
	u, name := sc.url(t, t.TempDir())
	var wg sync.WaitGroup
	stores := make([]*Store, 6)
	errs := make([]error, len(stores))
	for i := range stores {
		wg.Go(func() { stores[i], errs[i] = Open(context.Background(), u) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		defer stores[i].Close()
	}
	all, err := steps()
	if err != nil {
		t.Fatal(err)
	}
	var n, top int
	if err := stores[0].pool.QueryRow(context.Background(), `SELECT COUNT(*), MAX(version) FROM `+name+`.schema_version`).Scan(&n, &top); err != nil {
		t.Fatal(err)
	}
	if n != len(all) || top != all[len(all)-1].version {
		t.Errorf("schema_version has %d rows up to %d; want %d up to %d", n, top, len(all), all[len(all)-1].version)
	}
	for i, st := range stores {
		if err := st.AddKey(context.Background(), fmt.Sprintf("%064x", i), "k", ""); err != nil {
			t.Errorf("store %d: %v", i, err)
		}
	}
}

// TestOpenRefusesNewerSchema: a database a newer atoll migrated is not
// touched.
func TestOpenRefusesNewerSchema(t *testing.T) {
	var sc schemas
	u, name := sc.url(t, t.TempDir())
	openStore(t, u).Close()
	admin(t, u, `INSERT INTO `+name+`.schema_version (version, name) VALUES (999999, 'future.sql')`)
	if st, err := Open(context.Background(), u); err == nil {
		st.Close()
		t.Fatal("opened a database of a newer schema")
	}
}

// TestOpenBadURL: a URL that does not parse is invalid, and the error does
// not repeat it (it may hold a password).
func TestOpenBadURL(t *testing.T) {
	_, err := Open(context.Background(), "postgres://user:s3cret@host:notaport/db")
	if !errors.Is(err, errdefs.ErrInvalid) || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("bad URL: %v", err)
	}
}

// kill ends the server's connections that name, the store's schema, names,
// as a server restart, a failover or a network fault would, and returns
// how many it ended.
func kill(t *testing.T, name string) int {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var n int
	if err := c.QueryRow(ctx, `SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = $1 AND pid <> pg_backend_pid()) k`, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestConnectionsDropped: with its connections ended under it, again and
// again while writers run, the store reconnects: each operation succeeds
// or (a write whose commit's answer was lost) says it is unavailable, and
// every write it acknowledged is there.
func TestConnectionsDropped(t *testing.T) {
	ctx := context.Background()
	var sc schemas
	u, name := sc.url(t, t.TempDir())
	st := openStore(t, u)
	defer st.Close()
	if err := st.AddKey(ctx, strings.Repeat("a", 64), "admin", ""); err != nil {
		t.Fatal(err)
	}
	// Idle connections, all dead: the next operations must not fail.
	if n := kill(t, name); n == 0 {
		t.Fatal("no connection to end")
	}
	if n, err := st.KeyCount(ctx); err != nil || n != 1 {
		t.Fatalf("key count after the connections ended: %d, %v", n, err)
	}
	if err := st.Create(ctx, storetest.NewSandbox("first")); err != nil {
		t.Fatalf("create after the connections ended: %v", err)
	}
	// Connections ended while writes run.
	var acked sync.Map
	var unavailable atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("w%d-%d", w, i)
				sb := storetest.NewSandbox(id)
				err := st.Create(ctx, sb)
				if err == nil {
					sb.State = api.StateRunning
					err = st.Update(ctx, sb, api.StateCreating)
				}
				switch {
				case err == nil:
					acked.Store(id, true)
				case errors.Is(err, errdefs.ErrUnavailable):
					unavailable.Add(1)
				default:
					t.Errorf("%s: %v", id, err)
					return
				}
			}
		})
	}
	ended := 0
	for range 10 {
		time.Sleep(50 * time.Millisecond)
		ended += kill(t, name)
	}
	close(stop)
	wg.Wait()
	n := 0
	acked.Range(func(k, _ any) bool {
		n++
		if sb, err := st.Get(ctx, k.(string)); err != nil || sb.State != api.StateRunning {
			t.Errorf("acknowledged %s: %+v, %v", k, sb.State, err)
		}
		return true
	})
	t.Logf("%d connections ended; %d writes acknowledged, %d unavailable", ended, n, unavailable.Load())
	if n == 0 {
		t.Error("no write got through")
	}
}

// TestServerRestart: the server restarted under a store in use (with the
// command ATOLL_TEST_POSTGRES_CTL names, which scripts/test.sh sets: it
// runs pg_ctl, given an action). The store's next operations wait for the
// server and succeed; what it acknowledged before is there.
func TestServerRestart(t *testing.T) {
	ctl := os.Getenv("ATOLL_TEST_POSTGRES_CTL")
	if ctl == "" {
		testenv.Skip(t, "ATOLL_TEST_POSTGRES_CTL is not set (scripts/test.sh sets it to its server's pg_ctl)")
	}
	ctx := context.Background()
	var sc schemas
	u, _ := sc.url(t, t.TempDir())
	st := openStore(t, u)
	defer st.Close()
	if err := st.Create(ctx, storetest.NewSandbox("before")); err != nil {
		t.Fatal(err)
	}
	restarted := make(chan error, 1)
	// Its output to a file, not a pipe: the server it starts keeps what
	// it inherits open, and a pipe would never end.
	out, err := os.Create(filepath.Join(t.TempDir(), "ctl.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", ctl+" restart")
	cmd.Stdout, cmd.Stderr = out, out
	go func() {
		err := cmd.Run()
		if err != nil {
			b, _ := os.ReadFile(out.Name())
			err = fmt.Errorf("%s restart: %v: %s", ctl, err, b)
		}
		restarted <- err
	}()
	// Writes during the restart: each waits for the server.
	var acked []string
	unavailable := 0
	for i := 0; ; i++ {
		id := fmt.Sprintf("during%d", i)
		switch err := st.Create(ctx, storetest.NewSandbox(id)); {
		case err == nil:
			acked = append(acked, id)
		case errors.Is(err, errdefs.ErrUnavailable):
			unavailable++
		default:
			t.Fatalf("create during the restart: %v", err)
		}
		select {
		case err := <-restarted:
			if err != nil {
				t.Fatal(err)
			}
		default:
			time.Sleep(10 * time.Millisecond)
			continue
		}
		break
	}
	if err := st.Create(ctx, storetest.NewSandbox("after")); err != nil {
		t.Fatalf("create after the restart: %v", err)
	}
	t.Logf("%d writes acknowledged during the restart, %d unavailable", len(acked), unavailable)
	for _, id := range append(acked, "before", "after") {
		if _, err := st.Get(ctx, id); err != nil {
			t.Errorf("%s: %v", id, err)
		}
	}
}

func TestCluster(t *testing.T) {
	serverURL(t)
	var sc schemas
	storetest.Cluster(t, func(t *testing.T, dir string) store.Cluster {
		u, _ := sc.url(t, dir)
		return openStore(t, u)
	})
}

// BenchmarkPlace places batches of 50 sandboxes from 8 callers at once
// onto 1,000 nodes with room for all, as a busy scheduler would; b.N is
// the number of batches. It reports placements per second. Its quota
// cases place them for tenants with a quota (that never refuses), which
// each batch locks and sums: one tenant for all (every batch waits for
// the one before), or one per caller.
//
//	go test -run '^$' -bench Place -benchtime 400x ./internal/store/postgres/
func BenchmarkPlace(b *testing.B) {
	for _, c := range []struct {
		name    string
		tenants int
	}{{"no-quota", 0}, {"quota-1-tenant", 1}, {"quota-8-tenants", 8}} {
		b.Run(c.name, func(b *testing.B) { benchPlace(b, c.tenants) })
	}
}

func benchPlace(b *testing.B, tenants int) {
	const nodes, callers, batch = 1000, 8, 50
	u := serverURLB(b)
	name := fmt.Sprintf("atoll_bench_%d_%d", os.Getpid(), tenants)
	adminB(b, u, `CREATE SCHEMA `+name)
	defer adminB(b, u, `DROP SCHEMA `+name+` CASCADE`)
	st, err := Open(context.Background(), withParamsB(u, name))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	for i := range nodes {
		n := storetest.NewNode(fmt.Sprintf("node-%04d", i))
		n.Capacity = store.Resources{CPU: 1e6, MemoryMiB: 1e9, DiskGiB: 1e9, Sandboxes: 1e6}
		if _, err := st.Join(ctx, n, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	for i := range tenants {
		if err := st.SetQuota(ctx, fmt.Sprintf("t%d", i), store.Quota{Sandboxes: 1e9, CPU: 1e9}); err != nil {
			b.Fatal(err)
		}
	}
	var next, refused atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
				sbs := make([]*store.Sandbox, batch)
				for j := range sbs {
					sbs[j] = storetest.NewSandbox(fmt.Sprintf("b%d-%d-%d", g, i, j))
					sbs[j].Node = fmt.Sprintf("node-%04d", (int(i)*batch+j*7919)%nodes)
					if tenants > 0 {
						sbs[j].Tenant = fmt.Sprintf("t%d", g%tenants)
					}
				}
				for _, err := range st.Place(ctx, sbs) {
					if err != nil {
						refused.Add(1)
						b.Error(err)
					}
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.ReportMetric(float64(b.N*batch)/elapsed.Seconds(), "placements/s")
	if refused.Load() > 0 {
		b.Errorf("%d placements refused", refused.Load())
	}
}

func serverURLB(b *testing.B) string {
	u := os.Getenv("ATOLL_TEST_POSTGRES_URL")
	if u == "" {
		b.Skip("ATOLL_TEST_POSTGRES_URL is not set")
	}
	return u
}

func withParamsB(u, schema string) string {
	p, err := url.Parse(u)
	if err != nil || !strings.HasPrefix(u, "postgres") {
		return u + " search_path=" + schema
	}
	q := p.Query()
	q.Set("search_path", schema)
	p.RawQuery = q.Encode()
	return p.String()
}

func adminB(b *testing.B, u, sql string) {
	c, err := pgx.Connect(context.Background(), u)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(context.Background(), sql); err != nil {
		b.Fatal(err)
	}
}

// A batch larger than one statement's parameters allow is placed whole.
func TestPlaceLargeBatch(t *testing.T) {
	var sc schemas
	u, _ := sc.url(t, t.TempDir())
	st := openStore(t, u)
	defer st.Close()
	ctx := context.Background()
	n := storetest.NewNode("big")
	n.Capacity = store.Resources{CPU: 1e6, MemoryMiB: 1e9, DiskGiB: 1e9, Sandboxes: 1e6}
	if _, err := st.Join(ctx, n, time.Hour); err != nil {
		t.Fatal(err)
	}
	var sbs []*store.Sandbox
	for i := range 2500 {
		sb := storetest.NewSandbox(fmt.Sprintf("sb-%d", i))
		sb.Node = "big"
		sbs = append(sbs, sb)
	}
	again := *sbs[0]
	sbs = append(sbs, &again) // and one twice: refused alone
	errs := st.Place(ctx, sbs)
	for i, err := range errs[:2500] {
		if err != nil {
			t.Fatalf("placement %d: %v", i, err)
		}
	}
	if !errors.Is(errs[2500], errdefs.ErrConflict) {
		t.Errorf("second placement of one ID: %v", errs[2500])
	}
	if all, err := st.ListNode(ctx, "big"); err != nil || len(all) != 2500 || sbs[2499].Slot != 2499 {
		t.Errorf("%d placed, last slot %d, %v", len(all), sbs[2499].Slot, err)
	}
}

// TestExpireEndsFencedSessions: a node cut off in the middle of a
// transaction (a session idle in it, holding its node's row) does not hold
// up its fence: Expire ends that node's sessions, and no others.
func TestExpireEndsFencedSessions(t *testing.T) {
	serverURL(t)
	var sc schemas
	u, _ := sc.url(t, t.TempDir())
	ctx := context.Background()
	fencer := openStore(t, u)
	defer fencer.Close()
	if _, err := fencer.Join(ctx, storetest.NewNode("a"), time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := fencer.Join(ctx, storetest.NewNode("b"), 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// b's session: a transaction that locks b's row and goes quiet.
	b, err := Open(ctx, u, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM nodes WHERE name = 'b' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	// a's session, beside it, must survive.
	a, err := Open(ctx, u, "a")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ac, err := a.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Release()

	ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	t0 := time.Now()
	gone, err := fencer.Expire(ectx, time.Now().Add(time.Second), "lease expired")
	if err != nil || len(gone) != 1 || gone[0].Name != "b" {
		t.Fatalf("Expire: %v, %v; want b fenced", gone, err)
	}
	t.Logf("fenced in %s beside b's open transaction", time.Since(t0).Round(time.Millisecond))
	if _, err := tx.Exec(ctx, `SELECT 1`); err == nil {
		t.Error("b's transaction went on after b was fenced")
	}
	if err := ac.Ping(ctx); err != nil {
		t.Errorf("a's session ended too: %v", err)
	}
}
