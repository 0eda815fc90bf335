package vault

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Mounting a vault into a sandbox (docs/vault.md, "In a sandbox") is a
// clone made on the host, from the vault's cache repository, and handed
// to the sandbox as a tar its agent unpacks: the sandbox needs neither a
// network nor git's protocol for it, and the clone is there before its
// create answers. The clone's origin is the vault's git URL as the
// sandbox reaches it, and its credential helper reads the sandbox's token
// from TokenFile, which the server writes and renews.

// Mount is a vault to clone into a sandbox.
type Mount struct {
	api.VaultMount // Path set (CheckMounts sets it)
	Sandbox        string
	// URL is the vault's git URL as the sandbox reaches it: origin.
	URL string
	// Token is the clone's first token (Token.Sign).
	Token string
	// UID and GID own the clone: the sandbox's user.
	UID, GID int
}

// TokenFile is where a clone keeps its token, inside its .git directory:
// it goes where the clone goes and is never committed.
const TokenFile = ".git/atoll-token"

// mountPathPattern is the shape of a mount's path: it is written into the
// clone's git config and a shell command (the credential helper), so only
// characters neither quotes.
var mountPathPattern = regexp.MustCompile(`^/[A-Za-z0-9._/-]+$`)

// CheckMounts checks a create's vault mounts, sets their default paths,
// and returns them; names, paths and counts are refused with
// errdefs.ErrInvalid. It does not look the vaults up.
func CheckMounts(ms []api.VaultMount) ([]api.VaultMount, error) {
	if len(ms) > api.MaxVaultMounts {
		return nil, fmt.Errorf("%w: at most %d vaults per sandbox", errdefs.ErrInvalid, api.MaxVaultMounts)
	}
	out := make([]api.VaultMount, 0, len(ms))
	names, paths := map[string]bool{}, map[string]bool{}
	for _, m := range ms {
		if err := CheckName(m.Name); err != nil {
			return nil, err
		}
		if m.Path == "" {
			m.Path = api.VaultMountDir + "/" + m.Name
		}
		m.Commit = "" // the server's to say
		clean := path.Clean(m.Path)
		if len(m.Path) > 1024 || !mountPathPattern.MatchString(m.Path) || clean != m.Path || clean == "/" || strings.Contains(m.Path, "/.") {
			return nil, fmt.Errorf("%w: vault %s's path %.80q: want an absolute, clean path of [A-Za-z0-9._/-], no component starting with a dot", errdefs.ErrInvalid, m.Name, m.Path)
		}
		if names[m.Name] {
			return nil, fmt.Errorf("%w: vault %s is mounted twice", errdefs.ErrInvalid, m.Name)
		}
		for p := range paths {
			if p == m.Path || strings.HasPrefix(m.Path, p+"/") || strings.HasPrefix(p, m.Path+"/") {
				return nil, fmt.Errorf("%w: vault paths %s and %s overlap", errdefs.ErrInvalid, p, m.Path)
			}
		}
		names[m.Name], paths[m.Path] = true, true
		out = append(out, m)
	}
	return out, nil
}

// ID returns the ID of the context's tenant's vault name: what its
// tokens name.
func (s *Service) ID(ctx context.Context, name string) (string, error) {
	v, err := s.lookup(ctx, name)
	return v.ID, err
}

// Upload unpacks in the sandbox, at its directory dir, the tar that write
// writes.
type Upload func(dir string, write func(io.Writer) error) error

// Clone makes a clone of the context's tenant's vault m.Name at m.Path in
// the sandbox that upload reaches: its .git and the directories above it
// in one tar at /, then its working tree at the main branch in another at
// m.Path (shorter names, for the agent to resolve in each of its files).
//
// No clone is made on the host: the .git is assembled from the cache
// repository as git clone would have made it (the cache's packs, the refs
// as packed-refs, an index read from the main branch's tree), and the
// files come from git archive; so the host writes one file (the index)
// whatever the vault holds, and runs two git processes.
func (s *Service) Clone(ctx context.Context, m Mount, upload Upload) error {
	v, err := s.lookup(ctx, m.Name)
	if err != nil {
		return err
	}
	unlock := s.lock(v.ID)
	dir, err := s.ensure(ctx, v)
	var refs map[string]string
	var objects []objectFile
	if err == nil {
		refs, _, err = s.cfg.Store.VaultState(ctx, v.ID)
	}
	if err == nil {
		// Opened under the lock: what they read is the cache as the refs
		// say, whatever happens to it later.
		objects, err = openObjects(dir)
	}
	unlock()
	defer func() {
		for _, o := range objects {
			o.f.Close()
		}
	}()
	if err != nil {
		return fmt.Errorf("cloning vault %s: %w", m.Name, err)
	}
	head := refs[mainRef]
	var indexFile, treeFile *os.File
	if head != "" {
		// Made once per commit (prepared); opened at once,
		// before a newer commit's replace them (a second try if that
		// happened in between).
		for try := 0; ; try++ {
			index, tree, err := s.prepared(ctx, v.ID, dir, head, m.UID, m.GID)
			if err == nil {
				if indexFile, err = os.Open(index); err == nil {
					if treeFile, err = os.Open(tree); err != nil {
						indexFile.Close()
					}
				}
			}
			if err == nil {
				break
			}
			if try > 0 || !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("cloning vault %s: %w", m.Name, err)
			}
		}
		defer indexFile.Close()
		defer treeFile.Close()
	}
	now := time.Now()
	own := func(h *tar.Header) *tar.Header {
		h.Uid, h.Gid, h.ModTime = m.UID, m.GID, now
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		return h
	}
	dirHeader := func(name string) *tar.Header {
		return own(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755})
	}
	rel := strings.TrimPrefix(m.Path, "/")
	gitDir := rel + "/.git"
	err = upload("/", func(w io.Writer) error {
		tw := tar.NewWriter(w)
		// The parents of the clone that are in the user's home are the
		// user's, so that it can make more there (another clone, notes of
		// its own).
		var dirs []string
		if home := "home/user/"; strings.HasPrefix(rel, home) {
			parts := strings.Split(strings.TrimPrefix(rel, home), "/")
			for i := 1; i < len(parts); i++ {
				dirs = append(dirs, home+strings.Join(parts[:i], "/"))
			}
		}
		dirs = append(dirs, rel, gitDir, gitDir+"/refs", gitDir+"/refs/heads", gitDir+"/refs/tags",
			gitDir+"/objects", gitDir+"/objects/pack", gitDir+"/objects/info")
		for _, d := range dirs {
			if err := tw.WriteHeader(dirHeader(d)); err != nil {
				return err
			}
		}
		files := []struct {
			name string
			mode int64
			body string
		}{
			{"HEAD", 0o644, "ref: " + mainRef + "\n"},
			{"config", 0o644, cloneConfig(m)},
			{"packed-refs", 0o644, packedRefs(refs)},
			{"description", 0o644, "vault " + m.Name + "\n"},
			{"atoll-token", 0o600, m.Token + "\n"},
		}
		if head != "" {
			files = append(files, struct {
				name string
				mode int64
				body string
			}{"refs/remotes/origin/HEAD", 0o644, "ref: refs/remotes/origin/main\n"})
			if err := tw.WriteHeader(dirHeader(gitDir + "/refs/remotes")); err != nil {
				return err
			}
			if err := tw.WriteHeader(dirHeader(gitDir + "/refs/remotes/origin")); err != nil {
				return err
			}
		}
		for _, f := range files {
			if err := tw.WriteHeader(own(&tar.Header{Typeflag: tar.TypeReg, Name: gitDir + "/" + f.name, Mode: f.mode, Size: int64(len(f.body))})); err != nil {
				return err
			}
			if _, err := io.WriteString(tw, f.body); err != nil {
				return err
			}
		}
		if head != "" {
			objects = append(objects, objectFile{name: "../index", f: indexFile})
		}
		for _, o := range objects {
			fi, err := o.f.Stat()
			if err != nil {
				return err
			}
			// Objects are read-only, as git makes them.
			mode := int64(0o444)
			if o.name == "../index" {
				mode = 0o644
			}
			if err := tw.WriteHeader(own(&tar.Header{Typeflag: tar.TypeReg, Name: path.Clean(gitDir + "/objects/" + o.name), Mode: mode, Size: fi.Size()})); err != nil {
				return err
			}
			if _, err := io.Copy(tw, io.NewSectionReader(o.f, 0, fi.Size())); err != nil {
				return err
			}
		}
		return tw.Close()
	})
	if err != nil || head == "" {
		return err
	}
	// The working tree's tar, as prepared: opened before the cache may
	// drop it for a newer commit's.
	return upload(m.Path, func(w io.Writer) error {
		_, err := io.Copy(w, treeFile)
		return err
	})
}

// objectFile is an open file of a cache repository's objects directory,
// named relative to it.
type objectFile struct {
	name string
	f    *os.File
}

// openObjects opens the object files of the cache repository dir: its
// packs with their indexes, and any loose objects (a cache has none, but a
// clone without them would be broken). Quarantines of pushes under way
// (git's tmp_objdir-incoming-*) are not objects yet.
func openObjects(dir string) (out []objectFile, err error) {
	defer func() {
		if err != nil {
			for _, o := range out {
				o.f.Close()
			}
		}
	}()
	root := filepath.Join(dir, "objects")
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		var want func(string) bool
		switch {
		case e.Name() == "pack":
			want = func(n string) bool {
				return strings.HasPrefix(n, "pack-") && (strings.HasSuffix(n, ".pack") || strings.HasSuffix(n, ".idx"))
			}
		case len(e.Name()) == 2 && e.IsDir():
			want = func(string) bool { return true }
		default:
			continue
		}
		files, err := os.ReadDir(filepath.Join(root, e.Name()))
		if err != nil {
			return out, err
		}
		for _, f := range files {
			if !f.Type().IsRegular() || !want(f.Name()) {
				continue
			}
			name := e.Name() + "/" + f.Name()
			fd, err := os.Open(filepath.Join(root, name))
			if err != nil {
				return out, err
			}
			out = append(out, objectFile{name, fd})
		}
	}
	return out, nil
}

// packedRefs is a clone's packed-refs: the vault's branches as origin's,
// main as the local branch too, its tags as tags.
func packedRefs(refs map[string]string) string {
	var b strings.Builder
	b.WriteString("# pack-refs with: sorted\n")
	lines := map[string]string{}
	for name, id := range refs {
		if br, ok := strings.CutPrefix(name, "refs/heads/"); ok {
			lines["refs/remotes/origin/"+br] = id
		} else if strings.HasPrefix(name, "refs/tags/") {
			lines[name] = id
		}
	}
	if id := refs[mainRef]; id != "" {
		lines[mainRef] = id
	}
	names := make([]string, 0, len(lines))
	for n := range lines {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(&b, "%s %s\n", lines[n], n)
	}
	return b.String()
}

// tarTree writes the tree of commit in the repository dir to tw, owned by
// uid and gid, from git archive's tar: files, directories and symlinks as
// the vault holds them (a link is made again in the sandbox, never
// followed here).
func (s *Service) tarTree(ctx context.Context, tw *tar.Writer, dir, commit string, uid, gid int) error {
	cmd := exec.CommandContext(ctx, s.git, "-c", "tar.umask=0022", "archive", "--format=tar", commit)
	cmd.Dir, cmd.Env, cmd.WaitDelay = dir, s.gitEnv(), 5*time.Second
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	err = func() error {
		tr := tar.NewReader(out)
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			switch hdr.Typeflag {
			case tar.TypeReg, tar.TypeDir, tar.TypeSymlink:
			default:
				continue // the pax header of the commit's ID; submodules are not in archives
			}
			hdr.Name = path.Clean(hdr.Name)
			if hdr.Typeflag == tar.TypeDir {
				hdr.Name += "/"
			}
			hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = uid, gid, "", ""
			hdr.PAXRecords, hdr.Format = nil, tar.FormatUnknown
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			if hdr.Typeflag == tar.TypeReg {
				if _, err := io.Copy(tw, tr); err != nil {
					return err
				}
			}
		}
	}()
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return err
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git archive: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// cloneConfig is the clone's .git/config: origin is the vault's URL, the
// credential helper reads the token file (and only answers "get": the
// server renews the file, git need not store or erase anything), and
// commits are signed as the sandbox.
func cloneConfig(m Mount) string {
	return fmt.Sprintf(`[core]
	repositoryformatversion = 0
	filemode = true
	bare = false
	logallrefupdates = true
[remote "origin"]
	url = %s
	fetch = +refs/heads/*:refs/remotes/origin/*
[branch "main"]
	remote = origin
	merge = refs/heads/main
[credential]
	helper =
	helper = "!f() { test \"$1\" = get || exit 0; echo username=sandbox; printf 'password='; cat %s/%s; }; f"
[user]
	name = atoll sandbox %s
	email = %s@sandbox.atoll.invalid
`, m.URL, m.Path, TokenFile, m.Sandbox, m.Sandbox)
}

// SandboxFilesTar writes to w a tar, to unpack at /, of the files of m's
// clone that are the sandbox's own (its .git/config and token): what a
// mount made of a layer (Layer) lacks.
func SandboxFilesTar(w io.Writer, m Mount) error {
	tw := tar.NewWriter(w)
	gitDir := strings.TrimPrefix(m.Path, "/") + "/.git/"
	now := time.Now()
	for _, f := range []struct {
		name string
		mode int64
		body string
	}{
		{"config", 0o644, cloneConfig(m)},
		{"atoll-token", 0o600, m.Token + "\n"},
	} {
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: gitDir + f.name, Mode: f.mode, Uid: m.UID, Gid: m.GID,
			Size: int64(len(f.body)), ModTime: now}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if _, err := io.WriteString(tw, f.body); err != nil {
			return err
		}
	}
	return tw.Close()
}

// TokenTar writes to w a tar, to unpack at /, that replaces the token of
// the clone at path (a mount's Path).
func TokenTar(w io.Writer, path, token string, uid, gid int) error {
	tw := tar.NewWriter(w)
	body := token + "\n"
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(path, "/") + "/" + TokenFile,
		Mode: 0o600, Uid: uid, Gid: gid, Size: int64(len(body)), ModTime: time.Now()}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := io.WriteString(tw, body); err != nil {
		return err
	}
	return tw.Close()
}
