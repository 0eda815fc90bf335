package templates

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// In a cluster (Config.Blobs set) every node can make template versions
// and run sandboxes of any, so a version's layers live in the cluster's
// object store, content-addressed:
//
//   - Making a version (import, build, bootstrap) publishes each of its
//     layers, a layers.PackLayer tar, as LayerKey(sha256 of the tar),
//     before the version is recorded, and records the digests with it
//     (store.TemplateConfig.Blobs). A layer some version already
//     published is not packed again.
//   - A node asked for a sandbox of a version whose layers it lacks pulls
//     them first (Pull; Stack does it too): it downloads each object to a
//     file, checks the digest recorded for it, and only then unpacks it.
//     A copy whose digest differs is refused, never unpacked. Concurrent
//     pulls of one layer on a node are one download.
//   - Collecting a version deletes the objects no remaining version names;
//     each node drops the local layers no version uses at its next Refresh.
//     A maker that dies between publishing a version's layers and recording
//     the version leaves objects no version names: a node's Refresh sweeps
//     those every sweepEvery, once the maker's pins have ended.
//   - Versions share objects, so a node making a version pins each object
//     (store.BlobPins) before it looks for it or writes it, and unpins once
//     the version is recorded (or refused); a node deleting one deletes it
//     only unpinned, under a lock the pin waits for. Otherwise a rebuild on
//     one node could find an object there and record a version naming it
//     just as another node, collecting the version before, deleted it: the
//     new version would name nothing. A version is recorded well within
//     pinFor of its pins; pins of a node that died end with pinFor.
//
// On a single machine nothing of this happens: the layers stay where they
// were made.

// pinFor is how long a version being made pins its objects.
const pinFor = time.Hour

// LayerKey is the object holding the layer tar whose sha256 is digest
// (hex).
func LayerKey(digest string) string { return layerPrefix + digest + ".tar" }

// Pull is what making a sandbox of a version waited for: the layers the
// node lacked, fetched from the object store (or by a concurrent pull of
// the same layers it waited for), their bytes, and how long it took.
type Pull struct {
	Layers   int
	Bytes    int64
	Duration time.Duration
}

// pullCall is one download of a layer that concurrent pulls share.
type pullCall struct {
	done  chan struct{}
	bytes int64
	err   error
}

// CorruptLayerError is a layer whose copy in the object store does not
// have the digest its version recorded: it is refused.
type CorruptLayerError struct {
	Layer, Want, Got string
}

func (e *CorruptLayerError) Error() string {
	return fmt.Sprintf("layer %.12s: the object store's copy has digest sha256:%.12s…, not the recorded sha256:%.12s…; refused", e.Layer, e.Got, e.Want)
}

func (e *CorruptLayerError) Unwrap() error { return errdefs.ErrUnavailable }

// publish puts t's layers in the object store and records their digests
// in t.Config.Blobs, each object pinned under pin until the caller unpins
// it (s.unpin) once t is recorded.
func (s *Service) publish(ctx context.Context, t *store.Template, pin string) error {
	if s.blobs == nil || len(t.Layers) == 0 {
		return nil
	}
	vs, err := s.store.ListTemplateVersions(ctx)
	if err != nil {
		return err
	}
	known := map[string]string{}
	for _, v := range vs {
		for id, d := range v.Config.Blobs {
			known[id] = d
		}
	}
	t.Config.Blobs = map[string]string{}
	for _, id := range t.Layers {
		if _, ok := t.Config.Blobs[id]; ok {
			continue
		}
		d, err := s.publishLayer(ctx, id, known[id], pin)
		if err != nil {
			// The store's own error may name its endpoint: logged, not
			// answered.
			s.log.Error("publishing a template layer", "template", t.Name, "layer", id, "err", err)
			return fmt.Errorf("%w: publishing layer %.12s to the cluster's object store failed", errdefs.ErrUnavailable, id)
		}
		t.Config.Blobs[id] = d
	}
	return nil
}

// publishLayer puts layer id in the object store unless it is there
// (known, if not "", is the digest another version recorded for it), and
// returns its digest.
func (s *Service) publishLayer(ctx context.Context, id, known, pin string) (string, error) {
	if known != "" {
		if err := s.pin(ctx, known, pin); err != nil {
			return "", err
		}
		if s.hasObject(ctx, LayerKey(known)) {
			return known, nil
		}
	}
	t0 := time.Now()
	// The digest names the object, so the tar goes to a file first. The
	// name is one the start-up sweep of uploads removes.
	f, err := os.CreateTemp(s.layers.Dir(), ".upload-layer-*.tar")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	if err := s.layers.PackLayer(id, io.MultiWriter(f, h)); err != nil {
		return "", err
	}
	d := hex.EncodeToString(h.Sum(nil))
	if d != known {
		if err := s.pin(ctx, d, pin); err != nil {
			return "", err
		}
	}
	if s.hasObject(ctx, LayerKey(d)) {
		return d, nil
	}
	size, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		return "", err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	err = s.blobs.Put(ctx, LayerKey(d), func(w io.Writer) error {
		_, err := io.Copy(w, f)
		return err
	})
	if err != nil {
		return "", err
	}
	s.log.Info("template layer published", "layer", id[:12], "object", LayerKey(d), "bytes", size, "ms", time.Since(t0).Milliseconds())
	return d, nil
}

// pin pins the object of layer digest d under pin for a version being
// made.
func (s *Service) pin(ctx context.Context, d, pin string) error {
	if s.pins == nil {
		return nil
	}
	return s.pins.PinBlob(ctx, LayerKey(d), pin, pinFor)
}

// newPin names the pins of a version being made.
func newPin() string { return "version-" + rand.Text() }

// unpin ends the pins of a version made (or refused). One left behind
// ends with pinFor.
func (s *Service) unpin(ctx context.Context, pin string) {
	if s.pins == nil {
		return
	}
	if err := s.pins.Unpin(context.WithoutCancel(ctx), pin); err != nil {
		s.log.Warn("unpinning template layers' objects", "err", err)
	}
}

// hasObject reports whether the object store has key (an error counts as
// no: the caller then writes it).
func (s *Service) hasObject(ctx context.Context, key string) bool {
	keys, err := s.blobs.List(ctx, key)
	return err == nil && slices.Contains(keys, key)
}

// Pull fetches the layers of version v that this node lacks from the
// object store. Without an object store it does nothing (Stack then
// reports a missing layer).
func (s *Service) Pull(ctx context.Context, v store.Template) (Pull, error) {
	if s.blobs == nil || v.ID == "" {
		return Pull{}, nil
	}
	t0 := time.Now()
	var missing []string
	for _, id := range v.Layers {
		if !s.layers.HasLayer(id) && !slices.Contains(missing, id) {
			missing = append(missing, id)
		}
	}
	if len(missing) == 0 {
		return Pull{}, nil
	}
	p := Pull{Layers: len(missing)}
	for _, id := range missing {
		n, err := s.pullLayer(ctx, v, id)
		p.Bytes += n
		if err != nil {
			s.log.Error("pulling template layers", "template", v.Name, "version", v.ID, "layer", id[:min(12, len(id))], "err", err)
			// What the local disk said (paths) is logged, not answered.
			if !errors.Is(err, errdefs.ErrUnavailable) {
				err = fmt.Errorf("%w: adding layer %.12s on this node failed", errdefs.ErrUnavailable, id)
			}
			return p, fmt.Errorf("template %s: pulling its layers: %w", v.Name, err)
		}
	}
	p.Duration = time.Since(t0)
	s.log.Info("pulled template layers", "template", v.Name, "version", v.ID, "layers", p.Layers, "bytes", p.Bytes, "ms", p.Duration.Milliseconds())
	s.noteHeld(v.ID)
	return p, nil
}

// pullLayer fetches layer id of v, or waits for the fetch of it under way.
func (s *Service) pullLayer(ctx context.Context, v store.Template, id string) (int64, error) {
	s.pullMu.Lock()
	if c := s.pulls[id]; c != nil {
		s.pullMu.Unlock()
		select {
		case <-c.done:
			return c.bytes, c.err
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	c := &pullCall{done: make(chan struct{})}
	s.pulls[id] = c
	s.pullMu.Unlock()
	// The download is shared: it goes on if the caller that began it
	// leaves. It counts as an import, which keeps the layer collector
	// away: collectLayers runs under tmplMu and skips while imports are
	// in flight, so a collection under way ends before the download
	// begins (and listed v, recorded before it), and a later one skips.
	s.tmplMu.Lock()
	s.importing++
	s.tmplMu.Unlock()
	c.bytes, c.err = s.fetchLayer(context.WithoutCancel(ctx), v, id)
	s.tmplMu.Lock()
	s.importing--
	s.tmplMu.Unlock()
	s.pullMu.Lock()
	delete(s.pulls, id)
	s.pullMu.Unlock()
	close(c.done)
	return c.bytes, c.err
}

// fetchLayer downloads layer id of v to a file, checks its digest and
// unpacks it.
func (s *Service) fetchLayer(ctx context.Context, v store.Template, id string) (int64, error) {
	t0 := time.Now()
	want := v.Config.Blobs[id]
	if _, err := hex.DecodeString(want); err != nil || len(want) != 2*sha256.Size {
		return 0, fmt.Errorf("%w: layer %.12s is not in the cluster's object store (version %s was made before its node published layers)", errdefs.ErrUnavailable, id, v.ID)
	}
	obj, err := s.blobs.Get(ctx, LayerKey(want))
	if errors.Is(err, errdefs.ErrNotFound) {
		return 0, fmt.Errorf("%w: layer %.12s is missing from the cluster's object store", errdefs.ErrUnavailable, id)
	}
	if err != nil {
		return 0, fmt.Errorf("%w: reading layer %.12s from the object store failed", errdefs.ErrUnavailable, id)
	}
	defer obj.Close()
	f, err := os.CreateTemp(s.layers.Dir(), ".upload-pull-*.tar")
	if err != nil {
		return 0, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), obj)
	if err != nil {
		return n, fmt.Errorf("%w: reading layer %.12s from the object store failed", errdefs.ErrUnavailable, id)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return n, &CorruptLayerError{Layer: id, Want: want, Got: got}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return n, err
	}
	if err := s.layers.AddPackedLayer(id, f); err != nil {
		return n, err
	}
	s.log.Info("template layer fetched", "layer", id[:12], "object", LayerKey(want), "bytes", n, "ms", time.Since(t0).Milliseconds())
	return n, nil
}

// Held returns the versions whose layers this node holds, as the last
// Refresh (or pull) found them: what the node reports for the scheduler's
// locality.
func (s *Service) Held() []string {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	return slices.Clone(s.held)
}

func (s *Service) noteHeld(id string) {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	if !slices.Contains(s.held, id) {
		s.held = append(s.held, id)
		sort.Strings(s.held)
	}
}

// Refresh finds again the versions whose layers this node holds, and
// drops the local layers no version uses any more: another node may have
// collected the last version that used them (best effort: the next
// Refresh tries again). Every sweepEvery it also deletes the layer objects
// no version names (sweepObjects).
func (s *Service) Refresh(ctx context.Context) {
	vs, err := s.store.ListTemplateVersions(ctx)
	if err != nil {
		return
	}
	var held []string
	used := s.pinnedBuildFiles()
	for _, v := range vs {
		all := true
		for _, l := range v.Layers {
			used[l] = true
			all = all && s.layers.HasLayer(l)
		}
		if all {
			held = append(held, v.ID)
		}
	}
	sort.Strings(held)
	s.heldMu.Lock()
	s.held = held
	sweep := s.blobs != nil && time.Since(s.swept) >= sweepEvery
	if sweep {
		s.swept = time.Now()
	}
	s.heldMu.Unlock()
	if s.blobs == nil {
		return
	}
	if sweep {
		s.sweepObjects(ctx)
	}
	ids, err := s.layers.LayerIDs()
	if err != nil {
		return
	}
	for _, id := range ids {
		if !used[id] {
			s.collectLayers(ctx)
			return
		}
	}
}

// dropObjects deletes the objects of the layers of versions gone (just
// collected) that no remaining version names.
func (s *Service) dropObjects(ctx context.Context, gone []store.Template) {
	if s.blobs == nil {
		return
	}
	keep, err := s.namedObjects(ctx)
	if err != nil {
		s.log.Warn("listing template versions", "err", err)
		return
	}
	for _, v := range gone {
		for _, d := range v.Config.Blobs {
			key := LayerKey(d)
			if keep[key] {
				continue
			}
			keep[key] = true // once
			dropped, err := s.dropObject(ctx, key)
			switch {
			case err != nil:
				s.log.Warn("deleting a template layer from the object store", "object", key, "err", err)
			case dropped:
				s.log.Info("template layer deleted from the object store", "object", key, "version", v.ID)
			default:
				s.log.Info("template layer kept in the object store: a version being made names it", "object", key, "version", v.ID)
			}
		}
	}
}

// namedObjects are the keys of the objects some recorded version names.
func (s *Service) namedObjects(ctx context.Context) (map[string]bool, error) {
	vs, err := s.store.ListTemplateVersions(ctx)
	if err != nil {
		return nil, err
	}
	named := map[string]bool{}
	for _, v := range vs {
		for _, d := range v.Config.Blobs {
			named[LayerKey(d)] = true
		}
	}
	return named, nil
}

// errNamed is a drop's finding that a version names the object after all.
var errNamed = errors.New("a template version names the object")

// dropObject deletes object key, unless a version being made pinned it or
// a version names it. The caller found no version naming it, but that was
// before: a maker may since have pinned the object, found it, recorded its
// version and unpinned. So the versions are looked at again once the pins
// are (under their lock): a maker unpins only after its version is
// recorded, so an object found unpinned that a version needs is named by
// then.
func (s *Service) dropObject(ctx context.Context, key string) (bool, error) {
	del := func(ctx context.Context) error {
		named, err := s.namedObjects(ctx)
		if err != nil {
			return err
		}
		if named[key] {
			return errNamed
		}
		if err := s.blobs.Delete(ctx, key); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return err
		}
		return nil
	}
	var dropped bool
	var err error
	if s.pins == nil {
		err = del(ctx)
		dropped = err == nil
	} else {
		dropped, err = s.pins.DropBlob(ctx, key, del)
	}
	if errors.Is(err, errNamed) {
		return false, nil
	}
	return dropped, err
}

// layerPrefix is where the layers' objects are (LayerKey).
const layerPrefix = "layers/sha256/"

// sweepEvery is how often a node looks for layer objects that no version
// names.
const sweepEvery = 15 * time.Minute

// sweepObjects deletes the layer objects that no version names and no
// maker pins: those of a maker that died between publishing a version's
// layers and recording it (its pins end with pinFor). Collection deletes
// the rest (dropObjects). Each goes as there, through dropObject.
func (s *Service) sweepObjects(ctx context.Context) {
	keys, err := s.blobs.List(ctx, layerPrefix)
	if err != nil {
		s.log.Warn("listing template layers in the object store", "err", err)
		return
	}
	named, err := s.namedObjects(ctx)
	if err != nil {
		s.log.Warn("listing template versions", "err", err)
		return
	}
	for _, key := range keys {
		if named[key] || !strings.HasPrefix(key, layerPrefix) {
			continue
		}
		dropped, err := s.dropObject(ctx, key)
		switch {
		case err != nil:
			s.log.Warn("deleting an unused template layer from the object store", "object", key, "err", err)
		case dropped:
			s.log.Info("template layer that no version names deleted from the object store", "object", key)
		}
	}
}
