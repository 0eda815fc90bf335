package agent

import (
	"context"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_DELETE |
	unix.IN_DELETE_SELF | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_MOVE_SELF |
	unix.IN_DONT_FOLLOW

// A write through the agent lands by renaming a temporary file over its
// target, so that readers never see half a file. Watchers are told of it
// as of a write in place, as E2B's envd makes it (open with O_TRUNC,
// chown, write): the temporary file is never named, and its rename onto
// the target reports the target as created (when it was new), chmod'ed
// and written. The temporary file's name says whether the target existed.
const (
	writeTempPrefix = ".atoll-write-"
	writeTempNew    = writeTempPrefix + "new-"
)

// writeTemp is the os.CreateTemp pattern of a write's temporary file.
func writeTemp(targetExists bool) string {
	if targetExists {
		return writeTempPrefix + "*"
	}
	return writeTempNew + "*"
}

// writeEvents are what a watcher reports when a write's temporary file
// is renamed onto its target.
func writeEvents(created bool) []string {
	if created {
		return []string{api.WatchCreate, api.WatchChmod, api.WatchWrite}
	}
	return []string{api.WatchChmod, api.WatchWrite}
}

// maxPendingWrites bounds the writes a watch has seen leave their
// temporary name but not yet arrive: a rename's two halves come together
// unless the temporary file was moved elsewhere by someone else.
const maxPendingWrites = 64

// watcher is one inotify instance and the paths of its watches.
type watcher struct {
	fd     int
	f      *os.File
	paths  map[int]string
	rootWD int
}

func (w *watcher) add(p string) error {
	wd, err := unix.InotifyAddWatch(w.fd, p, watchMask)
	if err != nil {
		return &os.PathError{Op: "watch", Path: p, Err: err}
	}
	w.paths[wd] = p
	return nil
}

// addTree watches dir and every directory under it; symlinks are not followed.
func (w *watcher) addTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil // gone or unreadable: nothing to watch there
		}
		if !d.IsDir() {
			return nil
		}
		if err := w.add(p); err != nil && p == dir {
			return err
		}
		return nil
	})
}

func (a *Agent) handleWatch(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		writeError(w, err)
		return
	}
	flags, err := queryBools(r, "recursive", "entries", "no_network_mounts")
	if err != nil {
		writeError(w, err)
		return
	}
	recursive, entries, localOnly := flags[0], flags[1], flags[2]
	fi, err := os.Lstat(p)
	if err != nil {
		writeError(w, fsError(err))
		return
	}
	if localOnly {
		if fs, err := networkFS(p); err != nil {
			writeError(w, fsError(err))
			return
		} else if fs != "" {
			writeError(w, errorf(errdefs.ErrInvalid, "cannot watch %s: it is on a network file system (%s), where changes may go unseen", p, fs))
			return
		}
	}
	wt, err := newWatcher(p, recursive && fi.IsDir())
	if err != nil {
		writeError(w, err)
		return
	}
	defer wt.f.Close()

	stream, err := startNDJSON(w)
	if err != nil {
		return
	}
	send := func(typ, path string) error {
		ev := api.WatchEvent{Type: typ, Path: path}
		if entries && entryEvents[typ] {
			if info, err := lstat(path); err == nil {
				addMetadata(&info)
				ev.Entry = &info
			}
		}
		return stream.send(ev)
	}
	// A deadline, not Close, ends the read: the fd stays valid for add.
	stop := context.AfterFunc(r.Context(), func() { wt.f.SetReadDeadline(time.Now()) })
	defer stop()
	wt.relay(send, recursive)
}

// newWatcher watches p, and with tree every directory below it too. Its
// errors carry their kind.
func newWatcher(p string, tree bool) (*watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, errorf(errdefs.ErrUnavailable, "creating inotify instance: %v", err)
	}
	wt := &watcher{fd: fd, f: os.NewFile(uintptr(fd), "inotify"), paths: make(map[int]string)}
	if tree {
		err = wt.addTree(p)
	} else {
		err = wt.add(p)
	}
	if err != nil {
		wt.f.Close()
		return nil, fsError(err)
	}
	for wd, wp := range wt.paths {
		if wp == p {
			wt.rootWD = wd
		}
	}
	return wt, nil
}

// relay reads inotify events and sends them as watch events until nothing
// is watched any more, the read fails (the request's end sets a deadline)
// or send fails. A write's temporary file is folded into one event on its
// target; with recursive, a new directory is watched and its entries sent.
func (wt *watcher) relay(send func(typ, path string) error, recursive bool) {
	// writes holds, by rename cookie, the writes whose temporary file has
	// left its name: whether each made its target.
	writes := make(map[uint32]bool)
	buf := make([]byte, 64<<10)
	for len(wt.paths) > 0 {
		n, err := wt.f.Read(buf)
		if err != nil {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			dir, ok := wt.paths[int(ev.Wd)]
			if !ok {
				continue
			}
			if ev.Mask&unix.IN_IGNORED != 0 {
				delete(wt.paths, int(ev.Wd))
				continue
			}
			name := string(nameBytes)
			for len(name) > 0 && name[len(name)-1] == 0 {
				name = name[:len(name)-1]
			}
			if strings.HasPrefix(name, writeTempPrefix) {
				if ev.Mask&unix.IN_MOVED_FROM != 0 {
					if len(writes) >= maxPendingWrites {
						clear(writes)
					}
					writes[ev.Cookie] = strings.HasPrefix(name, writeTempNew)
				}
				continue
			}
			path := dir
			if name != "" {
				path = filepath.Join(dir, name)
			}
			if created, ok := writes[ev.Cookie]; ok && ev.Mask&unix.IN_MOVED_TO != 0 {
				delete(writes, ev.Cookie)
				for _, typ := range writeEvents(created) {
					if err := send(typ, path); err != nil {
						return
					}
				}
				continue
			}
			typ := watchType(ev.Mask, int(ev.Wd) == wt.rootWD)
			if typ == "" {
				continue
			}
			newDir := recursive && typ == api.WatchCreate && ev.Mask&unix.IN_ISDIR != 0
			if newDir {
				wt.addTree(path)
			}
			if err := send(typ, path); err != nil {
				return
			}
			if newDir && !sendExisting(send, path) {
				return
			}
		}
	}
}

// watchType maps an inotify mask to a watch event type, as fsnotify does: a
// rename reports the old name as "rename" and the new one as "create". Events
// about a watched directory itself are reported only for the top one; its
// parent's watch reports the others.
func watchType(mask uint32, top bool) string {
	switch {
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		return api.WatchCreate
	case mask&unix.IN_MODIFY != 0:
		return api.WatchWrite
	case mask&unix.IN_ATTRIB != 0:
		return api.WatchChmod
	case mask&unix.IN_DELETE != 0:
		return api.WatchRemove
	case mask&unix.IN_MOVED_FROM != 0:
		return api.WatchRename
	case mask&unix.IN_DELETE_SELF != 0 && top:
		return api.WatchRemove
	case mask&unix.IN_MOVE_SELF != 0 && top:
		return api.WatchRename
	}
	return ""
}

// sendExisting reports as created what a new directory already holds: entries
// made before its watch was added would otherwise go unseen (a directory made
// and filled at once, as mkdir -p a/b does). A later event may repeat one.
func sendExisting(send func(typ, path string) error, dir string) bool {
	ok := true
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir || strings.HasPrefix(d.Name(), writeTempPrefix) {
			return nil
		}
		if err := send(api.WatchCreate, p); err != nil {
			ok = false
			return filepath.SkipAll
		}
		return nil
	})
	return ok
}

// entryEvents are the event types that name a file still there, whose
// entry a watch with entries reports. A remove or the old name of a
// rename names one that went: looking there could find a file made
// since, so they carry none, as in E2B's envd.
var entryEvents = map[string]bool{api.WatchCreate: true, api.WatchWrite: true, api.WatchChmod: true}

// networkFSMagic names the file systems (statfs f_type) a watch refuses
// unless allowed, those E2B's envd refuses: inotify sees only the changes
// made through this kernel, not another client's.
var networkFSMagic = map[int64]string{
	unix.NFS_SUPER_MAGIC:  "nfs",
	unix.CIFS_SUPER_MAGIC: "cifs",
	unix.SMB_SUPER_MAGIC:  "smb",
	unix.SMB2_SUPER_MAGIC: "smb2",
	unix.FUSE_SUPER_MAGIC: "fuse",
}

// networkFS is the name of p's file system if it is a network one, "" if not.
func networkFS(p string) (string, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(p, &st); err != nil {
		return "", &os.PathError{Op: "statfs", Path: p, Err: err}
	}
	return networkFSMagic[int64(st.Type)], nil
}
