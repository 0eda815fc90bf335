package templates

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/atoll-dev/atoll/internal/blob"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/store/sqlite"
	"github.com/atoll-dev/atoll/internal/testenv"
	"github.com/atoll-dev/atoll/internal/testenv/pgtest"
)

// syncBuffer is a log destination several goroutines write.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// commitLayer commits layer id to ls, holding one file f with content.
func commitLayer(t *testing.T, ls *layers.Store, id, content string) {
	t.Helper()
	dir, err := ls.NewLayerDir()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ls.CommitLayer(id, dir); err != nil {
		t.Fatal(err)
	}
}

// node is a Service with its own layer store, over the shared store and
// bucket, as a cluster node has.
func node(t *testing.T, st store.Store, bucket blob.Store, log io.Writer) (*Service, *layers.Store) {
	ls := testenv.Layers(t, testenv.Dir(t))
	return New(Config{Store: st, Layers: ls, Blobs: bucket, Logger: slog.New(slog.NewTextHandler(log, nil))}), ls
}

// TestShareLayers publishes a version's layer from one node and pulls it on
// another: eight concurrent pulls download it once; the puller then holds
// the version. A tampered object is refused and leaves nothing behind; a
// version without recorded digests is refused; collecting the version
// deletes the object and, at the next Refresh, the puller's copy.
func TestShareLayers(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "atoll.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	bucket, err := blob.Open(ctx, "file://"+t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer bucket.Close()
	var log1, log2 syncBuffer
	n1, ls1 := node(t, st, bucket, &log1)
	n2, ls2 := node(t, st, bucket, &log2)

	record := func(tpl store.Template) store.Template {
		t.Helper()
		v, _, err := st.PutTemplate(ctx, tpl)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	id := strings.Repeat("a1", 32)
	commitLayer(t, ls1, id, "shared")
	tpl := store.Template{Name: "t", Layers: []string{id}, Config: store.TemplateConfig{Base: layers.HostTemplate}}
	if err := n1.publish(ctx, &tpl, "p1"); err != nil {
		t.Fatal(err)
	}
	d := tpl.Config.Blobs[id]
	keys, _ := bucket.List(ctx, "layers/")
	if len(keys) != 1 || keys[0] != LayerKey(d) {
		t.Fatalf("objects after publishing: %v, want [%s]", keys, LayerKey(d))
	}
	v := record(tpl)
	// Publishing the layer again (another version of it) writes nothing.
	again := store.Template{Name: "t2", Layers: []string{id}}
	if err := n1.publish(ctx, &again, "p2"); err != nil || again.Config.Blobs[id] != d {
		t.Fatalf("publishing again: %v, %v", err, again.Config.Blobs)
	}
	if strings.Count(log1.String(), "template layer published") != 1 {
		t.Errorf("node 1 published %d times", strings.Count(log1.String(), "template layer published"))
	}

	var wg sync.WaitGroup
	pulls := make([]Pull, 8)
	errs := make([]error, 8)
	for i := range pulls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pulls[i], errs[i] = n2.Pull(ctx, v)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(log2.String(), "template layer fetched"); got != 1 {
		t.Errorf("eight concurrent pulls fetched %d times, want once", got)
	}
	for _, p := range pulls {
		if p.Layers != 1 || p.Bytes == 0 {
			t.Errorf("pull %+v", p)
		}
	}
	if b, err := os.ReadFile(filepath.Join(ls2.LayerDir(id), "f")); err != nil || string(b) != "shared" {
		t.Errorf("pulled layer: %q %v", b, err)
	}
	if p, err := n2.Pull(ctx, v); err != nil || p != (Pull{}) {
		t.Errorf("pull of a layer held: %+v %v", p, err)
	}
	if h := n2.Held(); len(h) != 1 || h[0] != v.ID {
		t.Errorf("node 2 holds %v, want [%s]", h, v.ID)
	}

	// Hostile: a tampered object; a version whose digest is not recorded.
	bad := strings.Repeat("b2", 32)
	commitLayer(t, ls1, bad, "original")
	badT := store.Template{Name: "bad", Layers: []string{bad}}
	if err := n1.publish(ctx, &badT, "p3"); err != nil {
		t.Fatal(err)
	}
	if err := bucket.Put(ctx, LayerKey(badT.Config.Blobs[bad]), func(w io.Writer) error {
		_, err := io.WriteString(w, "something else")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	_, err = n2.Pull(ctx, record(badT))
	var corrupt *CorruptLayerError
	if !errors.As(err, &corrupt) || !errors.Is(err, errdefs.ErrUnavailable) || corrupt.Layer != bad {
		t.Errorf("pull of a tampered layer: %v, want a CorruptLayerError", err)
	}
	if ls2.HasLayer(bad) {
		t.Error("the tampered layer was added")
	}
	if left, _ := filepath.Glob(filepath.Join(ls2.Dir(), ".upload-*")); len(left) != 0 {
		t.Errorf("the refused pull left %v", left)
	}
	unpublished := record(store.Template{Name: "old", Layers: []string{strings.Repeat("c3", 32)}})
	if _, err := n2.Pull(ctx, unpublished); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "not in the cluster's object store") {
		t.Errorf("pull of a version without digests: %v", err)
	}

	// Collecting the version deletes its object, and node 2's copy at its
	// next Refresh.
	if err := st.DeleteTemplate(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	n1.Collect(ctx, v.ID)
	if keys, _ := bucket.List(ctx, LayerKey(d)); len(keys) != 0 {
		t.Errorf("object of the collected version: %v", keys)
	}
	n2.Refresh(ctx)
	if ls2.HasLayer(id) {
		t.Error("node 2 keeps the layer of the collected version")
	}
	for _, h := range n2.Held() {
		if h == v.ID {
			t.Error("node 2 still reports the collected version")
		}
	}
}

// TestSharePinned: a node making a version that names an object pins it,
// so that another node collecting the last version that named it keeps
// it; the new version, recorded after, is then pulled by a third node, and
// its collection once it is unpinned deletes the object.
// Without the pin the collection deletes the object the new version names
// (checked first, with nodes that have no pins).
func TestSharePinned(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	for _, pinned := range []bool{false, true} {
		st := pgtest.Open(t, "templatepins")
		bucket, err := blob.Open(ctx, "file://"+t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		defer bucket.Close()
		var logs [3]syncBuffer
		var nodes [3]*Service
		var ls [3]*layers.Store
		for i := range nodes {
			ls[i] = testenv.Layers(t, testenv.Dir(t))
			cfg := Config{Store: st, Layers: ls[i], Blobs: bucket, Logger: slog.New(slog.NewTextHandler(&logs[i], nil))}
			if pinned {
				cfg.Pins = st
			}
			nodes[i] = New(cfg)
		}
		id := strings.Repeat("d4", 32)
		commitLayer(t, ls[0], id, "shared")
		// Version 1 of app, made on node 0.
		v1 := store.Template{Name: "app", Layers: []string{id}, Config: store.TemplateConfig{Base: layers.HostTemplate}}
		if err := nodes[0].publish(ctx, &v1, "v1"); err != nil {
			t.Fatal(err)
		}
		nodes[0].unpin(ctx, "v1")
		rec1, _, err := st.PutTemplate(ctx, v1)
		if err != nil {
			t.Fatal(err)
		}
		// Node 1 makes version 2 of app, of the same layer: it finds the
		// object there. Before it records the version, node 0 collects
		// version 1, which nothing holds any more.
		v2 := store.Template{Name: "app", Layers: []string{id}, Config: store.TemplateConfig{Base: layers.HostTemplate}}
		if err := nodes[1].publish(ctx, &v2, "v2"); err != nil {
			t.Fatal(err)
		}
		if err := st.DeleteTemplate(ctx, "app"); err != nil {
			t.Fatal(err)
		}
		nodes[0].Collect(ctx, rec1.ID)
		rec2, _, err := st.PutTemplate(ctx, v2)
		if err != nil {
			t.Fatal(err)
		}
		_, err = nodes[2].Pull(ctx, rec2)
		if !pinned {
			if err == nil {
				t.Fatal("without pins, the collection kept the object: the test shows nothing")
			}
			continue
		}
		if err != nil {
			t.Fatalf("pull of the version recorded after the collection: %v", err)
		}
		if !strings.Contains(logs[0].String(), "a version being made names it") {
			t.Errorf("node 0's log does not say why the object stayed:\n%s", logs[0].String())
		}
		if b, err := os.ReadFile(filepath.Join(ls[2].LayerDir(id), "f")); err != nil || string(b) != "shared" {
			t.Errorf("pulled layer: %q %v", b, err)
		}
		// Once node 1 recorded version 2 and unpinned, collecting it
		// deletes the object.
		nodes[1].unpin(ctx, "v2")
		if err := st.DeleteTemplate(ctx, "app"); err != nil {
			t.Fatal(err)
		}
		nodes[0].Collect(ctx, rec2.ID)
		if keys, _ := bucket.List(ctx, LayerKey(v2.Config.Blobs[id])); len(keys) != 0 {
			t.Errorf("object of the collected version 2: %v", keys)
		}
	}
}

// TestShareSweep: the objects of a version whose maker died before it
// recorded the version stay while its pins last and go at the next sweep
// after (Refresh sweeps); a version's objects, and keys outside the
// layers' prefix, stay. A drop that finds, under the pins' lock, a version
// naming the object after all (recorded and unpinned since its caller
// looked) keeps it; without that second look it went (checked first).
func TestShareSweep(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	st := pgtest.Open(t, "templatesweep")
	bucket, err := blob.Open(ctx, "file://"+t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer bucket.Close()
	var nodes [3]*Service
	var ls [3]*layers.Store
	for i := range nodes {
		ls[i] = testenv.Layers(t, testenv.Dir(t))
		nodes[i] = New(Config{Store: st, Layers: ls[i], Blobs: bucket, Pins: st, Logger: slog.New(slog.DiscardHandler)})
	}
	exists := func(key string) bool {
		keys, err := bucket.List(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return len(keys) == 1
	}
	// A version made and recorded on node 0.
	kept := strings.Repeat("a1", 32)
	commitLayer(t, ls[0], kept, "kept")
	v1 := store.Template{Name: "app", Layers: []string{kept}, Config: store.TemplateConfig{Base: layers.HostTemplate}}
	if err := nodes[0].publish(ctx, &v1, "v1"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.PutTemplate(ctx, v1); err != nil {
		t.Fatal(err)
	}
	nodes[0].unpin(ctx, "v1")
	// Node 1 publishes a version's layer and dies before recording it.
	orphan := strings.Repeat("b2", 32)
	commitLayer(t, ls[1], orphan, "orphan")
	v2 := store.Template{Name: "other", Layers: []string{orphan}, Config: store.TemplateConfig{Base: layers.HostTemplate}}
	if err := nodes[1].publish(ctx, &v2, "dead"); err != nil {
		t.Fatal(err)
	}
	keptKey, orphanKey := LayerKey(v1.Config.Blobs[kept]), LayerKey(v2.Config.Blobs[orphan])
	foreign := "archives/sandbox.tar"
	if err := bucket.Put(ctx, foreign, func(w io.Writer) error { _, err := io.WriteString(w, "x"); return err }); err != nil {
		t.Fatal(err)
	}
	// While its pins last, the orphan stays.
	nodes[2].sweepObjects(ctx)
	if !exists(orphanKey) || !exists(keptKey) || !exists(foreign) {
		t.Fatalf("pinned: orphan %v, kept %v, foreign %v; want all there", exists(orphanKey), exists(keptKey), exists(foreign))
	}
	// Its pins end (as they do after pinFor); node 0's next Refresh
	// sweeps.
	if err := st.Unpin(ctx, "dead"); err != nil {
		t.Fatal(err)
	}
	nodes[0].Refresh(ctx)
	if exists(orphanKey) {
		t.Error("the dead maker's object is still there after the sweep")
	}
	if !exists(keptKey) || !exists(foreign) {
		t.Errorf("kept %v, foreign %v; want both there", exists(keptKey), exists(foreign))
	}
	// A drop whose caller saw no version naming the object, when one is
	// recorded by now: the object stays.
	if dropped, err := nodes[2].dropObject(ctx, keptKey); err != nil || dropped || !exists(keptKey) {
		t.Errorf("drop of an object a version names: dropped %v, %v, there %v", dropped, err, exists(keptKey))
	}
}
