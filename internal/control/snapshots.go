package control

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/layers"
	"github.com/atoll-dev/atoll/internal/runtime"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// maxFork bounds the children one fork makes.
const maxFork = 100

var snapshotName = regexp.MustCompile(`^[A-Za-z0-9._-]{0,63}$`)

// pause freezes a running sandbox's processes.
func (s *Service) pause(ctx context.Context, id string) (api.Sandbox, error) {
	return s.locked(ctx, id, "pause", s.pauseLocked)
}

// pauseLocked freezes running sb. An auto-resume sandbox waits for
// traffic, not for its timeout, while paused: traffic sets it again.
func (s *Service) pauseLocked(ctx context.Context, sb *store.Sandbox) error {
	if err := s.runtimes[sb.Runtime].Pause(ctx, sb.ID); err != nil {
		s.log.Error("pausing sandbox", "sandbox", sb.ID, "err", err)
		return fmt.Errorf("%w: pausing failed", errdefs.ErrUnavailable)
	}
	sb.State = api.StatePaused
	if sb.AutoResume {
		sb.ExpiresAt = nil
	}
	if err := s.setState(ctx, sb, api.StateRunning); err != nil {
		_ = s.runtimes[sb.Runtime].Resume(ctx, sb.ID)
		sb.State = api.StateRunning
		return err
	}
	return nil
}

// resumption is how resume brings a paused state back.
type resumption struct {
	resume func(s *Service, ctx context.Context, sb *store.Sandbox) error
	// onTraffic: traffic wakes an auto-resume sandbox in this state. Not
	// a shelved one: its processes (the server a request is for) are
	// gone, so E2B refuses autoResume without memory too.
	onTraffic bool
}

// resumes is how resume brings back each state it applies to; resume of a
// sandbox in any other state is a conflict. Adding a kind of pause means a
// row here, and its state, transitions and recovery in internal/lifecycle
// (whose test then asks for docs/lifecycle.md to be regenerated).
var resumes = map[string]resumption{
	api.StatePaused:    {(*Service).thawLocked, true},
	api.StateSuspended: {(*Service).restoreLocked, true},
	api.StateShelved:   {(*Service).bootShelvedLocked, false},
}

// resume brings back a paused sandbox as resumes says: thawed, restored from
// its memory image, or booted again over its files.
func (s *Service) resume(ctx context.Context, id string) (api.Sandbox, error) {
	return s.locked(ctx, id, "resume", func(ctx context.Context, sb *store.Sandbox) error {
		return resumes[sb.State].resume(s, ctx, sb)
	})
}

func (s *Service) thawLocked(ctx context.Context, sb *store.Sandbox) error {
	if err := s.runtimes[sb.Runtime].Resume(ctx, sb.ID); err != nil {
		s.log.Error("resuming sandbox", "sandbox", sb.ID, "err", err)
		return fmt.Errorf("%w: resuming failed", errdefs.ErrUnavailable)
	}
	sb.State = api.StateRunning
	return s.setState(ctx, sb, api.StatePaused)
}

// frozen runs f with sb's processes frozen when it runs, so that its files
// hold still: the instant a snapshot or fork captures. The writable layer is
// flushed first, while the sandbox still runs: btrfs then has only what was
// written since left to flush inside f (see docs/lifecycle.md). op names the
// operation in the log line that reports how long the sandbox was frozen.
func (s *Service) frozen(ctx context.Context, sb store.Sandbox, op string, f func() error) error {
	if sb.State != api.StateRunning {
		return f()
	}
	t0 := time.Now()
	if err := s.layers.FlushWritable(sb.ID); err != nil {
		// Not fatal: the snapshot flushes what is left, only frozen.
		s.log.Warn("flushing before a freeze", "sandbox", sb.ID, "op", op, "err", err)
	}
	flushed := ms(t0)
	rt := s.runtimes[sb.Runtime]
	t0 = time.Now()
	if err := rt.Pause(ctx, sb.ID); err != nil {
		return fmt.Errorf("%w: freezing the sandbox failed", errdefs.ErrUnavailable)
	}
	err := f()
	if rerr := rt.Resume(context.WithoutCancel(ctx), sb.ID); rerr != nil {
		s.log.Error("thawing sandbox", "sandbox", sb.ID, "op", op, "err", rerr)
	}
	// From the freeze asked to the thaw done: the time the sandbox's
	// processes could not run.
	s.log.Info("sandbox frozen", "sandbox", sb.ID, "op", op, "ms", ms(t0), "flush_ms", flushed)
	return err
}

// createSnapshot turns a sandbox's files into an immutable snapshot.
func (s *Service) createSnapshot(ctx context.Context, id string, req api.CreateSnapshotRequest) (api.Snapshot, error) {
	if !snapshotName.MatchString(req.Name) {
		return api.Snapshot{}, fmt.Errorf("%w: snapshot names are at most 63 of [A-Za-z0-9._-]", errdefs.ErrInvalid)
	}
	ctx = context.WithoutCancel(ctx)
	sb, unlock, err := s.acquire(ctx, id, "snapshot")
	if err != nil {
		return api.Snapshot{}, err
	}
	defer unlock()
	sn := store.Snapshot{ID: newID(), Name: req.Name, SandboxID: id, Template: sb.Template, TemplateVersion: sb.TemplateVersion, State: api.SnapshotReady,
		Tenant: sb.Tenant, CreatedAt: time.Now().UTC()}
	// The subvolume first, then the record: a crash in between leaves a
	// snapshot no record names, which the next start removes.
	if err := s.frozen(ctx, sb, "snapshot", func() error { return s.layers.SnapshotWritable(id, sn.ID) }); err != nil {
		return api.Snapshot{}, err
	}
	if err := s.store.PutSnapshot(ctx, sn); err != nil {
		_ = s.layers.RemoveSnapshot(sn.ID)
		return api.Snapshot{}, err
	}
	return apiSnapshot(sn), nil
}

// ListSnapshots returns the snapshots of a sandbox, or all.
func (s *Service) ListSnapshots(ctx context.Context, sandboxID string) ([]api.Snapshot, error) {
	if sandboxID != "" {
		if err := checkID(sandboxID); err != nil {
			return nil, err
		}
	}
	sns, err := s.store.ListSnapshots(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	users, err := s.store.SnapshotUsers(ctx)
	if err != nil {
		return nil, err
	}
	out := []api.Snapshot{}
	for _, sn := range sns {
		if !tenant.Sees(ctx, sn.Tenant) {
			continue
		}
		a := apiSnapshot(sn)
		a.Sandboxes = users[sn.ID]
		out = append(out, a)
	}
	return out, nil
}

// GetSnapshot returns one snapshot.
func (s *Service) GetSnapshot(ctx context.Context, id string) (api.Snapshot, error) {
	sn, err := s.snapshot(ctx, id)
	if err != nil {
		return api.Snapshot{}, err
	}
	users, err := s.store.SnapshotUsers(ctx)
	if err != nil {
		return api.Snapshot{}, err
	}
	a := apiSnapshot(sn)
	a.Sandboxes = users[id]
	return a, nil
}

// DeleteSnapshot removes a snapshot. Sandboxes made from it keep their files:
// each has its own copy-on-write copy.
func (s *Service) DeleteSnapshot(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	ctx = context.WithoutCancel(ctx)
	unlock := s.lock(snapshotLock(id))
	defer unlock()
	sn, err := s.snapshot(ctx, id)
	if err != nil {
		return err
	}
	if err := s.store.DeleteSnapshot(ctx, id); err != nil {
		return err
	}
	if err := s.layers.RemoveSnapshot(id); err != nil {
		s.log.Error("removing snapshot", "snapshot", id, "err", err)
	}
	if sn.State != api.SnapshotReady && s.archive != nil {
		if err := s.archive.Delete(ctx, snapshotKey(id)); err != nil && !isNotExist(err) {
			s.log.Error("removing archived snapshot", "snapshot", id, "err", err)
		}
	}
	s.tmpls.Release(ctx, sn.TemplateVersion)
	return nil
}

// fork makes count children of a sandbox, each with the parent's files at one
// instant and a writable layer of its own, and starts them.
func (s *Service) fork(ctx context.Context, id string, req api.ForkRequest) ([]api.Sandbox, error) {
	if req.Count == 0 {
		req.Count = 1
	}
	if req.Count < 0 || req.Count > maxFork {
		return nil, fmt.Errorf("%w: fork count must be between 1 and %d", errdefs.ErrInvalid, maxFork)
	}
	if err := s.limitCreates(ctx, req.Count); err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx)
	parent, unlock, err := s.acquire(ctx, id, "snapshot")
	if err != nil {
		return nil, err
	}
	var cp runtime.Checkpointer
	if req.Memory {
		if cp, err = s.memoryForkable(parent); err != nil {
			unlock()
			return nil, err
		}
	}
	children, err := s.forkRecords(parent, req)
	if err != nil {
		unlock()
		return nil, err
	}
	// Children have the parent's version, whatever its name points to now.
	tmpl, err := s.tmpls.SandboxStack(ctx, parent)
	if err != nil {
		unlock()
		return nil, err
	}
	t0 := time.Now()
	image := "" // the parent's memory, for a fork with memory
	fail := func(err error) ([]api.Sandbox, error) {
		for _, c := range children {
			s.discard(ctx, c)
		}
		if image != "" {
			_ = os.RemoveAll(image)
		}
		return nil, err
	}
	if err := s.newSandboxes(ctx, children); err != nil {
		unlock()
		return nil, err
	}
	if req.Memory {
		image, err = s.captureForFork(ctx, &parent, children)
	} else {
		err = s.copyForkLayers(ctx, parent, children)
	}
	unlock()
	if err != nil {
		return fail(err)
	}
	s.log.Debug("children recorded and copied", "sandbox", id, "op", "fork", "ms", ms(t0))
	if err := s.startForkChildren(ctx, children, cp, tmpl, image); err != nil {
		return fail(err)
	}
	if image != "" {
		if err := os.RemoveAll(image); err != nil {
			s.log.Error("removing a fork's memory image", "sandbox", id, "err", err)
		}
	}
	out := make([]api.Sandbox, len(children))
	for i, c := range children {
		out[i] = s.view(c)
	}
	return out, nil
}

// forkRecords makes the records of req.Count children of parent: its
// settings and version, its labels with req's over them.
func (s *Service) forkRecords(parent store.Sandbox, req api.ForkRequest) ([]store.Sandbox, error) {
	labels := map[string]string{}
	for k, v := range parent.Labels {
		labels[k] = v
	}
	for k, v := range req.Labels {
		labels[k] = v
	}
	check := api.CreateSandboxRequest{Template: parent.Template, Runtime: parent.Runtime, CPU: parent.CPU,
		MemoryMiB: parent.MemoryMiB, DiskGiB: parent.DiskGiB, PIDs: parent.PIDs, Env: parent.Env, Labels: labels}
	if err := s.validate(&check); err != nil {
		return nil, err
	}
	children := make([]store.Sandbox, 0, req.Count)
	for i := 0; i < req.Count; i++ {
		children = append(children, store.Sandbox{Sandbox: api.Sandbox{
			State: api.StateCreating, Template: parent.Template, TemplateVersion: parent.TemplateVersion, Runtime: parent.Runtime,
			CPU: parent.CPU, MemoryMiB: parent.MemoryMiB, DiskGiB: parent.DiskGiB, PIDs: parent.PIDs,
			Env: parent.Env, Labels: labels, CreatedAt: time.Now().UTC(), Ports: parent.Ports,
			// The clones come with the files; each child gets its own
			// token (the server writes it after the fork).
			Vaults: parent.Vaults,
		}, Policy: parent.Policy, Tenant: parent.Tenant})
	}
	return children, nil
}

// copyForkLayers gives each child a copy of parent's writable layer. The
// parent is frozen only while its layer is copied once, for the first
// child, which costs the same whatever it holds. The other children copy
// the first child's layer, which holds still (the child has not started):
// each btrfs snapshot commits a transaction, and the parent need not wait
// for all.
func (s *Service) copyForkLayers(ctx context.Context, parent store.Sandbox, children []store.Sandbox) error {
	first := children[0]
	err := s.frozen(ctx, parent, "fork", func() error {
		_, err := s.layers.ForkWritable(parent.ID, first.ID, first.DiskGiB<<30)
		return err
	})
	for _, c := range children[1:] {
		if err != nil {
			break
		}
		_, err = s.layers.ForkWritable(first.ID, c.ID, c.DiskGiB<<30)
	}
	return err
}

// startForkChildren starts the children concurrently, from the parent's
// memory image when there is one. They stay recorded as creating until all
// run: then one transaction records them running, so that a crash leaves
// all of them or (see Recover) none.
func (s *Service) startForkChildren(ctx context.Context, children []store.Sandbox, cp runtime.Checkpointer, tmpl layers.Template, image string) error {
	errs := make(chan error, len(children))
	for i := range children {
		go func(c *store.Sandbox) {
			unlock := s.lock(c.ID)
			defer unlock()
			if image != "" {
				errs <- s.restoreFrom(ctx, cp, c, tmpl, image)
				return
			}
			errs <- s.run(ctx, c, tmpl, api.StateRunning, 0)
		}(&children[i])
	}
	var firstErr error
	for range children {
		if err := <-errs; err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		return firstErr
	}
	running := make([]*store.Sandbox, len(children))
	for i := range children {
		running[i] = &children[i]
	}
	return s.setStates(ctx, running, api.StateCreating)
}

// restore rolls a sandbox's files back to a snapshot of the same template;
// a running sandbox is restarted over them.
func (s *Service) restore(ctx context.Context, id string, req api.RestoreRequest) (api.Sandbox, error) {
	if err := checkID(req.Snapshot); err != nil {
		return api.Sandbox{}, err
	}
	ctx = context.WithoutCancel(ctx)
	sn, err := s.snapshot(ctx, req.Snapshot)
	if err != nil {
		return api.Sandbox{}, err
	}
	sb, unlock, err := s.acquire(ctx, id, "")
	if err != nil {
		return api.Sandbox{}, err
	}
	defer unlock()
	// Its files are a diff over the layers of one version.
	if sn.Template != sb.Template || sn.TemplateVersion != sb.TemplateVersion {
		return api.Sandbox{}, fmt.Errorf("%w: snapshot %s is of template %s@%s; sandbox %s is of %s@%s", errdefs.ErrInvalid,
			sn.ID, sn.Template, orNone(sn.TemplateVersion), id, sb.Template, orNone(sb.TemplateVersion))
	}
	// A suspended sandbox's memory belongs to the files it had: it is
	// dropped, and the sandbox starts afresh over the snapshot's.
	if err := refuses("restore", sb); err != nil {
		return api.Sandbox{}, err
	}
	wasRunning := sb.State != api.StateStopped
	if wasRunning {
		if err := s.stopLocked(ctx, &sb, ""); err != nil {
			return api.Sandbox{}, err
		}
	}
	_, err = s.withSnapshot(ctx, sn.ID, func() error {
		return s.layers.RestoreWritable(sn.ID, id, sb.DiskGiB<<30)
	})
	if err != nil {
		return api.Sandbox{}, err
	}
	if wasRunning {
		if err := s.restartLocked(ctx, &sb); err != nil {
			return api.Sandbox{}, err
		}
	}
	return s.view(sb), nil
}

func apiSnapshot(sn store.Snapshot) api.Snapshot {
	return api.Snapshot{ID: sn.ID, Name: sn.Name, SandboxID: sn.SandboxID, Template: sn.Template, TemplateVersion: sn.TemplateVersion,
		State: sn.State, CreatedAt: sn.CreatedAt}
}

func orNone(v string) string {
	if v == "" {
		return "-"
	}
	return v
}
