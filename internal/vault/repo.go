package vault

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// The local cache. Each vault has a bare repository at Dir/<id>.git whose
// refs never run ahead of the store's: git moves them only after the
// pre-receive hook has committed the same move to the store. They can fall
// behind (a crash between that commit and git's own ref update, a push
// through another node), and a missing repository is all behind; so every
// request first brings the repository up to the store (ensure): the packs
// it lacks are fetched from the object store and indexed, then its refs
// are set to the store's in one ref transaction.

const mainRef = "refs/heads/main"

func (s *Service) repoDir(id string) string { return filepath.Join(s.cfg.Dir, id+".git") }

// objectPrefix is where vault id's objects are in the object store.
func objectPrefix(id string) string { return "vaults/" + id + "/" }

// packKey is the key of vault id's pack name (pack-<hash>.pack, the name
// git gives it: its content's hash, so that a pack stored twice is one
// object).
func packKey(id, name string) string { return objectPrefix(id) + "packs/" + name }

// lock serializes, per vault, ensure and the end of the pushes through
// this node: a push's hook takes it before it commits the push to the
// store and the request holds it until git has moved its own refs, so
// that ensure never sees a ref the store moved and git is about to move
// too. It returns the unlock.
func (s *Service) lock(id string) func() {
	s.mu.Lock()
	l := s.locks[id]
	if l == nil {
		l = &vaultLock{}
		s.locks[id] = l
	}
	l.users++
	s.mu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		s.mu.Lock()
		if l.users--; l.users == 0 {
			delete(s.locks, id)
		}
		s.mu.Unlock()
	}
}

// ready brings v's cache up to the store and returns its directory, for
// reading.
func (s *Service) ready(ctx context.Context, v store.Vault) (string, error) {
	unlock := s.lock(v.ID)
	defer unlock()
	return s.ensure(ctx, v)
}

// repoConfig is every cache repository's configuration. The hook, not
// git's receive.deny* settings, decides what a push may do: it runs
// before them and commits to the store, which git must then follow.
const repoConfig = `[http]
	receivepack = true
	uploadpack = true
[receive]
	# Every push's objects arrive as one pack (never loose), which the
	# hook stores as it is.
	unpackLimit = 1
	fsckObjects = true
	denyNonFastForwards = false
	denyDeletes = false
	denyCurrentBranch = ignore
	shallowUpdate = false
	maxInputSize = %d
	# No gc: see gc.auto.
	autogc = false
[transfer]
	fsckObjects = true
[gc]
	# The cache keeps the store's packs as they are: ensure finds a pack
	# by its name.
	auto = 0
[core]
	logAllRefUpdates = false
`

// hookScript is the pre-receive hook of every cache repository: it hands
// the push to the server (listen, serveHook) at the address the server
// gave git http-backend, and lets git go on only if the server stored it.
// bash, for its /dev/tcp: a shell starts in a fraction of the time any
// program that speaks JSON over a unix socket would.
const hookScript = `#!/bin/bash
# atoll: a push is accepted only once the server has stored it durably.
if [ -z "$ATOLL_VAULT_HOOK" ] || [ -z "$ATOLL_VAULT_PUSH" ]; then
	echo "atoll: this repository takes pushes only through the atoll server" >&2
	exit 1
fi
# (exec's own 2>/dev/null would silence the rest of the script)
if ! { exec 3<>"/dev/tcp/${ATOLL_VAULT_HOOK%:*}/${ATOLL_VAULT_HOOK##*:}"; } 2>/dev/null; then
	echo "atoll: the server is not there to store the push; nothing was changed" >&2
	exit 1
fi
# Builtins only from here: a cat is a process more on every push.
{
	printf '%s\n%s\n' "$ATOLL_VAULT_PUSH" "$GIT_QUARANTINE_PATH"
	while IFS= read -r line; do printf '%s\n' "$line"; done
	echo
} >&3
IFS= read -r verdict <&3
while IFS= read -r line <&3; do printf '%s\n' "$line" >&2; done
[ "$verdict" = ok ]
`

// ensure brings v's cache up to the store, making it if it is missing,
// and returns its directory. The caller holds v's lock.
func (s *Service) ensure(ctx context.Context, v store.Vault) (string, error) {
	dir, _, err := s.ensureRefs(ctx, v)
	return dir, err
}

// ensureRefs is ensure, also returning the refs the cache then has.
func (s *Service) ensureRefs(ctx context.Context, v store.Vault) (string, map[string]string, error) {
	dir := s.repoDir(v.ID)
	if _, err := os.Stat(filepath.Join(dir, "hooks", "pre-receive")); errors.Is(err, os.ErrNotExist) {
		if err := s.initRepo(ctx, dir); err != nil {
			return "", nil, fmt.Errorf("making vault %s's repository: %w", v.Name, err)
		}
	} else if err != nil {
		return "", nil, err
	}
	refs, packs, err := s.cfg.Store.VaultState(ctx, v.ID)
	if err != nil {
		return "", nil, err
	}
	local, err := s.localRefs(ctx, dir)
	if err != nil {
		return "", nil, err
	}
	if maps.Equal(refs, local) {
		return dir, local, nil
	}
	for _, name := range packs {
		// A pack is there once its index is (written last).
		if _, err := os.Stat(filepath.Join(dir, "objects", "pack", strings.TrimSuffix(name, ".pack")+".idx")); err == nil {
			continue
		}
		if err := s.fetchPack(ctx, v, dir, name); err != nil {
			return "", nil, err
		}
	}
	// Packs the store no longer records were consolidated into one it
	// does, fetched above.
	if err := pruneLocal(dir, packs); err != nil {
		return "", nil, fmt.Errorf("pruning vault %s's cache: %w", v.Name, err)
	}
	var cmds bytes.Buffer
	cmds.WriteString("start\n")
	for _, name := range slices.Sorted(maps.Keys(refs)) {
		fmt.Fprintf(&cmds, "update %s %s\n", name, refs[name])
	}
	for name := range local {
		if _, ok := refs[name]; !ok {
			fmt.Fprintf(&cmds, "delete %s\n", name)
		}
	}
	cmds.WriteString("prepare\ncommit\n")
	if _, err := s.run(ctx, dir, nil, &cmds, "update-ref", "--stdin"); err != nil {
		return "", nil, fmt.Errorf("setting vault %s's cached refs: %w", v.Name, err)
	}
	s.log.Info("vault cache brought up to the store", "vault", v.ID, "refs", len(refs), "packs", len(packs))
	return dir, refs, nil
}

// initRepo makes a cache repository at dir: made whole in a directory
// beside it, then renamed into place, so that a crash never leaves a
// half-made one under the name.
func (s *Service) initRepo(ctx context.Context, dir string) error {
	tmp := dir + ".tmp-" + newID()
	defer os.RemoveAll(tmp)
	if _, err := s.run(ctx, s.cfg.Dir, nil, nil, "init", "--quiet", "--bare", "--initial-branch=main", tmp); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(tmp, "config"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, repoConfig, s.cfg.MaxPush)
	if err := errors.Join(err, f.Close()); err != nil {
		return err
	}
	hooks := filepath.Join(tmp, "hooks")
	if err := os.RemoveAll(hooks); err != nil { // git's samples
		return err
	}
	if err := os.Mkdir(hooks, 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(hooks, "pre-receive"), []byte(hookScript), 0o700); err != nil {
		return err
	}
	os.RemoveAll(dir) // a cache without its hook: made again
	return os.Rename(tmp, dir)
}

// localRefs are the refs of the cache at dir, read from git's files (its
// "files" ref backend, the one initRepo makes): the packed refs, then the
// loose ones, which override them. Read in-process, as ensure does before
// every request: a git for-each-ref would be a process per request.
func (s *Service) localRefs(ctx context.Context, dir string) (map[string]string, error) {
	refs := map[string]string{}
	packed, err := os.ReadFile(filepath.Join(dir, "packed-refs"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, l := range strings.Split(string(packed), "\n") {
		if l == "" || l[0] == '#' || l[0] == '^' { // header, peeled tags
			continue
		}
		if oid, name, ok := strings.Cut(l, " "); ok {
			refs[name] = oid
		}
	}
	err = filepath.WalkDir(filepath.Join(dir, "refs"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || strings.HasSuffix(p, ".lock") {
			return err
		}
		b, err := os.ReadFile(p)
		if errors.Is(err, os.ErrNotExist) {
			return nil // deleted meanwhile (packed)
		}
		if err != nil {
			return err
		}
		oid := strings.TrimSpace(string(b))
		if strings.HasPrefix(oid, "ref:") {
			return nil // a symbolic ref, not one of the store's
		}
		rel, _ := filepath.Rel(dir, p)
		refs[filepath.ToSlash(rel)] = oid
		return nil
	})
	return refs, err
}

// fetchPack copies pack name of v from the object store into the cache
// at dir; git index-pack checks it and writes it with its index.
func (s *Service) fetchPack(ctx context.Context, v store.Vault, dir, name string) error {
	obj, err := s.cfg.Blob.Get(ctx, packKey(v.ID, name))
	if err != nil {
		return fmt.Errorf("fetching vault %s's pack %s: %w", v.Name, name, err)
	}
	defer obj.Close()
	out, err := s.run(ctx, dir, nil, obj, "index-pack", "--stdin")
	if err != nil {
		return fmt.Errorf("indexing vault %s's pack %s: %w", v.Name, name, err)
	}
	// index-pack names the pack by its hash, as the store does.
	if got := "pack-" + strings.TrimPrefix(strings.TrimSpace(string(out)), "pack\t") + ".pack"; got != name {
		return fmt.Errorf("vault %s's pack %s indexes as %s: the object store's copy is not what was pushed", v.Name, name, got)
	}
	return nil
}

// storePack writes the pack file at p to the object store as v's, under
// its name; durable when it returns.
func (s *Service) storePack(ctx context.Context, v store.Vault, p string) (string, error) {
	name := filepath.Base(p)
	if !strings.HasPrefix(name, "pack-") || !strings.HasSuffix(name, ".pack") {
		return "", fmt.Errorf("unexpected pack file %s", name)
	}
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	err = s.cfg.Blob.Put(ctx, packKey(v.ID, name), func(w io.Writer) error {
		_, err := io.Copy(w, f)
		return err
	})
	return name, err
}

// File is one file of a commit the server makes.
type File struct {
	Path    string
	Content string
}

// commit makes a commit of files on v's main branch, which must have
// none yet (the seed of a layout), through the same path a push takes:
// the pack to the object store, then the ref in the store, then the
// cache. git fast-import writes the pack, in a scratch repository.
func (s *Service) commit(ctx context.Context, v store.Vault, files []File, message string) error {
	unlock := s.lock(v.ID)
	defer unlock()
	if _, err := s.ensure(ctx, v); err != nil {
		return err
	}
	scratch := filepath.Join(s.cfg.Dir, "scratch-"+newID())
	defer os.RemoveAll(scratch)
	if _, err := s.run(ctx, s.cfg.Dir, nil, nil, "init", "--quiet", "--bare", scratch); err != nil {
		return err
	}
	var in bytes.Buffer
	now := time.Now().Unix()
	fmt.Fprintf(&in, "commit %s\ncommitter atoll <atoll@localhost> %d +0000\ndata %d\n%s\n", mainRef, now, len(message), message)
	for _, f := range files {
		fmt.Fprintf(&in, "M 100644 inline %s\ndata %d\n%s\n", f.Path, len(f.Content), f.Content)
	}
	in.WriteString("done\n")
	if _, err := s.run(ctx, scratch, nil, &in, "-c", "fastimport.unpackLimit=0", "fast-import", "--quiet", "--done"); err != nil {
		return err
	}
	head, err := s.run(ctx, scratch, nil, nil, "rev-parse", mainRef)
	if err != nil {
		return err
	}
	// fastimport.unpackLimit=0: the objects come as one pack, never loose.
	packs, _ := filepath.Glob(filepath.Join(scratch, "objects", "pack", "pack-*.pack"))
	if len(packs) == 0 {
		return errors.New("git fast-import wrote no pack")
	}
	var names []string
	for _, p := range packs {
		name, err := s.storePack(ctx, v, p)
		if err != nil {
			return err
		}
		names = append(names, name)
	}
	up := store.RefUpdate{Name: mainRef, New: strings.TrimSpace(string(head))}
	if err := s.cfg.Store.UpdateVaultRefs(ctx, v.ID, []store.RefUpdate{up}, names); err != nil {
		if errors.Is(err, errdefs.ErrConflict) {
			return fmt.Errorf("%w: vault %s has commits already", errdefs.ErrConflict, v.Name)
		}
		return err
	}
	_, err = s.ensure(ctx, v) // the cache follows the store
	return err
}
