package vault

import (
	"context"
	"os"
	"path/filepath"
	"time"
)

// SetAfterCommit sets what runs after a push is committed to the store
// (nil: nothing), for the tests of a crash at that moment.
func SetAfterCommit(s *Service, f func() error) { s.afterCommit = f }

// HookAddr is where s listens for its hooks.
func HookAddr(s *Service) string { return s.ln.Addr().String() }

// SetBeforeCompactCommit sets what runs before a compaction's commit goes
// to the store, for the test of a push racing it.
func SetBeforeCompactCommit(s *Service, f func()) { s.beforeCompactCommit = f }

// RunDue makes the scheduled compactions due now that s claims.
func RunDue(s *Service, ctx context.Context) { s.runDue(ctx) }

// NextRun is nextRun, for its test.
var NextRun = nextRun

// QuarantineParents is quarantineParents, for its test.
var QuarantineParents = quarantineParents

// LayerWhole makes the layer of spec at dir with every file written, as
// without an earlier layer to make it from.
func LayerWhole(s *Service, ctx context.Context, spec LayerSpec, dir string) error {
	return s.makeLayer(ctx, spec, dir, layerBase{}, nil)
}

// AgeLayers makes s's layers look made and last asked for d ago.
func AgeLayers(s *Service, d time.Duration) {
	s.mu.Lock()
	clear(s.layerUsed)
	s.mu.Unlock()
	ents, _ := os.ReadDir(s.layersDir())
	for _, e := range ents {
		t := time.Now().Add(-d)
		os.Chtimes(filepath.Join(s.layersDir(), e.Name()), t, t)
	}
}

// SetLayerMade sets Config.LayerMade.
func SetLayerMade(s *Service, f func(ctx context.Context, dir string)) { s.cfg.LayerMade = f }

// TempLayer is tempLayer: a directory as a build under way has.
func TempLayer(s *Service) (string, func(), error) { return s.tempLayer() }

// FinishLayer is finishLayer.
var FinishLayer = finishLayer

// LayersDir is where s keeps its layers.
func LayersDir(s *Service) string { return s.layersDir() }

// LastLayers is how many mounts s keeps the last layers of.
func LastLayers(s *Service) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.lastLayer)
}

// InProcess counts the pushes s took in-process.
func InProcess(s *Service) int64 { return s.inProcess.Load() }

// SetPackLimits sets the number of packs past which a vault's are
// consolidated and the grace of unrecorded packs, for a test.
func SetPackLimits(t interface{ Cleanup(func()) }, at int, grace time.Duration) {
	oldAt, oldGrace := consolidateAt, packGrace
	consolidateAt, packGrace = at, grace
	t.Cleanup(func() { consolidateAt, packGrace = oldAt, oldGrace })
}
