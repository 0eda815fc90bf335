package agent

import (
	"context"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_DELETE |
	unix.IN_DELETE_SELF | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_MOVE_SELF |
	unix.IN_DONT_FOLLOW

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
	recursive, err := queryBool(r, "recursive")
	if err != nil {
		writeError(w, err)
		return
	}
	fi, err := os.Lstat(p)
	if err != nil {
		writeError(w, fsError(err))
		return
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		writeError(w, errorf(errdefs.ErrUnavailable, "creating inotify instance: %v", err))
		return
	}
	wt := &watcher{fd: fd, f: os.NewFile(uintptr(fd), "inotify"), paths: make(map[int]string)}
	defer wt.f.Close()
	if recursive && fi.IsDir() {
		err = wt.addTree(p)
	} else {
		err = wt.add(p)
	}
	if err != nil {
		writeError(w, fsError(err))
		return
	}
	for wd, wp := range wt.paths {
		if wp == p {
			wt.rootWD = wd
		}
	}

	stream, err := startNDJSON(w)
	if err != nil {
		return
	}
	// A deadline, not Close, ends the read: the fd stays valid for add.
	stop := context.AfterFunc(r.Context(), func() { wt.f.SetReadDeadline(time.Now()) })
	defer stop()

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
			path := dir
			if name != "" {
				path = filepath.Join(dir, name)
			}
			typ := watchType(ev.Mask, int(ev.Wd) == wt.rootWD)
			if typ == "" {
				continue
			}
			newDir := recursive && typ == api.WatchCreate && ev.Mask&unix.IN_ISDIR != 0
			if newDir {
				wt.addTree(path)
			}
			if err := stream.send(api.WatchEvent{Type: typ, Path: path}); err != nil {
				return
			}
			if newDir && !sendExisting(stream, path) {
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
func sendExisting(stream *ndjson, dir string) bool {
	ok := true
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return nil
		}
		if err := stream.send(api.WatchEvent{Type: api.WatchCreate, Path: p}); err != nil {
			ok = false
			return filepath.SkipAll
		}
		return nil
	})
	return ok
}
