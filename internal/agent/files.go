package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/filemeta"
)

// cleanPath checks a path from a client: absolute, no NUL; it returns it cleaned.
func cleanPath(p string) (string, error) {
	switch {
	case p == "":
		return "", errorf(errdefs.ErrInvalid, "path is required")
	case strings.ContainsRune(p, 0):
		return "", errorf(errdefs.ErrInvalid, "path contains NUL")
	case !path.IsAbs(p):
		return "", errorf(errdefs.ErrInvalid, "path %q is not absolute", p)
	}
	return filepath.Clean(p), nil
}

func queryPath(r *http.Request) (string, error) {
	return cleanPath(r.URL.Query().Get("path"))
}

func queryBool(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errorf(errdefs.ErrInvalid, "bad %s %q", name, v)
	}
	return b, nil
}

// fsError gives a file system error its kind; the message keeps the path,
// which is the sandbox's own.
func fsError(err error) error {
	if err == nil {
		return nil
	}
	var ke *kindError
	if errors.As(err, &ke) {
		return err
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return err
	}
	var kind error
	switch errno {
	case syscall.ENOENT:
		kind = errdefs.ErrNotFound
	case syscall.EEXIST, syscall.ENOTEMPTY, syscall.EBUSY, syscall.ETXTBSY:
		kind = errdefs.ErrConflict
	case syscall.ENOSPC, syscall.EDQUOT:
		kind = errdefs.ErrQuota
	case syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM:
		kind = errdefs.ErrUnavailable
	case syscall.EISDIR, syscall.ENOTDIR, syscall.EINVAL, syscall.ENAMETOOLONG, syscall.ELOOP,
		syscall.EXDEV, syscall.EACCES, syscall.EPERM, syscall.EROFS, syscall.EFBIG, syscall.EMLINK:
		kind = errdefs.ErrInvalid
	default:
		return err
	}
	return &kindError{kind: kind, msg: err.Error()}
}

// fileMode converts chmod bits to an os.FileMode.
func fileMode(m uint32) (os.FileMode, error) {
	if m > 0o7777 {
		return 0, errorf(errdefs.ErrInvalid, "bad mode %#o", m)
	}
	fm := os.FileMode(m & 0o777)
	for _, b := range specialBits {
		if m&b.chmod != 0 {
			fm |= b.mode
		}
	}
	return fm, nil
}

// specialBits pairs chmod's setuid, setgid and sticky bits with
// os.FileMode's.
var specialBits = []struct {
	chmod uint32
	mode  os.FileMode
}{{syscall.S_ISUID, os.ModeSetuid}, {syscall.S_ISGID, os.ModeSetgid}, {syscall.S_ISVTX, os.ModeSticky}}

// chmodBits converts an os.FileMode back to chmod bits.
func chmodBits(fm os.FileMode) uint32 {
	m := uint32(fm.Perm())
	for _, b := range specialBits {
		if fm&b.mode != 0 {
			m |= b.chmod
		}
	}
	return m
}

func fileInfo(p string, fi fs.FileInfo) api.FileInfo {
	info := api.FileInfo{
		Name:    fi.Name(),
		Path:    p,
		Size:    fi.Size(),
		Mode:    chmodBits(fi.Mode()),
		ModTime: fi.ModTime().UTC(),
	}
	if p == "/" {
		info.Name = "/"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		info.UID, info.GID = int(st.Uid), int(st.Gid)
	}
	switch {
	case fi.Mode().IsRegular():
		info.Type = api.FileTypeFile
	case fi.IsDir():
		info.Type = api.FileTypeDir
	case fi.Mode()&os.ModeSymlink != 0:
		info.Type = api.FileTypeSymlink
		info.Target, _ = os.Readlink(p)
	default:
		info.Type = api.FileTypeOther
	}
	return info
}

func lstat(p string) (api.FileInfo, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return api.FileInfo{}, fsError(err)
	}
	return fileInfo(p, fi), nil
}

// withMetadata is the with_metadata query parameter of the calls that
// describe files: whether to read each one's metadata (filemeta), which
// costs a listxattr and a getxattr per key.
// queryBools is queryBool of each of names, in their order.
func queryBools(r *http.Request, names ...string) ([]bool, error) {
	out := make([]bool, len(names))
	for i, name := range names {
		var err error
		if out[i], err = queryBool(r, name); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func withMetadata(r *http.Request) (bool, error) { return queryBool(r, "with_metadata") }

// addMetadata fills in info's metadata. It is best effort, as in E2B's
// envd: a file that went or cannot be read still has its other fields.
func addMetadata(info *api.FileInfo) {
	info.Metadata, _ = filemeta.Read(info.Path)
}

// queryMetadata is the metadata query parameter of a write: a JSON object
// of string values, checked against filemeta's limits. ok is false when
// the request carries none.
func queryMetadata(r *http.Request) (m map[string]string, ok bool, err error) {
	v, ok := r.URL.Query()["metadata"]
	if !ok {
		return nil, false, nil
	}
	if len(v) != 1 || len(v[0]) > 4*filemeta.MaxTotal {
		return nil, true, errorf(errdefs.ErrInvalid, "metadata: want one JSON object of at most %d bytes", filemeta.MaxTotal)
	}
	if err := json.Unmarshal([]byte(v[0]), &m); err != nil {
		return nil, true, errorf(errdefs.ErrInvalid, "metadata: want a JSON object of strings: %v", err)
	}
	if err := filemeta.Validate(m); err != nil {
		return nil, true, errorf(errdefs.ErrInvalid, "%v", err)
	}
	return m, true, nil
}

func (a *Agent) handleReadFile(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		writeError(w, err)
		return
	}
	// O_NONBLOCK so a fifo cannot hang the open; it is refused below anyway.
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		writeError(w, fsError(err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeError(w, fsError(err))
		return
	}
	if fi.IsDir() {
		writeError(w, errorf(errdefs.ErrInvalid, "%s is a directory", p))
		return
	}
	if !fi.Mode().IsRegular() {
		writeError(w, errorf(errdefs.ErrInvalid, "%s is not a regular file", p))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	// Files like those in /proc report size 0 yet have content: stream them chunked.
	if fi.Size() > 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
		io.CopyN(w, f, fi.Size())
		return
	}
	io.Copy(w, f)
}

func (a *Agent) handleWriteFile(w http.ResponseWriter, r *http.Request) {
	info, err := a.writeFile(r)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// writeFile streams the body to a temporary file next to the target and
// renames it into place, so readers never see half a file. Watchers see
// the write as one in place (see writeTemp).
func (a *Agent) writeFile(r *http.Request) (api.FileInfo, error) {
	p, err := queryPath(r)
	if err != nil {
		return api.FileInfo{}, err
	}
	mode, modeGiven, err := queryMode(r)
	if err != nil {
		return api.FileInfo{}, err
	}
	// Write through a symlink, as a shell redirection would.
	target := p
	if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			target = real
		}
	}
	owner, err := a.owner(r.URL.Query().Get("user"))
	if err != nil {
		return api.FileInfo{}, err
	}
	meta, metaGiven, err := queryMetadata(r)
	if err != nil {
		return api.FileInfo{}, err
	}
	uid, gid := owner.uid, owner.gid
	exists := false
	if fi, err := os.Stat(target); err == nil {
		exists = true
		if fi.IsDir() {
			return api.FileInfo{}, errorf(errdefs.ErrInvalid, "%s is a directory", p)
		}
		if fi.Mode().IsRegular() {
			if !modeGiven {
				mode = fi.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)
			}
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				uid, gid = int(st.Uid), int(st.Gid)
			}
		}
	}
	dir := filepath.Dir(target)
	if err := mkdirAll(dir, 0o755, owner); err != nil {
		return api.FileInfo{}, fsError(err)
	}
	tmp, err := os.CreateTemp(dir, writeTemp(exists))
	if err != nil {
		return api.FileInfo{}, fsError(err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, r.Body); err != nil {
		if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
			return api.FileInfo{}, errorf(errdefs.ErrTooLarge, "body too large")
		}
		return api.FileInfo{}, fsError(fmt.Errorf("writing %s: %w", p, err))
	}
	if uid >= 0 {
		if err := tmp.Chown(uid, gid); err != nil {
			return api.FileInfo{}, fsError(err)
		}
	}
	// After chown, which clears setuid bits.
	if err := tmp.Chmod(mode); err != nil {
		return api.FileInfo{}, fsError(err)
	}
	// The new file replaces the old one, metadata and all: a write without
	// metadata leaves none, as E2B's envd clears it on overwrite. Set
	// before the rename, a file never shows without the metadata it was
	// written with.
	if len(meta) > 0 {
		if err := writeMetadata(tmp, meta, dir, p); err != nil {
			return api.FileInfo{}, err
		}
	}
	if err := tmp.Sync(); err != nil {
		return api.FileInfo{}, fsError(err)
	}
	if err := tmp.Close(); err != nil {
		return api.FileInfo{}, fsError(err)
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return api.FileInfo{}, fsError(err)
	}
	ok = true
	info, err := lstat(target)
	if err == nil && metaGiven {
		addMetadata(&info)
	}
	return info, err
}

// queryMode reads the mode query parameter, in octal; without it the mode is
// 0644 and given is false.
func queryMode(r *http.Request) (mode os.FileMode, given bool, err error) {
	s := r.URL.Query().Get("mode")
	if s == "" {
		return 0o644, false, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil {
		return 0, false, errorf(errdefs.ErrInvalid, "bad mode %q: want octal", s)
	}
	if mode, err = fileMode(uint32(m)); err != nil {
		return 0, false, err
	}
	return mode, true, nil
}

// writeMetadata sets meta on tmp, the temporary file in dir of a write to p,
// with the refusals of a file system that keeps none, or none this large,
// told apart.
func writeMetadata(tmp *os.File, meta map[string]string, dir, p string) error {
	err := filemeta.Write(int(tmp.Fd()), meta)
	if err == nil {
		return nil
	}
	if filemeta.Unsupported(err) {
		return errorf(errdefs.ErrInvalid, "the file system of %s keeps no metadata (user extended attributes)", dir)
	}
	if errors.Is(err, syscall.E2BIG) || errors.Is(err, syscall.ERANGE) {
		return errorf(errdefs.ErrInvalid, "the file system of %s keeps no metadata this large", dir)
	}
	return fsError(fmt.Errorf("writing metadata of %s: %w", p, err))
}

// fileOwner is who files and directories a call creates belong to; -1
// leaves them to the agent (root).
type fileOwner struct{ uid, gid int }

// owner resolves the user query parameter or field of a file call.
func (a *Agent) owner(user string) (fileOwner, error) {
	if user == "" {
		return fileOwner{-1, -1}, nil
	}
	acct, err := a.lookupUser(user)
	if err != nil {
		return fileOwner{}, err
	}
	return fileOwner{acct.uid, acct.gid}, nil
}

// mkdirAll is os.MkdirAll that gives the directories it creates to owner.
func mkdirAll(p string, mode os.FileMode, owner fileOwner) error {
	var created []string
	if owner.uid >= 0 {
		for d := p; ; d = filepath.Dir(d) {
			if _, err := os.Lstat(d); err == nil || d == "/" {
				break
			}
			created = append(created, d)
		}
	}
	if err := os.MkdirAll(p, mode); err != nil {
		return err
	}
	for _, d := range created {
		// Lchown: a process of the sandbox may have swapped in a symlink.
		if err := os.Lchown(d, owner.uid, owner.gid); err != nil {
			return err
		}
	}
	return nil
}

func (a *Agent) handleRemove(w http.ResponseWriter, r *http.Request) {
	err := func() error {
		p, err := queryPath(r)
		if err != nil {
			return err
		}
		recursive, err := queryBool(r, "recursive")
		if err != nil {
			return err
		}
		if p == "/" {
			return errorf(errdefs.ErrInvalid, "refusing to remove /")
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return fsError(err)
		}
		if recursive {
			return fsError(os.RemoveAll(p))
		}
		if err := os.Remove(p); err != nil {
			if fi.IsDir() && errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
				return errorf(errdefs.ErrConflict, "directory %s is not empty; set recursive", p)
			}
			return fsError(err)
		}
		return nil
	}()
	respondEmpty(w, err)
}

func (a *Agent) handleStat(w http.ResponseWriter, r *http.Request) {
	p, meta, err := queryPathMeta(r)
	if err != nil {
		writeError(w, err)
		return
	}
	info, err := lstatMeta(p, meta)
	respond(w, info, err)
}

// queryPathMeta reads the path and with_metadata query parameters of r.
func queryPathMeta(r *http.Request) (p string, meta bool, err error) {
	if p, err = queryPath(r); err == nil {
		meta, err = withMetadata(r)
	}
	return p, meta, err
}

// lstatMeta is lstat with metadata if meta.
func lstatMeta(p string, meta bool) (api.FileInfo, error) {
	info, err := lstat(p)
	if err == nil && meta {
		addMetadata(&info)
	}
	return info, err
}

func (a *Agent) handleList(w http.ResponseWriter, r *http.Request) {
	list, err := func() (api.FileList, error) {
		p, meta, err := queryPathMeta(r)
		if err != nil {
			return api.FileList{}, err
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			return api.FileList{}, fsError(err)
		}
		list := api.FileList{Files: []api.FileInfo{}}
		for _, e := range entries {
			fi, err := e.Info()
			if err != nil {
				continue // removed since ReadDir
			}
			info := fileInfo(filepath.Join(p, e.Name()), fi)
			if meta {
				addMetadata(&info)
			}
			list.Files = append(list.Files, info)
		}
		return list, nil
	}()
	respond(w, list, err)
}

// decodeAt decodes r's JSON body, a Req, and cleans the path it names
// (path(req)).
func decodeAt[Req any](w http.ResponseWriter, r *http.Request, path func(*Req) string) (req Req, p string, err error) {
	if err = decodeJSON(w, r, &req); err == nil {
		p, err = cleanPath(path(&req))
	}
	return req, p, err
}

func (a *Agent) handleMkdir(w http.ResponseWriter, r *http.Request) {
	info, err := func() (api.FileInfo, error) {
		req, p, err := decodeAt(w, r, func(req *api.MkdirRequest) string { return req.Path })
		if err != nil {
			return api.FileInfo{}, err
		}
		mode := os.FileMode(0o755)
		if req.Mode != 0 {
			if mode, err = fileMode(req.Mode); err != nil {
				return api.FileInfo{}, err
			}
		}
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return api.FileInfo{}, errorf(errdefs.ErrConflict, "%s exists and is not a directory", p)
		}
		owner, err := a.owner(req.User)
		if err != nil {
			return api.FileInfo{}, err
		}
		if err := mkdirAll(p, mode, owner); err != nil {
			return api.FileInfo{}, fsError(err)
		}
		if req.Mode != 0 { // MkdirAll's mode is subject to the umask
			if err := os.Chmod(p, mode); err != nil {
				return api.FileInfo{}, fsError(err)
			}
		}
		return lstat(p)
	}()
	respond(w, info, err)
}

func (a *Agent) handleRename(w http.ResponseWriter, r *http.Request) {
	info, err := func() (api.FileInfo, error) {
		var req api.RenameRequest
		if err := decodeJSON(w, r, &req); err != nil {
			return api.FileInfo{}, err
		}
		from, err := cleanPath(req.From)
		if err != nil {
			return api.FileInfo{}, fmt.Errorf("from: %w", err)
		}
		to, err := cleanPath(req.To)
		if err != nil {
			return api.FileInfo{}, fmt.Errorf("to: %w", err)
		}
		if from == "/" || to == "/" {
			return api.FileInfo{}, errorf(errdefs.ErrInvalid, "cannot rename /")
		}
		meta, err := withMetadata(r)
		if err != nil {
			return api.FileInfo{}, err
		}
		if err := os.Rename(from, to); err != nil {
			return api.FileInfo{}, fsError(err)
		}
		return lstatMeta(to, meta)
	}()
	respond(w, info, err)
}

func (a *Agent) handleChmod(w http.ResponseWriter, r *http.Request) {
	info, err := func() (api.FileInfo, error) {
		req, p, err := decodeAt(w, r, func(req *api.ChmodRequest) string { return req.Path })
		if err != nil {
			return api.FileInfo{}, err
		}
		mode, err := fileMode(req.Mode)
		if err != nil {
			return api.FileInfo{}, err
		}
		if err := os.Chmod(p, mode); err != nil {
			return api.FileInfo{}, fsError(err)
		}
		return lstat(p)
	}()
	respond(w, info, err)
}
