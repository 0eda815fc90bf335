package vault

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// A mount as a layer (docs/vault.md, "How a mount is made"). Unpacking a
// clone's files into a sandbox's writable layer costs a little for each
// file; a vault of a thousand files took most of a create. So a mount is
// made, where the sandbox's runtime allows, of a read-only layer: a
// directory holding, at the mount's path, the checkout of one commit with
// the .git a clone of it has (objects, index, HEAD, packed-refs), made
// once per commit, owner, path and template (the directories above the
// path as the template has them) and shared by every sandbox that mounts
// it. The runtime stacks it over the template's layers, as an erofs image
// like theirs; the sandbox's own files of the clone (.git/config, the
// token) are unpacked after it starts. What the agent changes is copied
// up into its writable layer as for any file of a template.

// LayerSpec says which layer a mount is: what a sandbox's writable layer
// keeps (with the writable layer, through stops, forks, snapshots and
// archives), and what makes the layer again where it is missing.
type LayerSpec struct {
	// Vault is the vault's ID, Tenant and Name where it is found.
	Vault  string `json:"vault"`
	Tenant string `json:"tenant"`
	Name   string `json:"name"`
	// Commit is the main branch's commit checked out.
	Commit string `json:"commit"`
	// From, if set, is an earlier commit: the layer holds only what
	// Commit changes (files written, removed ones as overlay whiteouts,
	// the .git's new index, refs and packs), and goes over From's.
	From string `json:"from,omitempty"`
	// Path is the mount's path in the sandbox; UID and GID own the clone.
	Path string `json:"path"`
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
	// Dirs are the directories above Path, top first: as the sandbox's
	// template has them, so that the layer, stacked over it, changes none.
	Dirs []LayerDir `json:"dirs"`
}

// LayerDir is a directory above a mount's path and its attributes.
type LayerDir struct {
	Path  string `json:"path"`
	Mode  uint32 `json:"mode"` // permission bits
	UID   int    `json:"uid"`
	GID   int    `json:"gid"`
	MTime int64  `json:"mtime,omitempty"` // Unix seconds
}

// check refuses a spec of no commit, a bad path, or directories that are
// not the path's ancestors, top first.
func (ls LayerSpec) check() error {
	if ls.Commit == "" || !mountPathPattern.MatchString(ls.Path) || path.Clean(ls.Path) != ls.Path {
		return fmt.Errorf("%w: a vault layer of no commit or a bad path", errdefs.ErrInvalid)
	}
	rel := strings.TrimPrefix(ls.Path, "/")
	for i, d := range ls.Dirs {
		if path.Clean(d.Path) != d.Path || !strings.HasPrefix(rel, d.Path+"/") || strings.Count(d.Path, "/") != i {
			return fmt.Errorf("%w: a vault layer's directory %q is not above its path", errdefs.ErrInvalid, d.Path)
		}
	}
	return nil
}

// key names the layer of spec: the same spec, the same layer.
func (ls LayerSpec) key() string {
	b, _ := json.Marshal(ls)
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])[:32]
}

// layersDir holds the vaults' layers, beside the cache repositories but
// not with them: a layer is the files of sandboxes that may outlive the
// cache (dropped after a reboot) and even the vault (deleted with
// --force), so it is fsynced, and kept while a sandbox of this node uses
// it (SweepLayers).
func (s *Service) layersDir() string { return filepath.Join(s.cfg.Dir, "layers") }

// Head returns the ID of the context's tenant's vault name and the commit
// of its main branch ("" for an empty vault), as the store has them.
func (s *Service) Head(ctx context.Context, name string) (id, commit string, err error) {
	v, err := s.lookup(ctx, name)
	if err != nil {
		return "", "", err
	}
	refs, _, err := s.cfg.Store.VaultState(ctx, v.ID)
	if err != nil {
		return "", "", err
	}
	return v.ID, refs[mainRef], nil
}

// Stack returns the layers, top first, that make the clone of spec (a
// mount at a commit), made if missing: the layer of the commit whole, or
// one of what it changes over the layers of an earlier commit of the
// same mount (From). The mount is remembered, so that the vault's next
// commits get theirs as soon as they are pushed (layersSoon). A commit's
// layers are made from the last ones of the mount, if any: of a commit
// few files apart, a small layer of those files over them (at most
// maxDeltas deep; a whole layer is then made in the background), else a
// whole one whose unchanged files are links to the last whole one's.
func (s *Service) Stack(ctx context.Context, spec LayerSpec) ([]LayerSpec, error) {
	spec.From = ""
	if err := spec.check(); err != nil {
		return nil, err
	}
	kind := spec
	kind.Commit = ""
	s.remember(kind)
	v, err := s.shared(ctx, "stack "+kind.key()+" "+spec.Commit, func(ctx context.Context) (any, error) {
		s.mu.Lock()
		last := s.lastLayer[kind.key()]
		s.mu.Unlock()
		if len(last.chain) > 0 && last.chain[0].Commit == spec.Commit {
			if _, err := s.LayersOf(ctx, last.chain); err == nil {
				return last.chain, nil
			}
		}
		var chain []LayerSpec
		if len(last.chain) > 0 && len(last.chain) <= maxDeltas {
			d := spec
			d.From = last.chain[0].Commit
			chain = append([]LayerSpec{d}, last.chain...)
			if _, err := s.LayersOf(ctx, chain); err != nil {
				if !errors.Is(err, errNoDelta) {
					s.log.Warn("making a vault layer of a commit's changes; making it whole", "vault", spec.Vault, "err", err)
				}
				chain = nil
			}
		}
		if chain == nil {
			if _, err := s.layer(ctx, spec, nil, last.full); err != nil {
				return nil, err
			}
			chain = []LayerSpec{spec}
		}
		s.setLast(kind, chain, "")
		if len(chain) > maxDeltas/2 {
			// Whole again, for the next commits, before the stack is
			// too deep.
			s.background(func(ctx context.Context) {
				if _, err := s.layer(ctx, spec, nil, last.full); err == nil {
					s.setLast(kind, []LayerSpec{spec}, spec.Commit)
				}
			})
		}
		return chain, nil
	})
	if err != nil {
		return nil, fmt.Errorf("the layers of vault %s at %.12s: %w", spec.Name, spec.Commit, err)
	}
	return v.([]LayerSpec), nil
}

// maxDeltas bounds the layers of commits' changes stacked over a whole
// one.
const maxDeltas = 8

// MaxStack bounds the layers of one mount (Stack).
const MaxStack = maxDeltas + 1

// lastLayers are a mount's last layers made: the next commit's are made
// from them.
type lastLayers struct {
	chain []LayerSpec // top first
	full  layerBase   // the last whole layer
}

// setLast records chain as the last layers of mount kind; if ifTop is
// not "", only if the last ones are still of that commit (a whole layer
// made in the background replaces the stack of its commit, not a newer
// one).
func (s *Service) setLast(kind LayerSpec, chain []LayerSpec, ifTop string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.ContainsFunc(s.mounted[kind.Vault], func(o LayerSpec) bool { return o.key() == kind.key() }) {
		return // forgotten (remember, forget) while its layers were made
	}
	last := s.lastLayer[kind.key()]
	if ifTop != "" && (len(last.chain) == 0 || last.chain[0].Commit != ifTop) {
		return
	}
	last.chain = chain
	if bottom := chain[len(chain)-1]; bottom.From == "" {
		last.full = layerBase{dir: filepath.Join(s.layersDir(), bottom.key()), commit: bottom.Commit}
	}
	s.lastLayer[kind.key()] = last
}

// LayersOf returns the directories of the layers specs (as Stack returns
// them, or several mounts' one after the other), made if missing. A
// layer of a commit's changes (From set) goes over the layers after it
// of the same mount, down to a whole one.
func (s *Service) LayersOf(ctx context.Context, specs []LayerSpec) ([]string, error) {
	dirs := make([]string, len(specs))
	// Bottom up: a layer of changes is made knowing those under it.
	for i := len(specs) - 1; i >= 0; i-- {
		var below []string
		if specs[i].From != "" {
			for j := i + 1; j < len(specs) && specs[j].Path == specs[i].Path; j++ {
				below = append(below, dirs[j])
				if specs[j].From == "" {
					break
				}
			}
			if len(below) == 0 || specs[i+1].Commit != specs[i].From {
				return nil, fmt.Errorf("%w: vault layers of %s out of order", errdefs.ErrInvalid, specs[i].Path)
			}
		}
		d, err := s.layer(ctx, specs[i], below, layerBase{})
		if err != nil {
			return nil, err
		}
		dirs[i] = d
	}
	// Those made first, again: the sweep keeps them as long as the last.
	s.used(dirs...)
	return dirs, nil
}

// layer returns the directory of the layer spec says, made if it is not
// there, from the vault's cache repository, which has every commit the
// main branch ever had (history is append-only) unless the vault allows
// rewrites and the commit was rewritten away: whole, from base if given
// (a whole layer of an earlier commit), or, for a spec From a commit, of
// the changes over the layers below.
func (s *Service) layer(ctx context.Context, spec LayerSpec, below []string, base layerBase) (string, error) {
	dir := filepath.Join(s.layersDir(), spec.key())
	s.used(dir)
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	_, err := s.shared(ctx, "layer "+dir, func(ctx context.Context) (any, error) {
		if _, err := os.Stat(dir); err == nil {
			return nil, nil
		}
		t0 := time.Now()
		if err := s.makeLayer(ctx, spec, dir, base, below); err != nil {
			return nil, err
		}
		s.log.Info("vault layer made", "vault", spec.Vault, "commit", spec.Commit, "layer", filepath.Base(dir),
			"changes_from", spec.From, "links_from", base.commit, "ms", time.Since(t0).Milliseconds())
		if s.cfg.LayerMade != nil {
			s.cfg.LayerMade(ctx, dir)
		}
		// On disk soon, not before the sandbox starts: until it is (the
		// mark beside it), a reboot drops it, and it is made again.
		s.background(func(context.Context) {
			if err := syncDir(dir); err == nil {
				err = os.WriteFile(dir+syncedMark, nil, 0o600)
			}
		})
		return nil, nil
	})
	if err != nil {
		return "", fmt.Errorf("the layer of vault %s at %.12s: %w", spec.Name, spec.Commit, err)
	}
	// Again once made: a build of over a minute is not swept as soon as
	// it is there.
	s.used(dir)
	return dir, nil
}

// used stamps the layers at dirs as asked for now: the sweep keeps them
// a minute.
func (s *Service) used(dirs ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range dirs {
		s.layerUsed[filepath.Base(d)] = time.Now()
	}
}

// ReadyStack returns the layers of spec (Stack) if they are made, or once
// they are if they can be made from the mount's last ones (a push's are
// under way as soon as the push is stored). If they would be made whole
// from nothing (the node's first mount of the vault since it started), it
// starts making them in the background and returns nil: a create does
// not wait for that (it costs what unpacking the clone into the sandbox
// does); a later one finds them.
func (s *Service) ReadyStack(ctx context.Context, spec LayerSpec) []LayerSpec {
	if spec.check() != nil {
		return nil
	}
	kind := spec
	kind.Commit, kind.From = "", ""
	s.remember(kind)
	s.mu.Lock()
	_, known := s.lastLayer[kind.key()]
	s.mu.Unlock()
	if !known {
		if _, err := os.Stat(filepath.Join(s.layersDir(), spec.key())); err != nil {
			s.background(func(ctx context.Context) {
				if _, err := s.Stack(ctx, spec); err != nil && ctx.Err() == nil {
					s.log.Warn("making a vault layer", "vault", spec.Vault, "err", err)
				}
			})
			return nil
		}
	}
	chain, err := s.Stack(ctx, spec)
	if err != nil {
		s.log.Warn("making a vault layer", "vault", spec.Vault, "err", err)
		return nil
	}
	return chain
}

// layerBase is a whole layer made, which a later commit's whole layer of
// the same mount is made from (makeLayer).
type layerBase struct{ dir, commit string }

// syncedMark, after a layer's directory name, names the file that says
// the layer is on disk.
const syncedMark = ".synced"

// mountKinds bounds the mounts a vault's layers are made ahead for.
const mountKinds = 4

// remember keeps kind (a mount: a LayerSpec without its commit) as one
// that a mount of its vault had: its next commits' layers are made
// ahead.
func (s *Service) remember(kind LayerSpec) {
	k := kind.key()
	s.mu.Lock()
	defer s.mu.Unlock()
	kinds := s.mounted[kind.Vault]
	for i, o := range kinds {
		if o.key() == k {
			kinds = append(kinds[:i], kinds[i+1:]...)
			break
		}
	}
	keep := min(len(kinds), mountKinds-1)
	// The mounts forgotten lose their last layers too: the sweep keeps
	// the last layers of every mount it knows (a template's directories'
	// times are a mount's: each rebuild of a template makes a new one).
	for _, o := range kinds[keep:] {
		delete(s.lastLayer, o.key())
	}
	s.mounted[kind.Vault] = append([]LayerSpec{kind}, kinds[:keep]...)
}

// forget drops what s keeps of the mounts of vault id: deleted.
func (s *Service) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, kind := range s.mounted[id] {
		delete(s.lastLayer, kind.key())
	}
	delete(s.mounted, id)
}

// PrepareLayers starts making ahead, in the background (until the
// service closes), the layers of the head of the context's tenant's
// vault name for the mounts of it this node has made.
func (s *Service) PrepareLayers(ctx context.Context, name string) error {
	v, err := s.lookup(ctx, name)
	if err != nil {
		return err
	}
	s.layersSoon(v)
	return nil
}

// headLayers makes the layers of vault id's head for the mounts of it
// this node has made.
func (s *Service) headLayers(ctx context.Context, id string) error {
	s.mu.Lock()
	kinds := slices.Clone(s.mounted[id])
	s.mu.Unlock()
	if len(kinds) == 0 {
		return nil
	}
	refs, _, err := s.cfg.Store.VaultState(ctx, id)
	if err != nil || refs[mainRef] == "" {
		return err
	}
	for _, spec := range kinds {
		spec.Commit = refs[mainRef]
		if _, err := s.Stack(ctx, spec); err != nil {
			return err
		}
	}
	return nil
}

// layersSoon makes, in the background, the layers of vault v's head
// that its mounts here will want: after a push, and at a create that
// mounts it (PrepareLayers).
func (s *Service) layersSoon(v store.Vault) {
	s.background(func(ctx context.Context) {
		if err := s.headLayers(ctx, v.ID); err != nil && ctx.Err() == nil {
			s.log.Debug("making a vault's layers ahead", "vault", v.ID, "err", err)
		}
	})
}

// shared runs fn once for the callers of the same key at once (the
// first's call, the others wait for it), under the service's context,
// not the first caller's: a caller that gives up (its request cancelled)
// returns its context's error and leaves the work to the others. Close
// cancels it and waits for it to end.
func (s *Service) shared(ctx context.Context, key string, fn func(ctx context.Context) (any, error)) (any, error) {
	ch := s.preparing.DoChan(key, func() (any, error) {
		// Counted with the background work, which Close waits for.
		s.idx.mu.Lock()
		if s.idx.closed {
			s.idx.mu.Unlock()
			return nil, fmt.Errorf("%w: the vault service is closing", errdefs.ErrUnavailable)
		}
		s.idx.wg.Add(1)
		s.idx.mu.Unlock()
		defer s.idx.wg.Done()
		return fn(s.idx.ctx)
	})
	select {
	case r := <-ch:
		return r.Val, r.Err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// background runs fn in the background until the service closes.
func (s *Service) background(fn func(ctx context.Context)) {
	s.idx.mu.Lock()
	if s.idx.closed {
		s.idx.mu.Unlock()
		return
	}
	s.idx.wg.Add(1)
	s.idx.mu.Unlock()
	go func() {
		defer s.idx.wg.Done()
		fn(s.idx.ctx)
	}()
}

// makeLayer makes the layer of spec at dir: from the layer of an
// earlier commit of the same mount (base, if there is one), whose files
// it links and whose changes since it writes; else every file.
func (s *Service) makeLayer(ctx context.Context, spec LayerSpec, dir string, base layerBase, below []string) error {
	if err := spec.check(); err != nil {
		return err
	}
	v, err := s.cfg.Store.GetVault(ctx, spec.Tenant, spec.Name)
	if err == nil && v.ID != spec.Vault || errors.Is(err, errdefs.ErrNotFound) {
		// Deleted (vault rm --force) while sandboxes mounted it: the
		// files they have of it are over this layer, which no vault
		// makes now. Such a sandbox cannot start on this node again.
		return fmt.Errorf("%w: vault %s was removed (vault rm --force) and this node no longer has its layer at %.12s, "+
			"which the sandbox's files of it are over: the sandbox cannot start again (delete it)", errdefs.ErrConflict, spec.Name, spec.Commit)
	}
	if err != nil {
		return fmt.Errorf("vault %s (%s): %w", spec.Name, spec.Vault, err)
	}
	if err := os.MkdirAll(s.layersDir(), 0o700); err != nil {
		return err
	}
	unlock := s.lock(v.ID)
	cache, refs, err := s.ensureRefs(ctx, v)
	var objects []objectFile
	if err == nil {
		objects, err = openObjects(cache)
	}
	unlock()
	defer func() {
		for _, o := range objects {
			o.f.Close()
		}
	}()
	if err != nil {
		return err
	}
	// The refs as a clone made now has them if the commit is the head;
	// an older commit's layer (made again elsewhere) has main only.
	if refs[mainRef] != spec.Commit {
		refs = map[string]string{mainRef: spec.Commit}
	}
	if spec.From != "" {
		return s.layerDelta(ctx, spec, dir, below, cache, refs, objects)
	}
	if base.dir != "" {
		err := s.layerFrom(ctx, spec, dir, base, cache, refs, objects)
		if err == nil {
			return nil
		}
		s.log.Warn("making a vault layer from the last one; making it whole", "vault", spec.Vault, "err", err)
	}
	return s.layerWhole(ctx, spec, dir, cache, refs, objects)
}

// layerSkeleton makes a layer under way for spec (tempLayer): its root and
// the directories above the path, as the template has them (the root's
// own are the writable layer's, which is on top). It returns the
// working tree's and .git's paths in it, and what removes it unless it
// was made whole.
func (s *Service) layerSkeleton(spec LayerSpec) (tmp, work, gitDir string, done func(), err error) {
	tmp, done, err = s.tempLayer()
	if err != nil {
		return "", "", "", nil, err
	}
	if err := os.Chmod(tmp, 0o755); err != nil {
		done()
		return "", "", "", nil, err
	}
	for _, d := range spec.Dirs {
		if err := os.Mkdir(filepath.Join(tmp, d.Path), 0o755); err != nil {
			done()
			return "", "", "", nil, err
		}
	}
	work = filepath.Join(tmp, spec.Path)
	return tmp, work, filepath.Join(work, ".git"), done, nil
}

// layerWhole makes the layer of spec at dir from the cache repository
// cache: every file written.
func (s *Service) layerWhole(ctx context.Context, spec LayerSpec, dir, cache string, refs map[string]string, objects []objectFile) error {
	tmp, work, gitDir, done, err := s.layerSkeleton(spec)
	if err != nil {
		return err
	}
	defer done()
	for _, d := range []string{work, gitDir, gitDir + "/refs/heads", gitDir + "/refs/tags", gitDir + "/refs/remotes/origin",
		gitDir + "/objects/pack", gitDir + "/objects/info"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	files := []struct {
		name, body string
	}{
		{"HEAD", "ref: " + mainRef + "\n"},
		{"description", "vault " + spec.Name + "\n"},
		{"refs/remotes/origin/HEAD", "ref: refs/remotes/origin/main\n"},
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(gitDir, f.name), []byte(f.body), 0o644); err != nil {
			return err
		}
	}
	if err := s.layerGit(ctx, spec, cache, gitDir, refs, objects); err != nil {
		return err
	}
	// The files, written by git from the cache's objects; a symlink is
	// made, never followed.
	env := []string{"GIT_INDEX_FILE=" + filepath.Join(gitDir, "index")}
	if _, err := s.run(ctx, cache, env, nil, "--work-tree="+work, "checkout-index", "--all", "--force"); err != nil {
		return err
	}
	// The clone is its owner's, with the modes git archive would give
	// (the server's umask is not the sandbox's).
	err = filepath.WalkDir(work, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return own(p, d, spec.UID, spec.GID)
	})
	if err != nil {
		return err
	}
	return finishLayer(spec, tmp, dir)
}

// layerGit writes, in the layer's .git at gitDir, what changes from
// commit to commit: the refs, the objects it lacks (copies, not links:
// the layer outlives the cache; read-only, as git makes them) and the
// index of the commit (without stat data: git in the sandbox hashes the
// files once, finds them clean and refreshes it).
func (s *Service) layerGit(ctx context.Context, spec LayerSpec, cache, gitDir string, refs map[string]string, objects []objectFile) error {
	if err := writeOwned(filepath.Join(gitDir, "packed-refs"), packedRefs(refs), spec.UID, spec.GID); err != nil {
		return err
	}
	for _, o := range objects {
		dst := filepath.Join(gitDir, "objects", o.name)
		if _, err := os.Lstat(dst); err == nil {
			continue // linked from the base
		}
		if err := copyObject(o.f, dst); err != nil {
			return err
		}
		if err := os.Lchown(dst, spec.UID, spec.GID); err != nil {
			return err
		}
	}
	index := filepath.Join(gitDir, "index")
	if _, err := s.run(ctx, cache, []string{"GIT_INDEX_FILE=" + index}, nil, "read-tree", spec.Commit); err != nil {
		return err
	}
	if err := os.Chmod(index, 0o644); err != nil {
		return err
	}
	return os.Lchown(index, spec.UID, spec.GID)
}

// layerFrom makes the layer of spec at dir from base, an earlier
// commit's of the same mount: its files linked (a layer's files are
// never changed, only replaced), those the commits differ by removed,
// and the new commit's written. A commit of a few files costs a link a
// file, not a file written.
func (s *Service) layerFrom(ctx context.Context, spec LayerSpec, dir string, base layerBase, cache string, refs map[string]string, objects []objectFile) error {
	tmp, done, err := s.tempLayer()
	if err != nil {
		return err
	}
	defer done()
	work := filepath.Join(tmp, spec.Path)
	gitDir := filepath.Join(work, ".git")
	// What changed, paths relative to the work tree.
	out, err := s.run(ctx, cache, nil, nil, "diff-tree", "-r", "-z", "--no-renames", "--raw", base.commit, spec.Commit)
	if err != nil {
		return err
	}
	fields := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	var gone, changed []string
	for i := 0; i+1 < len(fields); i += 2 {
		meta, p := fields[i], fields[i+1]
		if p == "" || strings.HasPrefix(p, ".git/") || p == ".git" {
			return fmt.Errorf("a path %q in the diff", p)
		}
		gone = append(gone, p) // the old file goes, whatever the change
		if !strings.HasSuffix(meta, " D") {
			changed = append(changed, p)
		}
	}
	// Every file linked but the .git's that change and the files that go.
	skip := map[string]bool{filepath.Join(gitDir, "packed-refs"): true, filepath.Join(gitDir, "index"): true}
	for _, p := range gone {
		skip[filepath.Join(work, p)] = true
	}
	err = filepath.WalkDir(base.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(base.dir, p)
		dst := filepath.Join(tmp, rel)
		if skip[dst] {
			return nil
		}
		if !d.IsDir() {
			return os.Link(p, dst)
		}
		if rel == "." {
			return os.Chmod(tmp, 0o755)
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if err := os.Mkdir(dst, 0o755); err != nil {
			return err
		}
		return setAttrs(dst, fs.FileMode(st.Mode&0o7777), int(st.Uid), int(st.Gid), 0)
	})
	if err != nil {
		return err
	}
	// Directories the removals emptied go: a clone would not have them.
	for _, p := range gone {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if os.Remove(filepath.Join(work, d)) != nil {
				break // not empty (or not there)
			}
		}
	}
	if err := s.layerGit(ctx, spec, cache, gitDir, refs, objects); err != nil {
		return err
	}
	if len(changed) > 0 {
		env := []string{"GIT_INDEX_FILE=" + filepath.Join(gitDir, "index")}
		in := strings.NewReader(strings.Join(changed, "\x00") + "\x00")
		if _, err := s.run(ctx, cache, env, in, "--work-tree="+work, "checkout-index", "--force", "-z", "--stdin"); err != nil {
			return err
		}
		// The files written and the directories made for them.
		done := map[string]bool{}
		for _, p := range changed {
			for q := p; q != "." && !done[q]; q = path.Dir(q) {
				done[q] = true
				fi, err := os.Lstat(filepath.Join(work, q))
				if err != nil {
					return err
				}
				if err := own(filepath.Join(work, q), fs.FileInfoToDirEntry(fi), spec.UID, spec.GID); err != nil {
					return err
				}
			}
		}
	}
	return finishLayer(spec, tmp, dir)
}

// errNoDelta is layerDelta's answer to changes a layer of changes does
// not make (a file become a directory or the reverse, a submodule): the
// commit's layer is made whole.
var errNoDelta = errors.New("changes a layer of changes does not make")

// layerDelta makes at dir the layer of what spec.Commit changes from
// spec.From, to go over From's layers (below, top first): the files
// added or changed, written; the removed ones, overlay whiteouts (0/0
// character devices, as the layer store keeps an image's); the .git's
// index and refs, and the packs below lacks. A directory emptied stays,
// empty (git does not see it).
func (s *Service) layerDelta(ctx context.Context, spec LayerSpec, dir string, below []string, cache string, refs map[string]string, objects []objectFile) error {
	out, err := s.run(ctx, cache, nil, nil, "diff-tree", "-r", "-z", "--no-renames", "--raw", spec.From, spec.Commit)
	if err != nil {
		return err
	}
	fields := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	var gone, written []string
	paths := map[string]bool{}
	for i := 0; i+1 < len(fields); i += 2 {
		meta, p := strings.Fields(fields[i]), fields[i+1]
		if len(meta) != 5 || p == "" || p == ".git" || strings.HasPrefix(p, ".git/") {
			return fmt.Errorf("a path %q in the diff", p)
		}
		if meta[0] == ":160000" || meta[1] == "160000" {
			return errNoDelta
		}
		paths[p] = true
		if meta[4] == "D" {
			gone = append(gone, p)
		} else {
			written = append(written, p)
		}
	}
	for p := range paths {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if paths[d] {
				return errNoDelta // a file where a directory was, or the reverse
			}
		}
	}
	tmp, work, gitDir, done, err := s.layerSkeleton(spec)
	if err != nil {
		return err
	}
	defer done()
	if err := os.MkdirAll(filepath.Join(gitDir, "objects", "pack"), 0o755); err != nil {
		return err
	}
	for _, p := range gone {
		w := filepath.Join(work, p)
		if err := os.MkdirAll(filepath.Dir(w), 0o755); err != nil {
			return err
		}
		if err := unix.Mknod(w, unix.S_IFCHR, 0); err != nil {
			return fmt.Errorf("a whiteout: %w", err)
		}
	}
	// The packs (and any loose objects) that the layers below lack.
	var lack []objectFile
	for _, o := range objects {
		found := false
		for _, b := range below {
			if _, err := os.Lstat(filepath.Join(b, spec.Path, ".git", "objects", o.name)); err == nil {
				found = true
				break
			}
		}
		if !found {
			if err := os.MkdirAll(filepath.Dir(filepath.Join(gitDir, "objects", o.name)), 0o755); err != nil {
				return err
			}
			lack = append(lack, o)
		}
	}
	if err := s.layerGit(ctx, spec, cache, gitDir, refs, lack); err != nil {
		return err
	}
	if len(written) > 0 {
		env := []string{"GIT_INDEX_FILE=" + filepath.Join(gitDir, "index")}
		in := strings.NewReader(strings.Join(written, "\x00") + "\x00")
		if _, err := s.run(ctx, cache, env, in, "--work-tree="+work, "checkout-index", "--force", "-z", "--stdin"); err != nil {
			return err
		}
	}
	// All of it the clone's owner's; the whiteouts' modes are the
	// overlay's.
	err = filepath.WalkDir(work, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeCharDevice != 0 {
			return nil
		}
		return own(p, d, spec.UID, spec.GID)
	})
	if err != nil {
		return err
	}
	return finishLayer(spec, tmp, dir)
}

// own gives the file p of a clone (d its entry) its owner and the mode
// git archive would give it.
func own(p string, d fs.DirEntry, uid, gid int) error {
	if d.Type()&fs.ModeSymlink != 0 {
		return os.Lchown(p, uid, gid)
	}
	fi, err := d.Info()
	if err != nil {
		return err
	}
	mode := fs.FileMode(0o644)
	switch {
	case d.IsDir():
		mode = 0o755
	case strings.Contains(p, "/.git/objects/"):
		mode = 0o444
	case fi.Mode()&0o100 != 0:
		mode = 0o755
	}
	if err := os.Chmod(p, mode); err != nil {
		return err
	}
	return os.Lchown(p, uid, gid)
}

// writeOwned writes body to a new file p, uid:gid's, mode 0644.
func writeOwned(p, body string, uid, gid int) error {
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		return err
	}
	if err := os.Chmod(p, 0o644); err != nil {
		return err
	}
	return os.Lchown(p, uid, gid)
}

// finishLayer gives the directories above the mount's path in the layer
// made at tmp their attributes (last: making the clone changed their
// times) and names it dir.
func finishLayer(spec LayerSpec, tmp, dir string) error {
	for i := len(spec.Dirs) - 1; i >= 0; i-- {
		d := spec.Dirs[i]
		if err := setAttrs(filepath.Join(tmp, d.Path), fs.FileMode(d.Mode&0o7777), d.UID, d.GID, d.MTime); err != nil {
			return err
		}
	}
	// A mark left by a layer of the same key swept (a kill between its
	// removal and the mark's) would say this one, not yet synced, is on
	// disk: a reboot would keep it.
	if err := os.Remove(dir + syncedMark); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.Rename(tmp, dir)
}

// setAttrs gives p mode, owner and modification time.
func setAttrs(p string, mode fs.FileMode, uid, gid int, mtime int64) error {
	if err := os.Chmod(p, mode); err != nil {
		return err
	}
	if err := os.Lchown(p, uid, gid); err != nil {
		return err
	}
	if mtime != 0 {
		t := time.Unix(mtime, 0)
		return os.Chtimes(p, t, t)
	}
	return nil
}

// copyObject copies the open object file f to dst.
func copyObject(f *os.File, dst string) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o444)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, io.NewSectionReader(f, 0, fi.Size()))
	return errors.Join(err, out.Close())
}

// syncDir flushes the file system holding dir.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// KeptLayers reads the layer specs kept in a sandbox's writable layer at
// file (none if there is no file).
func KeptLayers(file string) ([]LayerSpec, error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []LayerSpec
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("vault layers of %s: %w", file, err)
	}
	return out, nil
}

// SweepLayers removes the layers that are neither in keep (keys, as
// LayerKey: those the sandboxes and snapshots of this node stack on) nor
// of the heads of the mounts this node made, and are older than a minute
// (a layer just made, for a create under way, is in no writable layer
// yet), and what builds of earlier runs left. It returns how many it
// removed.
//
// A layer is first renamed away, then removed: a layer at its key is
// whole (layer finds it there and uses it), whatever stops a sweep
// halfway (an error, a kill); what is left under the other name is
// removed by a later sweep.
func (s *Service) SweepLayers(ctx context.Context, keep map[string]bool) int {
	s.mu.Lock()
	for l, t := range s.layerUsed {
		if time.Since(t) >= time.Minute {
			delete(s.layerUsed, l)
		}
	}
	for _, last := range s.lastLayer {
		for _, spec := range last.chain {
			keep[spec.key()] = true
		}
		keep[filepath.Base(last.full.dir)] = true
	}
	s.mu.Unlock()
	n := 0
	ents, _ := os.ReadDir(s.layersDir())
	for _, e := range ents {
		fi, err := e.Info()
		tmp := strings.HasPrefix(e.Name(), tmpLayerPrefix)
		if err != nil || !e.IsDir() || keep[e.Name()] || time.Since(fi.ModTime()) < time.Minute ||
			strings.HasPrefix(e.Name(), ".") && !tmp {
			continue
		}
		d := filepath.Join(s.layersDir(), e.Name())
		trash := d
		// Checked and renamed under mu: layer, which stamps layerUsed
		// under it before it looks, then finds the layer gone and makes
		// it again, or the sweep keeps it.
		s.mu.Lock()
		_, used := s.layerUsed[e.Name()]
		skip := used || s.building[e.Name()]
		if !skip && !tmp {
			trash = filepath.Join(s.layersDir(), s.tempName())
			if err := os.Rename(d, trash); err != nil {
				s.log.Warn("removing a vault layer", "layer", e.Name(), "err", err)
				skip = true
			}
		}
		s.mu.Unlock()
		if skip {
			continue
		}
		n++
		if !tmp {
			os.Remove(d + syncedMark)
		}
		if err := os.RemoveAll(trash); err != nil {
			s.log.Warn("removing a vault layer", "layer", e.Name(), "err", err)
		}
	}
	return n
}

// tmpLayerPrefix starts the names of layers being made (tempLayer) and
// of those being removed (SweepLayers).
const tmpLayerPrefix = ".tmp-"

// tempName returns a new name for a layer being made or removed: of
// this run (s.run, random) and never used in it.
func (s *Service) tempName() string {
	s.tmpSeq++
	return fmt.Sprintf("%s%s-%d", tmpLayerPrefix, s.runID, s.tmpSeq)
}

// tempLayer makes a directory to make a layer in, which the sweep
// leaves alone until done (which removes it) is called: a build is not
// removed under it however long it takes (the directory's time is that
// of its start).
func (s *Service) tempLayer() (dir string, done func(), err error) {
	s.mu.Lock()
	name := s.tempName()
	s.building[name] = true
	s.mu.Unlock()
	done = func() {
		dir := filepath.Join(s.layersDir(), name)
		if err := os.RemoveAll(dir); err != nil {
			s.log.Warn("removing a vault layer not made", "dir", dir, "err", err)
		}
		s.mu.Lock()
		delete(s.building, name)
		s.mu.Unlock()
	}
	dir = filepath.Join(s.layersDir(), name)
	if err := os.Mkdir(dir, 0o700); err != nil {
		done()
		return "", nil, err
	}
	return dir, done, nil
}

// LayerKey is the name of spec's layer, for SweepLayers.
func LayerKey(spec LayerSpec) string { return spec.key() }

// TemplateDirs are the directories above path (a mount's, clean and
// absolute) as the template whose layers are tmpl (top first) has them:
// each as the topmost layer that has it holds it; one that none has (or
// that a layer hides, with a whiteout or a file in its place) is made
// uid:gid's under /home/user (as Clone makes it) and root's elsewhere.
func TemplateDirs(tmpl []string, mountPath string, uid, gid int) []LayerDir {
	var out []LayerDir
	parts := strings.Split(strings.TrimPrefix(path.Dir(mountPath), "/"), "/")
	if path.Dir(mountPath) == "/" {
		parts = nil
	}
	for i := range parts {
		p := strings.Join(parts[:i+1], "/")
		d := LayerDir{Path: p, Mode: 0o755}
		if strings.HasPrefix(p+"/", "home/user/") && p != "home/user" {
			d.UID, d.GID = uid, gid
		}
		for _, l := range tmpl {
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(l, p), &st); err != nil {
				continue
			}
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				d.Mode, d.UID, d.GID, d.MTime = st.Mode&0o7777, int(st.Uid), int(st.Gid), st.Mtim.Sec
			}
			break
		}
		out = append(out, d)
	}
	return out
}
