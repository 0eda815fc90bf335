package envd

import (
	"bufio"
	"context"
	"errors"
	"io"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/e2b/envd/spec/filesystem"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// accounts is what the sandbox's /etc/passwd and /etc/group say, read
// through the agent: E2B answers with owner names and resolves relative
// paths against the user's home.
type accounts struct {
	users  map[int]string
	groups map[int]string
	homes  map[string]string
}

// maxAccountsFile bounds how much of /etc/passwd or /etc/group is read.
const maxAccountsFile = 1 << 20

func (c *call) accounts(ctx context.Context) *accounts {
	if c.accts != nil {
		return c.accts
	}
	a := &accounts{users: map[int]string{}, groups: map[int]string{}, homes: map[string]string{}}
	parse := func(file string, f func(fields []string)) {
		r, err := c.sb.Agent.ReadFile(ctx, file)
		if err != nil {
			return // a minimal image may lack them; names fall back to numbers
		}
		defer r.Close()
		sc := bufio.NewScanner(io.LimitReader(r, maxAccountsFile))
		for sc.Scan() {
			if fields := strings.Split(sc.Text(), ":"); len(fields) >= 3 {
				f(fields)
			}
		}
	}
	parse("/etc/passwd", func(f []string) {
		if id, err := strconv.Atoi(f[2]); err == nil {
			if _, ok := a.users[id]; !ok {
				a.users[id] = f[0]
			}
		}
		if len(f) >= 6 {
			a.homes[f[0]] = f[5]
		}
	})
	parse("/etc/group", func(f []string) {
		if id, err := strconv.Atoi(f[2]); err == nil {
			if _, ok := a.groups[id]; !ok {
				a.groups[id] = f[0]
			}
		}
	})
	if _, ok := a.homes["root"]; !ok {
		a.homes["root"] = "/root"
	}
	c.accts = a
	return a
}

// home is the request user's home directory; unknown users are refused
// as E2B's envd refuses them.
func (c *call) home(ctx context.Context) (string, error) {
	if h, ok := c.accounts(ctx).homes[c.user]; ok {
		return h, nil
	}
	return "", connect.NewError(connect.CodeUnauthenticated, errors.New("invalid username: '"+c.user+"'"))
}

// resolve turns a path as E2B clients send it into an absolute one: "~"
// and relative paths are taken from the user's home.
func (c *call) resolve(ctx context.Context, p string) (string, error) {
	if strings.ContainsRune(p, 0) {
		return "", invalid("path contains NUL")
	}
	if strings.HasPrefix(p, "~") {
		if len(p) > 1 && p[1] != '/' {
			return "", invalid("cannot expand user-specific home dir in %q", p)
		}
		p = p[1:]
		if p == "" {
			p = "."
		} else {
			p = "." + p
		}
	}
	if path.IsAbs(p) {
		return path.Clean(p), nil
	}
	home, err := c.home(ctx)
	if err != nil {
		return "", err
	}
	return path.Join(home, p), nil
}

// goMode is the os.FileMode of fi, for E2B's permissions string (Go's
// FileMode.String, as envd renders it).
func goMode(fi api.FileInfo) fs.FileMode {
	m := fs.FileMode(fi.Mode & 0o777)
	if fi.Mode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if fi.Mode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if fi.Mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	switch fi.Type {
	case api.FileTypeDir:
		m |= fs.ModeDir
	case api.FileTypeSymlink:
		m |= fs.ModeSymlink
	case api.FileTypeOther:
		m |= fs.ModeIrregular
	}
	return m
}

func fileType(t string) filesystem.FileType {
	switch t {
	case api.FileTypeFile:
		return filesystem.FileType_FILE_TYPE_FILE
	case api.FileTypeDir:
		return filesystem.FileType_FILE_TYPE_DIRECTORY
	case api.FileTypeSymlink:
		return filesystem.FileType_FILE_TYPE_SYMLINK
	}
	return filesystem.FileType_FILE_TYPE_UNSPECIFIED
}

// dirBlock is the size of an empty directory on ext4 with 4 KiB blocks.
const dirBlock = 4096

// entry converts what the agent says about a file (lstat) to E2B's
// EntryInfo. With follow, a symlink reports its target's type and mode, as
// envd's Stat does; listings report the link itself.
func (c *call) entry(ctx context.Context, fi api.FileInfo, follow bool) *filesystem.EntryInfo {
	a := c.accounts(ctx)
	e := &filesystem.EntryInfo{
		Name:         fi.Name,
		Type:         fileType(fi.Type),
		Path:         fi.Path,
		Size:         fi.Size,
		Mode:         fi.Mode & 0o777,
		Permissions:  goMode(fi).String(),
		Owner:        nameOr(a.users, fi.UID),
		Group:        nameOr(a.groups, fi.GID),
		ModifiedTime: timestamppb.New(fi.ModTime),
		Metadata:     fi.Metadata,
	}
	// E2B's sandboxes are on ext4, where a directory's size is at least one
	// block, and its SDK's tests count on a directory having a size; on
	// atoll's btrfs layers an empty one has none. envd reports a
	// directory's size as ext4 would at least; atoll's own API the real one.
	if fi.Type == api.FileTypeDir && e.Size < dirBlock {
		e.Size = dirBlock
	}
	if fi.Type == api.FileTypeSymlink {
		target := fi.Target
		if !path.IsAbs(target) {
			target = path.Join(path.Dir(fi.Path), target)
		}
		e.SymlinkTarget = &target
		if follow {
			e.Type, e.Mode = filesystem.FileType_FILE_TYPE_UNSPECIFIED, 0
			if t, err := c.follow(ctx, fi.Path); err == nil {
				e.Type, e.Mode = fileType(t.Type), t.Mode&0o777
				e.SymlinkTarget = &t.Path
			}
		}
	}
	return e
}

// follow resolves symlinks at p, at most 40 deep as the kernel does, and
// returns what the last one names.
func (c *call) follow(ctx context.Context, p string) (api.FileInfo, error) {
	for range 40 {
		fi, err := c.sb.Agent.Stat(ctx, p)
		if err != nil || fi.Type != api.FileTypeSymlink {
			return fi, err
		}
		t := fi.Target
		if !path.IsAbs(t) {
			t = path.Join(path.Dir(p), t)
		}
		p = path.Clean(t)
	}
	return api.FileInfo{}, connect.NewError(connect.CodeFailedPrecondition, errors.New("cyclic symlink or chain of more than 40 links at "+p))
}

func nameOr(names map[int]string, id int) string {
	if n, ok := names[id]; ok {
		return n
	}
	return strconv.Itoa(id)
}

// isNotFound reports whether err is the agent's not-found answer.
func isNotFound(err error) bool { return errors.Is(err, errdefs.ErrNotFound) }
