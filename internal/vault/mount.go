package vault

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
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
// the sandbox that upload reaches: its .git (set up as the package
// comment says) and the directories above it in one tar at /, then its
// working tree at the main branch in another at m.Path (shorter names, for
// the agent to resolve in each of its thousands of files).
func (s *Service) Clone(ctx context.Context, m Mount, upload Upload) error {
	v, err := s.lookup(ctx, m.Name)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp(s.cfg.Dir, "mount-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	work := filepath.Join(tmp, "w")
	unlock := s.lock(v.ID)
	dir, err := s.ensure(ctx, v)
	if err == nil {
		// --local hard-links the cache's packs, and no working tree is
		// written here: the files go from git archive to the tar, so the
		// host writes a few files whatever the vault holds.
		err = s.runGit(ctx, tmp, "clone", "-q", "--local", "--no-tags", "--no-checkout", dir, work)
	}
	unlock()
	if err != nil {
		return fmt.Errorf("cloning vault %s: %w", m.Name, err)
	}
	// An empty vault has no HEAD yet: its clone is .git alone.
	hasHead := s.runGit(ctx, work, "rev-parse", "-q", "--verify", "HEAD^{commit}") == nil
	if hasHead {
		// The index of HEAD's tree, without its files' stat data: git in
		// the sandbox hashes them once, finds them clean and refreshes it.
		if err := s.runGit(ctx, work, "read-tree", "HEAD"); err != nil {
			return fmt.Errorf("cloning vault %s: %w", m.Name, err)
		}
	}
	if err := os.WriteFile(filepath.Join(work, ".git", "config"), []byte(cloneConfig(m)), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(work, TokenFile), []byte(m.Token+"\n"), 0o600); err != nil {
		return err
	}
	now := time.Now()
	dirHeader := func(name string) *tar.Header {
		return &tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: 0o755, Uid: m.UID, Gid: m.GID, ModTime: now}
	}
	rel := strings.TrimPrefix(m.Path, "/")
	err = upload("/", func(w io.Writer) error {
		tw := tar.NewWriter(w)
		// The parents of the clone that are in the user's home are the
		// user's, so that it can make more there (another clone, notes of
		// its own).
		if home := "home/user/"; strings.HasPrefix(rel, home) {
			parts := strings.Split(strings.TrimPrefix(rel, home), "/")
			for i := 1; i < len(parts); i++ {
				if err := tw.WriteHeader(dirHeader(home + strings.Join(parts[:i], "/"))); err != nil {
					return err
				}
			}
		}
		if err := tw.WriteHeader(dirHeader(rel)); err != nil {
			return err
		}
		if err := s.tarDir(tw, filepath.Join(work, ".git"), rel+"/.git", m.UID, m.GID); err != nil {
			return fmt.Errorf("packing vault %s's clone: %w", m.Name, err)
		}
		return tw.Close()
	})
	if err != nil || !hasHead {
		return err
	}
	return upload(m.Path, func(w io.Writer) error {
		tw := tar.NewWriter(w)
		if err := s.tarTree(ctx, tw, work, "", m.UID, m.GID); err != nil {
			return fmt.Errorf("packing vault %s's files: %w", m.Name, err)
		}
		return tw.Close()
	})
}

// tarDir writes directory dir to tw under the name prefix, owned by uid
// and gid: regular files and directories (a fresh clone's .git has no
// other kind).
func (s *Service) tarDir(tw *tar.Writer, dir, prefix string, uid, gid int) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		r, _ := filepath.Rel(dir, p)
		name := path.Join(prefix, filepath.ToSlash(r))
		hdr := &tar.Header{Name: name, Mode: int64(fi.Mode().Perm()), Uid: uid, Gid: gid, ModTime: fi.ModTime()}
		switch {
		case d.IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
			return tw.WriteHeader(hdr)
		case fi.Mode().IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		}
		return nil
	})
}

// tarTree writes HEAD's tree of the clone work to tw under the name
// prefix, owned by uid and gid, from git archive's tar: files, directories
// and symlinks as the vault holds them (a link is made again in the
// sandbox, never followed here).
func (s *Service) tarTree(ctx context.Context, tw *tar.Writer, work, prefix string, uid, gid int) error {
	cmd := exec.CommandContext(ctx, s.git, "-c", "tar.umask=0022", "archive", "--format=tar", "HEAD")
	cmd.Dir, cmd.Env, cmd.WaitDelay = work, s.gitEnv(), 5*time.Second
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
			hdr.Name = path.Join(prefix, hdr.Name)
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

func (s *Service) runGit(ctx context.Context, dir string, args ...string) error {
	cmd := exec.CommandContext(ctx, s.git, args...)
	cmd.Dir = dir
	cmd.Env = s.gitEnv()
	cmd.WaitDelay = 5 * time.Second
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("git %s: %v: %s", args[0], err, strings.TrimSpace(string(out)))
	}
	return nil
}
